"""Data pipeline: prepare (counts, determinism, formats), import, store, bad input."""

import json

import numpy as np
import pytest

from gptrain.data import prepare as prep_mod
from gptrain.data import sources
from gptrain.data.formats import open_split, read_meta
from gptrain.errors import UserError
from gptrain.tokenizers import CharTokenizer, GPT2Tokenizer
from tests.conftest import run_cli
from tests.helpers import http_server

DOCS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 30,
    "It's a truth universally acknowledged, that a single man in possession of a good fortune\n" * 40,
    "Ünïcödé lines — with “quotes”, tabs\tand  double  spaces.\n   indented line\n" * 25,
]


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i, text in enumerate(DOCS):
        (d / f"doc{i}.txt").write_text(text)
    return d


def _tokens(out, split="train"):
    return open_split(out, split).tolist()


def test_gpt2_counts_equal_direct_tokenization(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "PIECE_CHARS", 200)  # documents read in many small pieces
    meta = prep_mod.prepare([str(corpus)], str(tmp_path / "out"), val_fraction=0.0, quiet=True)
    tok = GPT2Tokenizer()
    expected = []
    for text in DOCS:
        expected += tok.encode(text) + [tok.eos_id]
    assert meta["splits"]["train"]["tokens"] == len(expected)
    assert meta["splits"]["train"]["documents"] == 3
    assert _tokens(tmp_path / "out") == expected
    raw = np.memmap(tmp_path / "out" / "train.bin", dtype=np.uint16, mode="r")  # nanoGPT's reader
    assert raw.tolist() == expected


def test_char_counts_and_vocab(corpus, tmp_path):
    meta = prep_mod.prepare([str(corpus)], str(tmp_path / "out"), tokenizer="char",
                            val_fraction=0.0, quiet=True)
    tok = CharTokenizer("".join(DOCS))
    assert meta["vocab_size"] == tok.vocab_size and meta["eos_id"] is None
    assert _tokens(tmp_path / "out") == tok.encode("".join(DOCS))


def test_num_proc_gives_identical_bytes(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(prep_mod, "TASK_CHARS", 500)  # many tasks in flight
    a = prep_mod.prepare([str(corpus)], str(tmp_path / "a"), num_proc=1, val_fraction=0.3, quiet=True)
    b = prep_mod.prepare([str(corpus)], str(tmp_path / "b"), num_proc=2, val_fraction=0.3, quiet=True)
    assert a["splits"] == b["splits"]
    for split in ("train", "val"):
        for f in a["splits"][split]["files"]:
            assert (tmp_path / "a" / f["name"]).read_bytes() == (tmp_path / "b" / f["name"]).read_bytes()


def test_shards_and_jsonl(tmp_path):
    rows = [{"text": f"record number {i} says hello"} for i in range(200)]
    src = tmp_path / "data.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    meta = prep_mod.prepare([str(src)], str(tmp_path / "out"), val_fraction=0.0, shard_tokens=500, quiet=True)
    files = meta["splits"]["train"]["files"]
    assert len(files) > 1 and files[0]["name"] == "train-00000.bin"
    tok = GPT2Tokenizer()
    expected = [t for r in rows for t in tok.encode(r["text"]) + [tok.eos_id]]
    assert _tokens(tmp_path / "out") == expected


def test_parquet_source(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["alpha beta", "gamma delta"]}), tmp_path / "d.parquet")
    meta = prep_mod.prepare([str(tmp_path / "d.parquet")], str(tmp_path / "out"), text_field="body",
                            val_fraction=0.0, quiet=True)
    assert meta["splits"]["train"]["documents"] == 2


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"good text \xff\xfe more text\n")
    meta = prep_mod.prepare([str(f)], str(tmp_path / "out"), val_fraction=0.0, quiet=True)
    assert meta["invalid_utf8_replaced"] == 2


def test_hf_save_to_disk_import_and_direct_use(tmp_path):
    import datasets

    from gptrain.data.hf_import import cached_import

    blocks = [[i, i + 1, i + 2, i + 3] for i in range(0, 400, 4)]
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"input_ids": blocks[:90]}),
        "validation": datasets.Dataset.from_dict({"input_ids": blocks[90:]}),
    })
    dd.save_to_disk(tmp_path / "hf")
    r = run_cli("data", "import", tmp_path / "hf", "--out", tmp_path / "imp")
    assert r.returncode == 0, r.stderr
    assert _tokens(tmp_path / "imp") == list(range(360))
    assert _tokens(tmp_path / "imp", "val") == list(range(360, 400))
    assert _tokens(cached_import(tmp_path / "hf")) == list(range(360))


