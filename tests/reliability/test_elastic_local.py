"""An elastic local job (`--nodes 1:2`) that loses node 1 mid-run: its torchrun agent and
worker killed outright (as when its host dies). The job goes on with node 0 from its latest
checkpoint, says so in a `node lost` event, and frees node 1's slot at once: the next job in
line starts on it while the elastic job is still training (real supervisors, torchrun, /proc)."""

import os
import signal

import pytest

from tests.job_helpers import TRAIN, job, job_processes, ok, rank_log_path, wait_for, wait_until
pytestmark = pytest.mark.slow


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[1])
    except OSError:
        return 0


def node_processes(name: str, node: int) -> set[int]:
    """Node `node`'s torchrun agent (is_host=1 only on node 0) and the workers it started."""
    procs = job_processes(name)
    flag = f"--rdzv-conf=is_host={int(node == 0)},"
    agents = {p for p in procs if any(a.startswith(flag) for a in cmdline(p))}
    return agents | {p for p in procs if parent(p) in agents}


def test_a_lost_node_frees_its_slot_and_the_elastic_job_goes_on(dataset):
    from gptrain.jobs import found, store
    from gptrain.jobs.folder import job_dir

    ok("run", "el", "--dataset", dataset, "--nodes", "1:2", "--accels", "1", "--",
       "--train.max_steps=100000", "--checkpoint.every=20", "--train.do_eval=false",
       "--train.global_batch_size=8", *TRAIN)
    assert sorted(job("el")["slots"] or []) in ([], [0, 1])
    wait_until(lambda: found.latest(job_dir("el")) is not None, 300, "el wrote no checkpoint")
    assert sorted(job("el")["slots"]) == [0, 1] and job("el")["state"] == "running", job("el")
    victims = node_processes("el", 1)
    assert len(victims) == 2, (victims, [cmdline(p) for p in job_processes("el")])  # agent + its worker
    for pid in victims:
        os.kill(pid, signal.SIGKILL)  # node 1's host is gone

    wait_until(lambda: "node lost" in [e["kind"] for e in store.events("el")], 120, "no node lost event")
    lost = next(e["message"] for e in store.events("el") if e["kind"] == "node lost")
    assert lost.startswith("node 1 lost") and "goes on with 1 node(s)" in lost, lost
    assert "its slots [1] are free for other jobs" in lost, lost
    assert job("el")["slots"] == [0], job("el")
    at_loss = found.latest(job_dir("el")).name

    # the freed slot is the next job's, while el trains on: both at once on 2 slots
    ok("run", "next", "--dataset", dataset, "--accels", "1", "--", "--train.max_steps=3", *TRAIN)
    assert wait_for("next", timeout=300)["state"] == "succeeded", store.events("next")
    assert job("el")["state"] == "running", store.events("el")
    assert any(e["message"] == "cpu slots [1]" for e in store.events("next")), store.events("next")
    wait_until(lambda: found.latest(job_dir("el")).name > at_loss, 300, "el did not go on after the loss")
    rank0 = rank_log_path("el").read_text()
    assert "world 1" in rank0 and "resumed from" in rank0, rank0[-3000:]

    ok("stop", "el", "--wait", "--timeout", "60")
    assert wait_for("el")["state"] == "stopped"
    assert not job_processes("el")
