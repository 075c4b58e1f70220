"""The user's own code as a job, end to end: programs in every style run from a --code
snapshot and from a git repository, with 2 real processes (torchrun, gloo), detached
supervisors and SQLite (issue 14)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.job_helpers import job, job_dir, ok, rank_log, rank_log_path, succeeded, wait_for
from tests.jobs_code.programs import git_repository, head, project, tiny_wheel

pytestmark = pytest.mark.slow


def test_nanogpt_style_script_runs_in_its_code_snapshot(slots, tmp_path):
    """exec(open('configurator.py')), a relative config/tiny.py and `$GPTRAIN_OUTPUT_DIR` in the
    arguments: the script runs in the snapshot of --code (ignored files left out) with 2 ranks."""
    code = project(tmp_path / "nano")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_cli("run", "nano", "--accels", "2", "--code", code, "--", "train.py", "config/tiny.py",
                "--out_dir=$GPTRAIN_OUTPUT_DIR/run", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    succeeded("nano")
    snap = job_dir("nano") / "code"
    assert (snap / "configurator.py").is_file() and (snap / "config/tiny.py").is_file()
    assert not (snap / "data").exists() and not (snap / "weights.bin").exists()  # .gitignore honoured
    out = job_dir("nano") / "output" / "run"
    text = rank_log("nano")
    assert f"saved {out}/ckpt.pt iters 7 sum 3.0 cwd {snap}" in text, text
    import torch

    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 7
    spec = json.loads(ok("inspect", "nano", "--json"))["spec"]
    assert spec["entry"] == "script" and spec["script"] == "train.py" and spec["code"] == str(code)
    assert spec["args"] == ["config/tiny.py", "--out_dir=$GPTRAIN_OUTPUT_DIR/run"]  # recorded as typed


def test_relative_script_snapshots_the_submit_directory(slots, tmp_path):
    code = git_repository(project(tmp_path / "repo"))  # a git work tree: git's own view of it
    (code / "untracked.py").write_text("X = 1\n")
    ok_ = run_cli("run", "here", "--", "train.py", "--max_iters=2", "--out_dir=$GPTRAIN_OUTPUT_DIR", cwd=code)
    assert ok_.returncode == 0, ok_.stderr
    succeeded("here")
    snap = job_dir("here") / "code"
    assert (snap / "untracked.py").is_file() and not (snap / ".git").exists()
    assert not (snap / "weights.bin").exists()
    assert "iters 2" in rank_log("here")


def test_kill_9_of_a_worker_restarts_from_the_latest_checkpoint(slots, tmp_path):
    """An HF Trainer-style script from a git repository URL (at a tag): rank 1 is killed with
    SIGKILL; the restart gets GPTRAIN_RESUME_FROM, continues the step, and no earlier
    checkpoint is written again."""
    repo = git_repository(project(tmp_path / "repo"))
    ok("run", "hf", "--accels", "2", "--max-restarts", "1", "--repository-url", f"file://{repo}",
       "--ref", "v1", "--", "hf_train.py", "--output_dir=$GPTRAIN_OUTPUT_DIR", "--max_steps=8", "--hold_at=3")
    out = job_dir("hf") / "output"
    deadline = time.time() + 300  # a hang guard: the first attempt holds at step 3 until killed
    while not (out / "held-1").is_file() or not (out / "pid-1-0").is_file():
        assert time.time() < deadline and job("hf")["state"] not in ("succeeded", "failed"), job("hf")
        time.sleep(0.2)
    os.kill(int((out / "pid-1-0").read_text()), signal.SIGKILL)
    j = succeeded("hf")
    assert j["restarts"] == 1
    text = rank_log("hf")
    assert "attempt 0 resume_from None start 0" in text
    resumed = [line for line in text.splitlines() if line.startswith("attempt 1 resume_from")][0]
    start = int(resumed.rsplit(" ", 1)[1])
    assert start >= 3 and resumed == f"attempt 1 resume_from {out}/checkpoint-{start} start {start}", text
    assert "done at step 8 w 16.0" in text  # 2 ranks x 8 steps: every step counted once
    written = {int(p.name.split("-")[1]): (p / "attempt").read_text() for p in out.glob("checkpoint-*")}
    assert sorted(written) == list(range(1, 9))
    assert all(written[s] == "0" for s in range(1, start + 1)) and written[8] == "1"
    spec = json.loads(ok("inspect", "hf", "--json"))["spec"]
    assert spec["commit"] == head(repo) and spec["ref"] == "v1" and spec["repository_url"] == f"file://{repo}"


def test_resume_of_a_failed_script_job_gets_its_latest_checkpoint(slots, tmp_path):
    """`gptrain resume` of a failed script job: GPTRAIN_RESUME_FROM names the checkpoint the
    failed run wrote last, and the resume event says so."""
    code = project(tmp_path / "proj")
    r = run_cli("run", "again", "--accels", "2", "--", "hf_train.py", "--output_dir=$GPTRAIN_OUTPUT_DIR",
                "--max_steps=4", "--fail_at=2", cwd=code)
    assert r.returncode == 0, r.stderr
    assert wait_for("again")["state"] == "failed"
    ok("resume", "again")
    succeeded("again")
    out = job_dir("again") / "output"
    assert f"attempt 0 resume_from {out}/checkpoint-2 start 2" in rank_log("again")
    assert "done at step 4 w 8.0" in rank_log("again")
    from gptrain.jobs import store

    assert any(e["message"] == "restarted from scratch: the program was given no resume arguments (see "
               f"--resume-args) (unless it reads GPTRAIN_RESUME_FROM, {out}/checkpoint-2)"
               for e in store.events("again")), store.events("again")


def test_shell_script_module_and_hosted_words(slots, tmp_path):
    """A .sh (bash, once per node, with the rendezvous variables: it starts its own torchrun of
    a -m module; it was run with python before) and a -m module under our torchrun, submitted
    and read with the hosted CLI's words."""
    code = project(tmp_path / "proj")
    r = run_cli("run", "sh", "--accels", "2", "--env", f"PYTHON={sys.executable}", "--",
                "run.sh", "$GPTRAIN_OUTPUT_DIR", cwd=code)
    assert r.returncode == 0, r.stderr
    succeeded("sh")
    text = rank_log("sh")
    assert "node 0 of 1, 2 per node, world 2, master 127.0.0.1:" in text and \
        f"out {job_dir('sh')}/output" in text, text
    assert text.count("module __main__ world 2 relative-import-ok") == 2, text
    assert json.loads(ok("training", "inspect", "sh", "--json"))["spec"]["command"] == "bash"

    r = run_cli("training", "run", "mod", "--accels", "2", "--", "-m", "pkg.train", cwd=code)
    assert r.returncode == 0, r.stderr
    succeeded("mod")
    for rank in (0, 1):
        assert "module __main__ world 2 relative-import-ok node 0" in rank_log("mod", rank), rank_log("mod", rank)
    assert "relative-import-ok" in ok("training", "logs", "mod", "--rank", "1")
    assert json.loads(ok("inspect", "mod", "--json"))["spec"]["module"] == "pkg.train"
    ok("training", "checkpoints", "mod")
    ok("training", "fetch", "mod", "--destination", tmp_path)
    assert (tmp_path / "mod.zip").is_file()


