"""Each host of a multi-host job fetches only its share of a dataset at a URL (issue #36), on real
separate hosts: four podman containers h1..h4 (tests/hosts/podman_hosts.py), each with its own
disk (the overlay root) and so its own shard cache (gptrain's default, in the host's /tmp), a
real Slurm on them (slurmctld on h1, a slurmd on each), and the dataset served by a real HTTP
server on this machine (the bridge's gateway address) that counts the bytes it sends to each host.

- a 2-host and a 4-host job train an epoch from the URL: all hosts together fetch at most 1.1x
  the bytes the job trained on (every host fetched all of it before: ~Nx), each host about 1/N;
- a 4-host job stopped mid-run and resumed on 2 hosts (`gptrain resume NAME --nodes 2`): every
  step after the resume trains on the blocks of the uninterrupted run (its loss equals that
  run's at each step, fp32, fixed seed: other blocks would move it by
  ~1e-3), the checkpoint resharded to the new world; and a 2-host one resumed on 4 is re-partitioned
  there, one partition per host (data/host_shares.py; it says so). Both fetch <= 1.1x the bytes
  trained on (2 -> 4 fetched 3.1x before the re-partition: 4 hosts took every world-th block of 2).
"""

import json
import re
import time

import numpy as np
import pytest

from gptrain.jobs import folder
from gptrain.jobs.logs import rank_log
from tests.helpers import TINY, losses, streaming_dataset
from tests.hosts.conftest import gptrain_on_h1, started_hosts

