"""`gptrain data prepare`: sources -> tokenized, flat token files + meta.json.

Work flows through three stages that never hold the whole corpus:
read (main process, streaming) -> tokenize (--num-proc workers, results taken back in
submission order, so the output is identical for any --num-proc) -> write (main process,
sha256 computed as it goes). Tasks are cut every TASK_CHARS of text, in the middle of a long
document too, so memory is bounded whatever the size of a file or a document. The output
directory appears atomically when everything is done.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import deque
from pathlib import Path

import numpy as np

from gptrain import tokenizers
from gptrain.atomic import new_directory
from gptrain.data import sources as src_mod
from gptrain.data.formats import FORMAT, VERSION, SplitWriter, token_dtype, write_meta, write_nanogpt_meta
from gptrain.errors import UserError

TASK_CHARS = 1 << 20          # text per tokenization task
DEFAULT_SHARD_TOKENS = 1 << 30  # tokens per .bin file before a new shard starts


_worker_tokenizer = None


def _init_worker(spec):
    global _worker_tokenizer
    _worker_tokenizer = tokenizers.from_spec(spec)


def _tokenize(task):
    """(split, tokens, where documents end in them) for a list of (text piece, ends a document)."""
    split, pieces = task
    tok = _worker_tokenizer
    ids = tok.encode_batch([text for text, _ in pieces])
    out, ends = [], []
    for (_, doc_end), piece_ids in zip(pieces, ids):
        out.extend(piece_ids)
        if doc_end:
            if tok.eos_id is not None:
                out.append(tok.eos_id)
            ends.append(len(out))
    return split, np.asarray(out, dtype=np.int64), ends


def _tasks(split_docs):
    """Group (split, document) pairs into tasks per split, each cut as soon as it holds
    TASK_CHARS of text, in the middle of a document too: a task is at most TASK_CHARS plus one
    piece (sources.PIECE_CHARS), and as pieces are tokenized one by one, where a task is cut
    does not change the ids."""
    buffers: dict[str, list] = {}
    sizes: dict[str, int] = {}

    def add(split, piece, doc_end):
        buffers.setdefault(split, []).append((piece, doc_end))
        sizes[split] = sizes.get(split, 0) + len(piece)
        if sizes[split] >= TASK_CHARS:
            sizes[split] = 0
            return buffers.pop(split)
        return None

    for split, doc in split_docs:
        last = None  # one piece held back: whether it ends the document is known at the next
        for piece in doc:
            if not piece:
                continue
            if last is not None and (task := add(split, last, False)):
                yield split, task
            last = piece
        # empty documents are skipped: no end-of-text, not counted
        if last is not None and (task := add(split, last, True)):
            yield split, task
    for split, buf in buffers.items():
        if buf:
            yield split, buf


def _split_documents(srcs, text_field, hf_config, val_fraction, seed, stats, progress):
    """(split, document) pairs: the source's own splits, or a seeded per-document draw."""
    if srcs[0].kind == "hf":
        for split, texts in src_mod.hf_splits(srcs[0].location, hf_config, text_field).items():
            for text in texts:
                if text:
                    progress.update(len(text))
                    yield split, iter([text])
        return
    index = 0
    for src in srcs:
        for doc in src_mod.documents(src, text_field, stats):
            rng = random.Random(f"{seed}:{index}")
            index += 1
            yield ("val" if rng.random() < val_fraction else "train"), _counting(doc, progress)


def _counting(pieces, progress):
    for piece in pieces:
        progress.update(len(piece))
        yield piece


def _corpus_chars(srcs, text_field, hf_config) -> str:
    """Every distinct character of the corpus: the vocabulary of the char tokenizer."""
    chars: set[str] = set()
    docs = _split_documents(srcs, text_field, hf_config, 0.0, 0, src_mod.ReadStats(), _NoProgress())
    for _, doc in docs:
        for piece in doc:
            chars.update(piece)
    return "".join(sorted(chars))