def test_hosted_words_take_the_same_arguments(isolated_home, tmp_path):
    from tests.helpers import make_dataset

    ok("dataset", "push", "wiki", "--file", make_dataset(tmp_path))
    assert "wiki" in ok("data", "list")
    for word in ("run", "inspect", "logs", "checkpoints", "fetch"):
        ours, alias = (" ".join(ok(*w, "--help").split()) for w in ([word], ["training", word]))
        assert alias.replace("gptrain training " + word, "gptrain " + word) == ours
    r = run_cli("training", "run", "x", "--source-name", "nope", "--", "-m", "pkg")
    assert r.returncode == 2 and "no source named 'nope'" in r.stderr


def test_executable_file_runs_as_itself(slots, tmp_path):
    """Any executable file (not .py, not .sh) runs as itself, once per node: it was run with
    python before (a bash script failed with a SyntaxError)."""
    code = tmp_path / "proj"
    code.mkdir()
    tool = code / "launch"
    tool.write_text('#!/bin/bash\necho "tool node=$NODE_RANK nnodes=$NNODES world=$WORLD_SIZE cwd=$(pwd)"\n')
    tool.chmod(0o755)
    r = run_cli("run", "tool", "--nodes", "2", "--", "launch", cwd=code)
    assert r.returncode == 0, r.stderr
    succeeded("tool")
    for node in (0, 1):  # once per node, each with its own NODE_RANK, in its node's first rank's log
        assert f"tool node={node} nnodes=2 world=2 cwd={job_dir('tool')}/code" in rank_log("tool", node)


