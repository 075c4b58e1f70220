"""The detached process that owns one local job from queued to its end.

    python -m gptrain.jobs.supervisor NAME      (started by `gptrain run`, in its own session)

queued -> (slots free, first in submission order) starting -> running -> succeeded | failed |
stopped, with restarting in between when an attempt fails and restarts are left. nodes > 1
runs one torchrun agent per node on this machine, joined by c10d rendezvous, to exercise the
multi-node path. SIGTERM (from `gptrain stop`) is passed to the workers, which save a
checkpoint and exit; after the stop timeout the whole process tree is killed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

from gptrain.jobs import launch, local, procs, secrets, store
from gptrain.jobs.logs import NO_SPACE, failed_rank, failure_summary, mentions_no_space
from gptrain.jobs.reconcile import reconcile
from gptrain.jobs.spec import JobSpec

POLL_S = 0.5
SYNC_EVERY_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        self.run_id = uuid.uuid4().hex
        self.failed_node: int | None = None  # the node whose agent exited in error first

    # ---- slots -------------------------------------------------------------------------------

    def wait_for_slots(self) -> list[int] | None:
        """Block until this job is first in line and its slots are free; None if stopped (or
        ended meanwhile). Jobs whose supervisor died are reconciled first, freeing their slots."""
        kind, total = local.local_slots()
        need = self.spec.nodes * self.spec.accels
        while not self._stop_asked():
            reconcile(skip=self.name)
            slots = store.claim_slots(self.name, kind, total, need)
            if slots != []:
                return slots
            time.sleep(POLL_S)
        return None

    def _stop_asked(self) -> bool:
        """A SIGTERM, or a stop request written before this supervisor could be signalled."""
        if not self.stop_requested and launch.stop_request(self.dir).exists():
            self.stop_requested = True
        return self.stop_requested

    # ---- one attempt -------------------------------------------------------------------------

    def launch(self, attempt: int, slots: list[int]) -> None:
        spec, logs = self.spec, self.dir / "logs"
        kind, _ = local.local_slots()
        env = {**os.environ, **spec.env, **secrets.load(self.name), **launch.job_env(spec, self.dir),
               "GPTRAIN_ATTEMPT": str(attempt)}
        env[procs.RUN_ID_ENV] = self.run_id  # every process of the job carries it (reconcile.py)
        launch.prepare_dirs(spec, self.dir)
        port = free_port()
        self.agents, self.failed_node = [], None
        for node in range(spec.nodes):
            node_env = dict(env)
            mine = slots[node * spec.accels:(node + 1) * spec.accels]
            if kind == "gpu":
                node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, mine))
            elif "OMP_NUM_THREADS" not in spec.env:
                node_env["OMP_NUM_THREADS"] = "1"  # one core per CPU slot
            if launch.under_torchrun(spec):
                torchrun = launch.torchrun_args(spec, nnodes=spec.nodes, endpoint=f"127.0.0.1:{port}",
                                                rdzv_id=f"{self.name}-{attempt}", is_host=int(node == 0))
            else:  # a command: once per node, told where to meet (launch.RENDEZVOUS_VARS)
                torchrun = []
                node_env.update(launch.rendezvous_env(spec.nodes, node, spec.accels, "127.0.0.1", port))
            cmd = launch.node_command(spec, self.dir, torchrun)
            out = open(logs / f"agent-node{node}.log", "ab")
            out.write(f"--- gptrain: attempt {attempt}, node {node}: {' '.join(cmd)}\n".encode())
            out.flush()
            # the agent dies with this supervisor, and its workers with it (jobs/rank_log.py)
            self.agents.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                env=node_env, cwd=launch.workdir(spec, self.dir),
                                                start_new_session=True, preexec_fn=procs.parent_preexec()))

    def wait(self) -> int:
        """Watch the agents until all exit; returns the attempt's exit code (first failure)."""
        stop_deadline = None
        while True:
            codes = [a.poll() for a in self.agents]
            if self.failed_node is None:
                self.failed_node = next((n for n, c in enumerate(codes) if c not in (None, 0)), None)
            if all(c is not None for c in codes):
                return next((c for c in codes if c != 0), 0)
            if any(c not in (None, 0) for c in codes) and stop_deadline is None:
                stop_deadline = time.time() + 30  # a failed node: give the others 30 s to notice
            if self._stop_asked():
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
        return launch.stop_timeout(self.dir)

    def _signal_workers(self, sig) -> None:
        """The workers are the children of each torchrun agent: signal them, not the agent, so
        they can save and exit 0 while the agent simply sees them finish. A command entrypoint
        is itself the worker of its node: it is signalled (and passes it on to its own)."""
        pids = procs.children({a.pid for a in self.agents}) if launch.under_torchrun(self.spec) \
            else {a.pid for a in self.agents if a.poll() is None}
        for pid in pids:
            if pid not in self.signaled:
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
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked by start_supervisor
        if not store.record_supervisor(self.name, procs.identity(os.getpid()), self.run_id):
            return  # ended, or taken over by another supervisor, before this one started
        slots = self.wait_for_slots()
        if slots is None:
            if store.get_job(self.name)["state"] == "queued":
                store.set_state(self.name, "stopped", "stopped while queued")
            return
        attempt = self.job["restarts"]  # > 0 when this supervisor took over from a dead one
        while True:
            self.launch(attempt, slots)
            store.set_state(self.name, "running", f"attempt {attempt}: {self.spec.nodes} node(s) x "
                            f"{self.spec.accels} process(es)")
            code = self.wait()
            procs.kill_run(self.run_id)  # nothing of this attempt outlives it (workers' children)
            self.sync_checkpoints()
            if self.stop_requested:
                store.set_state(self.name, "stopped", "stopped on request", exit_code=code)
                return
            if code == 0:
                store.set_state(self.name, "succeeded", exit_code=0)
                return
            error = failure_summary(self.dir / "logs", code, self.failed_node)
            final = self.no_restart_reason(code, error)
            if final is None and attempt < self.spec.max_restarts:
                attempt += 1
                store.set_state(self.name, "restarting", f"attempt {attempt - 1} failed ({error}); "
                                f"restart {attempt} of {self.spec.max_restarts}", restarts=attempt)
                continue
            store.set_state(self.name, "failed", final or error, exit_code=code, error=final or error)
            return

    def no_restart_reason(self, code: int, error: str) -> str | None:
        """Why a restart would fail the same way (a full disk, a user error), or None."""
        logs = self.dir / "logs"
        full = local.full_disk_of(self.name)
        if full is None and (NO_SPACE in error.lower() or mentions_no_space(logs)):
            full = f"{NO_SPACE} on the disk holding {self.dir}"
        if full:
            return f"{full}; free some space, then `gptrain resume {self.name}` ({error})"
        if failed_rank(logs, code)[1] == 2:
            return f"{error} (a user error: not restarted; fix it and submit again)"
        return None

    def _on_sigterm(self, signum, frame) -> None:
        self.stop_requested = True  # acted on (and recorded) by the polling loops


def _killpg(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main() -> None:
    os.umask(0o077)  # the job's files (logs, checkpoints) are the user's alone, as in the CLI
    sup = Supervisor(sys.argv[1])
    try:
        sup.run()
    except Exception as e:  # record the last word; the reconciler covers a supervisor that cannot
        for a in sup.agents:
            _killpg(a.pid, signal.SIGKILL)
        why = secrets.masked(sup.name, f"the supervisor failed: {e!r}")  # repr: its escaped forms too
        store.set_state(sup.name, "failed", why, error=why)
        raise


if __name__ == "__main__":
    main()
