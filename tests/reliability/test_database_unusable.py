"""A gptrain.db that cannot be used where it is: every command says so in one line (what is wrong,
what to do), exit 2, no traceback (#47 round 3: an OperationalError traceback, exit 1, for a
read-only home, a folder or a link to /dev/null in its place)."""

import subprocess

import pytest

from tests.conftest import run_cli

COMMANDS = [("jobs",), ("data", "list"), ("inspect", "x"), ("checkpoints", "x")]


def one_line(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert all(w in lines[0] for w in words), lines[0]


@pytest.mark.parametrize("args", COMMANDS)
def test_a_folder_or_a_link_to_dev_null_in_its_place_is_one_line(isolated_home, args):
    isolated_home.mkdir(parents=True, exist_ok=True)
    db = isolated_home / "gptrain.db"
    db.mkdir()
    one_line(run_cli(*args), "cannot open", "is it a folder")
    db.rmdir()
    db.symlink_to("/dev/null")
    one_line(run_cli(*args), "keeps no tables", "move it aside")


def test_a_read_only_home_is_one_line(isolated_home, tmp_path):
    assert run_cli("jobs").returncode == 0  # the database made
    view = tmp_path / "read-only"
    view.mkdir()
    made = subprocess.run(["mount", "--bind", str(isolated_home), str(view)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({made.stderr.decode().strip()}): not root")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        for args in COMMANDS:
            one_line(run_cli(*args, env={"GPTRAIN_HOME": str(view)}), "cannot", "writ")
    finally:
        subprocess.run(["umount", str(view)], capture_output=True)
