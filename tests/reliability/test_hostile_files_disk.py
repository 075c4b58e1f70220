"""A full disk while preparing, pushing or training: one line naming the path and saying the disk
is full, exit 2, and nothing half-written that looks complete (no output directory, no registered
dataset, no checkpoint, no leftover temporary directory).

Uses a real 2 MiB tmpfs (mounting needs root; skipped otherwise), filled to a few KiB free."""

import os
import subprocess
import sys

import pytest

from gptrain import run_layout
from tests.conftest import run_cli
from tests.helpers import TINY, env, step_dir, write_corpus

FULL_LINE = "gptrain: error: no space left on device writing "


def _fill(disk, free_bytes: int) -> None:
    """Leave `free_bytes` free on the disk."""
    st = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize - free_bytes))


def _full(r, path):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(FULL_LINE + str(path)), r.stderr[-3000:]
    assert "free space on that disk and retry" in lines[0]


def test_prepare_on_a_full_disk(small_disk, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", n_chars=200_000)  # 400 KB of uint16 tokens
    _fill(small_disk, 64 * 1024)
    out = small_disk / "data"
    _full(run_cli("data", "prepare", corpus, "--out", out, "--tokenizer", "char"), out)
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # no output, no temp dir


def test_push_on_a_full_disk(small_disk, prepared, monkeypatch):
    from gptrain.data.store import list_all

    home = small_disk / "home"
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    assert run_cli("data", "list").returncode == 0  # the store exists; the copy will not fit
    _fill(small_disk, 32 * 1024)
    _full(run_cli("data", "push", "wiki", prepared), home / "datasets" / "wiki")
    assert list_all() == []
    assert not (home / "datasets").exists() or list((home / "datasets").iterdir()) == []


def _train_args(data, out, *extra):
    return [f"--data.path={data}", f"--train.output_dir={out}", "--train.batch_size=2",
            "--train.max_steps=2", "--train.do_eval=false", "--train.precision=fp32", *TINY, *extra]


def _no_checkpoint(out):
    from gptrain.weights.layout import find_latest

    root = run_layout.checkpoints_dir(out)
    assert find_latest(out) is None
    assert not root.exists() or sorted(p.name for p in root.iterdir()) == []  # no .tmp-step-N left


def test_checkpoint_on_a_full_disk(small_disk, prepared):
    """The model and optimizer (~300 KB) do not fit; config.toml and metrics.jsonl do."""
    _fill(small_disk, 64 * 1024)
    out = small_disk / "run"
    r = run_cli("train", *_train_args(prepared, out))
    _full(r, step_dir(out, 2))
    _no_checkpoint(out)


def test_tensorboard_on_a_full_disk(small_disk, prepared):
    """TensorBoard (the default sink) writes from a thread of its own: when it meets the full
    disk, no thread traceback runs into the one line (found by a new-user trial)."""
    _fill(small_disk, 4096)
    out = small_disk / "run"
    _full(run_cli("train", *_train_args(prepared, out, "--report_to=tensorboard")), out)
    _no_checkpoint(out)


def test_training_output_on_a_full_disk(small_disk, prepared):
    """Not even config.toml fits: the line names the output directory."""
    out = small_disk / "run"
    out.mkdir()
    _fill(small_disk, 0)
    _full(run_cli("train", *_train_args(prepared, out)), out)
    _no_checkpoint(out)


@pytest.mark.slow
def test_checkpoint_on_a_full_disk_under_torchrun(small_disk, prepared):
    """Every rank ends with the one line and exit 2 (torchrun itself then exits non-zero)."""
    _fill(small_disk, 64 * 1024)
    out = small_disk / "run"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        "-m", "gptrain", "train", *_train_args(prepared, out, "--parallel.dp_shard=2")],
                       capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("gptrain: error:")]
    assert lines and all(line.startswith(FULL_LINE + str(step_dir(out, 2)))
                         for line in lines), r.stderr[-3000:]
    assert "exitcode  : 2" in r.stderr  # the rank that failed first, in torchrun's report
    _no_checkpoint(out)


def test_an_unwritable_output_dir_under_torchrun(tmp_path, prepared):
    """Rank 0 cannot make the output directory: every rank that reports says so in the same
    one line (no broken-connection traceback from the others), and torchrun reports exit 2."""
    (tmp_path / "a-file").write_text("not a directory\n")
    out = tmp_path / "a-file" / "out"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        "-m", "gptrain", "train", *_train_args(prepared, out)],
                       capture_output=True, text=True, env=env(), timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.startswith("gptrain: error:")]
    assert lines and all(line.startswith(f"gptrain: error: cannot write the output directory {out} (")
                         for line in lines), r.stderr[-3000:]
    assert "exitcode  : 2" in r.stderr and "Connection closed" not in r.stderr, r.stderr[-3000:]


def test_the_background_full_disk_hook_is_installed_once(isolated_home):
    """Commands run in one process (tests, a notebook) install the thread hook once, not a
    chain of hooks each wrapping the one before."""
    import threading

    from gptrain.cli import main

    main(["jobs"])
    hook = threading.excepthook
    main(["jobs"])
    assert threading.excepthook is hook and getattr(hook, "quiet_full_disk", False)
