"""`data prepare` with bounded memory (tasks cut inside long documents)."""

import numpy as np

from gptrain.data import prepare as prep_mod
from gptrain.data import sources
from gptrain.tokenizers import GPT2Tokenizer
from tests.helpers import write_corpus


def test_a_long_document_is_cut_into_bounded_tasks_with_the_ids_of_one_encoding(tmp_path, monkeypatch):
    """One .txt file is one document: it used to be buffered whole into one task (3.1 GB peak
    RSS for a 200 MB file); now no task holds more than TASK_CHARS plus one piece."""
    monkeypatch.setattr(sources, "PIECE_CHARS", 300)
    monkeypatch.setattr(prep_mod, "TASK_CHARS", 1000)
    src = write_corpus(tmp_path / "one.txt", n_chars=30_000)
    text = src.read_text()
    docs = prep_mod._split_documents(sources.expand([str(src)], None), "text", None, 0.0, 0,
                                     sources.ReadStats(), prep_mod._NoProgress())
    tasks = list(prep_mod._tasks(docs))
    sizes = [sum(len(t) for t, _ in pieces) for _, pieces in tasks]
    assert len(tasks) >= 20 and max(sizes) < 1000 + 300, sizes
    assert "".join(t for _, pieces in tasks for t, _ in pieces) == text
    assert [end for _, pieces in tasks for _, end in pieces].count(True) == 1

    meta = prep_mod.prepare([str(src)], str(tmp_path / "out"), val_fraction=0.0, quiet=True)
    tok = GPT2Tokenizer()
    expected = tok.encode(text) + [tok.eos_id]
    assert (tmp_path / "out" / "train.bin").read_bytes() == np.asarray(expected, "<u2").tobytes()
    assert meta["splits"]["train"]["documents"] == 1
    assert meta["splits"]["train"]["files"][0]["documents"] == 1


def test_a_line_longer_than_a_piece_does_not_make_the_rest_of_the_file_one_piece(tmp_path, monkeypatch):
    """Pieces were cut only at a safe point within the first PIECE_CHARS of what was buffered: a
    long first line (no such point) made the whole rest of the file one piece, held in memory."""
    monkeypatch.setattr(sources, "PIECE_CHARS", 300)
    text = "x" * 2000 + "\n" + write_corpus(tmp_path / "body.txt", n_chars=20_000).read_text()
    (tmp_path / "a.txt").write_text(text)
    with open(tmp_path / "a.txt", "rb") as f:
        pieces = list(sources._pieces(f, "a.txt", sources.ReadStats()))
    assert "".join(pieces) == text
    assert pieces[0] == "x" * 2000 + "\n" and len(pieces) > 50 and max(map(len, pieces[1:])) <= 300
    prep_mod.prepare([str(tmp_path / "a.txt")], str(tmp_path / "out"), val_fraction=0.0, quiet=True)
    tok = GPT2Tokenizer()
    expected = tok.encode(text) + [tok.eos_id]
    assert (tmp_path / "out" / "train.bin").read_bytes() == np.asarray(expected, "<u2").tobytes()
