"""`data prepare` with bounded memory (tasks cut inside long documents) and OUT.partial, which a
rerun continues: byte-identical output, a changed source or option refused in one line, a
hostile journal refused without touching anything outside the folder."""

import itertools
import json

import numpy as np
import pytest

from gptrain.data import prepare as prep_mod
from gptrain.data import sources
from gptrain.data.formats import read_meta, verify
from gptrain.errors import UserError
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


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """Many small tasks, several shards per split, a journal after every task."""
    monkeypatch.setattr(sources, "PIECE_CHARS", 400)
    monkeypatch.setattr(prep_mod, "TASK_CHARS", 1500)
    monkeypatch.setattr(prep_mod, "JOURNAL_SECONDS", 0.0)
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(12):
        write_corpus(d / f"doc{i:02d}.txt", n_chars=4000, seed=i)
    return d


OPTS = dict(val_fraction=0.3, shard_tokens=700, quiet=True)


def _interrupt_after(monkeypatch, n: int):
    """Ctrl-C as the prepare starts its task number n (counting from 0)."""
    real, calls = prep_mod._tokenize, itertools.count()

    def tokenize(task):
        if next(calls) == n:
            raise KeyboardInterrupt
        return real(task)
    monkeypatch.setattr(prep_mod, "_tokenize", tokenize)


def _same_dataset(a, b):
    ma, mb = read_meta(a), read_meta(b)
    for m in (ma, mb):
        m.pop("created"), m.pop("prepare_seconds")
    assert ma == mb
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for p in a.iterdir():
        assert p.name == "meta.json" or p.read_bytes() == (b / p.name).read_bytes(), p.name


def test_an_interrupted_prepare_continues_to_the_same_bytes(corpus, tmp_path, monkeypatch, capsys):
    ref = tmp_path / "ref"
    prep_mod.prepare([str(corpus)], str(ref), **OPTS)
    assert len(read_meta(ref)["splits"]["train"]["files"]) > 3
    assert all("documents" in f for s in read_meta(ref)["splits"].values() for f in s["files"])

    out, real = tmp_path / "out", prep_mod._tokenize
    for n in (7, 12):  # interrupted twice, the second time after continuing
        _interrupt_after(monkeypatch, n)
        with pytest.raises(KeyboardInterrupt):
            prep_mod.prepare([str(corpus)], str(out), **OPTS)
        assert not out.exists() and (tmp_path / "out.partial" / "journal.json").is_file()
    monkeypatch.setattr(prep_mod, "_tokenize", real)
    capsys.readouterr()
    prep_mod.prepare([str(corpus)], str(out), **{**OPTS, "quiet": False}, num_proc=2)
    assert "continuing an interrupted prepare: 19 tasks (" in capsys.readouterr().out
    assert not (tmp_path / "out.partial").exists()
    verify(out)
    _same_dataset(ref, out)


def _partial(corpus, tmp_path, monkeypatch):
    real = prep_mod._tokenize
    _interrupt_after(monkeypatch, 20)
    with pytest.raises(KeyboardInterrupt):
        prep_mod.prepare([str(corpus)], str(tmp_path / "out"), **OPTS)
    monkeypatch.setattr(prep_mod, "_tokenize", real)
    return tmp_path / "out.partial"


def _refused(call, *needles) -> str:
    with pytest.raises(UserError) as e:
        call()
    line = str(e.value)
    assert "\n" not in line
    for needle in needles:
        assert needle in line, line
    return line


def test_a_changed_source_or_option_is_refused_in_one_line(corpus, tmp_path, monkeypatch):
    partial = _partial(corpus, tmp_path, monkeypatch)
    journal = (partial / "journal.json").read_bytes()
    out = str(tmp_path / "out")
    _refused(lambda: prep_mod.prepare([str(corpus)], out, **{**OPTS, "seed": 7}),
             "--seed was 1337, now 7", f"remove {partial}", "or give a new --out")
    _refused(lambda: prep_mod.prepare([str(corpus)], out, **{**OPTS, "shard_tokens": 800}), "--shard-tokens")
    _refused(lambda: prep_mod.prepare([str(corpus)], out, **{**OPTS, "tokenizer": "byte"}), "another tokenizer")
    with open(corpus / "doc03.txt", "a") as f:
        f.write("One more line.\n")
    _refused(lambda: prep_mod.prepare([str(corpus)], out, **OPTS),
             f"{corpus / 'doc03.txt'} has changed since", f"remove {partial}")
    (corpus / "doc99.txt").write_text("A new file.\n")
    _refused(lambda: prep_mod.prepare([str(corpus)], out, **OPTS), "other sources (12 files then, 13 now)")
    assert (partial / "journal.json").read_bytes() == journal  # left as it was, for the user


