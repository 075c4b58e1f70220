"""The local scheduler: jobs on this machine, each watched by a detached supervisor.

`submit` records the job and starts `python -m gptrain.jobs.supervisor NAME` in a new session
(it outlives the CLI and the terminal). The supervisor waits for accelerator slots, runs
torchrun, restarts on failure, and records every transition (jobs/supervisor.py). A job whose
supervisor died is ended or handed to a new supervisor by jobs/reconcile.py; `resume` queues a
failed or stopped job again, to continue from its latest checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from gptrain.errors import UserError
from gptrain.home import home
from gptrain.jobs import procs, secrets, store
from gptrain.jobs.launch import job_dir, stop_request, write_stop_request  # noqa: F401 (job_dir: used by many)
from gptrain.jobs.spec import JobSpec



def local_slots() -> tuple[str, int]:
    """('gpu', n) on a machine with NVIDIA GPUs, else ('cpu', cores); GPTRAIN_LOCAL_SLOTS overrides
    the count. Read without importing torch, so the CLI stays fast."""
    gpus = Path("/proc/driver/nvidia/gpus")
    kind, count = ("gpu", len(list(gpus.iterdir()))) if gpus.is_dir() else ("cpu", os.cpu_count() or 1)
    override = os.environ.get("GPTRAIN_LOCAL_SLOTS") or user_setting("local", "slots")
    return kind, int(override) if override else count


def user_setting(section: str, key: str):
    """A value from $GPTRAIN_HOME/config.toml, or None."""
    import tomllib

    path = home() / "config.toml"
    if not path.is_file():
        return None
    try:
        return tomllib.loads(path.read_text()).get(section, {}).get(key)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {e}") from None


def refresh(name: str) -> dict:
    """The job, its state first brought up to date: a job whose supervisor died is ended or
    handed to a new supervisor (with what reconcile learnt but could not record)."""
    job = store.get_job(name)
    if job["state"] in store.ACTIVE:
        from gptrain.jobs.reconcile import reconcile

        unrecorded = reconcile()
        job = {**store.get_job(name), **unrecorded.get(name, {})}
    return job


def describe(job: dict) -> str | None:
    """The `inspect` line of a local job beyond its slots: none."""
    return None


def submit(spec: JobSpec, dry_run: bool = False) -> str | None:
    from gptrain.jobs.reconcile import reconcile

    if dry_run:
        raise UserError("--dry-run prints a Slurm script: add --scheduler slurm")
    spec.validate()
    reconcile()  # slots held by jobs whose supervisor died are freed before this one queues
    kind, total = local_slots()
    need = spec.nodes * spec.accels
    if need > total:
        raise UserError(f"job needs {spec.nodes} x {spec.accels} = {need} {kind} slots but this "
                        f"machine has {total}; ask for fewer (or set GPTRAIN_LOCAL_SLOTS)")
    from gptrain.jobs import code

    with code.staged(spec) as snapshot:  # the code, before anything is recorded
        d = create(spec, snapshot, "local")
    try:
        start_supervisor(spec.name)
    except BaseException:  # no supervisor (fork failed): no job either
        forget(spec.name, d)
        raise
    return None


def create(spec: JobSpec, snapshot, scheduler: str) -> Path:
    """Record a new job and make its folder (secrets, code snapshot, job.json): all of it or,
    on any failure, none of it (the row, the folder and the secrets are removed again). A folder
    already there without a record (left by a job whose gptrain.db was deleted) is refused."""
    from gptrain.errors import disk_full
    from gptrain.jobs import code

    d = job_dir(spec.name)
    store.create_job(spec.name, spec.to_dict(), spec.nodes, spec.accels, scheduler)
    made = False
    try:
        try:
            d.mkdir(parents=True)
        except FileExistsError:
            raise UserError(f"job folder {d} is already there, left by a job gptrain.db does not know "
                            "(was the database deleted or replaced?); move it away or pick another name") from None
        made = True
        secrets.save(spec.name, spec.secrets)  # apart from the record (0600); the supervisor reads it
        (d / "logs").mkdir()
        code.place(snapshot, d)
        (d / "job.json").write_text(json.dumps(spec.to_dict(), indent=2))
    except BaseException as e:
        forget(spec.name, d if made else None)
        full = disk_full(e, d)
        if full is not None:
            raise full from None
        if isinstance(e, OSError):
            raise UserError(f"cannot make job folder {d}: {e.strerror or e}; nothing was recorded") from None
        raise
    return d


def forget(name: str, folder: Path | None) -> None:
    """Undo a submit that failed half-way: the row and, when it made them, folder and secrets."""
    store.delete_job(name)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        secrets.remove(name)


def start_supervisor(name: str) -> None:
    """Start the detached supervisor of a queued job and record who it is. SIGTERM is blocked
    across the start (the child inherits the mask), so a `stop` that lands before the supervisor
    installed its handler stays pending instead of killing it silently."""
    log = open(job_dir(name) / "supervisor.log", "ab")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gptrain.jobs.supervisor", name],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True, env=supervisor_env())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        log.close()
    ident = procs.identity(proc.pid)
    if ident:
        store.record_supervisor(name, ident)


def supervisor_env() -> dict:
    """The CLI's environment, without the tag of a job it may itself run in (procs.RUN_ID_ENV):
    a supervisor started from inside a job is not one of that job's processes."""
    env = {k: v for k, v in os.environ.items() if k != procs.RUN_ID_ENV}
    return {**env, "GPTRAIN_HOME": str(home())}


