"""A `data push` or `run --code` killed with SIGKILL half-way leaves its hidden working folder
(`.NAME.push-PID`, `.NAME.code-PID`); the next gptrain command removes it (real processes)."""

import os
import signal
import subprocess
import sys
import time

from tests.conftest import run_cli


def kill_when_it_appears(args, folder, prefix, timeout=120):
    """Start `gptrain ARGS`, SIGKILL it as soon as `folder/prefix*` exists; that folder."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "gptrain", *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            found = [e for e in os.listdir(folder) if e.startswith(prefix)]
            if found:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return folder / found[0]
            assert proc.poll() is None, "the command ended before it could be killed"
            time.sleep(0.001)
        raise AssertionError(f"no {prefix}* after {timeout}s")
    finally:
        proc.kill()
        proc.wait()


def many_files(root, count, size):
    root.mkdir()
    for i in range(count):
        (root / f"f{i:05d}.bin").write_bytes(os.urandom(size))
    return root


def test_a_killed_push_leaves_nothing_after_the_next_command(isolated_home, tmp_path):
    src = many_files(tmp_path / "big", 48, 1 << 20)
    left = kill_when_it_appears(["data", "push", "big", src], isolated_home / "datasets", ".big.push-")
    assert left.is_dir()
    r = run_cli("data", "list")
    assert r.returncode == 0, r.stderr
    assert not left.exists() and os.listdir(isolated_home / "datasets") == []
    assert run_cli("data", "push", "big", src).returncode == 0  # and the name is free


def test_a_killed_run_leaves_nothing_after_the_next_command(isolated_home, tmp_path):
    code = many_files(tmp_path / "code", 3000, 1024)
    (code / "train.py").write_text("print('hi')\n")
    left = kill_when_it_appears(["run", "killed", "--code", code, "--", "train.py"],
                                isolated_home / "jobs", ".killed.code-")
    assert left.is_dir()
    r = run_cli("jobs")
    assert r.returncode == 0, r.stderr
    assert not left.exists() and os.listdir(isolated_home / "jobs") == []


def test_a_live_commands_folder_is_left_alone(isolated_home):
    """Only a dead PID's folder goes: a folder of a command still running stays."""
    live = isolated_home / "datasets" / f".busy.push-{os.getpid()}"
    live.mkdir(parents=True)
    assert run_cli("data", "list").returncode == 0
    assert live.is_dir()
