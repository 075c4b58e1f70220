"""A full disk under GPTRAIN_HOME (a real, small tmpfs): the job whose worker hits ENOSPC ends
failed with a reason naming the disk, without wasting restarts, and `jobs`, `inspect` and
`logs` still answer with the truth while the disk stays full."""

import json
import os
import subprocess
import time

import pytest

from tests.conftest import run_cli
from tests.helpers import tmpfs
from tests.job_helpers import identity_of, ok, record_job, wait_for
FILL = ("import os, pathlib\n"
        "with open(pathlib.Path(os.environ['GPTRAIN_CHECKPOINT_DIR']) / 'huge.bin', 'wb') as f:\n"
        "    while True:\n"
        "        f.write(b'x' * 65536)\n"
        "        f.flush()\n")


@pytest.fixture
def small_home(tmp_path, monkeypatch):
    with tmpfs(tmp_path / "small-home", "48m") as home:
        monkeypatch.setenv("GPTRAIN_HOME", str(home))
        monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "2")
        yield home


def fill(path):
    """Use up every byte left on the file system holding `path`."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except OSError:
        return  # not even room for a new file
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_enospc_fails_the_job_once_and_reads_still_tell_the_truth(small_home, tmp_path):
    script = tmp_path / "fill_disk.py"
    script.write_text(FILL)
    ok("run", "filler", "--max-restarts", "2", "--", script)
    j = wait_for("filler", timeout=300)
    assert j["state"] == "failed" and j["restarts"] == 0, j  # no restart wasted on a full disk
    assert "no space left on device" in j["error"] and str(small_home) in j["error"], j["error"]
    assert "gptrain resume filler" in j["error"]

    # a job whose supervisor died, found while the disk is full: shown failed, not "running"
    gone = subprocess.Popen(["sleep", "60"])
    ident = identity_of(gone.pid)
    gone.kill()
    gone.wait()
    record_job("ghost", script, "running", ident)
    fill(small_home / "more")
    time.sleep(0.2)

    r = run_cli("jobs", "--json")
    assert r.returncode == 0, r.stderr
    states = {j["name"]: j for j in json.loads(r.stdout)}
    assert states["filler"]["state"] == "failed" and states["ghost"]["state"] == "failed", states
    assert "its supervisor died" in states["ghost"]["error"]
    r = run_cli("jobs")
    assert r.returncode == 0 and "filler" in r.stdout, r.stderr
    r = run_cli("inspect", "filler")
    assert r.returncode == 0 and "no space left on device" in r.stdout, r.stderr
    r = run_cli("logs", "filler")
    assert r.returncode == 0 and "--- gptrain: attempt 0" in r.stdout, r.stderr
    r = run_cli("inspect", "ghost")
    assert r.returncode == 0 and "state      failed" in r.stdout, (r.stdout, r.stderr)
