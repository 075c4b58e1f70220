"""Local jobs survive any death of their own processes: the state tells the truth, no orphan
keeps running, and a pid that was reused is never signalled (real supervisors, torchrun, /proc)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import run_cli
from tests.job_helpers import (
    TRAIN, identity_of, job, job_processes, ok, parent_of, rank_log_path, record_job, wait_for,
    wait_until)


def noop_script(tmp_path, body="pass\n"):
    script = tmp_path / "noop.py"
    script.write_text(body)
    return script


@pytest.mark.slow
def test_kill_9_of_the_supervisor_takes_its_workers_and_frees_its_slots(dataset, tmp_path):
    from gptrain.jobs.folder import job_dir

    ok("run", "victim", "--dataset", dataset, "--accels", "2", "--", "--train.max_steps=100000",
       "--checkpoint.every=100000", "--train.do_eval=false", *TRAIN)
    # supervisor + torchrun agent + 2 workers, once rank 1 is training
    wait_until(lambda: len(job_processes("victim")) >= 4 and "step" in _text(rank_log_path("victim")),
               300, "the job never ran")
    sup = job("victim")["supervisor_pid"]
    os.kill(sup, signal.SIGKILL)
    # no CLI call in between: the agent and the workers die with their supervisor
    wait_until(lambda: not job_processes("victim"), 60, f"processes survived their supervisor: {job_processes('victim')}")
    assert "failed" in ok("jobs")
    j = job("victim")
    assert j["state"] == "failed" and f"its supervisor died (pid {sup}" in j["error"], j
    assert "supervisor died" in ok("inspect", "victim")
    # its two slots are free again: a 2-slot job runs now
    ok("run", "next", "--accels", "2", "--", noop_script(tmp_path))
    assert wait_for("next", timeout=180)["state"] == "succeeded"
    ok("rm", "victim")
    time.sleep(2)
    assert not job_dir("victim").exists()  # no orphan writing into it again


def _text(path):
    return path.read_text(errors="replace") if path.is_file() else ""


@pytest.mark.parametrize("change", ["start time", "boot id"])
def test_a_reused_pid_is_never_signalled(tmp_path, change):
    """After a crash or a reboot the recorded pid may belong to an unrelated process: `stop`
    and the reconciler must leave it alone and still end the job."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        pid, start, boot = identity_of(bystander.pid)
        recorded = [pid, start - 1, boot] if change == "start time" else [pid, start, "boot-before-reboot"]
        record_job("ghost", noop_script(tmp_path), "running", recorded)
        r = run_cli("stop", "ghost")
        assert r.returncode == 0, (r.stdout, r.stderr)
        time.sleep(0.5)
        assert bystander.poll() is None, "an unrelated process was signalled"
        # its supervisor had died: the job ended (failed, found by the reconciler in `stop`)
        assert job("ghost")["state"] == "failed" and "job ghost: failed" in r.stdout
        if change == "boot id":
            assert "machine restarted" in json.dumps(run_cli("inspect", "ghost", "--json").stdout)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_run_killed_after_recording_does_not_freeze_the_queue(tmp_path, monkeypatch):
    """`gptrain run` killed between recording the job and starting its supervisor leaves a queued
    row nobody owns: the jobs behind it must still run, and it ends with the reason."""
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "1")
    script = noop_script(tmp_path)
    record_job("stuck", script, "queued", None)
    ok("run", "after", "--", script)
    assert wait_for("after", timeout=180)["state"] == "succeeded"
    j = job("stuck")
    assert j["state"] == "failed" and "never started" in j["error"], j


def test_a_queued_job_whose_supervisor_is_dead_is_ended_at_once(tmp_path):
    gone = subprocess.Popen(["sleep", "60"])
    ident = identity_of(gone.pid)
    gone.kill()
    gone.wait()
    record_job("orphan", noop_script(tmp_path), "queued", ident)
    out = ok("jobs")
    assert "failed" in out, out
    assert f"its supervisor died (pid {ident[0]}" in job("orphan")["error"]


def test_stop_before_the_supervisor_is_ready_still_stops_the_job(tmp_path, monkeypatch):
    """The SIGTERM of a `stop` right after `run` lands before the supervisor installed its
    handler: it must not kill it silently (leaving the job queued for ever)."""
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "1")
    script = noop_script(tmp_path, "import time\ntime.sleep(60)\n")
    code = ("import sys\nfrom gptrain.jobs.engines import local\nfrom gptrain.jobs.spec import JobSpec\n"
            f"local.submit(JobSpec(name='early', script={str(script)!r}))\n"
            "print(local.stop('early', 5))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert wait_for("early", timeout=180)["state"] == "stopped"
    assert "stopped" in ok("jobs")


@pytest.mark.slow
def test_kill_9_of_the_torchrun_agent_takes_its_workers(dataset):
    """torchrun starts workers in sessions of their own: killing the agent used to leave them
    training while the supervisor recorded the attempt as over."""
    ok("run", "headless", "--dataset", dataset, "--accels", "2", "--", "--train.max_steps=100000",
       "--checkpoint.every=100000", "--train.do_eval=false", *TRAIN)
    wait_until(lambda: len(job_processes("headless")) >= 4 and "step" in _text(rank_log_path("headless")),
               300, "the job never ran")
    sup = job("headless")["supervisor_pid"]
    agent = next(p for p in job_processes("headless") if parent_of(p) == sup)
    workers = {p for p in job_processes("headless") if parent_of(p) == agent}
    assert len(workers) == 2
    os.kill(agent, signal.SIGKILL)
    j = wait_for("headless", timeout=180)
    assert j["state"] == "failed", j
    wait_until(lambda: not (workers & job_processes("headless")), 60, "workers outlived their agent")


