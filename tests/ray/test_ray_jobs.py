"""`--scheduler ray` end to end on a real two-node Ray cluster (tests/ray/cluster.py): real
raylets, NodeAgent actors, torchrun agents and gloo workers, real SQLite."""

import json
import os
import signal

import pytest

from tests.conftest import run_cli
from tests.helpers import step_dir
from tests.job_helpers import (
    agent_log_path, job, job_dir, kinds, live_with_env, ok, rank_log_path, wait_for, wait_until,
    worker_pids)
from tests.ray.cluster import node_agents
from tests.ray.conftest import NO_RAY, SKIP

pytestmark = pytest.mark.skipif(NO_RAY, reason=SKIP)
TRAIN = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32",
         "--train.batch_size=4", "--report_to=none", "--metrics.log_every=1", "--train.lr=1e-3",
         "--train.precision=fp32"]


def run_ray(name, *args):
    return ok("run", name, "--scheduler", "ray", "--nodes", "2", "--accels", "1", "--dataset", "tiny", *args)


def nothing_left(cluster, name):
    """No process of the job on any node (the workers, agents, supervisor: all carry its
    environment) and no NodeAgent actor left in the cluster."""
    wait_until(lambda: not live_with_env(f"GPTRAIN_JOB={name}") and not node_agents(cluster), 60,
               f"processes of {name} still alive: {live_with_env(f'GPTRAIN_JOB={name}')}, "
               f"actors {node_agents(cluster)}")


def events_of(name, kind):
    from gptrain.jobs import store

    return [e["message"] for e in store.events(name) if e["kind"] == kind]


def test_two_nodes_succeed_with_both_ranks_logs_checkpoints_and_generate(ray_job):
    out = run_ray("pair", "--", "--train.max_steps=12", "--checkpoint.every=4", *TRAIN)
    assert "submitted job pair" in out and "ray" in out
    j = wait_for("pair")
    assert j["state"] == "succeeded", (j, (job_dir("pair") / "supervisor.log").read_text())
    assert kinds("pair")[:4] == ["submitted", "queued", "starting", "running"]
    placed = events_of("pair", "starting")[0]
    assert "placement group" in placed and "node 0:" in placed and "node 1:" in placed, placed
    assert "completed at step 12" in ok("logs", "pair")
    assert "attempt 0, rank 1" in ok("logs", "pair", "--rank", "1")  # (rank 0 alone prints steps)
    host = ray_job.address.split(":")[0]
    node0, node1 = (agent_log_path("pair", n).read_text() for n in (0, 1))
    assert f"--rdzv-endpoint={host}:" in node1 and "is_host=0" in node1 and "is_host=1" in node0
    ckpts = json.loads(ok("checkpoints", "pair", "--json"))
    assert [c["step"] for c in ckpts] == [4, 8, 12]
    assert ok("generate", "pair", "--prompt", "The king", "--max-new-tokens", "5", "--seed", "1").startswith("The king")
    nothing_left(ray_job, "pair")


def test_stop_ends_every_process_and_resume_continues_from_the_checkpoint(ray_job):
    run_ray("long", "--", "--train.max_steps=100000", "--checkpoint.every=100000", "--train.do_eval=false", *TRAIN)
    log = rank_log_path("long")
    wait_until(lambda: "step " in (log.read_text() if log.exists() else ""), 180, "long never trained")
    assert "ray        cluster" in ok("inspect", "long")  # the engine's line, while it runs
    assert "stopped" in ok("stop", "long", "--wait", "--timeout", "60")
    nothing_left(ray_job, "long")
    steps = [c["step"] for c in json.loads(ok("checkpoints", "long", "--json"))]
    assert len(steps) == 1 and steps[0] > 0, steps  # the checkpoint saved on stop
    ok("resume", "long")
    wait_until(lambda: f"resumed from {step_dir(job_dir('long'), steps[0])}" in log.read_text(),
               180, "the resumed job never continued from the checkpoint")
    assert job("long")["state"] == "running"
    assert "stopped" in ok("stop", "long", "--wait", "--timeout", "60")
    nothing_left(ray_job, "long")