def test_push_list_inspect_rm(corpus, tmp_path):
    out = tmp_path / "prepared"
    assert run_cli("data", "prepare", corpus, "--out", out).returncode == 0
    r = run_cli("data", "push", "demo-set", out)
    assert r.returncode == 0, r.stderr
    r = run_cli("data", "list")
    assert "demo-set" in r.stdout and "gpt2" in r.stdout
    r = run_cli("data", "inspect", "demo-set", "--verify")
    assert r.returncode == 0 and "verified" in r.stdout and "First Citizen" in r.stdout
    assert run_cli("data", "push", "demo-set", out).returncode == 2  # duplicate name
    assert run_cli("data", "rm", "demo-set").returncode == 0
    assert "demo-set" not in run_cli("data", "list").stdout


def _assert_one_line_error(r, needle):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in r.stderr, r.stderr


def test_bad_input_is_one_line_exit_2_and_leaves_nothing(corpus, tmp_path, isolated_home):
    out = tmp_path / "out"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\x00\x01\x02binary")
    cases = [
        (["data", "prepare", tmp_path / "missing.txt", "--out", out], "does not exist"),
        (["data", "prepare", empty, "--out", out], "empty"),
        (["data", "prepare", binary, "--out", out], "binary"),
        (["data", "prepare", corpus, "--out", out, "--tokenizer", "nope"], "unknown tokenizer"),
        (["data", "push", "Bad/Name", corpus], "invalid dataset name"),
        (["data", "push", "../x", corpus], "invalid dataset name"),
        (["data", "push", "ok", corpus / "doc0.txt"], "is not a directory"),
    ]
    for args, needle in cases:
        _assert_one_line_error(run_cli(*args), needle)
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out."))]  # nor out.partial
    assert not (isolated_home / "datasets").exists() or not list((isolated_home / "datasets").iterdir())


def test_corrupted_token_file_is_refused(corpus, tmp_path, isolated_home):
    out = tmp_path / "prepared"
    prep_mod.prepare([str(corpus)], str(out), val_fraction=0.0, quiet=True)
    data = bytearray((out / "train.bin").read_bytes())
    data[10] ^= 0xFF
    (out / "train.bin").write_bytes(bytes(data))
    _assert_one_line_error(run_cli("data", "push", "x", out), "sha256")
    (out / "train.bin").write_bytes(bytes(data[:-2]))
    _assert_one_line_error(run_cli("data", "inspect", out), "truncated")
    assert not (isolated_home / "datasets" / "x").exists()


def test_meta_records_splits_and_checksums(corpus, tmp_path):
    meta = prep_mod.prepare([str(corpus)], str(tmp_path / "out"), val_fraction=0.5, seed=3, quiet=True)
    again = read_meta(tmp_path / "out")
    assert again == meta and meta["tokenizer"] == {"name": "gpt2"} and meta["dtype"] == "uint16"
    assert meta["splits"]["train"]["tokens"] > 0 and meta["splits"]["val"]["tokens"] > 0


