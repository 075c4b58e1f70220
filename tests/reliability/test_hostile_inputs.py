"""Hostile input from elsewhere that reaches a tokenizer or the dataset store (issue #22): a
tokenizer folder that ships its own Python code, a malformed tokenizer spec, links in a pushed
folder. Each is one line, exit 2, nothing run, stored or written; readers of what is already on
disk answer for the rest. Real CLI processes (and a real console for its datasets API)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import run_cli
from tests.helpers import edit_meta, nothing_registered, write_corpus
from tests.job_helpers import refused


# ---- 1. a tokenizer folder with its own code: never run, never asked about ---------------------

def code_tokenizer(tmp_path):
    """A tokenizer folder whose config maps AutoTokenizer onto its own evil.py (which writes a
    marker when imported). Returns (folder, marker)."""
    folder, marker = tmp_path / "evil-tokenizer", tmp_path / "MARKER"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}))
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
                                    "from transformers import PreTrainedTokenizer\n"
                                    "class EvilTokenizer(PreTrainedTokenizer):\n    pass\n")
    return folder, marker


def cli_answering_yes(*args, timeout=300):
    """The CLI with 'y' on stdin, then end of input: a [y/N] prompt would be answered yes, and a
    second one could not hang (stdin is closed after it)."""
    return subprocess.run([sys.executable, "-m", "gptrain", *map(str, args)], input="y\n",
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("where", ["--tokenizer", "meta.json", "gptrain_tokenizer.json"])
def test_a_tokenizer_folder_with_its_own_code_never_runs_it(where, prepared, tiny_hf_gpt2, tmp_path):
    folder, marker = code_tokenizer(tmp_path)
    if where == "--tokenizer":
        r = cli_answering_yes("data", "prepare", write_corpus(tmp_path / "c.txt", 2000),
                              "--out", tmp_path / "out", "--tokenizer", folder)
        assert not (tmp_path / "out").exists()
    elif where == "meta.json":
        data = shutil.copytree(prepared, tmp_path / "data")
        edit_meta(data, lambda m: m.update(tokenizer={"name": "hf", "path": str(folder)}))
        r = cli_answering_yes("data", "inspect", data)
    else:
        model = shutil.copytree(tiny_hf_gpt2, tmp_path / "model")
        (model / "gptrain_tokenizer.json").write_text(json.dumps({"name": "hf", "path": str(folder)}))
        r = cli_answering_yes("generate", model, "--prompt", "hi", "--max-new-tokens", "2")
    assert "custom code" not in r.stdout + r.stderr, "transformers asked to run the folder's code"
    assert not marker.exists(), "the tokenizer folder's code ran"
    refused(r, "needs its own Python code", "never runs")


# ---- 2. a malformed tokenizer spec: refused at push, tolerated by readers ---------------------

BAD_SPECS = [{"name": "char", "chars": 12345}, {"name": "char", "chars": ""}, {"name": "char"},
             {"name": "hf", "path": ["x"]}, {"name": "nope"}, {"chars": "abc"}]


@pytest.mark.parametrize("spec", BAD_SPECS, ids=[json.dumps(s) for s in BAD_SPECS])
def test_a_malformed_tokenizer_spec_is_refused_at_push(spec, prepared, tmp_path):
    data = shutil.copytree(prepared, tmp_path / "data")
    edit_meta(data, lambda m: m.update(tokenizer=spec))
    refused(run_cli("data", "push", "bad", data), "meta.json's tokenizer")
    nothing_registered()


def test_a_malformed_tokenizer_spec_already_stored_is_one_line_and_one_row(prepared, isolated_home):
    from tests.browser.conftest import Console

    for name in ("bad", "good"):
        assert run_cli("data", "push", name, prepared).returncode == 0
    edit_meta(isolated_home / "datasets" / "bad", lambda m: m.update(tokenizer={"name": "char", "chars": 12345}))
    refused(run_cli("data", "inspect", "bad"), "meta.json's tokenizer", "chars")
    refused(run_cli("data", "inspect", "bad", "--verify"), "meta.json's tokenizer")
    console = Console()
    try:
        with console.open("/api/datasets", timeout=60) as resp:
            assert resp.status == 200
            rows = {d["name"]: d for d in json.load(resp)}
    finally:
        console.close()
    assert "meta.json's tokenizer" in rows["bad"]["sample"], rows["bad"]
    assert rows["good"]["sample"] and "no sample" not in rows["good"]["sample"], rows["good"]


# ---- 3. links in a pushed folder: inside kept as links, outside refused -----------------------

def tree(root, files: dict):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def outside(tmp_path):
    return tree(tmp_path / "outside", {"id_rsa": "PRIVATE KEY", "deep/more.txt": "more private"})


def files_folder(tmp_path):
    return tree(tmp_path / "files", {"a.txt": "a", "sub/b.txt": "b"})


@pytest.mark.parametrize("link", ["file", "folder", "absolute-chain", "dangling"])
def test_a_link_out_of_a_pushed_folder_is_refused(link, outside, prepared, tmp_path, isolated_home):
    d = files_folder(tmp_path)
    name = {"file": "key", "folder": "sub/stash", "absolute-chain": "hop", "dangling": "gone"}[link]
    if link == "file":
        os.symlink(outside / "id_rsa", d / name)
    elif link == "folder":
        os.symlink(outside, d / name)
    elif link == "absolute-chain":  # inside, to a link that leads out
        os.symlink(outside / "deep", d / "sub" / "out")
        os.symlink(d / "sub" / "out", d / name)
    else:
        os.symlink(tmp_path / "nothing-here", d / name)
    refused(run_cli("data", "push", "ds", d), name, "links in a pushed folder may only point inside it")
    nothing_registered()
    assert not any("PRIVATE" in p.read_text() for p in isolated_home.rglob("*") if p.is_file()
                   and not p.is_symlink() and p.suffix != ".db")
    prep = shutil.copytree(prepared, tmp_path / "prep")  # a prepared dataset the same
    os.symlink(outside / "id_rsa", prep / "notes.txt")
    refused(run_cli("data", "push", "prep", prep), "notes.txt", "outside")
    nothing_registered()


def test_links_inside_a_pushed_folder_stay_links_and_every_file_is_verified(tmp_path, isolated_home):
    d = files_folder(tmp_path)
    os.symlink("sub/b.txt", d / "rel-link")
    os.symlink(d / "sub", d / "abs-folder-link")  # absolute, but inside: kept, pointing in the store
    r = run_cli("data", "push", "ds", d)
    assert r.returncode == 0, r.stderr
    stored = isolated_home / "datasets" / "ds"
    assert (stored / "rel-link").is_symlink() and (stored / "abs-folder-link").is_symlink()
    assert (stored / "abs-folder-link").resolve() == (stored / "sub").resolve()
    listed = json.loads(run_cli("data", "inspect", "ds", "--verify", "--json").stdout)
    assert sorted(f["name"] for f in listed["files"]) == ["a.txt", "sub/b.txt"]
    (stored / "sub" / "smuggled.txt").write_text("added later")  # verify checks every file
    refused(run_cli("data", "inspect", "ds", "--verify"), "smuggled.txt", "not in its manifest")
    (stored / "sub" / "smuggled.txt").unlink()
    (stored / "rel-link").unlink()
    os.symlink("/etc/passwd", stored / "rel-link")
    refused(run_cli("data", "inspect", "ds", "--verify"), "rel-link", "points elsewhere")
