"""A job's record created (all or nothing, by every scheduler's submit), brought up to date,
resumed and removed. Users' operations reach these through jobs/api.py."""

from __future__ import annotations

import json
from pathlib import Path

from gptrain.jobs import folder


def known(name: str) -> dict:
    """The job's record as stored (a malformed name is BadName, an unknown one NotFound)."""
    from gptrain.home import check_name
    from gptrain.jobs import store

    check_name(name, "job")
    return store.get_job(name)


def create(spec, snapshot, scheduler: str) -> Path:
    """Record a new job and make its folder (secrets, code snapshot, job.json): all of it or,
    on any failure, none of it (the row, the folder and the secrets are removed again). A folder
    already there without a record (left by a job whose gptrain.db was deleted) is refused."""
    from gptrain.errors import UserError, disk_full
    from gptrain.jobs import secrets, store
    from gptrain.jobs.programs import code

    d = folder.job_dir(spec.name)
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
        folder.logs_dir(d).mkdir()
        code.place(snapshot, d)
        folder.spec_file(d).write_text(json.dumps(spec.to_dict(), indent=2))
    except BaseException as e:
        forget(spec.name, d if made else None)
        full = disk_full(e, d)
        if full is not None:
            raise full from None
        if isinstance(e, OSError):
            raise UserError(f"cannot make job folder {d}: {e.strerror or e}; nothing was recorded") from None
        raise
    return d


def forget(name: str, made: Path | None) -> None:
    """Undo a submit that failed half-way: the row and, when it made them, folder and secrets."""
    import shutil

    from gptrain.jobs import secrets, store

    store.delete_job(name)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        secrets.remove(name)


def check_resumable(name: str, extending: bool) -> dict:
    """The job's record, when `gptrain resume` may start it again: failed or stopped, or one that
    succeeded when `extending` it (--max-steps); one line otherwise. (store.reopen's rule is the
    wider one: it reopens what this lets through.)"""
    from gptrain.errors import UserError
    from gptrain.jobs import store

    job = store.get_job(name)
    resumable = (store.JobState.FAILED, store.JobState.STOPPED, *((store.JobState.SUCCEEDED,) if extending else ()))
    if job["state"] not in resumable:
        more = "; a job that succeeded trains further with --max-steps N" if job["state"] == store.JobState.SUCCEEDED else ""
        raise UserError(f"job {name} is {job['state']}; only a failed or stopped job can be resumed{more}")
    return job


MAX_STEPS_FLAG = "--train.max_steps="  # what `resume --max-steps` adds to a trainer job's flags
STEPS_BOUND = 10 ** 12