def resume(name: str) -> None:
    """Queue a failed or stopped job again under a new supervisor: same name, same spec; the
    trainer continues from the latest checkpoint in the job's directory."""
    from gptrain.jobs.reconcile import reconcile

    reconcile()
    d = job_dir(name)
    if not d.is_dir():
        raise UserError(f"job {name} has no directory {d} any more; submit it again with `gptrain run`")
    latest = latest_checkpoint(name)
    store.reopen(name, f"continues from {latest}" if latest else "starts again (no checkpoint yet)")
    stop_request(d).unlink(missing_ok=True)
    start_supervisor(name)


def stop(name: str, timeout: float) -> str:
    """Ask a job to stop: graceful (checkpoint, then exit), forced after `timeout` seconds. The
    request is written first: a supervisor still starting reads it when it is ready."""
    from gptrain.jobs.reconcile import reconcile, supervisor_alive

    reconcile()
    state = store.get_job(name)["state"]
    if store.JobState(state).is_terminal():
        return state
    write_stop_request(job_dir(name), timeout)
    job = store.get_job(name)  # read after the request is on disk: no start slips between
    ident = json.loads(job["supervisor"]) if job["supervisor"] else None
    if ident and procs.kill(ident, signal.SIGTERM):
        return "stopping"
    if ident is None and supervisor_alive(job) is None:
        return "stopping"  # not recorded yet: it reads the request at start (or is reconciled)
    reconcile()  # its supervisor is gone: ended "stopped" now that the request is on disk
    return store.get_job(name)["state"]


def scan_checkpoints(job: str) -> list[dict]:
    """The checkpoints a job wrote, built-in trainer or script (jobs/found.py), with the rows
    recorded before passed along so unchanged files are not read again."""
    from gptrain.jobs import found

    known = {r["name"]: r for r in store.checkpoints(job)}
    return found.scan(job_dir(job), known)


DISK_FULL_BYTES = 2 << 20  # less free than this where a job writes: its disk is full


def full_disk_of(job: str) -> str | None:
    """'no space left on device on the disk holding DIR (N KiB free)' when it is full, else None."""
    d = job_dir(job)
    try:
        st = os.statvfs(d if d.is_dir() else home())
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return f"no space left on device on the disk holding {d} ({free // 1024} KiB free)" \
        if free < DISK_FULL_BYTES else None


def latest_checkpoint(job: str) -> str | None:
    """The name of the newest checkpoint of a job (what it resumes from)."""
    from gptrain.jobs import found

    row = found.newest(scan_checkpoints(job))
    return row["name"] if row else None
