"""On a real Slurm: a time limit shorter than the training, and Slurm's pre-timeout signal, end
in a checkpoint at the step reached (0 steps lost), a requeue, and `succeeded`; a user's
`scancel` ends `stopped`, its checkpoint at the step reached."""

import json
import re
import time

import pytest

from tests import helpers
from tests.job_helpers import TRAIN, job_dir, logs_tail, ok, rank_log_path, states_until_done, trainer_pids

pytestmark = pytest.mark.slow
# the runs a signal interrupts: it is sent once the first step is logged, ~10 s of steps before the end
STEPS = 1000


def steps_lost(name) -> list[int]:
    return helpers.steps_lost(rank_log_path(name).read_text(errors="replace"))


def _wait_for_a_step(name, timeout=300):
    deadline = time.time() + timeout
    path = rank_log_path(name)
    while not (path.is_file() and re.search(r"step\s+\d+/", path.read_text(errors="replace"))):
        assert time.time() < deadline, logs_tail(name)
        time.sleep(0.2)


def _external_id(name):
    return json.loads(ok("inspect", name, "--json"))["job"]["external_id"]


def test_the_pre_timeout_signal_checkpoints_requeues_and_the_job_succeeds(dataset, slurm):
    """What Slurm sends SIGNAL_GRACE_S before the time limit (`--signal=B:USR1@120`), sent now."""
    ok("run", "stime", "--scheduler", "slurm", "--nodes", "1", "--accels", "1", "--dataset", dataset,
       "--", f"--train.max_steps={STEPS}", "--checkpoint.every=100000", "--train.do_eval=false", *TRAIN)
    _wait_for_a_step("stime")
    slurm.run("scancel", "--batch", "--signal=USR1", _external_id("stime"))
    seen = states_until_done("stime")
    report = json.loads(ok("inspect", "stime", "--json"))
    assert seen[-1] == "succeeded", (seen, report["events"], logs_tail("stime"))
    assert any(e["kind"] == "preempted" and "time limit was near" in e["message"] for e in report["events"]), \
        report["events"]
    assert steps_lost("stime") == [0], logs_tail("stime")
    assert re.search(r"resumed from .*step-\d+ at step", ok("logs", "stime"))
    assert json.loads(ok("checkpoints", "stime", "--json"))[-1]["step"] == STEPS


def test_a_real_time_limit_shorter_than_the_training(dataset, slurm):
    """--time 2 with the signal 40 s before it: Slurm sends it at its first check (every 30 s) with
    less than 40 + 30 s left, 50-80 s after the start; the job saves, requeues and runs again (then
    the test stops it: each attempt has its own 2 minutes). With the signal 100 s before the limit
    it came at the first check, 0-30 s after the start: in CI, before the first step, each time."""
    ok("run", "slimit", "--scheduler", "slurm", "--nodes", "1", "--accels", "1", "--time", "2",
       "--sbatch-arg=--signal=B:USR1@40", "--dataset", dataset,
       "--", "--train.max_steps=10000000", "--checkpoint.every=100000000", "--train.do_eval=false", *TRAIN)
    deadline, seen = time.time() + 400, []
    while time.time() < deadline:
        report = json.loads(ok("inspect", "slimit", "--json"))
        seen.append(report["job"]["state"])
        log = rank_log_path("slimit")
        if log.is_file() and "resumed from" in log.read_text(errors="replace"):
            break
        assert report["job"]["state"] not in ("failed", "succeeded", "stopped"), (report, logs_tail("slimit"))
        time.sleep(1)
    else:
        raise AssertionError(f"never resumed after its time limit: {seen[-5:]} {logs_tail('slimit')}")
    events = json.loads(ok("inspect", "slimit", "--json"))["events"]
    assert any(e["kind"] == "preempted" for e in events), events
    assert steps_lost("slimit") == [0], logs_tail("slimit")
    ok("stop", "slimit", "--wait", "--timeout", "120")
    assert json.loads(ok("inspect", "slimit", "--json"))["job"]["state"] == "stopped"


STALLS = """
import os, sys, time
print("attempt", os.environ["GPTRAIN_ATTEMPT"], "started", flush=True)
time.sleep(3600)  # never a checkpoint, and a SIGTERM ends it
"""


def test_a_time_limit_that_ends_every_attempt_before_a_checkpoint_is_not_requeued_forever(slurm, tmp_path,
                                                                                          monkeypatch):
    """Slurm's pre-timeout signal (sent by the test, as in the first test) to a program that has
    not saved anything: requeued twice, then the job fails with the reason and what to change."""
    (tmp_path / "stalls.py").write_text(STALLS)
    monkeypatch.chdir(tmp_path)
    ok("run", "sstall", "--scheduler", "slurm", "--", "stalls.py")
    log = rank_log_path("sstall")
    for attempt in range(3):
        deadline = time.time() + 300
        while not (log.is_file() and f"attempt {attempt} started" in log.read_text(errors="replace")):
            assert time.time() < deadline, logs_tail("sstall")
            time.sleep(0.2)
        slurm.run("scancel", "--batch", "--signal=USR1", _external_id("sstall"))
    seen = states_until_done("sstall")
    job = json.loads(ok("inspect", "sstall", "--json"))["job"]
    assert seen[-1] == "failed", (seen, logs_tail("sstall"))
    assert "its time limit was near in 3 attempts in a row before a new checkpoint (there is none yet)" \
        in job["error"] and "a longer --time" in job["error"], job
    assert "attempt 3 started" not in log.read_text(errors="replace")


def test_a_users_scancel_is_stopped_with_its_checkpoint(dataset, slurm):
    ok("run", "scan", "--scheduler", "slurm", "--nodes", "1", "--accels", "1", "--dataset", dataset,
       "--", "--train.max_steps=1000000", "--checkpoint.every=100000000", "--train.do_eval=false", *TRAIN)
    _wait_for_a_step("scan")
    slurm.run("scancel", _external_id("scan"))
    assert states_until_done("scan")[-1] == "stopped", logs_tail("scan")
    assert steps_lost("scan") == [0], logs_tail("scan")


def _worker_pid(name) -> int:
    """The trainer process of a 1x1 job."""
    (pid,) = trainer_pids(job_dir(name))
    return pid


def test_a_sigterm_to_a_worker_requeues_the_job_and_it_succeeds(dataset, slurm):
    """SIGTERM to the trainer itself (an admin, an eviction; not Slurm, not `gptrain stop`): it
    saves at the step reached, the batch script asks gptrain.jobs.logs how the attempt ended and
    requeues it (`preempted`); it continues and succeeds, 0 steps lost."""
    import os
    import signal

    ok("run", "sterm", "--scheduler", "slurm", "--nodes", "1", "--accels", "1", "--dataset", dataset,
       "--", f"--train.max_steps={STEPS}", "--checkpoint.every=100000", "--train.do_eval=false", *TRAIN)
    _wait_for_a_step("sterm")
    os.kill(_worker_pid("sterm"), signal.SIGTERM)
    seen = states_until_done("sterm")
    report = json.loads(ok("inspect", "sterm", "--json"))
    assert seen[-1] == "succeeded", (seen, report["events"], logs_tail("sterm"))
    assert any(e["kind"] == "preempted" and "got SIGTERM" in e["message"] for e in report["events"]), report["events"]
    assert steps_lost("sterm") == [0], logs_tail("sterm")
    assert json.loads(ok("checkpoints", "sterm", "--json"))[-1]["step"] == STEPS
