"""The user's own code on the real test Slurm cluster: a --code snapshot is where every node's
workers start (2 nodes x 1 process), and a shell script runs once per node with the
rendezvous variables (issue 14)."""

import sys

import pytest

from tests.jobs_code.programs import project
from tests.slurm.test_slurm import _job_dir, _logs, ok, states_until_done

pytestmark = pytest.mark.slow


def test_code_snapshot_script_on_two_nodes(slurm, tmp_path, monkeypatch):
    code = project(tmp_path / "nano")
    monkeypatch.chdir(tmp_path)
    ok("run", "scode", "--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--code", code, "--",
       "train.py", "config/tiny.py", "--out_dir=$GPTRAIN_OUTPUT_DIR")
    seen = states_until_done("scode")
    assert seen[-1] == "succeeded", (seen, _logs("scode"))
    jdir = _job_dir("scode")
    assert f"saved {jdir}/output/ckpt.pt iters 7 sum 3.0 cwd {jdir}/code" in ok("logs", "scode")
    assert not (jdir / "code" / "weights.bin").exists()


def test_shell_script_once_per_node(slurm, tmp_path, monkeypatch):
    code = project(tmp_path / "proj")
    monkeypatch.chdir(code)
    ok("run", "ssh", "--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--env",
       f"PYTHON={sys.executable}", "--", "run.sh", "$GPTRAIN_OUTPUT_DIR")
    seen = states_until_done("ssh")
    assert seen[-1] == "succeeded", (seen, _logs("ssh"))
    jdir = _job_dir("ssh")
    for node in (0, 1):  # node N's output: the log of its first rank (N x 1)
        text = (jdir / "logs" / f"rank-{node}.log").read_text()
        assert f"node {node} of 2, 1 per node, world 2" in text and f"out {jdir}/output" in text, text
        assert "module __main__ world 2 relative-import-ok" in text, text
