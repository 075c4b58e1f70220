"""The prepared-dataset format: meta.json + flat little-endian token files.

    DIR/meta.json   {"format": "gptrain-tokens", "version": 1, "tokenizer": {...}, "vocab_size",
                     "eos_id", "dtype": "uint16"|"uint32",
                     "splits": {"train": {"tokens", "documents", "files": [{"name", "tokens",
                     "sha256", "documents"}]}, "val": {...}}, ...}   (a file's "documents":
                     those whose last token it holds; absent in older datasets)
    DIR/train.bin   (or train-00000.bin, train-00001.bin, ... for large corpora)
    DIR/val.bin
    DIR/meta.pkl    char-level data only: nanoGPT's {'vocab_size', 'itos', 'stoi'} (plain dicts),
                    which its sample.py reads; written for it (nanoGPT's own folders, which
                    have no meta.json, are read by data/nanogpt_dir.py, as plain data only)

The .bin files are what nanoGPT reads with np.memmap(path, dtype=np.uint16, mode="r").
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from gptrain.errors import UserError
from gptrain.files import check_plain_name, read_json, within
from gptrain.tokenizers import check_spec

FORMAT = "gptrain-tokens"
VERSION = 1
MAX_COUNT = 2**48  # the largest token, document or example count a meta.json may hold


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class SplitWriter:
    """Appends token arrays to DIR/SPLIT.bin, rolling over to numbered shards when large.

    Each finished file is {"name", "tokens", "sha256", "documents"}: the documents whose last
    token it holds (counted when `write` is told where documents end). `state()`, given back as
    `state`, lets an interrupted prepare continue where it was (data/prepare_journal.py)."""

    def __init__(self, out_dir: Path, split: str, dtype: str, shard_tokens: int, state: dict | None = None):
        self.out_dir, self.split, self.dtype, self.shard_tokens = out_dir, split, dtype, shard_tokens
        self.little_endian = np.dtype(dtype).newbyteorder("<")
        self.files: list[dict] = [dict(f) for f in (state or {}).get("files", [])]
        self.documents = sum(f.get("documents", 0) for f in self.files)
        self._open_new(state)

    def shard_name(self, index: int) -> str:
        return f"{self.split}-{index:05d}.bin"

    def _open_new(self, state: dict | None = None):
        """Start the next shard; with `state` (checked by the caller), reopen the one it names,
        cut back to its recorded tokens, and hash what it keeps."""
        self._name = self.shard_name(len(self.files))
        self._sha = hashlib.sha256()
        self._count, self._docs = (state["tokens"], state["documents"]) if state else (0, 0)
        self.documents += self._docs
        path = self.out_dir / self._name
        if not self._count:
            path.unlink(missing_ok=True)  # what a killed run left there (never a link's target)
            self._f = open(path, "xb")
            return
        keep = self._count * self.little_endian.itemsize
        if path.is_symlink() or not path.is_file() or path.stat().st_size < keep:
            raise UserError(f"{path} is shorter than its journal says: the interrupted prepare's "
                            f"folder {self.out_dir} was changed; remove it to start over")
        self._f = open(path, "r+b")
        self._f.truncate(keep)
        for block in iter(lambda: self._f.read(1 << 22), b""):
            self._sha.update(block)

    def _close_current(self):
        self.sync()
        self._f.close()
        self.files.append({"name": self._name, "tokens": self._count, "sha256": self._sha.hexdigest(),
                           "documents": self._docs})

    def sync(self):
        """Flush the current shard to the disk (before a journal names its length)."""
        self._f.flush()
        os.fsync(self._f.fileno())

    def state(self) -> dict:
        """The finished files and the current shard's tokens and documents (for a journal)."""
        return {"files": [dict(f) for f in self.files], "tokens": self._count, "documents": self._docs}

    def write(self, tokens: np.ndarray, ends=None):
        """Append `tokens`; `ends`: the offsets in `tokens` just after each document's last token."""
        ends = list(ends or ())
        done, e = 0, 0
        while len(tokens):
            room = self.shard_tokens - self._count
            if room == 0:
                self._close_current()
                self._open_new()
                continue
            part, tokens = tokens[:room], tokens[room:]
            data = part.astype(self.little_endian, copy=False).tobytes()
            self._f.write(data)
            self._sha.update(data)
            self._count += len(part)
            done += len(part)
            while e < len(ends) and ends[e] <= done:
                self._docs, self.documents, e = self._docs + 1, self.documents + 1, e + 1
        self._docs += len(ends) - e
        self.documents += len(ends) - e

    def close(self) -> list[dict]:
        """Finish the current shard; the files, under their shard names."""
        self._close_current()
        return self.files

    def finish(self) -> dict:
        self.close()
        if len(self.files) == 1:  # one file: the plain nanoGPT name
            os.replace(self.out_dir / self.files[0]["name"], self.out_dir / f"{self.split}.bin")
            self.files[0]["name"] = f"{self.split}.bin"
        return {"tokens": sum(f["tokens"] for f in self.files), "documents": self.documents,
                "files": self.files}