class _NoProgress:
    def update(self, n):
        pass

    def close(self):
        pass


def prepare(sources: list[str], out: str, tokenizer: str = "gpt2", hf_config: str | None = None,
            text_field: str = "text", val_fraction: float = 0.0005, num_proc: int = 1,
            seed: int = 1337, shard_tokens: int = DEFAULT_SHARD_TOKENS, quiet: bool = False) -> dict:
    """Prepare a dataset directory; returns its meta. Nothing is left behind on failure."""
    if not sources:
        raise UserError("give at least one SOURCE (file, folder, glob, URL or HF dataset name)")
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if num_proc < 1:
        raise UserError(f"--num-proc must be >= 1, got {num_proc}")
    out_dir = Path(out).expanduser()
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"output {out_dir} already exists; choose a new --out directory")
    srcs = src_mod.expand(sources, hf_config)
    from gptrain.data import sft

    local = [Path(s.location) for s in srcs if s.kind == "file" and "://" not in s.location]
    kind = sft.detect(local) if len(local) == len(srcs) else None
    if kind and tokenizer == "char":
        raise UserError("instruction data needs a tokenizer with an end-of-sequence token: use "
                        "--tokenizer gpt2, byte or a Hugging Face tokenizer directory, not char")
    tok = tokenizers.by_name(tokenizer, _corpus_chars(srcs, text_field, hf_config)
                             if tokenizer == "char" else None)
    with new_directory(out_dir) as tmp:
        if kind:  # instruction (SFT) records: tokens, loss mask and example boundaries
            meta = _meta(tok, sft.prepare(local, kind, tok, tmp, val_fraction, seed, token_dtype(tok.vocab_size)),
                         seed, val_fraction, 0, 0.0)
        else:
            meta = _write_all(srcs, tok, tmp, text_field, hf_config, val_fraction, num_proc, seed,
                              shard_tokens, quiet)
        meta["sources"] = list(sources)
        write_meta(tmp, meta)
        if tok.name == "char":
            write_nanogpt_meta(tmp, tok.chars)
    return meta


def _write_all(srcs, tok, tmp, text_field, hf_config, val_fraction, num_proc, seed, shard_tokens, quiet):
    dtype = token_dtype(tok.vocab_size)
    writers = {s: SplitWriter(tmp, s, dtype, shard_tokens) for s in ("train", "val")}
    stats = src_mod.ReadStats()
    total = sum(s.size for s in srcs) or None
    progress = _NoProgress() if quiet else _tqdm(total)
    docs = _split_documents(srcs, text_field, hf_config, val_fraction, seed, stats, progress)
    spec = tok.spec()

    def consume(result):
        split, ids, ends = result
        writers[split].write(ids, ends)

    started = time.perf_counter()
    try:
        if num_proc == 1:
            _init_worker(spec)
            for task in _tasks(docs):
                consume(_tokenize(task))
        else:
            import multiprocessing as mp

            # spawn, not fork: tokenizer libraries run their own threads.
            with mp.get_context("spawn").Pool(num_proc, _init_worker, (spec,)) as pool:
                pending: deque = deque()
                for task in _tasks(docs):
                    pending.append(pool.apply_async(_tokenize, (task,)))
                    if len(pending) >= 2 * num_proc:  # bounded: memory does not grow with the corpus
                        consume(pending.popleft().get())
                while pending:
                    consume(pending.popleft().get())
    finally:
        progress.close()
    splits = {name: w.finish() for name, w in writers.items()}
    if splits["train"]["tokens"] == 0:
        raise UserError(f"no text found in {', '.join(s.location for s in srcs)}: the corpus is empty")
    if splits["val"]["tokens"] == 0 and val_fraction > 0:
        _tail_to_val(tmp, splits, dtype, val_fraction)
    if stats.replaced_chars and not quiet:
        print(f"warning: replaced {stats.replaced_chars} invalid UTF-8 sequences with U+FFFD")
    return _meta(tok, {"splits": splits}, seed, val_fraction, stats.replaced_chars,
                 time.perf_counter() - started)


