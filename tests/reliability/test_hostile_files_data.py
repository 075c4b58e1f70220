"""Hostile and corrupt dataset directories: meta.json may only name plain files beside it, must
have the fields gptrain reads, and its vocab_size must cover the token ids; every command that
reads one (push, inspect, train, eval) answers with one line and exit 2, writes nothing outside
the store and registers nothing."""

import hashlib
import json
import shutil

import numpy as np
import pytest

from gptrain import run_layout
from tests.conftest import run_cli
from tests.helpers import TINY, edit_meta, nothing_registered
from tests.job_helpers import refused


def _train(data, tmp_path):
    return run_cli("train", f"--data.path={data}", f"--train.output_dir={tmp_path / 'run'}",
                   "--train.batch_size=2", "--train.max_steps=2", *TINY)


@pytest.fixture
def traversal(prepared, tmp_path, request):
    """A dataset whose meta.json names a token file outside its directory (which exists, with the
    right size and sha256, so nothing but the name is wrong). Returns (dir, escaped target)."""
    src = tmp_path / "a" / "b" / "c" / "src"
    shutil.copytree(prepared, src)
    payload = b"#!/bi"[:4]  # 2 uint16 tokens
    if request.param == "relative":
        name = "../../../escaped.sh"  # from the store's hidden push directory: GPTRAIN_HOME/..
        (src / name).write_bytes(payload)
        target = tmp_path / "escaped.sh"
    else:
        name = str(tmp_path / "abs-escaped.sh")
        target = tmp_path / "abs-escaped.sh.copy"  # not created either way: the check is the name
        (tmp_path / "abs-escaped.sh").write_bytes(payload)
    entry = {"name": name, "tokens": 2, "sha256": hashlib.sha256(payload).hexdigest()}
    edit_meta(src, lambda m: m["splits"]["train"]["files"].append(entry) or
               m["splits"]["train"].update(tokens=m["splits"]["train"]["tokens"] + 2))
    return src, target


@pytest.mark.parametrize("traversal", ["relative", "absolute"], indirect=True)
def test_token_file_names_outside_the_dataset_are_refused(traversal, tmp_path):
    src, target = traversal
    pushed = run_cli("data", "push", "ds", src)
    assert not target.exists(), "push wrote outside the store"
    refused(pushed, "not a plain file name")
    nothing_registered()
    refused(run_cli("data", "inspect", src), "not a plain file name")
    refused(_train(src, tmp_path), "not a plain file name")
    assert not run_layout.checkpoints_dir(tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["..", ".", "", "a\\b", "nul\x00.bin", "sub/train.bin"])
def test_every_kind_of_non_plain_name_is_refused(prepared, name):
    from gptrain.data.formats import check_meta
    from gptrain.errors import UserError

    meta = json.loads((prepared / "meta.json").read_text())
    meta["splits"]["val"]["files"][0]["name"] = name
    with pytest.raises(UserError, match="not a plain file name"):
        check_meta(meta, "meta.json")


