"""The detached process that owns one local job from queued to its end.

    python -m gptrain.jobs.supervisor NAME      (started by `gptrain run`, in its own session)

queued -> (slots free, first in submission order) starting -> running -> succeeded | failed |
stopped, with restarting in between when an attempt fails and restarts are left. nodes > 1
runs one torchrun agent per node on this machine, joined by c10d rendezvous, to exercise the
multi-node path. SIGTERM (from `gptrain stop`) is passed to the workers, which save a
checkpoint and exit; after the stop timeout the whole process tree is killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gptrain.jobs import local, secrets, store
from gptrain.jobs.logs import failure_summary
from gptrain.jobs.spec import JobSpec

POLL_S = 0.5
SYNC_EVERY_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dataset_env(spec: JobSpec) -> dict:
    """GPTRAIN_DATASET_DIR (the first dataset) and GPTRAIN_DATASET_<NAME>_DIR for each."""
    from gptrain.data.store import path_of

    env = {}
    for i, name in enumerate(spec.datasets):
        path = str(path_of(name))
        if i == 0:
            env["GPTRAIN_DATASET_DIR"] = path
        env[f"GPTRAIN_DATASET_{re.sub(r'[^A-Z0-9]', '_', name.upper())}_DIR"] = path
    return env


def entry_command(spec: JobSpec, jdir: Path) -> list[str]:
    """What every worker runs: the built-in trainer (output in the job dir) or the user's script.
    It reads the job's config from jdir (see write_config); nothing is written here."""
    if spec.script:
        return [sys.executable, spec.script, *spec.args]
    cmd = [sys.executable, "-m", "gptrain", "train"]
    if spec.config is not None:
        cmd.append(str(jdir / SUBMITTED_CONFIG))
    if spec.datasets:
        cmd.append(f"--data.path={spec.datasets[0]}")
    return [*cmd, *spec.args, f"--train.output_dir={jdir}"]


SUBMITTED_CONFIG = "submitted-config.toml"


def write_config(spec: JobSpec, jdir: Path) -> None:
    """The job's trainer config, where entry_command points the trainer at it."""
    if spec.config is not None and not spec.script:
        (jdir / SUBMITTED_CONFIG).write_text(spec.config)


