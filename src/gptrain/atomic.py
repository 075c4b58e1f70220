"""Files and directories that appear whole or not at all."""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from gptrain.errors import UserError, disk_full


@contextmanager
def new_directory(out, what: str = "output"):
    """Yield a hidden temporary directory beside `out`; it is renamed to `out` when the block
    succeeds and removed when it fails (a full disk is reported as a UserError naming `out`).
    `out` must not exist, or be an empty directory."""
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{what} {out} already exists; choose a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full(e, out)
        if full is not None:
            raise full from None
        raise


def write_text_atomic(path, text: str) -> None:
    """Write a file that readers see whole or not at all (a temporary file beside it, renamed)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def exclusive(lock_file):
    """Hold an exclusive lock on `lock_file` (POSIX record lock: across processes, jobs and,
    on a shared disk with locking, nodes); released when the block ends or the process dies."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def build_once(out, build, done: str = "meta.json") -> Path:
    """`out`, made by `build(out)` unless it is already complete (`out/done` exists). Processes
    that need the same `out` at once (the ranks of a job, nodes on a shared disk, two jobs) take
    turns on a lock beside it: one builds, the others wait and then find it done."""
    out = Path(out)
    if (out / done).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(out.parent / f".{out.name}.lock"):
        if not (out / done).is_file():
            build(out)
    return out