def test_stop_reaches_a_command(slots, tmp_path):
    """`gptrain stop` sends SIGTERM to a command entrypoint itself (it has no torchrun agent
    in front of it): it can save and exit, and the job ends stopped."""
    code = tmp_path / "proj"
    code.mkdir()
    (code / "loop.sh").write_text("trap 'echo got-term; exit 0' TERM\necho started\n"
                                  "while true; do sleep 0.2; done\n")
    assert run_cli("run", "loop", "--", "loop.sh", cwd=code).returncode == 0
    deadline = time.time() + 180
    while not rank_log_path("loop").is_file() or "started" not in rank_log("loop"):
        assert time.time() < deadline, job("loop")
        time.sleep(0.2)
    ok("stop", "loop", "--timeout", "120", "--wait")
    assert job("loop")["state"] == "stopped" and "got-term" in rank_log("loop"), (job("loop"), rank_log("loop"))


def test_requirements_install_into_a_layered_virtualenv(slots, tmp_path):
    """--requirements: a local wheel installed into a per-job virtualenv that still sees
    gptrain's packages (torch); a second job with the same file reuses it."""
    wheel = tiny_wheel(tmp_path)
    req = tmp_path / "requirements.txt"
    req.write_text(f"{wheel}\n")
    script = tmp_path / "uses.py"
    script.write_text("import sys, torch, tinypkg\nprint('tinypkg', tinypkg.VALUE, 'python', sys.executable)\n")
    for name in ("req1", "req2"):
        ok("run", name, "--requirements", req, "--", script)
        succeeded(name)
    from gptrain.home import home

    venvs = list((home() / "venvs").iterdir())
    assert [v.name for v in venvs if not v.name.startswith(".")].__len__() == 1, venvs
    venv = next(v for v in venvs if not v.name.startswith("."))
    for name in ("req1", "req2"):
        assert f"tinypkg 42 python {venv}/bin/python" in rank_log(name)
    import subprocess

    r = subprocess.run([sys.executable, "-c", "import tinypkg"], capture_output=True)
    assert r.returncode != 0  # installed for the job only


def test_accelerate_launch_command(slots, tmp_path):
    """`-- accelerate launch ...`: a command on PATH, once per node; accelerate starts the
    --accels processes itself, in the job's code snapshot (before: run with python, and failed)."""
    import shutil

    prog = shutil.which("accelerate") or str(Path(sys.executable).parent / "accelerate")
    if not Path(prog).is_file():
        pytest.skip("accelerate is not installed")
    code = tmp_path / "acc"
    code.mkdir()
    (code / "t.py").write_text("import os\nfrom accelerate import Accelerator\na = Accelerator(cpu=True)\n"
                               "os.write(1, f'acc rank {a.process_index} of {a.num_processes} cwd {os.getcwd()}\\n'.encode())\n")
    r = run_cli("run", "acc", "--accels", "2", "--", prog, "launch", "--multi_gpu", "--num_processes",
                "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "t.py", cwd=code)
    assert r.returncode == 0, r.stderr
    succeeded("acc")
    for rank in (0, 1):
        assert f"acc rank {rank} of 2 cwd {job_dir('acc')}/code" in rank_log("acc")
