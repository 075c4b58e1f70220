"""A real Slurm for the tests: munged + slurmctld + two slurmd (node1, node2), on one host
(or on several: tests/hosts/slurm_hosts.py).

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
    """`Cluster(root)`: the daemons on this machine, its two nodes node1 and node2 at 127.0.0.1.

    Other hosts (tests/hosts/slurm_hosts.py) give `ctld` (hostname, address), `nodes` [(name,
    hostname, address)] and a `munge_run` folder private to each host (each host runs its own
    munged with the shared key), and override `on` and `_spawn`, which run a command on a host;
    `extra`: more slurm.conf lines.
    """

    def __init__(self, root: Path, ctld: tuple[str, str] | None = None,
                 nodes: list[tuple[str, str, str]] | None = None, munge_run: Path | None = None,
                 extra: str = "", cred_expire: int | None = 15):
        self.root = root
        # Slurm holds a requeued job PENDING (BeginTime) for cred_expire + 1 s, 120 s by default;
        # 15 s keeps the requeue tests' wait short on the same path. None: Slurm's default.
        self.cred_expire = cred_expire
        host = socket.gethostname()
        self.ctld = ctld or (host, "127.0.0.1")
        self.nodes = nodes or [("node1", host, "127.0.0.1"), ("node2", host, "127.0.0.1")]
        self.munge_run = munge_run or root / "munge"
        self.extra = extra  # more slurm.conf lines
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        r = self.root
        for d in ("state", "log", "munge", *(f"spool-{n}" for n, _, _ in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        ctld, slurmd = _free_port(), _free_port()
        nodes = "".join(f"NodeName={name} NodeHostname={host} NodeAddr={addr} Port={_free_port()} "
                        "CPUs=2 State=UNKNOWN\n" for name, host, addr in self.nodes)
        self.conf.write_text(f"""ClusterName=gptrain-test
SlurmctldHost={self.ctld[0]}({self.ctld[1]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_run}/munge.socket{f",cred_expire={self.cred_expire}" if self.cred_expire else ""}
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
{self.extra}{nodes}PartitionName=debug Nodes={",".join(n for n, _, _ in self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")

    def on(self, host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """`cmd` on the host named `host`, with SLURM_CONF (here: every host is this machine)."""
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr}")
        return r

    def _spawn(self, host: str, *cmd: str) -> None:
        """Start the daemon `cmd` on `host`, its output in log/."""
        log = open(self.root / "log" / f"{Path(cmd[0]).name}-{len(self.procs)}.out", "ab")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log,
                                           stdin=subprocess.DEVNULL, start_new_session=True))

    def start(self) -> None:
        ensure_installed()
        self.write_config()
        key = self.root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o400)
        hosts = list(dict.fromkeys([self.ctld[0], *(h for _, h, _ in self.nodes)]))
        for h in hosts:  # one munged per host, all with the same key
            self.start_munged(h)
        self._spawn(self.ctld[0], "slurmctld", "-D", "-i", "-f", str(self.conf))
        self._wait(lambda: self.run("sinfo", check=False).returncode == 0, "slurmctld")
        for name, h, _ in self.nodes:
            self.start_slurmd(name, h)
        n = len(self.nodes)
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%D %t").stdout.split() == [str(n), "idle"],
                   f"{n} idle nodes")

    def start_munged(self, h: str) -> None:
        """The munge daemon of host `h`, with the cluster's key."""
        key, run = self.root / "munge" / "munge.key", self.munge_run
        self.on(h, "mkdir", "-p", str(run))
        self.on(h, "rm", "-f", f"{run}/munge.socket")  # (a host that came back may keep its old one)
        self._spawn(h, "munged", "--foreground", "--force", f"--key-file={key}",
                    f"--socket={run}/munge.socket", f"--pid-file={run}/munged.pid",
                    f"--seed-file={run}/munge.seed", f"--log-file={self.root}/log/munged-{h}.log")
        self._wait(lambda: self.on(h, "test", "-S", f"{run}/munge.socket", check=False).returncode == 0,
                   f"munged on {h}")

    def start_slurmd(self, name: str, h: str) -> None:
        self._spawn(h, "slurmd", "-D", "-f", str(self.conf), "-N", name)

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command on the controller's host."""
        return self.on(self.ctld[0], *cmd, check=check)

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
