"""Named datasets: files under $GPTRAIN_HOME/datasets/NAME, registered in gptrain.db.

push checks meta.json (plain file names only, data/formats.py), copies and verifies into a
hidden directory (removed again on any failure, a full disk included), renames it into place,
then registers it; rm unregisters first, then deletes. A name is usable exactly when it is registered and its
files are complete.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from gptrain import db
from gptrain.data.formats import is_prepared_dir, read_meta, verify
from gptrain.errors import UserError, disk_full
from gptrain.home import check_name, home


def datasets_dir() -> Path:
    return home() / "datasets"


def path_of(name: str) -> Path:
    check_name(name, "dataset")
    row = db.fetch_one("SELECT path FROM datasets WHERE name = ?", (name,))
    if row is None:
        raise UserError(f"no dataset named {name!r}; see `gptrain data list`")
    if not is_prepared_dir(row["path"]):
        raise UserError(f"dataset {name!r} is registered but its files in {row['path']} are gone; "
                        f"`gptrain data rm {name}` and push it again")
    return Path(row["path"])


def is_path(ref: str) -> bool:
    """Whether a dataset reference is written as a path (it has a '/', or starts with . or ~)."""
    return "/" in ref or ref.startswith((".", "~"))


def resolve(ref: str) -> Path:
    """What a dataset reference means, by one rule: written as a path (see is_path), it is that
    file or directory; a bare word is the pushed dataset of that name, and only when no dataset
    has that name, a file or directory of that name in the current directory. So a pushed name is
    never shadowed by a folder beside you (write ./NAME for the folder)."""
    import sys

    p = Path(ref).expanduser()
    if is_path(ref):
        if not p.exists():
            raise UserError(f"dataset path {ref} does not exist")
        return p
    if registered(ref):
        if p.exists():
            print(f"note: {ref!r} is the pushed dataset; for the {'directory' if p.is_dir() else 'file'} "
                  f"here, write ./{ref}", file=sys.stderr)
        return path_of(ref)
    if p.exists():
        return p
    raise UserError(f"no dataset named {ref!r} and no file or directory ./{ref}; see `gptrain data list`")


def registered(name: str) -> bool:
    from gptrain.home import NAME_RE

    if not NAME_RE.fullmatch(name) or not db.db_path().is_file():
        return False
    return db.fetch_one("SELECT 1 FROM datasets WHERE name = ?", (name,)) is not None


def push(name: str, src: str) -> Path:
    """Copy a prepared dataset into the store; checksums verified; all or nothing."""
    check_name(name, "dataset")
    src_dir = Path(src).expanduser()
    if not src_dir.is_dir():
        raise UserError(f"{src} is not a directory; push a directory made by `gptrain data prepare`")
    if not is_prepared_dir(src_dir):
        from gptrain.data.hf_import import is_hf_saved

        hint = " (it is a Hugging Face save_to_disk dataset: run `gptrain data import` first)" \
            if is_hf_saved(src_dir) else ""
        raise UserError(f"{src} is not a prepared dataset (no meta.json){hint}")
    verify(src_dir)
    dest = datasets_dir() / name
    if dest.exists():
        raise UserError(f"dataset {name!r} already exists; `gptrain data rm {name}` first or pick another name")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{name}.push-{os.getpid()}"
    try:
        meta = read_meta(src_dir)
        tmp.mkdir()
        names = [f["name"] for split in meta["splits"].values() for f in split["files"]]
        for fname in ["meta.json", *names]:
            shutil.copy2(src_dir / fname, tmp / fname)
        verify(tmp)  # what landed is what was prepared
        with db.transaction() as conn:
            if conn.execute("SELECT 1 FROM datasets WHERE name = ?", (name,)).fetchone():
                raise UserError(f"dataset {name!r} already exists; `gptrain data rm {name}` first")
            os.rename(tmp, dest)
            size = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
            tokens = sum(split["tokens"] for split in meta["splits"].values())
            conn.execute("INSERT INTO datasets (name, path, tokenizer, tokens, bytes, created) "
                         "VALUES (?, ?, ?, ?, ?, ?)", (name, str(dest), meta["tokenizer_name"], tokens,
                                                       size, time.time()))
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full(e, dest)
        if full is not None:
            raise full from None
        raise
    return dest


def list_all() -> list[dict]:
    """Every registered dataset: name, path, tokenizer, tokens, bytes, created."""
    return db.fetch_all("SELECT * FROM datasets ORDER BY name")


def remove(name: str) -> None:
    p = path_of(name)
    with db.transaction() as conn:
        conn.execute("DELETE FROM datasets WHERE name = ?", (name,))
        trash = p.parent / f".{name}.rm-{os.getpid()}"
        os.rename(p, trash)  # the name disappears at once; the bytes go after
    shutil.rmtree(trash)
