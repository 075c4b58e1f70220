"""The user's own code on the real test Slurm cluster: a --code snapshot is where every node's
workers start (2 nodes x 1 process), and a shell script runs once per node with the
rendezvous variables (issue 14)."""

import sys

import pytest

from tests.jobs_code.programs import project
from tests.job_helpers import job_dir, logs_tail, ok, rank_log_path, requeue_when_written, states_until_done
pytestmark = pytest.mark.slow


def test_code_snapshot_script_on_two_nodes(slurm, tmp_path, monkeypatch):
    code = project(tmp_path / "nano")
    monkeypatch.chdir(tmp_path)
    ok("run", "scode", "--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--code", code, "--",
       "train.py", "config/tiny.py", "--out_dir=$GPTRAIN_OUTPUT_DIR")
    seen = states_until_done("scode")
    assert seen[-1] == "succeeded", (seen, logs_tail("scode"))
    jdir = job_dir("scode")
    assert f"saved {jdir}/output/ckpt.pt iters 7 sum 3.0 cwd {jdir}/code" in ok("logs", "scode")
    assert not (jdir / "code" / "weights.bin").exists()


def test_shell_script_once_per_node(slurm, tmp_path, monkeypatch):
    code = project(tmp_path / "proj")
    monkeypatch.chdir(code)
    ok("run", "ssh", "--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--env",
       f"PYTHON={sys.executable}", "--", "run.sh", "$GPTRAIN_OUTPUT_DIR")
    seen = states_until_done("ssh")
    assert seen[-1] == "succeeded", (seen, logs_tail("ssh"))
    jdir = job_dir("ssh")
    for node in (0, 1):  # node N's output: the log of its first rank (N x 1)
        text = rank_log_path("ssh", node).read_text()
        assert f"node {node} of 2, 1 per node, world 2" in text and f"out {jdir}/output" in text, text
        assert "module __main__ world 2 relative-import-ok" in text, text


# Writes checkpoint-2 under a folder with a space and a quote in its name, then waits to be
# requeued; started again, it prints the arguments it was given.
HOLDS = '''
import json, os, sys, time
out = os.path.join(os.environ["GPTRAIN_OUTPUT_DIR"], "my run's")
print("argv", json.dumps(sys.argv[1:]), flush=True)
if "--resume" in sys.argv:
    sys.exit(0)
ck = os.path.join(out, "checkpoint-2")
os.makedirs(ck)
open(os.path.join(ck, "config.json"), "w").write("{}")
open(os.path.join(ck, "model.safetensors"), "wb").write(b"x")
json.dump({"global_step": 2}, open(os.path.join(ck, "trainer_state.json"), "w"))
open(os.path.join(out, "held"), "w").close()
while True:
    time.sleep(0.2)
'''


def test_requeue_gives_the_program_its_resume_args(slurm, tmp_path, monkeypatch):
    """--resume-args on Slurm: the batch script carries only the template; after `scontrol
    requeue` the program gets `--resume PATH` as two arguments, whatever the path holds."""
    import json

    (tmp_path / "holds.py").write_text(HOLDS)
    monkeypatch.chdir(tmp_path)
    ok("run", "sresume", "--scheduler", "slurm", "--resume-args", "--resume {checkpoint}", "--", "holds.py")
    out = job_dir("sresume") / "output" / "my run's"
    seen = requeue_when_written("sresume", out / "held", slurm)
    assert seen[-1] == "succeeded", (seen, logs_tail("sresume"))
    log = ok("logs", "sresume")
    assert "argv []" in log and f"argv {json.dumps(['--resume', str(out / 'checkpoint-2')])}" in log, log