@pytest.mark.parametrize("edit, needle", [
    (lambda j: j["splits"]["train"]["files"][0].update(name="../outside.bin"), "'../outside.bin'"),
    (lambda j: j["splits"]["val"]["files"][0].update(name="/tmp/x.bin"), "'/tmp/x.bin'"),
    (lambda j: j["splits"]["train"].update(tokens=-3), "malformed train split"),
    (lambda j: j["splits"]["train"].update(tokens=True), "malformed train split"),
    (lambda j: j.update(tasks="7"), "malformed counts"),
    (lambda j: j["splits"]["train"]["files"][0].update(tokens=10**9), "not the file of 1000000000 tokens"),
    (lambda j: j["splits"]["train"].update(tokens=699), "not the file of 699 tokens"),
    (lambda j: j.update(journal=99), "unknown journal version"),
])
def test_a_hostile_journal_is_refused_in_one_line_and_nothing_outside_is_touched(
        corpus, tmp_path, monkeypatch, edit, needle):
    partial = _partial(corpus, tmp_path, monkeypatch)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not yours" * 100)
    journal = json.loads((partial / "journal.json").read_text())
    assert journal["splits"]["train"]["files"] and journal["splits"]["val"]["files"]
    edit(journal)
    (partial / "journal.json").write_text(json.dumps(journal))
    before = {p.name: p.read_bytes() for p in partial.iterdir()}
    _refused(lambda: prep_mod.prepare([str(corpus)], str(tmp_path / "out"), **OPTS), needle, f"remove {partial}")
    assert outside.read_bytes() == b"not yours" * 100
    assert {p.name: p.read_bytes() for p in partial.iterdir()} == before
    assert not (tmp_path / "out").exists()


def test_a_shard_replaced_by_a_link_out_is_refused_and_the_target_untouched(corpus, tmp_path, monkeypatch):
    partial = _partial(corpus, tmp_path, monkeypatch)
    current = json.loads((partial / "journal.json").read_text())["splits"]["train"]
    assert current["tokens"] > 0
    outside = tmp_path / "outside.bin"
    shard = partial / f"train-{len(current['files']):05d}.bin"  # the shard being written
    data = shard.read_bytes()
    outside.write_bytes(data + b"more")  # longer than the journal says: it would be cut back
    shard.unlink()
    shard.symlink_to(outside)
    _refused(lambda: prep_mod.prepare([str(corpus)], str(tmp_path / "out"), **OPTS), str(shard))
    assert outside.read_bytes() == data + b"more"


