"""The detached process that owns one local job from queued to its end.

    python -m gptrain.jobs.engines.supervisor NAME      (started by `gptrain run`, in its own session)

queued -> (slots free, first in submission order) starting -> running -> succeeded | failed |
stopped, with restarting in between when an attempt fails and restarts are left. nodes > 1
runs one torchrun agent per node on this machine, joined by c10d rendezvous, to exercise the
multi-node path. SIGTERM (from `gptrain stop`) is passed to the workers, which save a
checkpoint and exit; after the stop timeout the whole process tree is killed.

A SIGTERM nobody asked for with `gptrain stop` (no stop request in the job's folder) is a
preemption, as torchrun, Slurm and Kubernetes mean it: to this supervisor, to a torchrun agent,
or to a worker (an admin, a container runtime, an OOM killer that sends TERM). The workers save
a checkpoint at the current step and exit 143; the job is `preempted` and continues from that
checkpoint by itself, spending none of its --max-restarts (those are for crashes). A run that
ended before its last step is never `succeeded`: the trainer exits 0 only when it completed. A Ray job's
supervisor (jobs/engines/ray_supervisor.py) lives the same life with its agents on the cluster: it
overrides where the agents run (placement, launch, poll, signal, kill), nothing else.

Every write carries this supervisor's owner token (its run_id, jobs/store.py): when the store
refuses one (the job was ended or taken over meanwhile), or gptrain.db is deleted or replaced
under it, the supervisor stops the job's processes the same way, says why in supervisor.log and
the agents' logs, and leaves without writing: no orphan runs on unseen, no newer record is
overwritten.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid

from gptrain import db
from gptrain.jobs import elastic, folder, found, launch, procs, resume, secrets, store
from gptrain.jobs.engines import held, local
from gptrain.jobs.logs import NO_SPACE, agent_log, failed_rank, failure_summary, mentions_no_space, signal_ended
from gptrain.jobs.reconcile import reconcile
from gptrain.jobs.spec import JobSpec
from gptrain.jobs.store import JobState

POLL_S = 0.5
SYNC_EVERY_S = 2.0
MAX_PREEMPTIONS = 100  # a job SIGTERMed this often in a row is failed (something keeps killing it)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def stopped_by_request(code: int, stop_requested: bool, entry: str) -> bool:
    """Whether an attempt that ended with `code` is `stopped`: the user asked, and it did not
    complete. The built-in trainer exits 0 only after its last step, so a stop that came as it
    ended is no stop (it is `succeeded`); a program of the user's may exit 0 when it is stopped."""
    return stop_requested and not (code == 0 and entry == "trainer")

class LostJob(Exception):
    """This supervisor no longer owns its job's record: it must stop the job and write nothing."""