def is_prepared_dir(path) -> bool:
    return (Path(path) / "meta.json").is_file()


def check_meta(meta, where) -> dict:
    """The one check of a dataset's meta.json, on every read and before every write: the fields
    gptrain uses are there with the right types, and every token file it names is a plain
    file name inside the dataset directory (never a path that reaches outside it)."""
    def bad(what):
        raise UserError(f"{where} {what}; it is corrupt or was not written by gptrain: "
                        "prepare the dataset again")

    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        bad(f"is not a {FORMAT} dataset description")
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        bad("has an unknown format version")
    if meta.get("dtype") not in ("uint16", "uint32"):
        bad(f"has dtype {meta.get('dtype')!r} (expected uint16 or uint32)")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not 0 < vocab <= np.iinfo(meta["dtype"]).max + 1:
        bad(f"has vocab_size {vocab!r}, not a positive size that fits {meta['dtype']}")
    if not isinstance(meta.get("tokenizer"), dict) or not isinstance(meta.get("tokenizer_name"), str):
        bad("lacks its tokenizer")
    check_spec(meta["tokenizer"], f"{where}'s tokenizer")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not isinstance(splits.get("train"), dict):
        bad("lacks its splits")
    for name, info in splits.items():
        if not isinstance(info, dict) or not isinstance(info.get("files"), list) or \
                not _count(info.get("tokens")) or not _count(info.get("documents")):
            bad(f"has a malformed {name!r} split")
        for f in info["files"]:
            if not isinstance(f, dict) or not _count(f.get("tokens")) or not _digest(f.get("sha256")) \
                    or not _count(f.get("documents", 0)):  # per-file documents: absent in older datasets
                bad(f"has a malformed file entry in split {name!r}")
            check_plain_name(f.get("name"), where)
        if info["files"] and sum(f["tokens"] for f in info["files"]) != info["tokens"]:
            bad(f"says split {name!r} has {info['tokens']} tokens, not the sum of its files'")
    sft = meta.get("sft")
    if sft is not None:  # instruction data (data/sft.py): each split's loss mask and example starts
        if not isinstance(sft, dict) or not isinstance(sft.get("splits"), dict):
            bad("has a malformed sft entry")
        for name, info in sft["splits"].items():
            if name not in splits or not isinstance(info, dict) or not _count(info.get("examples")):
                bad(f"has a malformed sft split {name!r}")
            for what in ("mask", "offsets"):
                f = info.get(what)
                if not isinstance(f, dict) or not _digest(f.get("sha256")):
                    bad(f"has a malformed sft {what} file in split {name!r}")
                check_plain_name(f.get("name"), where)
    return meta


def _count(value) -> bool:
    """A count gptrain could have written: an int from 0 to 2**48 (a petabyte of tokens), so
    sums and offsets of counts stay far inside int64."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _digest(value) -> bool:
    """A sha256 as gptrain writes it, 64 lowercase hex digits: shard caches name files by it."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def read_meta(path) -> dict:
    path = Path(path)
    if not (path / "meta.json").is_file():
        raise UserError(f"{path} is not a prepared dataset (no meta.json); make one with "
                        "`gptrain data prepare`")
    return check_meta(read_json(path / "meta.json", "dataset description"), path / "meta.json")


def write_meta(out_dir: Path, meta: dict) -> None:
    """meta.json of a dataset being written (checked like every meta.json that is read)."""
    check_meta(meta, "the new meta.json")
    (Path(out_dir) / "meta.json").write_text(json.dumps(meta, indent=2))


def write_nanogpt_meta(out_dir: Path, chars: str) -> None:
    """nanoGPT's meta.pkl for character-level token files: plain data (ints and strings), so
    it unpickles without any class; gptrain only writes it (it never unpickles anything)."""
    import pickle

    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)),
            "stoi": {c: i for i, c in enumerate(chars)}}
    (Path(out_dir) / "meta.pkl").write_bytes(pickle.dumps(meta, protocol=4))


def max_token(fp: Path, dtype: str) -> int:
    """The largest token id in a token file (-1 when it is empty), read in blocks."""
    tokens = np.memmap(fp, dtype=dtype, mode="r") if fp.stat().st_size else np.zeros(0, dtype)
    block = 1 << 24
    return max((int(tokens[i: i + block].max()) for i in range(0, len(tokens), block)), default=-1)


def check_token_ids(fp, largest: int, vocab_size: int) -> None:
    if largest >= vocab_size:
        raise UserError(f"token file {fp} holds token id {largest}, outside the dataset's "
                        f"vocab_size {vocab_size} in meta.json: the files do not match their "
                        "tokenizer; prepare the dataset again")


