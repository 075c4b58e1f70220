"""Datasets saved by HF `DatasetDict.save_to_disk` with an `input_ids` column.

This is what the hosted-service tutorials' prepare_save_dataset.py writes (grouped into
blocks or not). Rows are concatenated per split into flat token files; grouped blocks were
cut from one stream, so concatenating them restores it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from gptrain.atomic import build_once, new_directory
from gptrain.data.formats import FORMAT, VERSION, token_dtype, write_meta
from gptrain.errors import UserError

SPLIT_NAMES = {"train": "train", "validation": "val", "valid": "val", "val": "val", "test": "test"}


def is_hf_saved(path) -> bool:
    p = Path(path)
    return (p / "dataset_dict.json").is_file() or (p / "state.json").is_file()


def load_saved(path):
    """`datasets.load_from_disk(path)`, once every file its metadata names has been checked
    (check_saved); its own errors are left to the caller."""
    import datasets

    check_saved(path)
    return datasets.load_from_disk(str(path))


def check_saved(path) -> None:
    """Every split folder (dataset_dict.json) and data file (each state.json's _data_files) of
    a save_to_disk folder is a plain name inside it, and no such file links outside it:
    `datasets` opens the names it finds there as given, ../ and absolute paths included."""
    from gptrain.files import check_plain_name, read_json, within

    root = Path(path)
    folders = [root]
    if (root / "dataset_dict.json").is_file():
        splits = read_json(root / "dataset_dict.json", "dataset dict").get("splits")
        if not isinstance(splits, list):
            raise UserError(f"{root / 'dataset_dict.json'} has no list of splits; it was not written by save_to_disk")
        folders = [root / check_plain_name(s, root / "dataset_dict.json") for s in splits]
    for folder in folders:
        state = folder / "state.json"
        if not state.is_file():
            continue
        files = read_json(state, "dataset state").get("_data_files")
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise UserError(f"{state} has no list of data files; it was not written by save_to_disk")
        for f in files:
            data = folder / check_plain_name(f.get("filename"), state)
            if data.is_symlink() and not within(data, root):
                raise UserError(f"{data} is a link to a file outside {root}; copy the file into the folder")


def import_hf(src: str, out: str, tokenizer: str | dict = "gpt2") -> dict:
    """Convert a save_to_disk dataset into a prepared dataset directory (atomic); `tokenizer`
    (a name, or a spec such as the one recorded at push) is the one its ids came from."""
    try:
        import datasets
    except ImportError:
        raise UserError("reading a Hugging Face saved dataset needs: pip install 'gptrain[hf]'") from None
    from gptrain import tokenizers

    src_dir = Path(src).expanduser()
    if not is_hf_saved(src_dir):
        raise UserError(f"{src} is not a dataset saved by Hugging Face save_to_disk")
    tok = tokenizers.from_spec(tokenizer) if isinstance(tokenizer, dict) else tokenizers.by_name(tokenizer)
    try:
        loaded = load_saved(src_dir)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cannot read {src}: {str(e).splitlines()[0]}") from None
    parts = loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    dtype = token_dtype(tok.vocab_size)
    with new_directory(out, "--out directory") as tmp:
        splits = {}
        for name, ds in parts.items():
            split = SPLIT_NAMES.get(name, name)
            if split == "test" and "validation" in parts:
                continue
            split = "val" if split == "test" else split
            if "input_ids" not in ds.column_names:
                raise UserError(f"{src} split {name!r} has no input_ids column "
                                f"(columns: {', '.join(ds.column_names)})")
            splits[split] = _write_split(ds, tmp / f"{split}.bin", dtype, tok.vocab_size)
        if "train" not in splits:
            raise UserError(f"{src} has no train split (splits: {', '.join(parts)})")
        meta = {"format": FORMAT, "version": VERSION, "tokenizer": tok.spec(),
                "tokenizer_name": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
                "dtype": dtype, "splits": splits, "sources": [str(src_dir)],
                "imported_from": "huggingface save_to_disk"}
        write_meta(tmp, meta)
    return meta


def _write_split(ds, path: Path, dtype: str, vocab_size: int) -> dict:
    sha, count = hashlib.sha256(), 0
    with open(path, "wb") as f:
        for batch in ds.select_columns(["input_ids"]).iter(batch_size=1000):
            rows = batch["input_ids"]
            if not rows:
                continue
            ids = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
            if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
                raise UserError(f"token id {int(ids.max())} is outside the tokenizer's vocabulary "
                                f"({vocab_size}); pass the matching --tokenizer")
            data = ids.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
            f.write(data)
            sha.update(data)
            count += len(ids)
    return {"tokens": count, "documents": len(ds),
            "files": [{"name": path.name, "tokens": count, "sha256": sha.hexdigest()}]}


def cached_import(src: Path, tokenizer: str | dict = "gpt2") -> Path:
    """A prepared copy of a save_to_disk dataset under $GPTRAIN_HOME/cache, made once per
    tokenizer: when many processes (ranks, nodes, jobs) ask at once, one imports and the others
    wait for it."""
    import json

    from gptrain.home import home

    stamp = max(p.stat().st_mtime_ns for p in src.rglob("*"))
    key = hashlib.sha256(f"{src.resolve()}:{stamp}:{json.dumps(tokenizer, sort_keys=True)}".encode()).hexdigest()[:16]
    return build_once(home() / "cache" / f"hf-import-{key}", lambda out: import_hf(str(src), str(out), tokenizer))
