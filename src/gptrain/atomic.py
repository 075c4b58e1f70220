"""Directories that appear whole or not at all."""

from __future__ import annotations

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
