"""Files and directories that appear whole or not at all."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from gptrain.errors import UserError, disk_full


def make_dir(path, what: str) -> None:
    """Folder `path` (a destination the user names) made with its parents; one that cannot be
    (a read-only disk, no permission, under /proc) is one line naming it, not a traceback."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        full = disk_full(e, path)
        if full is not None:
            raise full from None
        raise UserError(f"cannot make {what} {path}: {e.strerror or e}; choose a folder you can write") from None


def check_new_folder(path, what: str, flag: str) -> Path:
    """A folder the user names for gptrain to write (`--out`, `--destination`): it must not exist
    or be an empty folder, and must not be a link (a dangling one, or one to a folder elsewhere:
    gptrain renames its finished copy into place and never writes through a link). One line,
    before anything is written."""
    path = Path(path).expanduser()
    if path.is_symlink():
        raise UserError(f"{what} {path} is a link; give {flag} a new folder's path (gptrain never writes "
                        "through a link)")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{what} {path} already exists and is not an empty folder; choose a new {flag}")
    return path


@contextmanager
def new_directory(out, what: str = "output", flag: str = "--out"):
    """Yield a hidden temporary directory beside `out`; it is renamed to `out` when the block
    succeeds and removed when it fails (a full disk is reported as a UserError naming `out`).
    `out` must not exist, or be an empty directory."""
    out = check_new_folder(out, what, flag)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    make_dir(out.parent, what)
    shutil.rmtree(tmp, ignore_errors=True)
    make_dir(tmp, what)
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


LEFTOVER = re.compile(r"\..+\.(?:push|code|rm)-([0-9]+)")  # data push / run's code stage / data rm


def sweep_leftovers(*folders) -> None:
    """Remove the hidden working folders (`.NAME.push-PID`, `.NAME.code-PID`, `.NAME.rm-PID`)
    that a command killed half-way left in `folders`, once their PID is gone: a live one is
    some other command still at work. A reused PID only postpones the removal."""
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            m = LEFTOVER.fullmatch(entry.name)
            if m and entry.is_dir(follow_symlinks=False) and not _pid_alive(int(m.group(1))):
                shutil.rmtree(entry.path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or a number no pid can be): left alone
    return pid > 0
