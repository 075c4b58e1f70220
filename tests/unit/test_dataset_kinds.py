"""`data push` of any dataset folder: prepared, HF save_to_disk (kept as is) or any files."""

import io
import json
import pickle

import pytest

from tests.conftest import run_cli
from tests.helpers import make_dataset, save_as_hf_blocks


def ok(*args):
    r = run_cli(*args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def one_line_error(r, needle):
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr


def test_save_to_disk_and_plain_files_are_pushed_as_they_are(tmp_path, isolated_home):
    prepared = make_dataset(tmp_path)
    saved = save_as_hf_blocks(prepared, tmp_path / "tokenized")
    files = tmp_path / "files"
    (files / "sub").mkdir(parents=True)
    (files / "a.csv").write_text("x,y\n1,2\n")
    (files / "sub" / "b.txt").write_text("hello")
    assert "(save_to_disk," in ok("data", "push", "saved", saved, "--tokenizer", "gpt2")
    assert "(files," in ok("data", "push", "raw", files)
    assert "(prepared," in ok("data", "push", "prep", prepared)
    listing = {line.split()[0]: line.split()[1] for line in ok("data", "list").splitlines()[1:]}
    assert listing == {"prep": "prepared", "raw": "files", "saved": "save_to_disk"}
    stored = isolated_home / "datasets"
    import datasets

    back = datasets.load_from_disk(str(stored / "saved"))  # what a script gets at GPTRAIN_DATASET_DIR
    assert back["train"]["input_ids"][0] == datasets.load_from_disk(str(saved))["train"]["input_ids"][0]
    assert (stored / "raw" / "sub" / "b.txt").read_text() == "hello"
    assert (stored / "prep" / "meta.pkl").read_bytes() == (prepared / "meta.pkl").read_bytes()  # nanoGPT's
    info = json.loads(ok("data", "inspect", "raw", "--verify", "--json"))
    assert info["kind"] == "files" and sorted(f["name"] for f in info["files"]) == ["a.csv", "sub/b.txt"]
    assert "kind save_to_disk" in ok("data", "inspect", "saved")
    (stored / "raw" / "a.csv").write_text("x,y\n1,3\n")  # same size, other bytes
    one_line_error(run_cli("data", "inspect", "raw", "--verify"), "sha256")
    assert not [p for p in stored.iterdir() if p.name.startswith(".")]


def test_the_trainer_reads_a_pushed_save_to_disk_dataset(tmp_path, isolated_home):
    from gptrain.train.model_init import resolve_data

    saved = save_as_hf_blocks(make_dataset(tmp_path, tokenizer="gpt2"), tmp_path / "tokenized")
    ok("data", "push", "saved", saved, "--tokenizer", "gpt2")
    first = resolve_data("saved")
    assert (first / "meta.json").is_file() and resolve_data("saved") == first  # imported once, cached


def test_the_trainer_prepares_a_pushed_folder_of_text_once(tmp_path, isolated_home):
    from gptrain.train.model_init import resolve_data
    from tests.helpers import write_corpus

    (tmp_path / "texts").mkdir()
    text = write_corpus(tmp_path / "texts" / "a.txt", n_chars=5000).read_text()
    ok("data", "push", "texts", tmp_path / "texts")
    first = resolve_data("texts", tokenizer="char")
    meta = json.loads((first / "meta.json").read_text())
    assert set(meta["tokenizer"]["chars"]) == set(text)  # the text only: not the manifest's JSON
    assert sum(s["tokens"] for s in meta["splits"].values()) == len(text)
    assert resolve_data("texts", tokenizer="char") == first  # cached


def test_char_data_has_nanogpts_meta_pkl_as_plain_data(tmp_path):
    out = make_dataset(tmp_path, tokenizer="char")
    chars = json.loads((out / "meta.json").read_text())["tokenizer"]["chars"]

    class NoClasses(pickle.Unpickler):  # plain data needs no class: any global is refused
        def find_class(self, module, name):
            raise AssertionError(f"meta.pkl references {module}.{name}")

    meta = NoClasses(io.BytesIO((out / "meta.pkl").read_bytes())).load()
    assert meta == {"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                    "stoi": {c: i for i, c in enumerate(chars)}}
    assert not (make_dataset(tmp_path, tokenizer="gpt2") / "meta.pkl").exists()


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd"])
def test_a_tampered_manifest_cannot_name_files_outside(tmp_path, isolated_home, name):
    files = tmp_path / "files"
    files.mkdir()
    (files / "a.txt").write_text("a")
    ok("data", "push", "raw", files)
    manifest = isolated_home / "datasets" / "raw" / ".gptrain-manifest.json"
    manifest.write_text(json.dumps({"kind": "files", "files": [{"name": name, "bytes": 1, "sha256": "0"}]}))
    one_line_error(run_cli("data", "inspect", "raw"), "corrupt")