def test_a_killed_rank_restarts_from_the_latest_checkpoint(ray_job):
    run_ray("faulty", "--max-restarts", "1", "--", "--train.max_steps=30", "--checkpoint.every=5",
            "--train.do_eval=false", *TRAIN)
    wait_until(lambda: step_dir(job_dir("faulty"), 10).exists() and 1 in worker_pids("faulty"), 180,
               "faulty never reached step 10")
    os.kill(worker_pids("faulty")[1], signal.SIGKILL)
    j = wait_for("faulty")
    assert j["state"] == "succeeded" and j["restarts"] == 1, j
    restart = events_of("faulty", "restarting")[0]
    assert "rank 1 was killed by SIGKILL" in restart and "restart 1 of 1" in restart, restart
    assert "resumed from" in rank_log_path("faulty").read_text()
    assert [c["step"] for c in json.loads(ok("checkpoints", "faulty", "--json"))][-1] == 30
    nothing_left(ray_job, "faulty")


def test_an_unasked_sigterm_to_a_worker_preempts_and_the_job_continues(ray_job):
    """SIGTERM to rank 1 on the second node (an admin, an eviction): it saves at the step reached
    with rank 0 and exits 143; the job is `preempted`, continues without spending a restart, and
    succeeds (jobs/engines/supervisor.py, which the Ray supervisor inherits)."""
    import re

    run_ray("evicted", "--", "--train.max_steps=40", "--checkpoint.every=1000", "--train.do_eval=false", *TRAIN)
    log = rank_log_path("evicted")
    wait_until(lambda: re.search(r"step\s+([5-9]|\d\d)/", log.read_text() if log.exists() else "")
               and 1 in worker_pids("evicted"), 180, "evicted never reached step 5")
    os.kill(worker_pids("evicted")[1], signal.SIGTERM)
    j = wait_for("evicted")
    assert j["state"] == "succeeded" and j["restarts"] == 0, (j, events_of("evicted", "preempted"))
    preempted = events_of("evicted", "preempted")
    assert len(preempted) == 1 and "got SIGTERM" in preempted[0], preempted
    first = log.read_text().split("--- gptrain: attempt")[1]
    trained = max(int(s) for s in re.findall(r"step\s+(\d+)/", first))
    assert f"saved checkpoint {step_dir(job_dir('evicted'), trained)}" in first, first[-2000:]
    assert f"resumed from {step_dir(job_dir('evicted'), trained)}" in log.read_text()
    nothing_left(ray_job, "evicted")


def test_kill_9_of_the_supervisor_ends_the_job_on_every_node(ray_job):
    """The supervisor is the job's Ray driver: Ray ends a dead driver's actors, and the agents
    and workers die with them; the job is then ended by the reconciler, as a local one."""
    run_ray("orphan", "--", "--train.max_steps=100000", "--checkpoint.every=100000", "--train.do_eval=false", *TRAIN)
    log = rank_log_path("orphan")
    wait_until(lambda: "step " in (log.read_text() if log.exists() else ""), 180, "orphan never trained")
    os.kill(job("orphan")["supervisor_pid"], signal.SIGKILL)
    nothing_left(ray_job, "orphan")
    assert "orphan" in ok("jobs")  # (reconciles)
    j = job("orphan")
    assert j["state"] == "failed" and "its supervisor died" in j["error"], j


def test_an_unreachable_cluster_is_one_line_and_nothing_is_recorded(isolated_home, monkeypatch, tmp_path):
    from tests.ray.cluster import free_ports

    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_ports(1)[0]}")
    r = run_cli("run", "nowhere", "--scheduler", "ray", "--", "--train.max_steps=1")
    assert r.returncode == 2 and "cannot reach a Ray cluster" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "nowhere" not in ok("jobs") and not job_dir("nowhere").exists()


def test_a_node_that_does_not_see_the_job_folder_is_refused_and_nothing_recorded(isolated_home, monkeypatch):
    """A one-node cluster whose node has its own (empty) filesystem over the folder holding
    GPTRAIN_HOME, as a node without the shared mount would: refused at submit, in one line."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from tests.ray.cluster import Cluster

    hidden = Path(tempfile.mkdtemp(prefix="gptrain-blind-", dir="/tmp"))
    cover = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"',
             str(hidden)]
    if subprocess.run([*cover, "true"], capture_output=True).returncode != 0:
        shutil.rmtree(hidden)
        pytest.skip("needs a mount namespace (unshare --mount, as root) to hide a folder from one Ray node")
    monkeypatch.setenv("GPTRAIN_HOME", str(hidden / "home"))
    blind = Cluster()
    try:
        monkeypatch.setenv("RAY_ADDRESS", blind.start(nodes=1, prefix=cover).address)
        r = run_cli("run", "blind", "--scheduler", "ray", "--", "--train.max_steps=1")
        assert r.returncode == 2 and "do not see" in r.stderr and "nothing was recorded" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "blind" not in ok("jobs") and not job_dir("blind").exists()
    finally:
        blind.stop()
        shutil.rmtree(hidden, ignore_errors=True)