def _meta(tok, written: dict, seed: int, val_fraction: float, replaced: int, seconds: float) -> dict:
    return {
        "format": FORMAT, "version": VERSION, "tokenizer": tok.spec(), "tokenizer_name": tok.name,
        "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "dtype": token_dtype(tok.vocab_size),
        **written, "invalid_utf8_replaced": replaced, "seed": seed, "val_fraction": val_fraction,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "prepare_seconds": round(seconds, 3),
    }


def _tail_to_val(tmp: Path, splits: dict, dtype: str, val_fraction: float):
    """Too few documents for a per-document draw: the last tokens of train become val."""
    train = splits["train"]
    if len(train["files"]) != 1:
        return
    path = tmp / train["files"][0]["name"]
    tokens = np.fromfile(path, dtype=dtype)
    n_val = max(1, int(len(tokens) * val_fraction))
    if n_val >= len(tokens):
        return
    for split, part in (("train", tokens[:-n_val]), ("val", tokens[-n_val:])):
        part.tofile(tmp / f"{split}.bin")
        splits[split].update(tokens=len(part), files=[{
            "name": f"{split}.bin", "tokens": len(part),
            "sha256": hashlib.sha256(part.tobytes()).hexdigest()}])
    splits["val"].update(documents=0, note="too few documents to draw from: the tail of train")


def _tqdm(total):
    from tqdm import tqdm

    return tqdm(total=total, unit="B" if total else "char", unit_scale=True, desc="tokenizing",
                disable=None, mininterval=0.5)


def _version(src: str) -> tuple[str, int | None]:
    """(what identifies a version of a file, folder or URL: its size and modification stamp, its size)."""
    if "://" not in src:
        p = Path(src)
        stats = [f.stat() for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p.stat()]
        size, stamp = sum(st.st_size for st in stats), max((st.st_mtime_ns for st in stats), default=0)
        return f"{p.resolve()}:{size}:{stamp}", size
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(src)
        info = fs.info(path)
    except (ImportError, ValueError, OSError) as e:
        raise UserError(f"cannot read {src}: {type(e).__name__}: {e}") from None
    version = [info.get(k) for k in ("size", "ETag", "LastModified", "mtime", "last-modified")]
    return f"{src}:{version}", info.get("size")


# A file trained on directly has no validation split of its own: some of its documents (or its
# last tokens, when it has too few documents) become one. Enough to evaluate on: about 64 KiB of
# text (thousands of blocks' worth of tokens), but no less than 1% and no more than 10% of the file.
VAL_BYTES, VAL_MIN_FRACTION, VAL_MAX_FRACTION = 64 * 1024, 0.01, 0.1


def cache_val_fraction(size: int | None) -> float:
    if not size:
        return VAL_MIN_FRACTION
    return round(min(VAL_MAX_FRACTION, max(VAL_MIN_FRACTION, VAL_BYTES / size)), 4)


def cached_prepare(src: str, tokenizer: str) -> Path:
    """A prepared copy of one text/JSONL/parquet file or URL (http, s3, ... through fsspec)
    under $GPTRAIN_HOME/cache, made once per (version stamp, tokenizer): when many processes
    (ranks, nodes, jobs) ask at once, one tokenizes and the others wait for it."""
    import sys

    from gptrain.atomic import build_once
    from gptrain.home import home

    version, size = _version(src)
    val_fraction = cache_val_fraction(size)
    key = hashlib.sha256(f"{version}:{tokenizer}:{val_fraction}".encode()).hexdigest()[:16]

    def build(out: Path) -> None:
        print(f"tokenizing {src} ({tokenizer}) once into {out}", file=sys.stderr)
        prepare([src], str(out), tokenizer=tokenizer, val_fraction=val_fraction, quiet=True)
    return build_once(home() / "cache" / f"prepared-{key}", build)