pytestmark = pytest.mark.slow
T, GLOBAL, PER_RANK = 128, 256, 64  # block, global batch (blocks), batch per rank and micro-step
EPOCHS = 1
REF = {}  # name -> the uninterrupted run's folder, the reference of the resumed ones


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Slurm on four podman hosts sharing one folder (their GPTRAIN_HOME lives there)."""
    from tests.hosts.slurm_hosts import HostsCluster
    from tests.slurm.cluster import Unavailable

    with started_hosts(tmp_path_factory, 4) as hosts:
        c = HostsCluster(hosts, hosts.shared_dir / "slurm")
        try:
            try:
                c.start()
            except Unavailable as e:
                pytest.skip(f"no Slurm on the podman hosts: {e}")
            yield c
        finally:
            c.stop()


@pytest.fixture(scope="module")
def served(cluster, serve):
    """(URL of a dataset of ~260 train shards (tests/helpers.streaming_dataset), its train
    split's blocks, the server), served on the hosts' gateway: what each host fetched is
    by_client[its address]."""
    made = {}
    gateway = cluster.hosts.ips[0].rsplit(".", 1)[0] + ".1"
    _, server = serve(lambda root: made.update(tokens=streaming_dataset(root / "ds")), host=gateway)
    return f"{server.url}/ds", made["tokens"] // T, server


@pytest.fixture(scope="module")
def home(cluster):
    return cluster.hosts.shared_dir / "home"


def gptrain(cluster, home, *args):
    return gptrain_on_h1(cluster.hosts, home, *args, env={"SLURM_CONF": str(cluster.conf)}).stdout


def state(cluster, home, name) -> str:
    return json.loads(gptrain(cluster, home, "inspect", name, "--json"))["job"]["state"]


def until(cluster, home, name, states=("succeeded", "failed", "stopped"), timeout=300) -> str:
    deadline = time.time() + timeout
    while (s := state(cluster, home, name)) not in states:
        assert time.time() < deadline, f"{name} still {s} after {timeout} s"
        time.sleep(1)
    return s


def submit(cluster, home, served, name: str, nodes: int, steps: int) -> None:
    url = served[0]
    gptrain(cluster, home, "run", name, "--scheduler", "slurm", "--nodes", nodes, "--accels", 1, "--",
            *TINY, f"--model.block_size={T}", f"--data.path={url}", f"--train.max_steps={steps}", f"--train.global_batch_size={GLOBAL}",
            f"--train.batch_size={PER_RANK}", "--train.do_eval=false", "--checkpoint.every=1000", "--train.seed=1",
            f"--data.cache_dir=/tmp/cache-{name}")  # (each host's own disk; a job's own, so no job reads
    # another's shards: a host's default cache is kept across jobs, and would hide what each fetches)


def logs_of(jdir) -> str:
    return "".join(p.read_text(errors="replace")[-3000:] for p in sorted(folder.logs_dir(jdir).glob("*")))


def fetched(server, cluster, since) -> list[int]:
    """Each host's bytes fetched since the counts `since` (a copy of by_client)."""
    return [server.by_client[ip] - since.get(ip, 0) for ip in cluster.hosts.ips]


def rank0(jdir) -> str:
    path = rank_log(folder.logs_dir(jdir), 0)
    return path.read_text(errors="replace") if path.is_file() else ""


def worlds(jdir) -> list[str]:
    """The world of each start of the job, as rank 0's log header says it."""
    text = rank0(jdir)
    return [line.split(", world ")[1].split(",")[0] for line in text.splitlines()
            if line.startswith("--- gptrain:") and ", world " in line]


@pytest.mark.parametrize("nodes", [2, 4])
def test_each_host_fetches_its_share_of_a_url(cluster, served, home, nodes):
    url, blocks, server = served
    steps = EPOCHS * blocks // GLOBAL
    name = f"stream{nodes}"
    since = dict(server.by_client)
    t0 = time.time()
    submit(cluster, home, served, name, nodes, steps)
    jdir = home / "jobs" / name
    assert until(cluster, home, name) == "succeeded", logs_of(jdir)
    took = time.time() - t0
    got, trained = fetched(server, cluster, since), steps * GLOBAL * T * 2
    used = [g for g in got if g]
    print(f"{nodes} hosts, {steps} steps ({EPOCHS} epochs of {blocks} blocks) in {took:.0f} s: fetched / "
          f"trained {sum(got) / trained:.3f}; each host {[round(g / trained, 3) for g in got]}")
    assert worlds(jdir) == [str(nodes)], logs_of(jdir)
    assert len(used) == nodes, got  # each host of the job fetched (its own cache), no other did
    assert sum(got) <= 1.1 * trained, (got, trained)
    assert max(used) <= 1.25 * trained / nodes, (got, trained)  # its share, not the whole
    REF[nodes] = jdir


@pytest.mark.parametrize("before,after", [(4, 2), (2, 4)])
def test_a_job_resumed_on_other_hosts_keeps_its_data_position_and_fetches_its_share(cluster, served, home, before, after):
    if before not in REF:
        pytest.skip(f"needs the uninterrupted {before}-host run of test_each_host_fetches_its_share_of_a_url")
    url, blocks, server = served
    steps = EPOCHS * blocks // GLOBAL
    name = f"moved{before}to{after}"
    since = dict(server.by_client)
    submit(cluster, home, served, name, before, steps)
    jdir = home / "jobs" / name
    deadline = time.time() + 240
    while not re.search(r"^step\s+40/", rank0(jdir), re.M):  # mid-run
        assert time.time() < deadline and state(cluster, home, name) in ("queued", "running"), logs_of(jdir)
        time.sleep(0.2)
    gptrain(cluster, home, "stop", name, "--wait")
    assert state(cluster, home, name) == "stopped", logs_of(jdir)
    out = gptrain(cluster, home, "resume", name, "--nodes", after)
    assert f"on {after} node(s)" in out, out
    assert until(cluster, home, name) == "succeeded", logs_of(jdir)
    assert worlds(jdir) == [str(before), str(after)], logs_of(jdir)
    events = json.loads(gptrain(cluster, home, "inspect", name, "--json"))["events"]
    assert any(e["kind"] == "placed" and f"on {after} node(s)" in e["message"] and f"(was {before})" in e["message"]
               for e in events), events
    ref, got_losses = losses(REF[before]), losses(jdir)
    text = rank0(jdir)
    resumed_at = int(text.split("resumed from ")[1].split(" at step ")[1].split()[0].rstrip(",;:."))
    after_steps = [s for s in sorted(ref) if s > resumed_at]
    assert len(after_steps) > 50 and set(after_steps) <= set(got_losses), (resumed_at, sorted(got_losses)[-3:])
    a = np.array([ref[s] for s in after_steps])
    b = np.array([got_losses[s] for s in after_steps])
    gap = float(np.max(np.abs(a - b) / a))
    step_to_step = float(np.median(np.abs(np.diff(a)) / a[1:]))  # what another batch moves the loss by
    got = fetched(server, cluster, since)
    trained = steps * GLOBAL * T * 2
    print(f"{before} -> {after} hosts, resumed at step {resumed_at}: each later step's loss within {gap:.1e} of "
          f"the uninterrupted run's (next batch moves it by {step_to_step:.1e}); fetched / trained "
          f"{sum(got) / trained:.3f}; each host {[round(g / trained, 3) for g in got]}")
    assert sum(got) <= 1.1 * trained, got  # each byte trained on fetched about once, either way
    if before % after == 0:  # fewer hosts: each takes whole partitions, in the uninterrupted order
        assert gap <= 1e-3 < step_to_step, (gap, step_to_step)
        assert "re-partitioned" not in text
    else:  # more hosts than partitions (2 -> 4): the documented re-partition, one partition per host
        assert f"partition(s) re-partitioned into {after}, one per host, at block {resumed_at * GLOBAL:,}" in text, text
        assert gap > step_to_step / 10  # (other batches from the resume on: the order is not the old one)
        assert abs(b[-1] - a[-1]) / a[-1] < 0.05  # the same data, the same amount: about the same loss
