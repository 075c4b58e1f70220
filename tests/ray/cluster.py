"""A real two-node Ray cluster on this machine, for the tests: a head (`ray start --head`) and a
second node joining it (`ray start --address`), each with one CPU, distinct ports, its own
temp dir, started with --block so that this process owns them. They are ended by their process
groups, never with `ray stop` (which ends every Ray process on the machine, anyone's)."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


class Cluster:
    def __init__(self):
        self.temp = tempfile.mkdtemp(prefix="gptrain-ray-", dir="/tmp")  # short: Ray's socket paths
        self.procs: list[subprocess.Popen] = []
        self.address = None

    def _start(self, args: list[str], log: str, prefix: list[str] = ()) -> None:
        out = open(os.path.join(self.temp, log), "wb")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        env.pop("RAY_ADDRESS", None)
        self.procs.append(subprocess.Popen([*prefix, RAY, "start", *args, "--block", "--disable-usage-stats"],
                                           stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=env, start_new_session=True))
        deadline = time.time() + 120
        while b"Ray runtime started" not in Path(out.name).read_bytes():
            if self.procs[-1].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"`ray start` did not start:\n{Path(out.name).read_text()[-3000:]}")
            time.sleep(0.3)

    def start(self, nodes: int = 2, prefix: list[str] = ()) -> "Cluster":
        port = free_ports(1)[0]
        self.address = f"{node_ip()}:{port}"
        common = ["--num-cpus=1", "--object-store-memory=100000000"]
        self._start(["--head", f"--port={port}", f"--temp-dir={self.temp}", "--include-dashboard=false",
                     *common], "head.log", prefix)
        for i in range(1, nodes):
            nm, om, lo = free_ports(3)
            self._start([f"--address={self.address}", f"--node-manager-port={nm}", f"--object-manager-port={om}",
                         f"--min-worker-port={lo}", f"--max-worker-port={lo + 40}", *common], f"node{i}.log")
        return self

    def pids(self) -> set[int]:
        """Every live process of this cluster: our `ray start`s and their descendants."""
        return descendants({p.pid for p in self.procs})

    def stop(self) -> None:
        """SIGKILL every process of the cluster (found before the first dies: then they are
        reparented), by process group and by pid, and reap our `ray start`s."""
        victims = self.pids() | {p.pid for p in self.procs}
        for pid in victims:
            for kill in (lambda: os.killpg(os.getpgid(pid), signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.procs:
            p.wait()
        subprocess.run(["rm", "-rf", self.temp])


def descendants(roots: set[int]) -> set[int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if stat[0] not in "ZX":
                parent[int(d)] = int(stat[1])
    found, grew = set(roots) & parent.keys(), True
    while grew:
        more = {p for p, pp in parent.items() if pp in found and p not in found}
        found |= more
        grew = bool(more)
    return found


def node_agents(cluster: Cluster) -> set[int]:
    """The cluster's live NodeAgent actors (Ray names their processes ray::NodeAgent...)."""
    out = set()
    for pid in cluster.pids():
        try:
            if b"NodeAgent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            pass
    return out