class Supervisor:
    def __init__(self, name: str):
        self.name = name
        self.db = db.Pinned()  # the database this job is recorded in (checked at each poll)
        self.job = store.get_job(name)
        self.spec = JobSpec.from_dict(self.job["spec"])
        self.dir = folder.job_dir(name)
        self.stop_requested = False  # the user's `gptrain stop` (its request is in the job's folder)
        self.signalled = False  # a SIGTERM to this supervisor: the user's stop, else a preemption
        self.agents: list[subprocess.Popen] = []
        self.signaled: set[int] = set()  # workers already asked to stop (once each)
        self.last_sync = 0.0
        self.run_id = uuid.uuid4().hex  # also the owner token of every write (jobs/store.py)
        self.agent_logs = []
        self.failed_node: int | None = None  # the node whose agent exited in error first
        self.lost: set[int] = set()  # an elastic job's nodes lost in this attempt (jobs/elastic.py)
        self.slots: list[int] = []  # the local slots this attempt claimed (node n: the n-th `accels`)
        self.before: dict = {}  # the job's checkpoints when this attempt started (resume.baseline)
        self.warned: set[str] = set()  # checkpoints already named in a warning

    # ---- slots -------------------------------------------------------------------------------

    def wait_for_slots(self) -> list[int] | None:
        """Block until this job is first in line and its slots are free; None if stopped (or
        ended meanwhile). Jobs whose supervisor died are reconciled first, freeing their slots."""
        kind, total = local.local_slots()
        need = self.spec.nodes * self.spec.accels
        while not self._stop_asked():
            self._check_db()
            reconcile(skip=self.name)
            slots = store.claim_slots(self.name, kind, total, need, owner=self.run_id)
            if slots != []:
                return slots
            time.sleep(POLL_S)
        return None

    def _stop_asked(self) -> bool:
        """The user's stop: its request is in the job's folder (`gptrain stop` writes it, then
        signals this supervisor; a request written before this supervisor started counts too)."""
        if not self.stop_requested and folder.stop_request(self.dir).exists():
            self.stop_requested = True
        return self.stop_requested

    # ---- the record: written only while it is this supervisor's ----------------------------

    def _check_db(self) -> None:
        if self.db.gone():
            raise LostJob(f"{db.db_path()} was deleted or replaced while the job ran")

    def _set(self, state: JobState, message: str = "", **fields) -> None:
        self._check_db()
        if not store.set_state(self.name, state, message, owner=self.run_id, **fields):
            raise LostJob(f"the record of job {self.name} is no longer this supervisor's "
                          f"(ended or taken over meanwhile), so {state} was not written")

    def abandon(self, reason: str) -> None:
        """Stop the job's processes (SIGTERM to the workers, SIGKILL after the stop timeout)
        without writing to the store, and say why where the user looks."""
        line = f"--- gptrain: {reason}; stopping this job's processes, nothing more is recorded\n"
        sys.stderr.write(line)
        sys.stderr.flush()
        for path in self.agent_logs:
            try:
                with open(path, "ab") as f:
                    f.write(line.encode(errors="backslashreplace"))
            except OSError:
                pass
        if self.agents:
            deadline = time.time() + self._stop_timeout()
            while None in self.poll_agents() and time.time() < deadline:
                self._signal_workers(signal.SIGTERM)  # each poll: a worker may just be starting
                time.sleep(POLL_S)
            self.kill_agents()
        self.end_attempt()

    # ---- one attempt -------------------------------------------------------------------------

    def job_env(self, attempt: int) -> dict:
        """What every process of this attempt gets on top of its node's environment."""
        env = {**self.spec.env, **secrets.load(self.name), **launch.job_env(self.spec, self.dir),
               "GPTRAIN_ATTEMPT": str(attempt)}
        env[procs.RUN_ID_ENV] = self.run_id  # every process of the job carries it (reconcile.py)
        return env

    def node_command(self, node: int, attempt: int, host: str, port: int, env: dict, gpu: bool) -> list[str]:
        """Node `node`'s process, meeting the others at host:port (node 0's); a command
        entrypoint gets the rendezvous in `env` (launch.RENDEZVOUS_VARS)."""
        spec = self.spec
        if not gpu and "OMP_NUM_THREADS" not in spec.env:
            env["OMP_NUM_THREADS"] = "1"  # one core per CPU slot
        if launch.under_torchrun(spec):
            torchrun = launch.torchrun_args(spec, nnodes=spec.nodes, endpoint=f"{host}:{port}",
                                            rdzv_id=f"{self.name}-{attempt}", is_host=int(node == 0))
        else:  # one process, or a command: once per node
            torchrun = []
        if launch.meets_by_rendezvous(spec):  # a command is told where to meet (launch.RENDEZVOUS_VARS)
            env.update(launch.rendezvous_env(spec.nodes, node, spec.accels, host, port))
        return launch.node_command(spec, self.dir, torchrun)

    def header(self, attempt: int, node: int, cmd: list[str]) -> bytes:
        """The first line of an attempt in a node's agent log."""
        return f"--- gptrain: attempt {attempt}, node {node}: {' '.join(cmd)}\n".encode()

    def launch(self, attempt: int, slots: list[int]) -> None:
        spec, logs = self.spec, folder.logs_dir(self.dir)
        kind, _ = local.local_slots()
        env = {**launch.inherited_env(spec), **self.job_env(attempt)}
        launch.prepare_dirs(spec, self.dir)
        port = free_port()
        self.agents, self.agent_logs, self.failed_node, self.lost = [], [], None, set()
        self.slots = slots
        for node in range(spec.nodes):
            node_env = dict(env)
            mine = slots[node * spec.accels:(node + 1) * spec.accels]
            if kind == "gpu":
                node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, mine))
            cmd = self.node_command(node, attempt, "127.0.0.1", port, node_env, kind == "gpu")
            self.agent_logs.append(agent_log(logs, node))
            out = open(self.agent_logs[-1], "ab")
            out.write(self.header(attempt, node, cmd))
            out.flush()
            # the agent dies with this supervisor, and its workers with it (jobs/rank_log.py)
            self.agents.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                env=node_env, cwd=launch.workdir(spec, self.dir),
                                                start_new_session=True, preexec_fn=procs.parent_preexec()))

    def wait(self) -> int:
        """Watch the agents until all exit; returns the attempt's exit code (first failure)."""
        stop_deadline = None
        while True:
            self._check_db()
            codes = self.poll_agents()
            for node in elastic.newly_lost(self.spec, codes, self.lost):
                elastic.record_loss(self.name, self.spec, self.dir, node, self.lost_why(node, codes[node]),
                                    self.lost, self.run_id, slots=self.slots)
            left = {n: c for n, c in enumerate(codes) if n not in self.lost}  # all but lost nodes
            if self.failed_node is None:
                self.failed_node = next((n for n, c in left.items() if c not in (None, 0)), None)
            codes = list(left.values())
            if all(c is not None for c in codes):
                return next((c for c in codes if c != 0), 0)
            if any(c not in (None, 0) for c in codes) and stop_deadline is None:
                stop_deadline = time.time() + 30  # a failed node: give the others 30 s to notice
            if self._stop_asked() or self.signalled:
                if stop_deadline is None:
                    if self.stop_requested:
                        self._set(JobState.STOPPING, "stop requested: workers save a checkpoint and exit")
                    stop_deadline = time.time() + self._stop_timeout()
                self._signal_workers(signal.SIGTERM)  # each poll: a worker may just be starting
            if stop_deadline is not None and time.time() > stop_deadline:
                self.kill_agents(wait=False)
            if time.time() - self.last_sync > SYNC_EVERY_S:
                self.sync_checkpoints()
            time.sleep(POLL_S)

    def lost_why(self, node: int, code: int) -> str:
        """Why an elastic job's node ended, for its event."""
        return f"its torchrun agent exited with {code}"

    def _stop_timeout(self) -> float:
        return folder.stop_timeout(self.dir)

    # ---- the agents: processes here (a scheduler running them elsewhere overrides these) -------

    def poll_agents(self) -> list[int | None]:
        """Each node agent's exit code, None while it runs."""
        return [a.poll() for a in self.agents]

    def kill_agents(self, wait: bool = True) -> None:
        """SIGKILL every agent's process group (and reap them)."""
        for a in self.agents:
            _killpg(a.pid, signal.SIGKILL)
            if wait:
                a.wait()

    def end_attempt(self) -> None:
        """Nothing of this attempt outlives it (workers' children): every tagged process killed."""
        procs.kill_run(self.run_id)

    def _signal_workers(self, sig) -> None:
        """The workers are the children of each torchrun agent: signal them, not the agent, so
        they can save and exit 0 while the agent simply sees them finish. A command entrypoint
        is itself the worker of its node: it is signalled (and passes it on to its own)."""
        pids = procs.children({a.pid for a in self.agents}) if launch.under_torchrun(self.spec) \
            else {a.pid for a in self.agents if a.poll() is None}
        procs.signal_once(pids, sig, self.signaled)

    def sync_checkpoints(self) -> None:
        self.last_sync = time.time()
        rows = found.scan_job(self.name)
        store.sync_checkpoints(self.name, rows, found.damage_reports(self.name))
        for name, warning in resume.rewinds(self.before, rows):
            if name not in self.warned:
                self.warned.add(name)
                self._check_db()
                with store.transaction() as conn:
                    store.add_event(conn, self.name, "warning", warning)

    # ---- the whole life ----------------------------------------------------------------------

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked by start_supervisor
        if not store.record_supervisor(self.name, procs.identity(os.getpid()), self.run_id):
            return  # ended, or taken over by another supervisor, before this one started
        try:
            self._run()
        except LostJob as e:
            self.abandon(str(e))
        except (sqlite3.DatabaseError, db.CorruptDatabase) as e:  # gptrain.db damaged under the job
            if db.corrupt(e) is None:
                raise
            self.abandon(f"{db.db_path()} became unreadable while the job ran; its workers save a "
                         f"checkpoint in {folder.checkpoints_dir(self.dir)} first")

    def _run(self) -> None:
        slots = self.wait_for_slots()
        if slots is None:  # stopped while queued (or no longer ours: then nothing is written)
            store.set_state(self.name, JobState.STOPPED, "stopped while queued", owner=self.run_id)
            return
        attempt = self.job["restarts"]  # > 0 when this supervisor took over from a dead one
        restarts, preemptions = attempt, 0  # crashes restarted (--max-restarts), signals survived
        while True:
            self.before, self.warned = resume.baseline(found.scan_job(self.name)), set()
            self.launch(attempt, slots)
            self._set(JobState.RUNNING, f"attempt {attempt}: {self.spec.nodes} node(s) x "
                      f"{self.spec.accels} process(es)")
            code = self.wait()
            self.end_attempt()
            self.sync_checkpoints()
            if stopped_by_request(code, self.stop_requested, self.spec.entry):
                self._set(JobState.STOPPED, "stopped on request", exit_code=code)
                return
            if code == 0:
                self._set(JobState.SUCCEEDED, elastic.finished_line(self.spec, self.lost), exit_code=0)
                return
            preempted = self.preempted_by(code)
            if preempted and preemptions < MAX_PREEMPTIONS:
                attempt, preemptions, self.signalled = attempt + 1, preemptions + 1, False
                self._set(JobState.PREEMPTED, f"attempt {attempt - 1} preempted: {preempted}, and no "
                          f"`gptrain stop` asked for it; continuing by itself (no restart spent): "
                          f"{resume.restart_line(self.spec, self.dir)}")
                continue
            error = failure_summary(folder.logs_dir(self.dir), code, self.failed_node)
            if preempted:
                error = f"preempted {preemptions} times ({preempted}): something keeps stopping it"
            final = self.no_restart_reason(code, error)
            if final is None and restarts < self.spec.max_restarts and not preempted:
                attempt, restarts = attempt + 1, restarts + 1
                self._set(JobState.RESTARTING, f"attempt {attempt - 1} failed ({error}); "
                          f"restart {restarts} of {self.spec.max_restarts}: "
                          f"{resume.restart_line(self.spec, self.dir)}", restarts=restarts)
                continue
            # the exit code shown is the failing program's (torchrun's own is 1 for any failed worker)
            worker_code = failed_rank(folder.logs_dir(self.dir), code)[1]
            if self.spec.keep_on_failure and not self.signalled:  # its environment kept (engines/held.py)
                held.keep(self, final or error, worker_code, attempt)
                return
            self._set(JobState.FAILED, final or error, exit_code=worker_code, error=final or error)
            return

    def preempted_by(self, code: int) -> str | None:
        """How a SIGTERM nobody asked for ended this attempt (logs.signal_ended), or None."""
        if self.signalled:
            return "SIGTERM to the job's supervisor"
        return signal_ended(folder.logs_dir(self.dir), code)

    def no_restart_reason(self, code: int, error: str) -> str | None:
        """Why a restart would fail the same way (a full disk, a user error), or None."""
        logs = folder.logs_dir(self.dir)
        full = folder.full_disk_of(self.name)
        if full is None and (NO_SPACE in error.lower() or mentions_no_space(logs)):
            full = f"{NO_SPACE} on the disk holding {self.dir}"
        if full:
            return f"{full}; free some space, then `gptrain resume {self.name}` ({error})"
        if failed_rank(logs, code)[1] == 2:
            return f"{error} (a user error: not restarted; fix it and submit again)"
        return None

    def _on_sigterm(self, signum, frame) -> None:
        self.signalled = True  # acted on (and recorded) by the polling loops: see _stop_asked


def _killpg(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main(kind=Supervisor) -> None:
    os.umask(0o077)  # the job's files (logs, checkpoints) are the user's alone, as in the CLI
    sup = kind(sys.argv[1])
    try:
        sup.run()
    except Exception as e:  # record the last word; the reconciler covers a supervisor that cannot
        try:
            sup.kill_agents(wait=False)
        except Exception:  # (an engine that cannot be reached any more)
            pass
        why = secrets.masked(sup.name, f"the supervisor failed: {e!r}")  # repr: its escaped forms too
        store.set_state(sup.name, JobState.FAILED, why, owner=sup.run_id, error=why)
        raise


if __name__ == "__main__":
    main()
