"""A gptrain job on a real Ray cluster of two hosts (podman containers h1 and h2, each with its
own address and hostname; conftest.py): the ranks meet only over the bridge network.

1. `--nodes 2`: the two nodes on different hosts, their ranks rendezvous at h1's address, the
   job succeeds, both ranks' logs (and both nodes' agent logs) reach the shared job folder.
2. `--nodes 1:2` (elastic), h2 killed mid-run (`podman kill`): the job goes on on h1 alone from
   its latest checkpoint (resharded to one rank, the data position carried over), ends
   `succeeded` without anyone typing a command, its final loss within 2% of test 1's
   uninterrupted run of the same config, and its events tell what happened.

The CLI runs on h1 (the supervisor, the job's Ray driver, lives there: a Ray driver must run
on a node of the cluster); this process only reads the shared folder and the database in it.
Runs in this order: test 2 kills h2.
"""

import time

import pytest

from gptrain.jobs import folder
from gptrain.jobs.logs import agent_log, rank_log
from tests.helpers import TINY
from tests.hosts.conftest import final_eval_loss, gptrain_on_h1, job_home

pytestmark = pytest.mark.slow
# the same config for both jobs: a fixed global batch, so 2 ranks and 1 rank see the same data
STEPS = 400
ARGS = [*TINY, f"--train.max_steps={STEPS}", "--train.batch_size=4", "--train.global_batch_size=8",
        "--checkpoint.every=50", "--train.seed=1"]
FINAL = {}  # test 1's final loss, the reference of test 2


@pytest.fixture
def home(ray_hosts, request, monkeypatch, tmp_path):
    return job_home(ray_hosts.shared_dir, request, monkeypatch, tmp_path)


def gptrain(hosts, home, *args, check=True):
    """`gptrain ARGS` on h1, against the cluster."""
    return gptrain_on_h1(hosts, home, *args, env={"RAY_ADDRESS": hosts.ray_address}, check=check)


def wait_for(name, states=("succeeded", "failed", "stopped"), timeout=240, until=None):
    from gptrain.jobs import store

    deadline = time.time() + timeout
    while time.time() < deadline:
        job = store.get_job(name)
        if job["state"] in states or (until and until()):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {name} still {job['state']} after {timeout} s: {store.events(name)}")


def test_two_hosts_one_job(ray_hosts, home):
    hosts = ray_hosts
    gptrain(hosts, home, "run", "two", "--scheduler", "ray", "--nodes", "2", "--accels", "1",
            "--dataset", "tiny", "--", *ARGS)
    job = wait_for("two")
    logs = folder.logs_dir(home / "jobs" / "two")
    assert job["state"] == "succeeded", agent_log(logs, 0).read_text()[-3000:]
    from gptrain.jobs import store

    where = " ".join(e["message"] for e in store.events("two") if e["kind"] == "starting")
    assert f"node 0: {hosts.ips[0]} (h1)" in where and f"node 1: {hosts.ips[1]} (h2)" in where, where
    heads = [rank_log(logs, r).read_text().splitlines()[0] for r in (0, 1)]
    assert {h.split(", host ")[1].split(",")[0] for h in heads} == {"h1", "h2"}, heads  # ranks on both hosts
    assert all("world 2" in h for h in heads), heads
    agents = [agent_log(logs, n).read_text() for n in (0, 1)]
    assert all(f"--rdzv-endpoint={hosts.ips[0]}:" in a for a in agents)  # met at h1's bridge address
    assert "is_host=1" in agents[0] and "is_host=0" in agents[1]
    FINAL["two"] = final_eval_loss(home / "jobs" / "two", STEPS)


def test_host_killed_elastic_job_goes_on(ray_hosts, home):
    if "two" not in FINAL:
        pytest.skip("needs test_two_hosts_one_job's uninterrupted run first")
    hosts = ray_hosts
    gptrain(hosts, home, "run", "el", "--scheduler", "ray", "--nodes", "1:2", "--accels", "1",
            "--dataset", "tiny", "--", *ARGS)
    from gptrain.jobs import found

    job = wait_for("el", until=lambda: found.latest(home / "jobs" / "el") is not None, timeout=180)
    assert job["state"] == "running", job
    hosts.kill(1)  # h2 dies with its raylet, torchrun agent and rank
    job = wait_for("el", timeout=240)
    from gptrain.jobs import store

    events = store.events("el")
    story = "\n".join(f"{e['kind']}: {e['message']}" for e in events)
    logs = folder.logs_dir(home / "jobs" / "el")
    assert job["state"] == "succeeded", story + agent_log(logs, 0).read_text()[-3000:]
    lost = [e["message"] for e in events if e["kind"] == "node lost"]
    assert len(lost) == 1 and lost[0].startswith(f"node 1 lost (its Ray actor on {hosts.ips[1]} (h2) died"), story
    assert "goes on with 1 node(s)" in lost[0] and "latest checkpoint (step-" in lost[0], story
    assert "finished on 1 of 2 nodes (lost: node 1)" in story, story
    rank0 = rank_log(logs, 0).read_text()
    assert "host h1, world 1" in rank0 and "resumed from" in rank0, rank0[-3000:]  # one rank, from the checkpoint
    loss, ref = final_eval_loss(home / "jobs" / "el", STEPS), FINAL["two"]
    print(f"final loss at step {STEPS}: uninterrupted 2 hosts {ref:.4f}, h2 killed {loss:.4f}")
    assert abs(loss - ref) <= 0.02 * ref, (loss, ref)
