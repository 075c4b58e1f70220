"""Processes of local jobs: their identity, and the start of a job's detached supervisor.

Process identity: a pid is reused, a (pid, start time, boot id) triple is not.

Every process a local job starts is recorded as `identity(pid)`: its pid, its start time in
clock ticks since boot (/proc/PID/stat field 22) and the boot id, so a process is signalled only
while it is the very one that was recorded: never an unrelated process that got the pid after
a crash or a reboot. Every process of a job also carries GPTRAIN_RUN_ID=<token> in its
environment, so the ones nobody recorded (workers, their own children) can be found and killed
when their supervisor is gone (`tagged`).

Workers die with their parents: `die_with_parent` sets PR_SET_PDEATHSIG, in the torchrun agents
(supervisor -> agent) and in every worker (agent -> worker, jobs/rank_log.py), so a kill -9 of
the supervisor takes the whole job with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gptrain.jobs import folder

RUN_ID_ENV = "GPTRAIN_RUN_ID"
_PR_SET_PDEATHSIG = 1
_boot_id: str | None = None
HAVE_PROC = os.path.isdir("/proc/self")  # without it (not Linux): pids only, as best we can


def boot_id() -> str:
    global _boot_id
    if _boot_id is None:
        try:
            _boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _boot_id = "unknown"
    return _boot_id


def _stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def identity(pid: int) -> list | None:
    """[pid, start time, boot id] of a live process, or None."""
    if not HAVE_PROC:
        return [pid, 0, boot_id()] if _exists(pid) else None
    fields = _stat(pid)
    if fields is None:
        return None
    return [pid, int(fields[19]), boot_id()]


def alive(ident) -> bool:
    """The recorded process still runs (same boot, same start time, not a zombie)."""
    if not ident:
        return False
    pid, start, boot = ident
    if boot != boot_id():
        return False
    if not HAVE_PROC:
        return _exists(pid)
    fields = _stat(pid)
    return fields is not None and int(fields[19]) == start and fields[0] not in ("Z", "X")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill(ident, sig=signal.SIGKILL) -> bool:
    """Signal the recorded process only if it is still that process; True if signalled. With a
    pidfd (Linux >= 5.3) the check and the signal are about the same process, race-free."""
    try:
        fd = os.pidfd_open(ident[0]) if ident and hasattr(os, "pidfd_open") else None
    except OSError:
        return False  # no such process
    try:
        if not alive(ident):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(ident[0], sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def children(pids: set[int]) -> list[int]:
    """The pids whose parent is one of `pids`."""
    found = []
    if not HAVE_PROC:
        return found
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields and int(fields[1]) in pids:
            found.append(int(stat.parent.name))
    return found


def signal_once(pids, sig, signaled: set[int]) -> None:
    """Send `sig` to each pid not in `signaled` yet (then added): a worker asked to stop at
    every poll is asked once, however long it takes to save its checkpoint."""
    for pid in pids:
        if pid not in signaled:
            signaled.add(pid)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def tagged(run_id: str) -> list[list]:
    """Identities of every live process started with GPTRAIN_RUN_ID=run_id (a /proc scan:
    only used once a job's supervisor is found dead)."""
    needle = f"{RUN_ID_ENV}={run_id}".encode()
    found = []
    if not HAVE_PROC:
        return found
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            ident = identity(int(d.name))
            if ident:
                found.append(ident)
    return found


KILL_WAIT_S = 30.0  # how long kill_run waits for its victims to be gone


def kill_run(run_id: str | None, recorded=()) -> int:
    """SIGKILL the recorded processes and every process tagged with run_id, and return once
    they are gone (a SIGKILL takes effect when the kernel gets to it: a big process can take a
    while to release its memory), or after KILL_WAIT_S; how many were signalled. Each look
    scans again: a process forked by one just signalled is found and killed too."""
    signalled, deadline = set(), time.time() + KILL_WAIT_S
    while True:
        live = [i for i in [*filter(None, recorded), *(tagged(run_id) if run_id else [])] if alive(i)]
        if not live or time.time() > deadline:
            return len(signalled)
        for ident in live:  # (again to one signalled before: a SIGKILL more is harmless)
            if kill(ident):
                signalled.add(tuple(ident))
        time.sleep(0.05)


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op).
    If the parent is already gone (we were reparented before the call), exit at once."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(137)


def parent_preexec():
    """A Popen preexec_fn: the child dies with the process that starts it (its parent)."""
    parent = os.getpid()
    return lambda: die_with_parent(parent)


# ---- the start of a job's supervisor (the engines that have one: jobs/engines/table.py) ---------

def start_supervisor(name: str) -> None:
    """Start the detached supervisor (jobs/engines/supervisor.py) of a queued job and record who it is. SIGTERM is blocked
    across the start (the child inherits the mask), so a `stop` that lands before the supervisor
    installed its handler stays pending instead of killing it silently."""
    from gptrain.jobs import store
    from gptrain.jobs.engines.table import engine

    module = engine(store.get_job(name)["scheduler"]).supervisor
    log = open(folder.supervisor_log(folder.job_dir(name)), "ab")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        proc = subprocess.Popen([sys.executable, "-m", module, name],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True, env=supervisor_env())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        log.close()
    ident = identity(proc.pid)
    if ident:
        store.record_supervisor(name, ident)


def supervisor_env() -> dict:
    """The CLI's environment, without the tag of a job it may itself run in (procs.RUN_ID_ENV):
    a supervisor started from inside a job is not one of that job's processes."""
    env = {k: v for k, v in os.environ.items() if k != RUN_ID_ENV}
    return {**env, "GPTRAIN_HOME": str(folder.home())}
