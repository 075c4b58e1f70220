"""The local scheduler: jobs on this machine, each watched by a detached supervisor.

`submit` records the job and starts `python -m gptrain.jobs.engines.supervisor NAME` in a new session
(it outlives the CLI and the terminal). The supervisor waits for accelerator slots, runs
torchrun, restarts on failure, and records every transition (jobs/engines/supervisor.py). A job whose
supervisor died is ended or handed to a new supervisor by jobs/reconcile.py; `resume` queues a
failed or stopped job again, to continue from its latest checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from gptrain.errors import UserError
from gptrain.home import user_setting
from gptrain.jobs import procs, records, store
from gptrain.jobs.folder import job_dir, stop_request, write_stop_request
from gptrain.jobs.resume import restart_line
from gptrain.jobs.spec import JobSpec



def local_slots() -> tuple[str, int]:
    """('gpu', n) on a machine with NVIDIA GPUs, else ('cpu', cores); GPTRAIN_LOCAL_SLOTS overrides
    the count. Read without importing torch, so the CLI stays fast."""
    gpus = Path("/proc/driver/nvidia/gpus")
    kind, count = ("gpu", len(list(gpus.iterdir()))) if gpus.is_dir() else ("cpu", os.cpu_count() or 1)
    override = os.environ.get("GPTRAIN_LOCAL_SLOTS") or user_setting("local", "slots")
    return kind, int(override) if override else count


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
    check_fits(spec)
    record_and_start(spec, "local")
    return None


def check_fits(spec: JobSpec) -> None:
    """One UserError when the job needs more slots than this machine has: at submit, and at a
    resume on other nodes (it would queue forever, and every later job behind it)."""
    kind, total = local_slots()
    need = spec.nodes * spec.accels
    if need > total:
        raise UserError(f"job needs {spec.nodes} x {spec.accels} = {need} {kind} slots but this "
                        f"machine has {total}; ask for fewer (or set GPTRAIN_LOCAL_SLOTS)")


def record_and_start(spec: JobSpec, scheduler: str, check=None) -> None:
    """Record the job (its code snapshot first) and start its supervisor, with `check(folder)`
    in between: all of it or, on any failure, nothing recorded."""
    from gptrain.jobs.programs import code

    with code.staged(spec) as snapshot:  # the code, before anything is recorded
        d = records.create(spec, snapshot, scheduler)
    try:
        if check is not None:
            check(d)
        procs.start_supervisor(spec.name)
    except BaseException:  # no supervisor (fork failed), or the check refused: no job either
        records.forget(spec.name, d)
        raise










def resume(name: str) -> None:
    """Queue a failed or stopped job again under a new supervisor: same name, same spec; the
    trainer continues from the latest checkpoint in the job's directory."""
    from gptrain.jobs.reconcile import reconcile

    reconcile()
    d = job_dir(name)
    if not d.is_dir():
        raise UserError(f"job {name} has no directory {d} any more; submit it again with `gptrain run`")
    spec = JobSpec.from_dict(store.get_job(name)["spec"])
    check_fits(spec)  # (resume --nodes, or fewer slots set since)
    store.reopen(name, restart_line(spec, d))
    stop_request(d).unlink(missing_ok=True)
    procs.start_supervisor(name)


def stop(name: str, timeout: float) -> str:
    """Ask a job to stop: graceful (checkpoint, then exit), forced after `timeout` seconds. The
    request is written first: a supervisor still starting reads it when it is ready."""
    from gptrain.jobs.reconcile import reconcile, supervisor_alive

    reconcile()
    state = store.get_job(name)["state"]
    if state in store.TERMINAL:
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
