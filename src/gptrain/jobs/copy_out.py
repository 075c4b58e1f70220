"""Copies of what a job wrote, out of its folder: one checkpoint as a directory (`checkpoint
fetch`, the console's downloads) or the whole job as a zip (`fetch`). One rule for links: they
are followed only while they stay inside the job's folder (nothing outside the job, ever). Every
copy is written beside its destination and renamed into place: a failure leaves nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gptrain.files import shown, within


def checkpoint_files(ckpt: dict, job_dir: Path) -> list[tuple]:
    """(file, its path inside the copy) for every file a copy of checkpoint row `ckpt` takes.
    A root that is itself a model (save_model into output/) gives its own files, not the
    checkpoints below it; a single-file checkpoint is that file."""
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


def export(ckpt: dict, job_dir: Path, dest: Path, fmt: str = "auto") -> str:
    """Checkpoint row `ckpt` written as the new directory `dest` (an empty one is replaced):
    exported as a Hugging Face model (`hf`: gptrain, HF and nanoGPT checkpoints; others
    refused), else its files as they are (`native`); `auto`: hf for a kind gptrain loads as a
    model, native for any other. Returns the format written."""
    from gptrain.atomic import check_new_folder, make_dir
    from gptrain.errors import disk_full
    from gptrain.weights.scan import LOADABLE

    if fmt == "auto":
        fmt = "hf" if ckpt.get("kind") in LOADABLE else "native"

    check_new_folder(dest, "destination", "--destination")
    make_dir(dest.parent, "destination")
    tmp = dest.parent / f".{dest.name}.fetch"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if fmt == "hf":
            from gptrain.models.api import export as export_model
            from gptrain.weights.scan import loadable_at

            export_model(str(loadable_at(Path(ckpt["path"]), ckpt["name"])), tmp, "hf")
        else:
            from gptrain.weights import checksums

            make_dir(tmp, "destination")
            for f, rel in checkpoint_files(ckpt, job_dir):
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, tmp / rel)
            try:  # the copy holds the bytes the checkpoint was written with (it names the source)
                checksums.verify(tmp)
            except checksums.VerificationError as e:
                raise checksums.VerificationError(ckpt["path"], e.why) from None
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
        return fmt
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full(e, dest) if isinstance(e, Exception) else None
        if full is not None:
            raise full from None
        raise


def zip_to_temp(files, top: str) -> str:
    """(file, path inside) pairs as a new temporary zip file, entries under `top/` (names are
    bytes from elsewhere: shown escaped); nothing is left on failure."""
    import tempfile
    import zipfile

    fd, tmp = tempfile.mkstemp(prefix="gptrain-", suffix=".zip")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:  # weights hardly compress
            for f, rel in files:
                z.write(f, shown(f"{top}/{rel}"))
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


# the files a job writes that a person reads as text (its metrics, notes, configs): masked like its
# logs when the job has secrets; the rest (weights, arrays) goes as it is
TEXT_SUFFIXES = (".txt", ".json", ".jsonl", ".csv", ".tsv", ".toml", ".yaml", ".yml", ".md", ".ini", ".cfg")


def zip_job(src: Path, dest: Path, values) -> None:
    """The job folder `src` as the zip file `dest`: its own files only (a link out of the job, to
    /etc/shadow say, is left out) and its logs as `gptrain logs` shows them, read a page at a
    time with the secret `values` masked, and so are its text files (TEXT_SUFFIXES: metrics.jsonl,
    a config a program wrote) and every entry's name (a folder the program named after a secret).
    Its other files (weights, arrays) go as they are."""
    import zipfile

    from gptrain.errors import UserError, disk_full
    from gptrain.jobs import logs, secrets

    tmp = dest.with_suffix(".zip.part")
    try:
        try:
            archive = zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED)
        except OSError as e:  # (a read-only folder, no permission: the user's to choose another)
            if disk_full(e, dest) is not None:
                raise
            raise UserError(f"cannot write {dest}: {e.strerror or e}; choose a folder you can write") from None
        with archive as z:
            for f in sorted(src.rglob("*")):
                if not f.is_file() or f.name.startswith(".tmp") or not within(f, src):
                    continue
                entry = shown(f.relative_to(src.parent))
                entry = secrets.mask(entry, values) if values else entry
                if f.suffix in (".log", ".out") or (values and f.suffix.lower() in TEXT_SUFFIXES):
                    with z.open(entry, "w", force_zip64=True) as out:
                        for page in logs.pages(f, values):
                            out.write(page.encode())
                else:
                    z.write(f, entry)
        tmp.rename(dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
