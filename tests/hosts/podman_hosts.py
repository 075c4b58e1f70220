"""N hosts with their own address and hostname, made from podman containers, for the tests.

Each host is a container on a bridge network of its own (its own /24 subnet), with a fixed
address, a hostname (h1, h2, ...) and every other host's name in its /etc/hosts (`--add-host`:
there is no DNS plugin here). Its root is this machine's own filesystem as an overlay
(`--rootfs /:O`: the same Python, torch, Ray and gptrain at the same paths, no image needed),
with the folders the hosts share (the test's GPTRAIN_HOME, like a cluster's shared filesystem)
bind-mounted at the same paths. Separate network and process namespaces: each host has its own
address, its own processes and its own loopback; killing one (`kill`) takes every process on it.

This machine (Debian 12, root, podman 4.3): crun refuses its hybrid cgroups, so `--runtime
runc`; root lacks CAP_SYS_RESOURCE, so the container ulimits are set low enough (nofile 1024,
nproc 4096). Install: apt-get install -y podman runc catatonit (`make podman` does).

Everything is cleaned up by what was started: the containers and the network this object
created, by name, never `podman rm -a` or `ray stop`.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid

RUNTIME = ["--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
CONTAINERS_CONF = ('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
                   '[engine]\nruntime = "runc"\n')


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ...: {r.stderr.strip()[-1500:]}")
    return r


def unavailable() -> str | None:
    """Why podman hosts cannot run here (one line), or None."""
    missing = [t for t in ("podman", "runc") if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install podman runc catatonit, as root)"
    if os.geteuid() != 0:
        return "podman hosts need root here (a bridge network with fixed addresses)"
    r = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        return f"podman cannot run here: {(r.stderr.strip().splitlines() or ['podman info failed'])[-1]}"
    return None


def bridge_network(name: str) -> str:
    """A bridge network NAME on a /24 no other podman network uses (tried at random); returns
    its first three octets ("10.B.C"). The caller removes it by name (`podman network rm`)."""
    err = ""
    for _ in range(8):
        subnet = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}.0/24"
        r = podman("network", "create", "--driver", "bridge", "--subnet", subnet, name, check=False)
        if r.returncode == 0:
            return subnet.rsplit(".", 1)[0]
        err = r.stderr.strip()
    raise RuntimeError(f"podman network create: {err[-500:]}")


class Hosts:
    """`Hosts(n, shared=[dirs]).start()`: containers h1..hN; `stop()` removes all it made."""

    def __init__(self, n: int, shared: list[str]):
        self.n, self.shared = n, [str(s) for s in shared]
        tag = uuid.uuid4().hex[:8]
        self.net = f"gptrain-hosts-{tag}"
        self.names = [f"gptrain-{tag}-h{i + 1}" for i in range(n)]
        self.hostnames = [f"h{i + 1}" for i in range(n)]
        self.ips: list[str] = []
        self.made: list[str] = []  # containers this object created (removed by stop)
        self.net_made = False

    def start(self) -> "Hosts":
        try:
            self._network()
            adds = [f"--add-host={h}:{ip}" for h, ip in zip(self.hostnames, self.ips)]
            mounts = [a for s in self.shared for a in ("-v", f"{s}:{s}")]
            for name, host, ip in zip(self.names, self.hostnames, self.ips):
                self.made.append(name)
                podman(*RUNTIME, "run", "-d", "--name", name, "--network", self.net, "--ip", ip,
                       "--hostname", host, *adds, *ULIMITS, "--shm-size=256m", *mounts,
                       "--rootfs", "/:O", "sleep", "infinity")
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        base = bridge_network(self.net)
        self.net_made = True
        self.ips = [f"{base}.{11 + i}" for i in range(self.n)]

    def exec(self, i: int, cmd: list[str], env: dict | None = None, detach: bool = False,
             check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run `cmd` on host i (0-based) with `env` on top of the container's environment."""
        envs = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        return podman("exec", *(["-d"] if detach else []), *envs, self.names[i], *cmd,
                      check=check, timeout=timeout)

    def kill(self, i: int) -> None:
        """The host dies: SIGKILL to everything in it (its network address goes with it)."""
        podman("kill", "--signal", "KILL", self.names[i], check=False)

    def revive(self, i: int) -> None:
        """A killed host comes back: the same container started again (its name, address and
        hostname), with none of its processes (they start as on a rebooted machine)."""
        podman("start", self.names[i])

    def stop(self) -> None:
        for name in self.made:
            podman("rm", "-f", "-t", "0", name, check=False)
        self.made = []
        if self.net_made:
            podman("network", "rm", "-f", self.net, check=False)
            self.net_made = False
