"""A job's record created (all or nothing), brought up to date, resumed, zipped and removed:
what every reader of jobs calls (the CLI's commands and the web console alike), so both see
and do the same."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gptrain.files import shown
from gptrain.jobs import folder


def create(spec, snapshot, scheduler: str) -> Path:
    """Record a new job and make its folder (secrets, code snapshot, job.json): all of it or,
    on any failure, none of it (the row, the folder and the secrets are removed again). A folder
    already there without a record (left by a job whose gptrain.db was deleted) is refused."""
    from gptrain.errors import UserError, disk_full
    from gptrain.jobs import code, secrets, store

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


def refresh(name: str) -> dict:
    """The job, with its state first brought up to date by its scheduler (Slurm's view; for a
    local job, reconciling: a dead supervisor's job is ended or handed to a new supervisor)."""
    from gptrain.jobs import store
    from gptrain.jobs.schedulers import scheduler

    return scheduler(store.get_job(name)["scheduler"]).refresh(name)


def resume(name: str) -> None:
    """A failed or stopped job started again by the scheduler it ran on, from its newest checkpoint."""
    from gptrain.jobs import store
    from gptrain.jobs.schedulers import scheduler

    scheduler(store.get_job(name)["scheduler"]).resume(name)


def sync_checkpoints(name: str) -> None:
    """The job's checkpoint rows made to match its directory; on a full disk the rows recorded
    so far stand (reads keep answering)."""
    import sqlite3

    from gptrain.db import out_of_space
    from gptrain.jobs import found, store

    if folder.job_dir(name).is_dir():
        try:
            store.sync_checkpoints(name, found.scan_job(name))
        except sqlite3.OperationalError as e:
            if not out_of_space(e):
                raise


def remove(name: str) -> None:
    """Delete a finished job: its record, its directory, its secrets."""
    import shutil

    from gptrain.errors import UserError
    from gptrain.jobs import secrets, store
    from gptrain.jobs.folder import job_dir

    job = refresh(name)
    if job["state"] in store.ACTIVE:
        raise UserError(f"job {name} is {job['state']}; `gptrain stop {name}` first")
    store.delete_job(name)
    shutil.rmtree(job_dir(name), ignore_errors=True)
    secrets.remove(name)


def zip_job(name: str, dest) -> None:
    """The job's directory as the zip file `dest` (written beside it, then renamed; nothing is
    left on failure): its own files only (a link out of the job, to /etc/shadow say, is left
    out) and its logs as `gptrain logs` shows them, read a page at a time with secrets masked."""
    import zipfile
    from pathlib import Path

    from gptrain.files import within
    from gptrain.jobs import logs, secrets, store
    from gptrain.jobs.folder import job_dir

    store.get_job(name)
    src, dest = job_dir(name), Path(dest)
    values = secrets.load(name).values()
    tmp = dest.with_suffix(".zip.part")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(src.rglob("*")):
                if not f.is_file() or f.name.startswith(".tmp") or not within(f, src):
                    continue
                entry = shown(f.relative_to(src.parent))
                if f.suffix in (".log", ".out"):
                    with z.open(entry, "w", force_zip64=True) as out:
                        for page in logs.pages(f, values):
                            out.write(page.encode())
                else:
                    z.write(f, entry)
        tmp.rename(dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def checkpoint_files(ckpt: dict, job_dir) -> list[tuple]:
    """(file, its path inside the copy) for every file a copy of checkpoint row `ckpt` takes:
    the one copy-out rule of `checkpoint fetch` and the console's zip. Links are followed only
    while they stay inside the job's directory (nothing outside the job, ever); a root that is
    itself a model (save_model into output/) gives its own files, not the checkpoints below it;
    a single-file checkpoint is that file."""
    from pathlib import Path

    from gptrain.files import within
    from gptrain.jobs.found import ROOTS

    src = Path(ckpt["path"])
    if not src.is_dir():
        return [(src, Path(src.name))] if within(src, job_dir) else []
    flat, seen, out = ckpt["name"] in ROOTS, set(), []
    for d, dirs, files in os.walk(src, followlinks=True):
        seen.add(os.path.realpath(d))  # a link to a folder above: walked once, not forever
        dirs[:] = [] if flat else sorted(n for n in dirs if within(Path(d) / n, job_dir)
                                         and os.path.realpath(Path(d) / n) not in seen)
        for n in sorted(files):
            f = Path(d) / n
            if within(f, job_dir) and f.is_file():
                out.append((f, f.relative_to(src)))
    return out


def zip_files(files, z, top: str) -> None:
    """`files` from checkpoint_files written into the open ZipFile `z` under `top/`."""
    for f, rel in files:
        z.write(f, shown(f"{top}/{rel}"))  # names are bytes from elsewhere: escaped
