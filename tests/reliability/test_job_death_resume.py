"""Every process of a running job killed at once (what a machine reboot does): the next CLI call
tells the truth, and the job continues from its latest checkpoint (by itself while restarts are
left, else with `gptrain resume NAME`) to the very weights of a run never interrupted."""

import json
import os
import signal
import time

import pytest
import torch

from tests.helpers import model_tensors, step_dir
from tests.job_helpers import TRAIN, job, job_processes, kinds, ok, wait_for, wait_until
pytestmark = pytest.mark.slow

STEPS = 10  # killed at step 4: the rest trained after the restart
ARGS = [f"--train.max_steps={STEPS}", "--checkpoint.every=2", "--train.precision=fp32",
        "--train.do_eval=false", *TRAIN]


def kill_everything_at_step_4(name):
    """Freeze every process of the job once step-000004 is written, then SIGKILL them all."""
    from gptrain.jobs.folder import job_dir

    ckpt = step_dir(job_dir(name), 4)
    deadline = time.time() + 180
    while not ckpt.exists():
        assert time.time() < deadline and job(name)["state"] in ("queued", "starting", "running"), job(name)
        time.sleep(0.02)
    victims = job_processes(name)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in victims:
            os.kill(pid, sig)
    assert job(name)["state"] == "running"  # nothing recorded the deaths
    # a SIGKILLed torch process takes a while to exit (its memory is torn down) on a busy machine
    wait_until(lambda: not job_processes(name), 60, f"processes alive after SIGKILL: {job_processes(name)}")


def final_weights(name):
    from gptrain.jobs.folder import job_dir

    return model_tensors(step_dir(job_dir(name), STEPS))


def test_kill_9_of_every_process_resumes_to_the_same_weights(dataset):
    from gptrain.jobs import store

    # restarts left: the next CLI call hands the job to a new supervisor
    ok("run", "auto", "--dataset", dataset, "--accels", "2", "--max-restarts", "1", "--", *ARGS)
    kill_everything_at_step_4("auto")
    ok("jobs")
    restart = [e for e in store.events("auto") if e["kind"] == "restarting"]
    assert restart and "its supervisor died" in restart[0]["message"] and "restart 1 of 1 by a new supervisor: " \
        "continues from step-0000" in restart[0]["message"], restart
    j = wait_for("auto")
    assert j["state"] == "succeeded" and j["restarts"] == 1, j

    # no restarts left, and the machine "rebooted" (another boot id): failed, then `gptrain resume`
    ok("run", "manual", "--dataset", dataset, "--accels", "2", "--", *ARGS)
    kill_everything_at_step_4("manual")
    ident = json.loads(job("manual")["supervisor"])
    store.update("manual", supervisor=json.dumps([ident[0], ident[1], "boot-before-reboot"]))
    assert "failed" in ok("jobs")
    j = job("manual")
    assert j["state"] == "failed" and "when the machine restarted" in j["error"] \
        and "gptrain resume manual" in j["error"], j
    assert "resumed job manual" in ok("resume", "manual")
    j = wait_for("manual")
    assert j["state"] == "succeeded", j
    assert "resumed" in kinds("manual")
    assert "resumed from" in ok("logs", "manual")

    ok("run", "clean", "--dataset", dataset, "--accels", "2", "--", *ARGS)
    assert wait_for("clean")["state"] == "succeeded"
    clean = final_weights("clean")
    for name in ("auto", "manual"):
        got = final_weights(name)
        assert got.keys() == clean.keys()
        for key in clean:
            assert torch.equal(got[key], clean[key]), (name, key)


def test_resume_refuses_what_it_cannot_resume(dataset, tmp_path):
    from tests.conftest import run_cli

    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    ok("run", "done", "--", script)
    wait_for("done")
    for name, message in (("done", "only a failed or stopped job"), ("nope", "no job named")):
        r = run_cli("resume", name)
        assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
