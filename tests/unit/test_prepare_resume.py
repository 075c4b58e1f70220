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