class Supervisor:
    def __init__(self, name: str):
        self.name = name
        self.job = store.get_job(name)
        self.spec = JobSpec.from_dict(self.job["spec"])
        self.dir = local.job_dir(name)
        self.stop_requested = False
        self.agents: list[subprocess.Popen] = []
        self.signaled: set[int] = set()  # workers already asked to stop (once each)
        self.last_sync = 0.0

    # ---- slots -------------------------------------------------------------------------------

    def wait_for_slots(self) -> list[int] | None:
        """Block until this job is first in line and its slots are free; None if stopped."""
        kind, total = local.local_slots()
        need = self.spec.nodes * self.spec.accels
        while not self.stop_requested:
            with store.transaction() as conn:
                rows = [dict(r) for r in conn.execute(
                    "SELECT name, seq, state, slots, supervisor_pid FROM jobs WHERE scheduler = 'local' "
                    f"AND state IN ({','.join('?' * len(store.ACTIVE))}) ORDER BY seq", store.ACTIVE)]
                self._reap_orphans(conn, rows)
                used = {s for r in rows if r["state"] != "queued" and r["slots"] for s in json.loads(r["slots"])}
                queued = [r for r in rows if r["state"] == "queued"]
                if queued and queued[0]["name"] == self.name:
                    free = [i for i in range(total) if i not in used]
                    if len(free) >= need:
                        slots = free[:need]
                        conn.execute("UPDATE jobs SET state = 'starting', slots = ?, updated = ? "
                                     "WHERE name = ?", (json.dumps(slots), time.time(), self.name))
                        store.add_event(conn, self.name, "starting", f"{kind} slots {slots}")
                        return slots
            time.sleep(POLL_S)
        return None

    def _reap_orphans(self, conn, rows) -> None:
        """Jobs whose supervisor died without a last word: mark them failed, free their slots."""
        for r in rows:
            if r["name"] != self.name and r["supervisor_pid"] and not local.pid_alive(r["supervisor_pid"]):
                conn.execute("UPDATE jobs SET state = 'failed', error = ?, ended = ?, updated = ? "
                             "WHERE name = ?", ("its supervisor exited unexpectedly", time.time(),
                                                time.time(), r["name"]))
                store.add_event(conn, r["name"], "failed", "its supervisor exited unexpectedly")
                r["state"] = "failed"
        rows[:] = [r for r in rows if r["state"] != "failed"]

    # ---- one attempt -------------------------------------------------------------------------

    def launch(self, attempt: int, slots: list[int]) -> None:
        spec, logs = self.spec, self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        kind, _ = local.local_slots()
        env = {**os.environ, **spec.env, **secrets.load(self.name), **dataset_env(spec), "GPTRAIN_JOB": self.name,
               "GPTRAIN_ATTEMPT": str(attempt), "GPTRAIN_OUTPUT_DIR": str(self.dir),
               "GPTRAIN_CHECKPOINT_DIR": str(self.dir / "checkpoints"), "PYTHONUNBUFFERED": "1"}
        (self.dir / "checkpoints").mkdir(exist_ok=True)
        write_config(spec, self.dir)
        entry = entry_command(spec, self.dir)
        port = free_port()
        self.agents = []
        for node in range(spec.nodes):
            node_env = dict(env)
            mine = slots[node * spec.accels:(node + 1) * spec.accels]
            if kind == "gpu":
                node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, mine))
            elif "OMP_NUM_THREADS" not in spec.env:
                node_env["OMP_NUM_THREADS"] = "1"  # one core per CPU slot
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={spec.accels}",
                   "--max-restarts=0"]
            if spec.nodes == 1:
                cmd.append("--standalone")
            else:
                cmd += [f"--nnodes={spec.nodes}", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={self.name}-{attempt}",
                        f"--rdzv-conf=is_host={1 if node == 0 else 0}"]
            cmd += ["-m", "gptrain.jobs.rank_log", str(logs), "--", *entry]
            out = open(logs / f"agent-node{node}.log", "ab")
            out.write(f"--- gptrain: attempt {attempt}, node {node}: {' '.join(cmd)}\n".encode())
            out.flush()
            self.agents.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                env=node_env, cwd=self.dir, start_new_session=True))

    def wait(self) -> int:
        """Watch the agents until all exit; returns the attempt's exit code (first failure)."""
        stop_deadline = None
        while True:
            codes = [a.poll() for a in self.agents]
            if all(c is not None for c in codes):
                return next((c for c in codes if c != 0), 0)
            if any(c not in (None, 0) for c in codes) and stop_deadline is None:
                stop_deadline = time.time() + 30  # a failed node: give the others 30 s to notice
            if self.stop_requested:
                if stop_deadline is None:
                    store.set_state(self.name, "stopping", "stop requested: workers save a checkpoint and exit")
                    stop_deadline = time.time() + self._stop_timeout()
                self._signal_workers(signal.SIGTERM)  # each poll: a worker may just be starting
            if stop_deadline is not None and time.time() > stop_deadline:
                for a in self.agents:
                    _killpg(a.pid, signal.SIGKILL)
            if time.time() - self.last_sync > SYNC_EVERY_S:
                self.sync_checkpoints()
            time.sleep(POLL_S)

    def _stop_timeout(self) -> float:
        try:
            return float(json.loads((self.dir / "stop-request").read_text())["timeout"])
        except (OSError, ValueError, KeyError):
            return 120.0

    def _signal_workers(self, sig) -> None:
        """The workers are the children of each torchrun agent: signal them, not the agent, so
        they can save and exit 0 while the agent simply sees them finish."""
        agent_pids = {a.pid for a in self.agents}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            pid = int(stat.parent.name)
            if int(fields[1]) in agent_pids and pid not in self.signaled:
                self.signaled.add(pid)
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def sync_checkpoints(self) -> None:
        self.last_sync = time.time()
        store.sync_checkpoints(self.name, local.scan_checkpoints(self.name))

    # ---- the whole life ----------------------------------------------------------------------

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        store.update(self.name, supervisor_pid=os.getpid())
        slots = self.wait_for_slots()
        if slots is None:
            store.set_state(self.name, "stopped", "stopped while queued")
            return
        attempt = 0
        while True:
            self.launch(attempt, slots)
            store.set_state(self.name, "running", f"attempt {attempt}: {self.spec.nodes} node(s) x "
                            f"{self.spec.accels} process(es)")
            code = self.wait()
            self.sync_checkpoints()
            if self.stop_requested:
                store.set_state(self.name, "stopped", "stopped on request", exit_code=code)
                return
            if code == 0:
                store.set_state(self.name, "succeeded", exit_code=0)
                return
            error = failure_summary(self.dir / "logs", code)
            if attempt < self.spec.max_restarts:
                attempt += 1
                store.set_state(self.name, "restarting", f"attempt {attempt - 1} failed ({error}); "
                                f"restart {attempt} of {self.spec.max_restarts}", restarts=attempt)
                continue
            store.set_state(self.name, "failed", error, exit_code=code, error=error)
            return

    def _on_sigterm(self, signum, frame) -> None:
        self.stop_requested = True  # acted on (and recorded) by the polling loops


def _killpg(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main() -> None:
    os.umask(0o077)  # the job's files (logs, checkpoints) are the user's alone, as in the CLI
    Supervisor(sys.argv[1]).run()


if __name__ == "__main__":
    main()
