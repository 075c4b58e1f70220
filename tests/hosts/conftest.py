"""Fixtures for tests on real separate hosts (podman containers, tests/hosts/podman_hosts.py).

`hosts`: two hosts h1, h2 for the module, sharing one folder (their GPTRAIN_HOME lives there).
`ray_hosts`: a real Ray cluster on them: the head on h1, a worker raylet on h2 (one CPU each).
`slurm_hosts`: a real Slurm on them: slurmctld on h1, a slurmd on each (tests/hosts/slurm_hosts.py).
Each skips, in one line, where podman cannot run, Ray is not installed or Slurm cannot be.
"""

import contextlib
import json
import sys
import time
from pathlib import Path

import pytest

from gptrain import run_layout
from tests.conftest import ROOT, run_cli
from tests.helpers import make_dataset
from tests.hosts.podman_hosts import Hosts, unavailable

RAY = str(Path(sys.executable).parent / "ray")
RAY_PORT = 6379


@contextlib.contextmanager
def started_hosts(tmp_path_factory, n: int):
    """n podman hosts sharing one new folder (`shared_dir`), removed at the end; the test skips,
    in one line, where podman cannot run them."""
    why = unavailable()
    if why:
        pytest.skip(f"no podman hosts: {why}")
    shared = tmp_path_factory.mktemp("shared")
    h = Hosts(n, shared=[shared])
    h.shared_dir = shared
    try:
        h.start()
    except RuntimeError as e:  # (start removed what it made)
        pytest.skip(f"no podman hosts: podman cannot run a container here: {str(e).splitlines()[-1][:300]}")
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with started_hosts(tmp_path_factory, 2) as h:
        yield h


def node_env() -> dict:
    """What every process on the hosts gets: this checkout's gptrain, one thread per process."""
    return {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0"}


def job_home(shared: Path, request, monkeypatch, tmp_path) -> Path:
    """A test's GPTRAIN_HOME in the hosts' shared folder, with a tiny dataset pushed."""
    home = shared / f"home-{request.node.name[:40]}"
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    return home


def final_eval_loss(jdir: Path, step: int) -> float:
    """A job's evaluation loss at `step` (the trainer evaluates on the same validation blocks
    at the end, whatever the world size): what an interrupted run is compared by."""
    rows = [json.loads(line) for line in run_layout.metrics_file(jdir).read_text().splitlines()]
    last = [r["eval/loss"] for r in rows if r.get("step") == step and "eval/loss" in r]
    assert last, rows[-3:]
    return last[-1]


def gptrain_on_h1(hosts, home, *args, env=None, check=True):
    """`gptrain ARGS` run on h1 (a node of the cluster), with GPTRAIN_HOME `home` and `env`."""
    env = {**node_env(), "GPTRAIN_HOME": str(home), **(env or {})}
    r = hosts.exec(0, [sys.executable, "-m", "gptrain", *map(str, args)], env=env, check=False)
    assert not check or r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def ray_hosts(hosts):
    """`ray start --head` on h1 and `ray start --address` on h2 (their output in the shared
    folder); ended with the containers (the fixture `hosts`), never with `ray stop`."""
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("Ray is not installed here: pip install 'gptrain[ray]' (`make test` does)")
    shared = hosts.shared_dir
    address = f"{hosts.ips[0]}:{RAY_PORT}"
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats", "--block"]
    starts = [(0, ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]), (1, [f"--address={address}"])]
    for i, args in starts:
        log = shared / f"ray-h{i + 1}.log"
        line = " ".join([RAY, "start", *args, f"--node-ip-address={hosts.ips[i]}", *common])
        hosts.exec(i, ["sh", "-c", f"exec {line} > {log} 2>&1"], env=node_env(), detach=True)
        deadline = time.time() + 120
        while b"Ray runtime started" not in (log.read_bytes() if log.exists() else b""):
            if time.time() > deadline:
                raise RuntimeError(f"ray start on h{i + 1} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
    hosts.ray_address = address
    return hosts


@pytest.fixture(scope="module")
def slurm_hosts(hosts):
    """A real Slurm on the hosts (tests/hosts/slurm_hosts.py): slurmctld on h1, slurmd h1 and h2."""
    from tests.hosts.slurm_hosts import HostsCluster
    from tests.slurm.cluster import Unavailable

    cluster = HostsCluster(hosts, hosts.shared_dir / "slurm", extra="SlurmdTimeout=10\n")
    try:
        cluster.start()
    except Unavailable as e:
        pytest.skip(f"no Slurm on the podman hosts: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()
