"""The prepared-dataset format: meta.json + flat little-endian token files.

    DIR/meta.json   {"format": "gptrain-tokens", "version": 1, "tokenizer": {...}, "vocab_size",
                     "eos_id", "dtype": "uint16"|"uint32",
                     "splits": {"train": {"tokens", "documents", "files": [{"name", "tokens",
                     "sha256"}]}, "val": {...}}, ...}
    DIR/train.bin   (or train-00000.bin, train-00001.bin, ... for large corpora)
    DIR/val.bin

The .bin files are what nanoGPT reads with np.memmap(path, dtype=np.uint16, mode="r").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from gptrain.errors import UserError

FORMAT = "gptrain-tokens"
VERSION = 1


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def is_prepared_dir(path) -> bool:
    return (Path(path) / "meta.json").is_file()


def read_meta(path) -> dict:
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise UserError(f"{path} is not a prepared dataset (no meta.json); make one with "
                        "`gptrain data prepare`") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}/meta.json is not valid JSON ({e}); prepare the dataset again") from None
    if meta.get("format") != FORMAT or meta.get("version", 0) > VERSION:
        raise UserError(f"{path}/meta.json is not a gptrain token dataset of a known version")
    return meta


def verify(path, checksums: bool = True) -> None:
    """Check every token file's size (and sha256) against meta.json; UserError on a mismatch."""
    path = Path(path)
    meta = read_meta(path)
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split, info in meta["splits"].items():
        for f in info["files"]:
            fp = path / f["name"]
            if not fp.is_file():
                raise UserError(f"token file {fp} is missing; prepare or push the dataset again")
            if fp.stat().st_size != f["tokens"] * itemsize:
                raise UserError(f"token file {fp} has {fp.stat().st_size} bytes, expected "
                                f"{f['tokens'] * itemsize}: it is truncated or corrupted")
            if checksums and sha256_file(fp) != f["sha256"]:
                raise UserError(f"token file {fp} fails its sha256 check: it is corrupted; "
                                "prepare or push the dataset again")


def open_split(path, split: str) -> np.ndarray:
    """All tokens of one split as one array (a memmap, or a concatenation of shard memmaps)."""
    path = Path(path)
    meta = read_meta(path)
    if split not in meta["splits"] or meta["splits"][split]["tokens"] == 0:
        raise UserError(f"dataset {path} has no {split!r} split")
    verify_sizes = [(path / f["name"], f["tokens"]) for f in meta["splits"][split]["files"]]
    arrays = []
    for fp, n in verify_sizes:
        if not fp.is_file() or fp.stat().st_size != n * np.dtype(meta["dtype"]).itemsize:
            raise UserError(f"token file {fp} is missing or has the wrong size; run "
                            f"`gptrain data inspect --verify` and prepare the dataset again")
        arrays.append(np.memmap(fp, dtype=meta["dtype"], mode="r"))
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
