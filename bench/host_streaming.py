"""A multi-host job from a URL against the same job from local files (issue #36), on real hosts.

    python bench/host_streaming.py [--hosts 2 4] [--rounds 2] [--epochs 1] [--shard-tokens 16800]
                                    [--model-arg=--model.n_embd=64 ...]

Needs root, podman, runc and Slurm (what tests/hosts needs: `make podman`, tests/slurm's
packages). Starts max(--hosts) podman hosts (tests/hosts/podman_hosts.py: own address, own disk)
with a real Slurm on them (slurmctld on h1, a slurmd on each), prepares a char dataset of 4.4M
tokens in ~260 shards (tests/helpers.streaming_dataset), and puts it (a) in the
hosts' shared folder and (b) behind a real HTTP server on the hosts' gateway that counts the
bytes it sends to each host. For each number of hosts and each round, alternating, one
`gptrain run --scheduler slurm --nodes H` job of a tiny model (fp32, global batch 256 blocks of
128 tokens, 64 per rank and micro-step) for --epochs epochs from (a) and one from (b), each URL job with its own
cache folder in each host's /tmp. Per job: steps/s from step 20 to the end (rank 0's logged step
times) and, for the URL jobs, the bytes fetched by all hosts / the bytes trained on. Prints each
side's median steps/s and their ratio (URL / local) per number of hosts, and each round's ratio
(the sides alternate which goes first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from gptrain import run_layout  # noqa: E402
from gptrain.data.formats import read_meta  # noqa: E402
from tests.byte_counting import ByteCountingServer  # noqa: E402
from tests.helpers import streaming_dataset  # noqa: E402
from tests.hosts.conftest import gptrain_on_h1  # noqa: E402
from tests.hosts.podman_hosts import Hosts, unavailable  # noqa: E402
from tests.hosts.slurm_hosts import HostsCluster  # noqa: E402

T, GLOBAL, PER_RANK, SKIP = 128, 256, 64, 10
MODEL = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", f"--model.block_size={T}",
         "--train.lr=1e-3", "--train.warmup_steps=2", "--metrics.log_every=1", "--report_to=none",
         "--train.precision=fp32", "--train.do_eval=false", "--checkpoint.every=100000", "--train.seed=1",
         f"--train.global_batch_size={GLOBAL}", f"--train.batch_size={PER_RANK}"]


def run_job(cluster, home, name: str, nodes: int, steps: int, data: list[str], extra: list[str]) -> float:
    """One job to its end; its steps/s from step SKIP on (rank 0's logged times)."""
    env = {"SLURM_CONF": str(cluster.conf)}
    gptrain_on_h1(cluster.hosts, home, "run", name, "--scheduler", "slurm", "--nodes", nodes, "--accels", 1,
                  "--", *MODEL, f"--train.max_steps={steps}", *data, *extra, env=env)
    while True:
        report = json.loads(gptrain_on_h1(cluster.hosts, home, "inspect", name, "--json", env=env).stdout)
        if report["job"]["state"] in ("succeeded", "failed", "stopped"):
            break
        time.sleep(1)
    if report["job"]["state"] != "succeeded":
        raise SystemExit(f"job {name} {report['job']['state']}: {report['events'][-1]['message']}")
    rows = [json.loads(line) for line in run_layout.metrics_file(home / "jobs" / name).read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if "train/loss" in r}
    return (steps - SKIP) / (times[steps] - times[SKIP])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--shard-tokens", type=int, default=16800,
                    help="tokens a shard (default: ~260 shards, a shard a step on each host, the data side at its "
                         "heaviest; 262144: ~17 shards, one every ~16 steps on each of 2 hosts)")
    ap.add_argument("--model-arg", action="append", default=[], help="one more trainer flag (repeat)")
    args = ap.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"no podman hosts: {why}")
    work = Path(tempfile.mkdtemp(prefix="host-streaming-"))
    shared = work / "shared"
    shared.mkdir()
    blocks = streaming_dataset(shared / "ds", args.shard_tokens) // T
    files = read_meta(shared / "ds")["splits"]["train"]["files"]
    steps = int(args.epochs * blocks // GLOBAL)
    print(f"dataset: {len(files)} train shards, {blocks:,} blocks of {T} tokens; {steps} steps of {GLOBAL} blocks per job")
    hosts = Hosts(max(args.hosts), shared=[shared])
    hosts.shared_dir = shared
    hosts.start()
    cluster = HostsCluster(hosts, shared / "slurm")
    server = None
    try:
        cluster.start()
        server = ByteCountingServer(shared, host=hosts.ips[0].rsplit(".", 1)[0] + ".1")
        home = shared / "home"
        trained = steps * GLOBAL * T * 2
        for n in args.hosts:
            rates = {"local": [], "url": []}
            ratios = []
            for r in range(args.rounds):
                for side in ("local", "url") if r % 2 == 0 else ("url", "local"):  # (no side always first)
                    name = f"{side}-{n}-{r}"
                    if side == "local":
                        data = [f"--data.path={shared / 'ds'}"]
                    else:
                        data = [f"--data.path={server.url}/ds", f"--data.cache_dir=/tmp/cache-{name}"]
                    before = server.sent
                    rates[side].append(run_job(cluster, home, name, n, steps, data, args.model_arg))
                    line = f"{n} hosts, round {r}, {side:5}: {rates[side][-1]:.2f} steps/s"
                    if side == "url":
                        ratios.append((server.sent - before) / trained)
                        line += f", fetched / trained {ratios[-1]:.3f}"
                    print(line, flush=True)
            local, url = statistics.median(rates["local"]), statistics.median(rates["url"])
            paired = [u / lo for u, lo in zip(rates["url"], rates["local"])]
            print(f"== {n} hosts: local files {local:.2f} steps/s, URL {url:.2f} steps/s, "
                  f"URL / local {url / local:.3f}; each round's URL / local {[round(p, 3) for p in paired]} "
                  f"(median {statistics.median(paired):.3f}); fetched / trained {statistics.median(ratios):.3f} "
                  f"(median of {args.rounds})", flush=True)
    finally:
        if server is not None:
            server.close()
        cluster.stop()
        hosts.stop()


if __name__ == "__main__":
    main()
