"""A job's checkpoints as the faces list them (secrets masked) and copy them out (a folder, a
Hugging Face export, a zip), and the job's folder as a zip; re-exported by jobs/api.py."""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import BadName, NotFound
from gptrain.jobs import copy_out, folder, records, secrets, store
from gptrain.jobs.records import known

CHECKPOINT_SHOWN = ("id", "name", "kind", "step", "train_loss", "eval_loss", "time", "size")  # in a report


def checkpoints(name: str, verify: bool = False) -> list[dict]:
    """The job's checkpoint rows (with their paths), first made to match its folder; `verify`:
    each with 'verified' (weights/checksums.py: 'ok', 'no checksums' or 'FAILED: why'). Shown
    as the faces show them: a name, path or reason holding one of the job's secrets (a folder
    the program named after it) masked; the ID reaches the real checkpoint."""
    from gptrain.weights import checksums

    known(name)
    records.sync_checkpoints(name)
    rows = store.checkpoints(name)
    for row in rows if verify else ():
        row.update(checksums.listing(row["path"]) if Path(row["path"]).is_dir() else {"verified": "no checksums"})
    values = secrets.load(name).values()
    if values:
        for row in rows:
            row.update({k: secrets.mask(row[k], values) for k in ("name", "path", "damaged", "verified")
                        if isinstance(row.get(k), str)})
    return rows


def checkpoint(ckpt_id: str, name: str | None = None) -> dict:
    """The row of a checkpoint (of job `name` when given), checked to be on disk inside its job's
    folder: a link out of the job is refused, never followed."""
    from gptrain.files import within

    if not ckpt_id.isascii() or not ckpt_id.isalnum():
        raise BadName(f"invalid checkpoint ID {ckpt_id!r}")
    if name is not None:
        known(name)
        row = next((c for c in store.checkpoints(name) if c["id"] == ckpt_id), None)
        if row is None:
            raise NotFound(f"job {name} has no checkpoint {ckpt_id}")
    else:
        row = store.checkpoint_by_id(ckpt_id)
    path = Path(row["path"])
    if not path.exists():
        raise NotFound(f"checkpoint {ckpt_id} is no longer on disk (pruned by keep_last?)")
    if not within(path, folder.job_dir(row["job"])):
        raise NotFound(f"checkpoint {ckpt_id} ({row['name']}) links outside its job's directory; "
                        "it is not copied")
    return row


def export_checkpoint(row: dict, dest: Path, fmt: str = "auto") -> str:
    """Checkpoint `row` written as the new directory `dest` (jobs/copy_out.py): all or nothing;
    `auto` is hf for a model checkpoint gptrain loads, native otherwise. The format written."""
    return copy_out.export(row, folder.job_dir(row["job"]), Path(dest), fmt)


def checkpoint_files(row: dict) -> list[tuple]:
    """(file, path inside the copy) of every file a copy of the checkpoint takes."""
    return copy_out.checkpoint_files(row, folder.job_dir(row["job"]))


def checkpoint_zip(name: str, ckpt_id: str, fmt: str = "native") -> tuple[str, str]:
    """One of job `name`'s checkpoints as a temporary zip file (the caller removes it) and the
    folder its entries lie under: its files as they are (`native`), or exported as a Hugging
    Face model (`hf`, what `checkpoint fetch --format hf` writes)."""
    import shutil
    import tempfile

    row = checkpoint(ckpt_id, name)
    top = secrets.mask(f"{name}-{Path(row['path']).name}", secrets.load(name).values()) + ("-hf" if fmt == "hf" else "")
    if fmt != "hf":
        return copy_out.zip_to_temp(checkpoint_files(row), top), top
    work = Path(tempfile.mkdtemp(prefix="gptrain-hf-"))
    try:
        export_checkpoint(row, work / top, "hf")
        files = [(p, p.relative_to(work / top)) for p in sorted((work / top).rglob("*")) if p.is_file()]
        return copy_out.zip_to_temp(files, top), top
    finally:
        shutil.rmtree(work, ignore_errors=True)


def zip_job(name: str, dest: Path) -> None:
    """The job's folder as the zip file `dest`, its logs masked (jobs/copy_out.py)."""
    from gptrain.atomic import make_dir

    known(name)
    make_dir(Path(dest).parent, "destination")
    copy_out.zip_job(folder.job_dir(name), Path(dest), secrets.load(name).values())