def test_files_count_their_documents_and_older_meta_without_them_still_reads(tmp_path):
    rows = [{"text": f"record number {i} says hello"} for i in range(200)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    meta = prep_mod.prepare([str(tmp_path / "data.jsonl")], str(out), val_fraction=0.0, shard_tokens=500, quiet=True)
    files = meta["splits"]["train"]["files"]
    assert len(files) > 2 and sum(f["documents"] for f in files) == meta["splits"]["train"]["documents"] == 200
    tok = GPT2Tokenizer()
    ends = np.cumsum([len(tok.encode(r["text"])) + 1 for r in rows])  # where each record ends
    for i, f in enumerate(files):  # a document is counted in the file that holds its last token
        assert f["documents"] == int(np.sum((ends > i * 500) & (ends <= i * 500 + f["tokens"])))
    older = json.loads((out / "meta.json").read_text())
    for f in older["splits"]["train"]["files"] + older["splits"]["val"]["files"]:
        del f["documents"]
    (out / "meta.json").write_text(json.dumps(older))
    assert read_meta(out)["splits"]["train"]["tokens"] == meta["splits"]["train"]["tokens"]
    older["splits"]["train"]["files"][0]["documents"] = -1
    (out / "meta.json").write_text(json.dumps(older))
    with pytest.raises(UserError, match="malformed file entry"):
        read_meta(out)


def test_hugging_face_dataset_source_uses_its_own_splits(tmp_path):
    """A local dataset in the hub's layout goes through datasets.load_dataset, like a hub name."""
    d = tmp_path / "hf-ds"
    d.mkdir()
    for split, texts in (("train", ["alpha beta", "", "gamma"]), ("validation", ["delta epsilon"])):
        (d / f"{split}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    meta = prep_mod.prepare([f"hf:{d}"], str(tmp_path / "out"), quiet=True)
    tok = GPT2Tokenizer()
    assert _tokens(tmp_path / "out") == tok.encode("alpha beta") + [50256] + tok.encode("gamma") + [50256]
    assert _tokens(tmp_path / "out", "val") == tok.encode("delta epsilon") + [50256]
    assert meta["splits"]["train"]["documents"] == 2


def test_unreachable_hub_dataset_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    r = run_cli("data", "prepare", "wikitext", "--hf-config", "wikitext-2-raw-v1", "--out", tmp_path / "o")
    _assert_one_line_error(r, "cannot load Hugging Face dataset 'wikitext'")
    assert not (tmp_path / "o").exists()


def test_http_source_through_fsspec(corpus, tmp_path):
    with http_server(corpus) as base:
        prep_mod.prepare([f"{base}/doc1.txt"], str(tmp_path / "web"), val_fraction=0.0, quiet=True)
    prep_mod.prepare([str(corpus / "doc1.txt")], str(tmp_path / "local"), val_fraction=0.0, quiet=True)
    assert _tokens(tmp_path / "web") == _tokens(tmp_path / "local")


def test_prepare_reads_a_save_to_disk_text_dataset_given_as_a_folder(tmp_path):
    """`gptrain data prepare wikitext-raw` on what `load_dataset(...).save_to_disk` wrote: its
    .json files are metadata, not records; its own splits are kept."""
    import datasets

    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["the king rode out\n", "", "at dawn\n"] * 50}),
        "validation": datasets.Dataset.from_dict({"text": ["the queen\n"] * 20}),
    }).save_to_disk(tmp_path / "wikitext-raw")
    r = run_cli("data", "prepare", "wikitext-raw", "--out", "prepared", "--tokenizer", "char", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "prepared" / "meta.json").read_text())
    assert meta["splits"]["val"]["tokens"] == 20 * len("the queen\n")  # its own validation split
    datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]}).save_to_disk(tmp_path / "tokenized")
    r = run_cli("data", "prepare", "tokenized", "--out", "p2", "--tokenizer", "char", cwd=tmp_path)
    assert r.returncode == 2 and "already tokenized" in r.stderr and "Traceback" not in r.stderr


def test_a_sharded_split_is_read_lazily(tmp_path):
    """open_split of several shards reads only the shards a slice spans, when it is sliced: not
    all of them into memory when it is opened (a dataset of many shards would have to fit in RAM,
    and the first training step waited for the whole read)."""
    text = "".join(f"line {i} of the corpus\n" for i in range(400))
    (tmp_path / "c.txt").write_text(text)
    meta = prep_mod.prepare([str(tmp_path / "c.txt")], str(tmp_path / "out"), tokenizer="char",
                            val_fraction=0.0, shard_tokens=1000, quiet=True)
    files = meta["splits"]["train"]["files"]
    assert len(files) >= 3
    tokens = open_split(tmp_path / "out", "train")
    whole = np.concatenate([np.fromfile(tmp_path / "out" / f["name"], dtype=meta["dtype"]) for f in files])
    assert len(tokens) == len(whole) and tokens.tolist() == whole.tolist()
    for lo, hi in ((0, 10), (995, 1005), (990, 2010), (len(whole) - 3, len(whole) + 5), (7, 7)):
        assert tokens[lo:hi].tolist() == whole[lo:hi].tolist()
    assert tokens[1000] == whole[1000] and tokens[-1] == whole[-1]
    # the second shard changed in place after the open: a slice of it reads the new bytes
    second = tmp_path / "out" / files[1]["name"]
    new = np.full(files[1]["tokens"], 3, dtype=meta["dtype"])
    with open(second, "r+b") as f:
        f.write(new.tobytes())
    assert tokens[1000:1010].tolist() == [3] * 10


def test_the_prepare_summary_says_val_is_the_tail_of_train(tmp_path, isolated_home):
    (tmp_path / "one.txt").write_text("hello world\n" * 50)
    r = run_cli("data", "prepare", str(tmp_path / "one.txt"), "--out", str(tmp_path / "out"), "--tokenizer", "char")
    assert r.returncode == 0 and "val: 60 tokens, the end of the text (too few documents to hold some out)" in r.stdout  # 10%, r.stdout
