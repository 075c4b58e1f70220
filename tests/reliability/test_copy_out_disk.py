"""Copying a job's files out onto a full disk (a real 2 MiB tmpfs; mounting needs root, skipped
with the reason otherwise): one line, exit 2, and nothing left on that disk. Before,
`checkpoint fetch` traced back (copytree gathers each file's ENOSPC into one shutil.Error) and
left a hidden half-copied directory with zero-byte files; `fetch` left its `.zip.part`."""

import json
import os

import pytest

from tests.browser.recorded_jobs import record_job
from tests.conftest import run_cli
from tests.helpers import tmpfs


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def _job_with_a_big_checkpoint():
    d = record_job("big")
    ck = d / "output" / "checkpoint-12"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 12}))
    (ck / "model.safetensors").write_bytes(os.urandom(3 * 2 ** 20))  # more than the disk holds
    (ck / "optimizer.pt").write_bytes(os.urandom(2 ** 20))
    r = run_cli("checkpoints", "big", "--json")
    assert r.returncode == 0, r.stderr
    return next(c["id"] for c in json.loads(r.stdout) if c["name"] == "output/checkpoint-12")


def _everything_on(disk):
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*"))


@pytest.mark.parametrize("command", ["checkpoint fetch", "fetch"])
def test_copying_out_onto_a_full_disk_is_one_line_and_leaves_nothing(isolated_home, small_disk, command):
    ckpt = _job_with_a_big_checkpoint()
    args = (["checkpoint", "fetch", ckpt, "--destination", small_disk / "got"] if command == "checkpoint fetch"
            else ["fetch", "big", "--destination", small_disk])
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("gptrain: error: no space left on device"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _everything_on(small_disk) == []