def test_an_error_removes_the_partial_folder(tmp_path):
    d = tmp_path / "w"
    d.mkdir()
    (d / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    _refused(lambda: prep_mod.prepare([str(d / "bad.jsonl")], str(d / "out"), quiet=True),
             "line 2 is not valid JSON")
    assert sorted(p.name for p in d.iterdir()) == ["bad.jsonl"]


@pytest.fixture(params=["save_to_disk", "hub-style repository"])
def hf_source(request, corpus, tmp_path):
    """The corpus as a Hugging Face dataset: a save_to_disk folder (memory-mapped arrow) or a
    dataset repository of JSONL files (hf:DIR, read by load_dataset(streaming=True) as a hub
    name is), train and validation splits."""
    import datasets

    texts = [p.read_text() for p in sorted(corpus.iterdir())]
    splits = {"train": texts[:10], "validation": texts[10:]}
    if request.param == "save_to_disk":
        out = tmp_path / "saved"
        datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}).save_to_disk(out)
        return str(out)
    repo = tmp_path / "repo" / "data"
    repo.mkdir(parents=True)
    for split, rows in splits.items():
        (repo / f"{split}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    return f"hf:{repo.parent}"


def test_an_interrupted_hf_prepare_continues_to_the_same_bytes(hf_source, tmp_path, monkeypatch, capsys):
    """Hugging Face sources used to be prepared in one go (a kill started over): now through
    OUT.partial like text, continued to the same bytes."""
    ref, out, real = tmp_path / "ref", tmp_path / "out", prep_mod._tokenize
    prep_mod.prepare([hf_source], str(ref), **OPTS)
    assert read_meta(ref)["splits"]["val"]["tokens"] > 0 and len(read_meta(ref)["splits"]["train"]["files"]) > 3
    _interrupt_after(monkeypatch, 9)
    with pytest.raises(KeyboardInterrupt):
        prep_mod.prepare([hf_source], str(out), **OPTS)
    assert not out.exists() and (tmp_path / "out.partial" / "journal.json").is_file()
    monkeypatch.setattr(prep_mod, "_tokenize", real)
    capsys.readouterr()
    prep_mod.prepare([hf_source], str(out), **{**OPTS, "quiet": False})
    assert "continuing an interrupted prepare: 9 tasks (" in capsys.readouterr().out
    verify(out)
    _same_dataset(ref, out)


def test_a_link_left_in_the_work_folder_is_not_written_through(tmp_path):
    """The last step of a prepare with too few documents splits train's shard into train.bin
    and val.bin: a link planted there (the work folder survives a kill) is replaced, never
    written through."""
    folder, victim = tmp_path / "out.partial", tmp_path / "victim.bin"
    folder.mkdir()
    victim.write_bytes(b"ORIGINAL")
    np.arange(100, dtype=np.uint16).tofile(folder / "shard-0.bin")
    for name in ("train.bin", "val.bin"):
        (folder / name).symlink_to(victim)
    splits = {"train": {"tokens": 100, "files": [{"name": "shard-0.bin"}]}, "val": {"files": []}}
    prep_mod._tail_to_val(folder, splits, "uint16", 0.1)
    assert victim.read_bytes() == b"ORIGINAL"
    assert not (folder / "val.bin").is_symlink() and np.fromfile(folder / "val.bin", np.uint16).tolist() == list(range(90, 100))


def test_an_output_that_cannot_be_written_is_one_line(tmp_path):
    """(/proc takes no new folders, even from root, as a read-only file system takes none)"""
    (tmp_path / "a.txt").write_text("some words\n" * 50)
    with pytest.raises(UserError, match="cannot write the prepared dataset at /proc/.*; give a --out you may write to"):
        prep_mod.prepare([str(tmp_path / "a.txt")], "/proc/gptrain-test/out", quiet=True)


def test_json_nested_past_the_recursion_limit_is_one_line(tmp_path):
    (tmp_path / "deep.jsonl").write_text('{"text": "ok"}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(UserError, match="line 2 is not valid JSON"):
        list(sources.documents(sources.expand([str(tmp_path / "deep.jsonl")], None)[0], "text", sources.ReadStats()))


def test_a_byte_order_mark_is_not_text(tmp_path):
    """Files saved by Windows tools start with a UTF-8 BOM: JSONL (plain and instruction) and
    text read as without it."""
    rows = '{"text": "hello world"}\n' * 3
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + rows.encode())
    (tmp_path / "plain.jsonl").write_text(rows)
    got = [["".join(d) for d in sources.documents(sources.expand([str(tmp_path / f"{n}.jsonl")], None)[0], "text",
                                                    sources.ReadStats())] for n in ("bom", "plain")]
    assert got[0] == got[1] == ["hello world"] * 3
    from gptrain.data import sft

    (tmp_path / "sft.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "Q", "completion": "A"}\n')
    assert sft.detect([tmp_path / "sft.jsonl"]) == sft.PROMPT_COMPLETION


def test_a_stalled_server_is_named_as_such():
    from gptrain.data.remote_shards import _cannot_read

    class FSTimeoutError(Exception):  # fsspec's, raised with no message
        pass

    assert "FSTimeoutError: no answer in time (the server stalled)" in str(_cannot_read("http://h/x", FSTimeoutError()))