def recorded_files(path) -> list[tuple[Path, str]]:
    """(file, its recorded sha256) of every file a prepared dataset's meta.json names: the token
    files of each split, and the mask and offsets of instruction data."""
    path = Path(path)
    meta = read_meta(path)
    out = [(path / f["name"], f["sha256"]) for info in meta["splits"].values() for f in info["files"]]
    for info in (meta.get("sft") or {}).get("splits", {}).values():
        out += [(path / info[what]["name"], info[what]["sha256"]) for what in ("mask", "offsets")]
    return out


def verify(path, checksums: bool = True) -> None:
    """Check every token file's size against meta.json; with `checksums`, also its sha256 and
    that its token ids are below vocab_size. UserError on a mismatch."""
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
            if checksums:
                check_token_ids(fp, max_token(fp, meta["dtype"]), meta["vocab_size"])
    for split, info in (meta.get("sft") or {}).get("splits", {}).items():
        for what in ("mask", "offsets"):
            fp = path / info[what]["name"]
            if not fp.is_file() or (checksums and sha256_file(fp) != info[what]["sha256"]):
                raise UserError(f"instruction data file {fp} is missing or fails its sha256 check; "
                                "prepare the dataset again")
        open_examples(path, split, meta["splits"][split]["tokens"])


def open_split(path, split: str) -> np.ndarray:
    """All tokens of one split as one array (a memmap, or a concatenation of shard memmaps)."""
    path = Path(path)
    meta = read_meta(path)
    if split not in meta["splits"] or meta["splits"][split]["tokens"] == 0:
        raise UserError(f"dataset {path} has no {split!r} split")
    verify_sizes = [(path / f["name"], f["tokens"]) for f in meta["splits"][split]["files"]]
    arrays = []
    for fp, n in verify_sizes:
        if fp.is_symlink() and not within(fp, path):
            raise UserError(f"token file {fp} is a link to a file outside {path}: a dataset's token files "
                            "are its own; copy the file into the folder")
        if not fp.is_file() or fp.stat().st_size != n * np.dtype(meta["dtype"]).itemsize:
            raise UserError(f"token file {fp} is missing or has the wrong size; run "
                            f"`gptrain data inspect --verify` and prepare the dataset again")
        arrays.append(np.memmap(fp, dtype=meta["dtype"], mode="r"))
    return arrays[0] if len(arrays) == 1 else ShardArray(arrays)


class ShardArray:
    """A split's shard memmaps read as one token array, lazily: len(), a[i] and a[lo:hi] read
    only the shards they span (np.concatenate of them all would read the whole dataset into
    memory when it is opened); np.asarray(a) and a.tolist() do read them all."""

    def __init__(self, arrays: list):
        self.arrays, self.dtype = arrays, arrays[0].dtype
        self.starts = np.concatenate([[0], np.cumsum([len(a) for a in arrays], dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple:
        return (len(self),)

    def _shard(self, i: int) -> int:
        return int(np.searchsorted(self.starts, i, "right")) - 1

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step in (None, 1):
            lo, hi, _ = key.indices(len(self))
            if hi <= lo:
                return np.zeros(0, self.dtype)
            parts = [self.arrays[s][max(lo, self.starts[s]) - self.starts[s]: min(hi, self.starts[s + 1]) - self.starts[s]]
                     for s in range(self._shard(lo), self._shard(hi - 1) + 1)]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"index {key} is out of bounds for {len(self)} tokens")
            s = self._shard(i)
            return self.arrays[s][i - self.starts[s]]
        return np.asarray(self)[key]

    def __array__(self, dtype=None, copy=None):
        whole = np.concatenate(self.arrays)
        return whole if dtype is None else whole.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()


def open_examples(path, split: str, n_tokens: int):
    """(loss mask, example starts) of one split of instruction data (data/sft.py), or None for
    plain text; their sizes checked against the tokens and each other."""
    path = Path(path)
    info = (read_meta(path).get("sft") or {}).get("splits", {}).get(split)
    if info is None:
        return None
    mask_file, starts_file = path / info["mask"]["name"], path / info["offsets"]["name"]
    for f in (mask_file, starts_file):
        if not f.is_file():
            raise UserError(f"instruction data file {f} is missing; prepare the dataset again")
    mask = np.memmap(mask_file, dtype=np.uint8, mode="r") if n_tokens else np.zeros(0, np.uint8)
    starts = np.fromfile(starts_file, dtype="<u8").astype(np.int64)
    if len(mask) != n_tokens or len(starts) != info["examples"] + 1 or starts[0] != 0 or \
            starts[-1] != n_tokens or np.any(np.diff(starts) < 0):
        raise UserError(f"instruction data files of split {split!r} in {path} do not match its tokens; "
                        "prepare the dataset again")
    return mask, starts
