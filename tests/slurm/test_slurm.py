"""gptrain jobs on a real Slurm (munged + slurmctld + two slurmd, started by the harness)."""

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers import step_dir
from tests.job_helpers import (
    TRAIN, agent_log_path, job_dir, logs_tail, ok, rank_log_path, requeue_when_written,
    states_until_done)

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "slurm.md"


def test_two_node_ddp_job_succeeds(dataset, tmp_path):
    ok("run", "sddp", "--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--dataset", dataset,
       "--", "--parallel.dp_replicate=2", "--parallel.dp_shard=1", "--train.max_steps=6",
       "--checkpoint.every=3", *TRAIN)
    seen = states_until_done("sddp")
    report = json.loads(ok("inspect", "sddp", "--json"))
    assert seen[-1] == "succeeded", (seen, report["events"], logs_tail("sddp"))
    assert "running" in [e["kind"] for e in report["events"]]
    assert report["job"]["external_id"] and report["job"]["scheduler"] == "slurm"
    for node in (0, 1):  # one torchrun agent per node, each with its own output, and one rank each
        assert agent_log_path("sddp", node).is_file() and rank_log_path("sddp", node).is_file()
    assert "completed at step 6" in ok("logs", "sddp") and "rank 1" in ok("logs", "sddp", "--rank", "1")
    ckpts = json.loads(ok("checkpoints", "sddp", "--json"))
    assert [c["step"] for c in ckpts] == [3, 6]
    ok("checkpoint", "fetch", ckpts[-1]["id"], "--destination", tmp_path / "hf", "--format", "hf")
    assert ok("generate", "sddp", "--prompt", "The", "--max-new-tokens", "4").startswith("The")


def test_stop_ends_a_running_job_with_a_checkpoint(dataset):
    ok("run", "slong", "--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--dataset", dataset,
       "--", "--parallel.dp_replicate=2", "--parallel.dp_shard=1", "--train.max_steps=1000000",
       "--checkpoint.every=1000000", "--train.do_eval=false", *TRAIN)
    _wait_for_log("slong", "(how and why: ")
    ok("stop", "slong", "--wait", "--timeout", "180")
    job = json.loads(ok("inspect", "slong", "--json"))["job"]
    assert job["state"] == "stopped", job
    ckpts = json.loads(ok("checkpoints", "slong", "--json"))
    assert ckpts and ckpts[-1]["step"] >= 1, logs_tail("slong")


def test_failing_training_reports_the_rank_error(dataset):
    ok("run", "sfail", "--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--dataset", dataset,
       "--", "--train.max_steps=3", "--model.block_size=100000", *TRAIN[:3])
    seen = states_until_done("sfail")
    report = json.loads(ok("inspect", "sfail", "--json"))
    assert seen[-1] == "failed" and "fewer blocks" in (report["job"]["error"] or ""), report["job"]
    # the other rank, ended by srun after this error, is no preemption: never requeued (it was, up
    # to 13 times, whenever srun's SIGTERM reached the other rank before its own error)
    assert "preempted" not in seen and not any(e["kind"] == "preempted" for e in report["events"]), report["events"]


def test_requeue_resumes_from_the_latest_checkpoint(dataset, slurm):
    ok("run", "sreq", "--scheduler", "slurm", "--nodes", "1", "--accels", "1", "--dataset", dataset,
       "--", "--train.max_steps=400", "--checkpoint.every=20", "--train.do_eval=false", *TRAIN)
    seen = requeue_when_written("sreq", step_dir(job_dir("sreq"), 20), slurm)
    assert seen[-1] == "succeeded", (seen, logs_tail("sreq"))
    log = ok("logs", "sreq")
    assert "attempt 1" in log and re.search(r"resumed from .*step-\d+ at step", log), log[-2000:]