BROKEN = {
    "no splits": lambda m: m.pop("splits"),
    "no dtype": lambda m: m.pop("dtype"),
    "dtype float64": lambda m: m.update(dtype="float64"),
    "vocab_size a string": lambda m: m.update(vocab_size="65"),
    "files not a list": lambda m: m["splits"]["train"].update(files="train.bin"),
    "file without tokens": lambda m: m["splits"]["train"]["files"][0].pop("tokens"),
    "no tokenizer": lambda m: m.pop("tokenizer"),
    # a URL dataset's shard cache names files by their sha256: a path there reached any file
    "sha256 an absolute path": lambda m: m["splits"]["train"]["files"][0].update(sha256="//////etc/passwd"),
    "sha256 not hex": lambda m: m["splits"]["train"]["files"][0].update(sha256="../" * 21 + "a"),
    "counts past int64 when summed": lambda m: m["splits"]["train"].update(
        tokens=10 * 2**60, files=[dict(m["splits"]["train"]["files"][0], tokens=2**60)] * 10),
    "split total not its files' sum": lambda m: m["splits"]["train"].update(tokens=m["splits"]["train"]["tokens"] + 1),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_meta_json_lacking_fields_is_one_line(prepared, tmp_path, broken):
    d = tmp_path / "broken"
    shutil.copytree(prepared, d)
    edit_meta(d, BROKEN[broken])
    refused(run_cli("data", "push", "ds", d), str(d / "meta.json"))
    nothing_registered()
    refused(run_cli("data", "inspect", d), str(d / "meta.json"))


def test_meta_json_that_is_not_json_is_one_line(prepared, tmp_path):
    d = tmp_path / "garbage"
    shutil.copytree(prepared, d)
    (d / "meta.json").write_bytes(b"\xff\xfe{not json")
    for args in (("data", "push", "ds", d), ("data", "inspect", d)):
        refused(run_cli(*args), str(d / "meta.json"))
    refused(_train(d, tmp_path), str(d / "meta.json"))


@pytest.fixture
def small_vocab(prepared, tmp_path):
    """meta.json says vocab_size 5, the token files hold ids up to the char vocabulary."""
    d = tmp_path / "small-vocab"
    shutil.copytree(prepared, d)
    assert np.fromfile(d / "train.bin", dtype=np.uint16).max() >= 5
    edit_meta(d, lambda m: m.update(vocab_size=5))
    return d


def test_vocab_smaller_than_token_ids_is_refused_on_push_and_verify(small_vocab):
    refused(run_cli("data", "push", "ds", small_vocab), "vocab_size 5", str(small_vocab / "train.bin"))
    nothing_registered()
    refused(run_cli("data", "inspect", small_vocab, "--verify"), "vocab_size 5")


def test_vocab_smaller_than_token_ids_is_refused_when_training(small_vocab, tmp_path):
    r = _train(small_vocab, tmp_path)
    refused(r, "vocab_size 5", str(small_vocab))
    assert not run_layout.checkpoints_dir(tmp_path / "run").exists()


def test_a_token_file_linked_outside_the_dataset_is_refused_by_train(prepared, tmp_path):
    """meta.json names train.bin, but train.bin is a link to a file elsewhere (of the right
    size): train reads a dataset's own files only, as push does."""
    d, outside = tmp_path / "linked", tmp_path / "outside.bin"
    shutil.copytree(prepared, d)
    shutil.copy(d / "train.bin", outside)
    (d / "train.bin").unlink()
    (d / "train.bin").symlink_to(outside)
    refused(_train(d, tmp_path), "is a link to a file outside")
    assert not run_layout.checkpoints_dir(tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["absolute", "relative", "split", "link"])
def test_a_save_to_disk_folder_naming_files_outside_it_is_refused(tmp_path, where):
    """`datasets.load_from_disk` opens the data files state.json names, as given: a folder whose
    state.json (or dataset_dict.json) reaches outside it is refused by prepare, train and push."""
    import datasets

    datasets.Dataset.from_dict({"text": ["the folder's own words"]}).save_to_disk(str(tmp_path / "hf"))
    datasets.Dataset.from_dict({"text": ["SECRET OUTSIDE"]}).save_to_disk(str(tmp_path / "outside"))
    outside = tmp_path / "outside" / "data-00000-of-00001.arrow"
    state = json.loads((tmp_path / "hf" / "state.json").read_text())
    if where == "link":
        (tmp_path / "hf" / "data-00000-of-00001.arrow").unlink()
        (tmp_path / "hf" / "data-00000-of-00001.arrow").symlink_to(outside)
    elif where == "split":
        (tmp_path / "dd").mkdir()
        (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["../outside"]}))
    else:
        name = str(outside) if where == "absolute" else "../outside/data-00000-of-00001.arrow"
        state["_data_files"] = [{"filename": name}]
        (tmp_path / "hf" / "state.json").write_text(json.dumps(state))
    folder = tmp_path / ("dd" if where == "split" else "hf")
    words = "is a link to a file outside" if where == "link" else "not a plain file name"
    refused(run_cli("data", "prepare", folder, "--out", tmp_path / "prep", "--tokenizer", "char"), words)
    assert not (tmp_path / "prep").exists()
    if where != "link":  # (push refuses a link outside the folder in its own words, tested above)
        refused(run_cli("data", "push", "ds", folder), words)
        nothing_registered()


@pytest.mark.parametrize("node", ["fifo", "device"])
def test_a_folder_holding_a_pipe_or_a_device_is_refused_not_read(isolated_home, tmp_path, node):
    """A named pipe blocked `data push` forever in open(); /dev/zero's twin was hashed at 100% CPU
    forever: one line naming it, nothing registered (#47 round 3)."""
    import os
    import stat

    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n")
    if node == "fifo":
        os.mkfifo(folder / "pipe")
    else:
        try:
            os.mknod(folder / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:
            pytest.skip("mknod needs root")
    r = run_cli("data", "push", "mixed", folder, timeout=120)
    refused(r, "is not a plain file")
    nothing_registered()


def test_a_process_count_past_any_machine_is_one_line(isolated_home, tmp_path):
    (tmp_path / "a.txt").write_text("some text\n")
    r = run_cli("data", "prepare", tmp_path / "a.txt", "--out", tmp_path / "out", "--num-proc", "100000")
    refused(r, "--num-proc must be 1 to 256")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out*"))