def place_on(name: str, nodes: str | None = None, allow_unverified: bool = False, max_steps: int | None = None):
    """A failed or stopped job's spec changed from its next start (`gptrain resume NAME`):
    `nodes` (--nodes N, or MIN:MAX where elastic runs), checked as at submit,
    `allow_unverified` (--allow-unverified: its workers may load a checkpoint without a checksum
    list, each with a warning: weights/checksums.admit), and `max_steps` (--max-steps: a trainer
    job trained to N steps in all, the one change that also reopens a job that succeeded: a run
    extended, its schedule recomputed for the new length). The record, its nodes column and
    job.json are written. Returns the undo (the old spec back, for a resume refused) and the lines
    for the job's events once the resume is taken."""
    from gptrain.errors import UserError
    from gptrain.jobs import store
    from gptrain.jobs.spec import JobSpec
    from gptrain.weights.checksums import ALLOW_ENV

    job = check_resumable(name, extending=max_steps is not None)
    old, changed, said = JobSpec.from_dict(job["spec"]), dict(job["spec"]), []
    if nodes is not None:
        changed.update(nodes=str(nodes), min_nodes=None)
    if allow_unverified:
        changed["env"] = {**old.env, ALLOW_ENV: "1"}
    if max_steps is not None:
        if old.entry != "trainer":
            raise UserError(f"--max-steps extends a run of gptrain's trainer; job {name} runs your own "
                            f"{old.entry}: resume it and give your program its own step count")
        if not 1 <= max_steps <= STEPS_BOUND:
            raise UserError(f"--max-steps must be 1 to {STEPS_BOUND}, got {max_steps}")
        changed["args"] = [a for a in old.args if not a.startswith(MAX_STEPS_FLAG)] + [f"{MAX_STEPS_FLAG}{max_steps}"]
    new = JobSpec.from_dict(changed)
    if nodes is not None:
        new.parse_nodes()  # (N or MIN:MAX as typed, first: its own words)
    new.validate()  # (N or MIN:MAX, elastic only where it runs, bounded: one line, as at submit;
    # what the machine has is the engine's resume's to check, which undoes this when it refuses)
    jfile = folder.spec_file(folder.job_dir(name))
    before = jfile.read_text() if jfile.is_file() else None

    def write(spec, text) -> None:
        store.update(name, spec=json.dumps(spec.to_dict()), nodes=spec.nodes)
        if text is not None:
            jfile.write_text(text)

    write(new, json.dumps(new.to_dict(), indent=2) if before is not None else None)
    if nodes is not None:
        was = f"{old.min_nodes}:{old.nodes}" if old.elastic else str(old.nodes)
        now = f"{new.min_nodes}:{new.nodes}" if new.elastic else str(new.nodes)
        said.append(("placed", f"to run on {now} node(s) from its next start (was {was})"))
    if allow_unverified:
        said.append(("allowed", "its workers may load a checkpoint without checksums.json from its next "
                     f"start, each with a warning (--allow-unverified: {ALLOW_ENV}=1 in its env)"))
    if max_steps is not None:
        said.append(("extended", f"trains to step {max_steps:,} in all from its next start ({MAX_STEPS_FLAG}"
                     f"{max_steps}; its learning-rate schedule is computed for that length)"))
    return lambda: write(old, before), said


def sync_checkpoints(name: str) -> None:
    """The job's checkpoint rows made to match its directory; on a full disk the rows recorded
    so far stand (reads keep answering)."""
    import sqlite3

    from gptrain.db import out_of_space
    from gptrain.jobs import found, store

    if folder.job_dir(name).is_dir():
        try:
            store.sync_checkpoints(name, found.scan_job(name), found.damage_reports(name))
        except sqlite3.OperationalError as e:
            if not out_of_space(e):
                raise


def record_seen(name: str, job: dict, state, note: str, fields: dict) -> dict:
    """What a polled engine (slurm, kubernetes) saw of a job, written as its state: a failure
    with its error (the engine's, else the failing rank's from the logs) in the event too, and
    the checkpoints synced once it runs or has ended. Nothing is written when the record moved
    on meanwhile (resumed as another engine job, or ended). Returns the job as recorded."""
    from gptrain.jobs import found, store
    from gptrain.jobs.logs import failure_summary

    state = store.JobState(state)
    if state == store.JobState.FAILED:
        fields.setdefault("exit_code", 1)
        fields.setdefault("error", failure_summary(folder.logs_dir(folder.job_dir(name)), fields["exit_code"]))
        note = f"{note}: {fields['error']}"
    if store.set_state(name, state, note, engine_job=job["external_id"], **fields) and \
            (state in store.TERMINAL or state == store.JobState.RUNNING):
        store.sync_checkpoints(name, found.scan_job(name), found.damage_reports(name))
    return store.get_job(name)


def remove(name: str, job: dict) -> None:
    """Delete a finished job (`job`: its record, brought up to date by its scheduler): its
    record, its directory, its secrets."""
    import shutil

    from gptrain.errors import UserError
    from gptrain.jobs import secrets, store
    from gptrain.jobs.folder import job_dir

    if job["state"] in store.ACTIVE:
        raise UserError(f"job {name} is {job['state']}; `gptrain stop {name}` first")
    store.delete_job(name)
    shutil.rmtree(job_dir(name), ignore_errors=True)
    secrets.remove(name)
