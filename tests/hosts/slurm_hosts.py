"""The test Slurm (tests/slurm/cluster.py) on podman hosts (tests/hosts/podman_hosts.py):
slurmctld on h1, one slurmd per host (node h1 at h1's address, node h2 at h2's), a munged on
each host with the same key. Its config, key, state and logs are in the hosts' shared folder;
each munged's socket is in the host's own /tmp (the overlay root: not shared). The daemons end
with their containers (`Hosts.stop`).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from tests.hosts.podman_hosts import Hosts
from tests.slurm.cluster import Cluster


class HostsCluster(Cluster):
    def __init__(self, hosts: Hosts, root: Path, extra: str = ""):
        names, ips = hosts.hostnames, hosts.ips
        super().__init__(root, ctld=(names[0], ips[0]), nodes=[(h, h, ip) for h, ip in zip(names, ips)],
                         munge_run=Path(f"/tmp/{hosts.net}-munge"), extra=extra, cred_expire=60)
        # A requeued job waits cred_expire + 1 s (Slurm's default: 120 s; every requeue test here paid
        # it). With 15 s, slurmctld's kill of the job's first run, held for the killed host, reached the
        # rebooted host after the requeued run had started there: its step got a SIGTERM (signal 991,
        # seen at SlurmctldDebug=debug2) ~12 s after it started. 60 s leaves the returned host the time.
        self.hosts = hosts

    def on(self, host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.hosts.exec(self.hosts.hostnames.index(host), list(cmd), env={"SLURM_CONF": str(self.conf)},
                               check=check)

    def _spawn(self, host: str, *cmd: str) -> None:
        log = self.root / "log" / f"{Path(cmd[0]).name}-{host}.out"
        self.hosts.exec(self.hosts.hostnames.index(host), ["sh", "-c", f"exec {shlex.join(cmd)} >> {log} 2>&1"],
                        env={"SLURM_CONF": str(self.conf)}, detach=True)

    def host_returns(self, i: int) -> None:
        """Host i, killed, is back (`Hosts.revive`) with its munged and slurmd, as after a reboot:
        slurmctld puts its node back in service when the slurmd registers (ReturnToService=2)."""
        self.hosts.revive(i)
        host = self.hosts.hostnames[i]
        self.start_munged(host)
        for name, h, _ in self.nodes:
            if h == host:
                self.start_slurmd(name, h)

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root", check=False)  # the daemons go with the containers
