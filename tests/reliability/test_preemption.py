"""A SIGTERM nobody asked for with `gptrain stop` is a preemption, never a success: to a worker
alone, to the torchrun agent and its workers together (what Slurm and Kubernetes send), or to the
job's supervisor, the workers save a checkpoint at the step they reached (0 steps lost), the job
is `preempted` and continues by itself without spending a restart, then ends `succeeded` with the
weights of a run never interrupted. A user's `gptrain stop` still ends `stopped`."""

import os
import re
import signal

import pytest
import torch

from gptrain import run_layout
from tests import helpers
from tests.helpers import model_tensors, step_dir
from tests.job_helpers import TRAIN, job, ok, rank_log_path, wait_for, wait_until

pytestmark = pytest.mark.slow

STEPS = 40
ARGS = [f"--train.max_steps={STEPS}", "--checkpoint.every=1000", "--train.precision=fp32",
        "--train.do_eval=false", *TRAIN]


def _log(name, rank=0) -> str:
    try:
        return rank_log_path(name, rank).read_text(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.add(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def at_step_5(name) -> dict:
    """Once rank 0 has logged step 5: {'supervisor': pid, 'agent': pid, 'workers': [pids]}."""
    wait_until(lambda: re.search(r"step\s+([5-9]|\d\d)/", _log(name)), 240, f"{name} never reached step 5")
    sup = job(name)["supervisor_pid"]
    (agent,) = _children(sup)
    workers = sorted(_children(agent))
    assert len(workers) == 2, (agent, workers)
    return {"supervisor": sup, "agent": agent, "workers": workers}


def steps_lost(name) -> list[int]:
    return helpers.steps_lost(_log(name))


_CLEAN: dict = {}  # the uninterrupted run's weights, made once (the dataset is the same each time)


def clean_weights(name="clean"):
    from gptrain.jobs.folder import job_dir

    if "weights" not in _CLEAN:
        ok("run", name, "--dataset", "tiny", "--accels", "2", "--", *ARGS)
        assert wait_for(name, timeout=600)["state"] == "succeeded"
        _CLEAN["weights"] = model_tensors(step_dir(job_dir(name), STEPS))
    return _CLEAN["weights"]


@pytest.mark.parametrize("target", ["worker", "agent+workers", "supervisor"])
def test_an_unasked_sigterm_preempts_and_the_job_continues_to_success(dataset, target):
    from gptrain.jobs import store
    from gptrain.jobs.folder import job_dir

    ok("run", "pre", "--dataset", dataset, "--accels", "2", "--max-restarts", "0", "--", *ARGS)
    pids = at_step_5("pre")
    victims = {"worker": pids["workers"][1:], "agent+workers": [pids["agent"], *pids["workers"]],
               "supervisor": [pids["supervisor"]]}[target]
    for pid in victims:
        os.kill(pid, signal.SIGTERM)
    j = wait_for("pre", timeout=600)
    events = store.events("pre")
    assert j["state"] == "succeeded" and j["restarts"] == 0, (j, events)
    preempted = [e["message"] for e in events if e["kind"] == "preempted"]
    assert len(preempted) == 1 and "no `gptrain stop` asked for it" in preempted[0], events
    # (a worker's SIGTERM: every rank agrees to stop at that step and exits 143; torchrun names one)
    assert re.search({"worker": r"rank \d got SIGTERM", "agent+workers": "torchrun agent of node0 got SIGTERM",
                      "supervisor": "SIGTERM to the job's supervisor"}[target], preempted[0]), preempted
    assert steps_lost("pre") == [0], _log("pre")[-4000:]
    assert "resumed from" in _log("pre")
    got, want = model_tensors(step_dir(job_dir("pre"), STEPS)), clean_weights()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_the_users_stop_is_stopped_and_a_stopped_run_is_never_succeeded(dataset):
    """`gptrain stop` ends `stopped` (the trainer exits 143 after its checkpoint, not 0), and
    `gptrain resume` then finishes it. 200 steps: a stop sent after step 5 of 40 could come as the
    run finished (it is then `succeeded`: it completed)."""
    ok("run", "mine", "--dataset", dataset, "--accels", "2", "--", *ARGS, "--train.max_steps=200")
    at_step_5("mine")
    ok("stop", "mine", "--wait")
    j = job("mine")
    assert j["state"] == "stopped", j
    assert steps_lost("mine") == [0]
    ok("resume", "mine")
    assert wait_for("mine", timeout=600)["state"] == "succeeded"


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_foreground_train_stopped_by_sigterm_or_ctrl_c_exits_after_its_checkpoint(tmp_path, sig, code):
    import subprocess
    import sys
    import time

    from tests.helpers import TINY, env, make_dataset

    data = make_dataset(tmp_path)
    out = tmp_path / "run"
    # as a terminal starts it: SIGINT at its default (a test runner's worker may ignore it, and a
    # process started with SIGINT ignored keeps ignoring it, as nohup means)
    p = subprocess.Popen([sys.executable, "-m", "gptrain", "train", f"--data.path={data}",
                          f"--train.output_dir={out}", "--train.max_steps=100000", "--train.do_eval=false",
                          *TINY], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not run_layout.metrics_file(out).exists() or "step" not in run_layout.metrics_file(out).read_text():
            assert time.time() < deadline and p.poll() is None
            time.sleep(0.1)
        p.send_signal(sig)  # Ctrl-C: exited 130 with no checkpoint before (issue 38)
        said, _ = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == code, said[-2000:]
    assert "saved checkpoint" in said and "stopped at step" in said
