"""nanoGPT's data folders, read as prepared datasets.

nanoGPT's prepare scripts write `train.bin` and `val.bin`, flat uint16 token ids (what its
train.py reads with np.memmap), and no meta.json: GPT-2 ids (data/shakespeare, openwebtext) or,
for character-level data (data/shakespeare_char), ids into the vocabulary of `meta.pkl`,
{'vocab_size', 'itos', 'stoi'}. meta.pkl is a pickle from elsewhere: it is read by an unpickler
that builds plain data only (any class or function named in it is refused, nothing is run).

The one reading of such a folder: `to_prepared` writes it out as a prepared dataset (meta.json
with its tokenizer and checksums, the token files, meta.pkl kept for nanoGPT's sample.py).
`data push` stores that; train and eval of an unpushed folder read a copy made once in the cache.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

from gptrain.errors import UserError

FILES = ("train.bin", "val.bin")
META_PKL = "meta.pkl"
META_MAX_BYTES = 16 << 20


def is_nanogpt_dir(path) -> bool:
    """A folder with nanoGPT's train.bin and no meta.json (nor a Hugging Face save_to_disk)."""
    from gptrain.data.hf_import import is_hf_saved

    p = Path(path)
    return (p / "train.bin").is_file() and not (p / "meta.json").exists() and not is_hf_saved(p)


class _PlainData(pickle.Unpickler):
    """An unpickler that builds plain data only (dicts, lists, str, int, ...): any class or
    function named in the file is refused, so nothing from it is ever run."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}; only plain data is read")


def read_char_vocab(meta: Path) -> str:
    """The characters of nanoGPT's meta.pkl, in id order (plain data only, never run). They must
    be distinct and in sorted order, as nanoGPT's prepare.py makes them (gptrain's char
    tokenizer numbers them so); a one-line UserError otherwise."""
    if meta.is_symlink() or meta.stat().st_size > META_MAX_BYTES:
        raise UserError(f"{meta} is a link or over {META_MAX_BYTES >> 20} MiB: not a nanoGPT character vocabulary")
    try:
        with open(meta, "rb") as f:
            data = _PlainData(f).load()
        itos = data["itos"]
        chars = "".join(itos[i] for i in range(int(data["vocab_size"])))
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, AttributeError,
            IndexError, RecursionError, MemoryError) as e:
        raise UserError(f"{meta} is not nanoGPT's character vocabulary ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    if not chars or "".join(sorted(set(chars))) != chars:
        raise UserError(f"{meta}: its characters are not distinct and in sorted order (nanoGPT's "
                        "prepare.py order); not a character vocabulary gptrain can use")
    return chars


def tokenizer_of(folder: Path, tokenizer: str = ""):
    """The folder's tokenizer: meta.pkl's characters when it has one, else the one named
    (`tokenizer`), else GPT-2's (nanoGPT's ids without meta.pkl)."""
    from gptrain import tokenizers

    folder = Path(folder)
    if (folder / META_PKL).exists():
        return tokenizers.CharTokenizer(read_char_vocab(folder / META_PKL))
    if tokenizer == "char":
        raise UserError(f"{folder} has no meta.pkl: a character vocabulary cannot be named for its ids; "
                        "give the tokenizer they were made with (gpt2, byte or a tokenizer directory)")
    return tokenizers.by_name(tokenizer or "gpt2")


def to_prepared(src, out, tokenizer: str = "") -> dict:
    """Write nanoGPT folder `src` into the empty folder `out` as a prepared dataset (meta.json
    written last); its meta. The token ids are checked against the tokenizer's vocabulary."""
    from gptrain.data.formats import FORMAT, VERSION, max_token, sha256_file, write_meta

    src, out = Path(src), Path(out)
    tok = tokenizer_of(src, tokenizer)
    if tok.vocab_size > 2**16:
        raise UserError(f"{tok.name} has {tok.vocab_size} tokens, more than nanoGPT's uint16 files hold")
    out.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name in FILES:
        fp = src / name
        if not fp.exists():
            continue
        if fp.is_symlink() or not fp.is_file():
            raise UserError(f"{fp} is not a plain file")
        if fp.stat().st_size % 2:
            raise UserError(f"{fp} has an odd number of bytes: not nanoGPT's uint16 token ids")
        shutil.copyfile(fp, out / name)
        top = max_token(out / name, "uint16")
        if top >= tok.vocab_size:
            raise UserError(f"{fp} holds token id {top}, outside the "
                            f"{tok.vocab_size} tokens of {tok.name}: name the tokenizer its ids came from")
        n = (out / name).stat().st_size // 2
        splits[name.removesuffix(".bin")] = {"tokens": n, "documents": 1 if n else 0, "files": [
            {"name": name, "tokens": n, "sha256": sha256_file(out / name)}]}
    if (src / META_PKL).exists():
        shutil.copyfile(src / META_PKL, out / META_PKL)  # nanoGPT's sample.py reads it
    meta = {"format": FORMAT, "version": VERSION, "tokenizer": tok.spec(), "tokenizer_name": tok.name,
            "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "dtype": "uint16", "splits": splits,
            "sources": [str(src)], "imported_from": "nanoGPT data folder"}
    write_meta(out, meta)
    return meta


def cached(src: Path, tokenizer: str = "") -> Path:
    """A prepared copy of nanoGPT folder `src` under $GPTRAIN_HOME/cache, made once (the ranks of
    a job take turns: one writes it, the others find it done)."""
    import hashlib

    from gptrain.atomic import build_once, new_directory
    from gptrain.home import home

    tokenizer = "" if (src / META_PKL).exists() else tokenizer  # meta.pkl's is the one
    stamp = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(src.iterdir())
             if p.name in (*FILES, META_PKL)]
    key = hashlib.sha256(f"{src.resolve()}:{stamp}:{tokenizer}".encode()).hexdigest()[:16]

    def build(out):
        with new_directory(out, "cache folder") as tmp:
            to_prepared(src, tmp, tokenizer)

    return build_once(home() / "cache" / f"nanogpt-{key}", build)
