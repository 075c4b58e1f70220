"""A real single-host Slurm for the tests: munged + slurmctld + two slurmd (node1, node2).

Installs Debian's slurmctld/slurmd/slurm-client/munge when they are missing and we are root
(CI is), writes a private slurm.conf with free ports and its own munge socket, starts the
daemons, waits for both nodes to be idle, and stops everything afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]


class Unavailable(Exception):
    pass


def ensure_installed() -> None:
    if all(shutil.which(t) for t in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("Slurm is not installed and this is not a root Debian machine to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise Unavailable(f"{' '.join(cmd)} failed: {r.stderr[-500:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        r = self.root
        host = socket.gethostname()
        for d in ("state", "log", "spool-node1", "spool-node2", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        ctld, slurmd, n1, n2 = (_free_port() for _ in range(4))
        self.conf.write_text(f"""ClusterName=gptrain-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket
SlurmctldPort={ctld}
SlurmdPort={slurmd}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
InactiveLimit=0
MinJobAge=300
KillWait=30
NodeName=node1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1} CPUs=2 State=UNKNOWN
NodeName=node2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, *cmd: str) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}-{len(self.procs)}.out", "ab")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log,
                                           stdin=subprocess.DEVNULL, start_new_session=True))

    def start(self) -> None:
        ensure_installed()
        self.write_config()
        key = self.root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o400)
        self._spawn("munged", "--foreground", "--force", f"--key-file={key}",
                    f"--socket={self.root}/munge/munge.socket", f"--pid-file={self.root}/munge/munged.pid",
                    f"--seed-file={self.root}/munge/munge.seed", f"--log-file={self.root}/log/munged.log")
        self._wait(lambda: (self.root / "munge" / "munge.socket").exists(), "munged")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._wait(lambda: self.run("sinfo", check=False).returncode == 0, "slurmctld")
        for node in ("node1", "node2"):
            self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", node)
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.split() == ["idle"], "two idle nodes")

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr}")
        return r

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if ready():
                    return
            except (RuntimeError, OSError):
                pass
            time.sleep(0.3)
        logs = "\n".join(p.read_text()[-800:] for p in (self.root / "log").glob("*"))
        raise RuntimeError(f"Slurm test cluster: {what} did not come up in {timeout}s\n{logs}")

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root", check=False)
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