def test_resume_submits_a_stopped_job_again_from_its_checkpoint(dataset):
    ok("run", "sres", "--scheduler", "slurm", "--nodes", "1", "--accels", "1", "--dataset", dataset,
       "--", "--train.max_steps=60", "--checkpoint.every=20", "--train.do_eval=false", *TRAIN)
    _wait_for_log("sres", "(how and why: ")
    ok("stop", "sres", "--wait", "--timeout", "180")
    first = json.loads(ok("inspect", "sres", "--json"))["job"]
    assert first["state"] == "stopped", first
    assert "resumed job sres" in ok("resume", "sres")  # was: "resume works for local jobs"
    seen = states_until_done("sres")
    report = json.loads(ok("inspect", "sres", "--json"))
    assert seen[-1] == "succeeded", (seen, logs_tail("sres"))
    assert report["job"]["external_id"] != first["external_id"]
    assert any("submitted again as Slurm job" in e["message"] for e in report["events"]), report["events"]
    assert re.search(r"resumed from .*step-\d+ at step", ok("logs", "sres")), logs_tail("sres")
    assert json.loads(ok("checkpoints", "sres", "--json"))[-1]["step"] == 60


def test_dry_run_matches_docs(tmp_path, monkeypatch):
    import os

    from gptrain.jobs.engines.slurm import PASS_THROUGH

    for key in [k for k in os.environ if k.startswith(PASS_THROUGH)]:
        monkeypatch.delenv(key)  # the documented script was made in a clean shell
    monkeypatch.setenv("GPTRAIN_HOME", "/shared/gptrain")
    r = run_cli("run", "gpt2-124m", "--scheduler", "slurm", "--nodes", "4", "--accels", "8",
                "--accel-type", "gpu", "--partition", "gpu", "--time", "24:00:00", "--dry-run", "--",
                "--model.preset=gpt2", "--data.path=/shared/data/owt", "--train.precision=bf16")
    assert r.returncode == 0, r.stderr
    script = r.stdout.replace(sys.executable, "/shared/venv/bin/python")
    documented = re.search(r"```bash\n(#!/bin/bash\n.*?)```", DOCS.read_text(), re.S).group(1)
    assert script == documented
    assert "#SBATCH --nodes=4" in script and "#SBATCH --gres=gpu:8" in script
    assert "--nproc-per-node=8" in script and "--rdzv-backend=c10d" in script


def test_bad_input(dataset, monkeypatch):
    r = run_cli("run", "x", "--scheduler", "slurm", "--partition", "nope", "--", "--train.max_steps=1")
    assert r.returncode == 2 and "partition 'nope' does not exist" in r.stderr, r.stderr
    monkeypatch.setenv("PATH", "/nonexistent")
    r = run_cli("run", "y", "--scheduler", "slurm", "--", "--train.max_steps=1")
    assert r.returncode == 2 and "sbatch is not on PATH" in r.stderr and r.stderr.count("\n") == 1
    assert json.loads(ok("jobs", "--json")) == []


def _wait_for_log(name, text, timeout=300):
    deadline = time.time() + timeout
    path = rank_log_path(name)
    while time.time() < deadline:
        if path.is_file() and text in path.read_text():
            return
        time.sleep(0.3)
    raise AssertionError(f"{text!r} never appeared: {logs_tail(name)}")


def test_scheduler_defaults_from_user_config_and_job_yaml(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    (home / "config.toml").write_text('[defaults]\nscheduler = "slurm"\n[slurm]\npartition = "big"\naccount = "proj"\n')
    r = run_cli("run", "j", "--accel-type", "gpu", "--dry-run", "--", "--train.max_steps=1")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --partition=big" in r.stdout and "#SBATCH --account=proj" in r.stdout
    (tmp_path / "job.yaml").write_text("name: y\nnodes: 2\nslurm: {partition: small, time: '01:00:00'}\n"
                                       "args: ['--train.max_steps=1']\n")
    r = run_cli("run", "-f", tmp_path / "job.yaml", "--accel-type", "cpu", "--dry-run")
    assert "#SBATCH --partition=small" in r.stdout and "#SBATCH --time=01:00:00" in r.stdout
    assert "#SBATCH --nodes=2" in r.stdout and "#SBATCH --cpus-per-task=1" in r.stdout
    r = run_cli("run", "-f", tmp_path / "job.yaml", "--partition", "cli", "--dry-run")
    assert "#SBATCH --partition=cli" in r.stdout
    # an inline config (the minGPT job of the README): printed, nothing written
    (tmp_path / "mingpt.yaml").write_text(
        "name: mingpt\nnodes: 2\nconfig:\n  data: {path: 's3://b/input.txt', tokenizer: char}\n"
        "  checkpoint: {every: 500, remote: 's3://b/snapshots'}\n")
    r = run_cli("run", "-f", tmp_path / "mingpt.yaml", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "submitted-config.toml" in r.stdout and not (home / "jobs").exists()
