"""tests/cli_process.py, the forked `gptrain` the suite's commands run in: a process of its own
as `python -m gptrain` is, and never one whose imports saw another environment."""

import json
import os
import signal
import subprocess
import sys

from tests import cli_process
from tests.conftest import run_cli


def test_the_preload_imports_nothing_that_reads_the_environment_the_commands_change():
    code = (f"import sys\nfor m in {cli_process.PRELOAD!r}: __import__(m)\n"
            f"print([m for m in {cli_process.NOT_PRELOADED!r} if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


def test_a_forked_command_is_a_process_of_its_own(isolated_home, tmp_path, monkeypatch):
    monkeypatch.setenv("GPTRAIN_ONLY_HERE", "x")
    os.umask(0o022)
    r = run_cli("jobs", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("NAME"), r
    bad = run_cli("inspect", "nope")
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.startswith("gptrain: error: no job named"), bad
    parse = run_cli("--no-such-flag")
    assert parse.returncode == 2 and "required: COMMAND" in parse.stderr, parse  # argparse exits (SystemExit)
    # what the child did to its own environment (main() sets a umask) and directory stays there
    umask = os.umask(0o022)
    os.umask(umask)
    assert umask == 0o022 and os.environ["GPTRAIN_ONLY_HERE"] == "x" and os.getcwd() != str(tmp_path)


def test_the_environment_and_directory_given_are_the_childs(slots, tmp_path):
    """A command sees exactly the environment passed (as subprocess's env=) and runs in cwd."""
    script = tmp_path / "show.py"
    script.write_text("import json, os, sys\n"
                      "print(json.dumps({'cwd': os.getcwd(), 'mine': os.environ.get('MINE'), 'pid': os.getpid(),"
                      " 'ppid': os.getppid()}))\n")
    r = cli_process.run(["run", "show", "--", script], {**os.environ, "MINE": "1"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from tests.job_helpers import ok, wait_for

    assert wait_for("show")["state"] == "succeeded"
    shown = json.loads(ok("logs", "show").splitlines()[-1])
    assert shown["mine"] == "1" and shown["pid"] != os.getpid()  # (the job's env is the submitter's)


def test_a_signal_ends_the_child_as_it_ends_a_process(isolated_home, tmp_path, monkeypatch):
    """A command killed by a signal is reported as subprocess reports it (-N), and a timeout kills it."""
    import pytest

    monkeypatch.setattr(cli_process, "_child", _sleeper)
    with pytest.raises(subprocess.TimeoutExpired):
        cli_process.run(["jobs"], dict(os.environ), timeout=2)
    monkeypatch.setattr(cli_process, "_child", _killed)
    assert cli_process.run(["jobs"], dict(os.environ)).returncode == -signal.SIGTERM


def _sleeper(*args):
    import time

    time.sleep(60)


def _killed(*args):
    os.kill(os.getpid(), signal.SIGTERM)


def test_an_environment_read_at_import_gets_a_new_interpreter(isolated_home, monkeypatch):
    started = cli_process._context(dict(os.environ))["env"]
    assert not cli_process._reads_at_import({**started, "GPTRAIN_HOME": "/elsewhere", "HF_HUB_OFFLINE": "0",
                                             "TORCHINDUCTOR_CACHE_DIR": "/x"}, started)
    for name in ("OMP_NUM_THREADS", "PYTHONPATH", "TORCH_LOGS", "LD_PRELOAD"):
        assert cli_process._reads_at_import({**started, name: "7"}, started), name
