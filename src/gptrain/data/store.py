"""Named datasets under $GPTRAIN_HOME/datasets/NAME: push (atomic, verified), list, inspect, rm."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gptrain.data.formats import is_prepared_dir, read_meta, verify
from gptrain.errors import UserError
from gptrain.home import check_name, home


def datasets_dir() -> Path:
    return home() / "datasets"


def path_of(name: str) -> Path:
    p = datasets_dir() / check_name(name, "dataset")
    if not is_prepared_dir(p):
        raise UserError(f"no dataset named {name!r}; see `gptrain data list`")
    return p


def resolve(ref: str) -> Path:
    """A dataset directory for what the user typed: a path, or a pushed dataset's name."""
    p = Path(ref).expanduser()
    if p.is_dir():
        return p
    if "/" in ref or ref.startswith("."):
        raise UserError(f"dataset path {ref} does not exist")
    return path_of(ref)


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
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def list_all() -> list[tuple[str, dict, int]]:
    """(name, meta, bytes) for every pushed dataset."""
    out = []
    d = datasets_dir()
    if d.is_dir():
        for p in sorted(d.iterdir()):
            if not p.name.startswith(".") and is_prepared_dir(p):
                size = sum(f.stat().st_size for f in p.iterdir() if f.is_file())
                out.append((p.name, read_meta(p), size))
    return out


def remove(name: str) -> None:
    p = path_of(name)
    trash = p.parent / f".{name}.rm-{os.getpid()}"
    os.rename(p, trash)  # the name disappears at once; the bytes go after
    shutil.rmtree(trash)
