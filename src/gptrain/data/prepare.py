"""`gptrain data prepare`: sources -> tokenized, flat token files + meta.json.

Work flows through three stages that never hold the whole corpus:
read (main process, streaming) -> tokenize (--num-proc workers, results taken back in
submission order, so the output is identical for any --num-proc) -> write (main process,
sha256 computed as it goes). Tasks are cut every TASK_CHARS of text, in the middle of a long
document too, so memory is bounded whatever the size of a file or a document.

Text sources and Hugging Face `datasets` (a save_to_disk folder, or a hub or local dataset
repository read as a stream) are written into OUT.partial/ (data/prepare_journal.py), which a
killed prepare leaves behind and a rerun of the same command continues; it becomes OUT atomically
when done. Instruction data (data/sft.py) is prepared in one go (a hidden temporary folder; a
killed prepare starts over).
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

from gptrain import tokenizers
from gptrain.atomic import new_directory
from gptrain.data import sources as src_mod
from gptrain.data.formats import (FORMAT, VERSION, SplitWriter, sha256_file, token_dtype, write_meta,
                                   write_nanogpt_meta)
from gptrain.data.prepare_journal import SPLITS, Journal
from gptrain.errors import UserError, disk_full
from gptrain.locations import is_url

MAX_PROCS = 256  # tokenizer processes at most (each a Python with the tokenizer loaded)
TASK_CHARS = 1 << 20          # text per tokenization task
# Tokens per .bin file before a new shard starts: 2^23, 16 MiB of uint16 (32 MiB of uint32). Sized
# for training from object storage: a reader holds its shard and prefetches the next, so the first
# step waits for one shard and a short run fetches two (docs/data.md, "Training from a URL").
DEFAULT_SHARD_TOKENS = 1 << 23
JOURNAL_SECONDS = 2.0         # how often the journal of OUT.partial records the tasks written


_worker_tokenizer = None


def _init_worker(spec):
    global _worker_tokenizer
    _worker_tokenizer = tokenizers.from_spec(spec)


def _tokenize(task):
    """(split, tokens, where documents end in them) for a list of (text piece, ends a document)."""
    split, pieces = task
    tok = _worker_tokenizer
    eos = np.array([] if tok.eos_id is None else [tok.eos_id], dtype=np.int64)
    out, ends, n = [], [], 0
    # numpy all the way (tokenizers that can): no Python int per token
    for (_, doc_end), ids in zip(pieces, tok.encode_arrays([text for text, _ in pieces])):
        out.append(ids)
        n += len(ids)
        if doc_end:
            out.append(eos)
            n += len(eos)
            ends.append(n)
    # in the file's dtype (uint16 for GPT-2): a quarter of int64's bytes back to the writer
    return split, np.concatenate(out or [eos[:0]]).astype(token_dtype(tok.vocab_size)), ends


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


# Sources with no validation split of their own get one: about 64 KiB of their text (thousands of
# blocks' worth of tokens), no less than 1% and no more than 10% of it (nanoGPT's shakespeare
# prepare.py takes the last 10% of input.txt). The same rule for `data prepare` and for a file
# trained on directly (prepared_cache.py), so one file gives the same split either way.
VAL_BYTES, VAL_MIN_FRACTION, VAL_MAX_FRACTION = 64 * 1024, 0.01, 0.1


def default_val_fraction(size: int | None) -> float:
    if not size:
        return VAL_MIN_FRACTION
    return round(min(VAL_MAX_FRACTION, max(VAL_MIN_FRACTION, VAL_BYTES / size)), 4)


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


MIN_SHARD_TOKENS = 256


def prepare(sources: list[str], out: str, tokenizer: str = "gpt2", hf_config: str | None = None,
            text_field: str = "text", val_fraction: float | None = None, num_proc: int = 1,
            seed: int = 1337, shard_tokens: int | None = None, quiet: bool = False) -> dict:
    """Prepare a dataset directory; returns its meta. Text sources: a killed prepare leaves
    OUT.partial, which the same call continues; an error removes it (nothing is left behind)."""
    if not sources:
        raise UserError("give at least one SOURCE (file, folder, glob, URL or HF dataset name)")
    if val_fraction is not None and not 0.0 <= val_fraction < 1.0:
        raise UserError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if not 1 <= num_proc <= MAX_PROCS:
        raise UserError(f"--num-proc must be 1 to {MAX_PROCS} (this machine has {os.cpu_count()} CPUs), "
                        f"got {num_proc}")
    shard_tokens = DEFAULT_SHARD_TOKENS if shard_tokens is None else shard_tokens
    if shard_tokens < MIN_SHARD_TOKENS:  # (1 made a file per token: 35,680 files in 20 s)
        raise UserError(f"--shard-tokens must be at least {MIN_SHARD_TOKENS} (a shard is a file), got {shard_tokens}")
    from gptrain.atomic import check_new_folder

    out_dir = check_new_folder(out, "output", "--out")
    srcs = src_mod.expand(sources, hf_config)
    if val_fraction is None:
        val_fraction = default_val_fraction(sum(s.size for s in srcs) or None)
    from gptrain.data import sft

    local = [Path(s.location) for s in srcs if s.kind == "file" and not is_url(s.location)]
    kind = sft.detect(local) if len(local) == len(srcs) else None
    if kind and tokenizer == "char":
        raise UserError("instruction data needs a tokenizer with an end-of-sequence token: use "
                        "--tokenizer gpt2, byte or a Hugging Face tokenizer directory, not char")
    tok = tokenizers.by_name(tokenizer, _corpus_chars(srcs, text_field, hf_config)
                             if tokenizer == "char" else None)
    if kind:  # instruction (SFT) records: tokens, loss mask and example boundaries, in one go
        with new_directory(out_dir) as tmp:
            meta = _meta(tok, sft.prepare(local, kind, tok, tmp, val_fraction, seed,
                                          token_dtype(tok.vocab_size)), seed, val_fraction, 0, 0.0)
            meta["sources"] = list(sources)
            write_meta(tmp, meta)
            if tok.name == "char":
                write_nanogpt_meta(tmp, tok.chars)
        return meta
    journal = Journal(out_dir, _identity(srcs, tok, text_field, hf_config, val_fraction, seed, shard_tokens))
    if journal.state.get("complete"):  # killed as it was renaming its finished folder
        try:
            return journal.finish_complete(list(sources), tok.spec())
        finally:
            journal.close()
    try:
        meta = _continue(journal, srcs, tok, text_field, hf_config, val_fraction, num_proc, seed,
                         shard_tokens, quiet)
        meta["sources"] = list(sources)
        write_meta(journal.dir, meta)
        if tok.name == "char":
            write_nanogpt_meta(journal.dir, tok.chars)
        journal.publish()
    except Exception as e:  # an error, not a kill or Ctrl-C: nothing is left behind
        journal.discard()
        full = disk_full(e, out_dir)
        if full is not None:
            raise full from None
        raise
    finally:
        journal.close()
    return meta


def _identity(srcs, tok, text_field, hf_config, val_fraction, seed, shard_tokens) -> dict:
    """What a rerun must match to continue an interrupted prepare: the sources' version stamps
    and every option that changes the bytes written (--num-proc does not)."""
    spec = dict(tok.spec())
    if spec["name"] == "hf" and Path(spec["path"]).exists():
        spec["stamp"] = src_mod.version_stamp(spec["path"])[0]
    return {"sources": [[s.location, _stamp(s)] for s in srcs], "tokenizer": spec,
            "val_fraction": val_fraction, "seed": seed, "shard_tokens": shard_tokens,
            "text_field": text_field, "hf_config": hf_config, "task_chars": TASK_CHARS,
            "piece_chars": src_mod.PIECE_CHARS, "itemsize": np.dtype(token_dtype(tok.vocab_size)).itemsize}


def _stamp(src) -> str:
    """A source's version stamp; a Hugging Face hub name has none here (its revision is the
    hub's): a rerun continues it as the same dataset."""
    if src.kind == "hf" and not is_url(src.location) and not Path(src.location).expanduser().exists():
        return f"hub:{src.location}"
    return src_mod.version_stamp(src.location)[0]


def _continue(journal, srcs, tok, text_field, hf_config, val_fraction, num_proc, seed, shard_tokens, quiet):
    state, folder = journal.state, journal.dir
    if state["done"]:  # every task was written: only the last steps remain
        return _finalize(folder, state, tok, seed, val_fraction, state["invalid_utf8_replaced"], 0.0, quiet,
                         srcs)
    dtype = token_dtype(tok.vocab_size)
    writers = {s: SplitWriter(folder, s, dtype, shard_tokens, state["splits"][s]) for s in SPLITS}
    if state["tasks"]:
        tokens = sum(st["tokens"] + sum(f["tokens"] for f in st["files"]) for st in state["splits"].values())
        print(f"continuing an interrupted prepare: {state['tasks']} tasks ({tokens:,} tokens) already written",
              file=sys.stderr if quiet else sys.stdout, flush=True)
    return _write_all(srcs, tok, folder, writers, state["tasks"], journal, text_field, hf_config,
                      val_fraction, num_proc, seed, quiet)


def _write_all(srcs, tok, folder, writers, skip, journal, text_field, hf_config, val_fraction, num_proc,
               seed, quiet):
    """Tokenize every task after the first `skip` into `writers`; with a journal, record the
    tasks written every JOURNAL_SECONDS and when done."""
    stats = src_mod.ReadStats()
    total = sum(s.size for s in srcs) or None
    progress = _NoProgress() if quiet else _tqdm(total)
    docs = _split_documents(srcs, text_field, hf_config, val_fraction, seed, stats, progress)
    tasks = itertools.islice(_tasks(docs), skip, None)  # the input is read again, not tokenized
    spec = tok.spec()
    written, saved = skip, time.monotonic()

    def consume(result):
        nonlocal written, saved
        split, ids, ends = result
        writers[split].write(ids, ends)
        written += 1
        if journal is not None and time.monotonic() - saved >= JOURNAL_SECONDS:
            journal.save(writers, written)
            saved = time.monotonic()

    started = time.perf_counter()
    try:
        if num_proc == 1:
            _init_worker(spec)
            for task in tasks:
                consume(_tokenize(task))
        else:
            import multiprocessing as mp

            # spawn, not fork: tokenizer libraries run their own threads.
            with mp.get_context("spawn").Pool(num_proc, _init_worker, (spec,)) as pool:
                pending: deque = deque()
                for task in tasks:
                    pending.append(pool.apply_async(_tokenize, (task,)))
                    if len(pending) >= 2 * num_proc:  # bounded: memory does not grow with the corpus
                        consume(pending.popleft().get())
                while pending:
                    consume(pending.popleft().get())
    finally:
        progress.close()
    for w in writers.values():
        w.close()
    state = {"splits": {s: {"files": w.files} for s, w in writers.items()}}
    if journal is not None:
        journal.save(writers, written, done=True, replaced=stats.replaced_chars)
        state = journal.state
    return _finalize(folder, state, tok, seed, val_fraction, stats.replaced_chars,
                     time.perf_counter() - started, quiet, srcs)


def _finalize(folder, state, tok, seed, val_fraction, replaced, seconds, quiet, srcs=None) -> dict:
    """The splits' final files (one file: nanoGPT's plain SPLIT.bin) and the meta. Can be run
    again after a kill: a file already renamed is found under its new name."""
    dtype = token_dtype(tok.vocab_size)
    splits = {s: {"tokens": sum(f["tokens"] for f in st["files"]),
                  "documents": sum(f["documents"] for f in st["files"]),
                  "files": [dict(f) for f in st["files"]]} for s, st in state["splits"].items()}
    if splits["train"]["tokens"] == 0:
        where = ", ".join(s.location for s in srcs or []) or "the sources"
        raise UserError(f"no text found in {where}: the corpus is empty")
    n = splits["train"]["tokens"]
    if splits["val"]["tokens"] == 0 and val_fraction > 0 and len(splits["train"]["files"]) == 1 \
            and max(1, int(n * val_fraction)) < n:
        _tail_to_val(folder, splits, dtype, val_fraction)
    else:
        for split, info in splits.items():
            if len(info["files"]) == 1:
                _rename(folder, info["files"][0], f"{split}.bin")
    if replaced and not quiet:
        print(f"warning: replaced {replaced} invalid UTF-8 sequences with U+FFFD")
    return _meta(tok, {"splits": splits}, seed, val_fraction, replaced, seconds)


def _rename(folder: Path, entry: dict, final: str) -> None:
    src = folder / entry["name"]
    if src.exists():
        os.replace(src, folder / final)
    elif not (folder / final).is_file():
        raise UserError(f"token file {src} is missing from {folder}; remove {folder} to start over")
    entry["name"] = final


def _meta(tok, written: dict, seed: int, val_fraction: float, replaced: int, seconds: float) -> dict:
    return {
        "format": FORMAT, "version": VERSION, "tokenizer": tok.spec(), "tokenizer_name": tok.name,
        "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "dtype": token_dtype(tok.vocab_size),
        **written, "invalid_utf8_replaced": replaced, "seed": seed, "val_fraction": val_fraction,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "prepare_seconds": round(seconds, 3),
    }


def _tail_to_val(folder: Path, splits: dict, dtype: str, val_fraction: float):
    """Too few documents for a per-document draw: the last tokens of train become val. The
    shard is read in blocks and removed only once train.bin and val.bin are on the disk."""
    train = splits["train"]
    n = train["tokens"]
    n_val = max(1, int(n * val_fraction))
    shard = folder / train["files"][0]["name"]
    if shard.exists():  # copied with reads, not a memmap: mapped pages would count as this process's memory
        size = np.dtype(dtype).itemsize
        with open(shard, "rb") as src:
            for split, lo, hi in (("train", 0, n - n_val), ("val", n - n_val, n)):
                src.seek(lo * size)
                (folder / f"{split}.bin").unlink(missing_ok=True)  # never through a link left in the work folder
                with open(folder / f"{split}.bin", "xb") as f:
                    left = (hi - lo) * size
                    while left:
                        block = src.read(min(left, 1 << 24))
                        if not block:
                            raise UserError(f"token file {shard} is shorter than its journal says; "
                                            f"remove {folder} to start over")
                        f.write(block)
                        left -= len(block)
                    f.flush()
                    os.fsync(f.fileno())
        for f in splits["val"]["files"]:
            (folder / f["name"]).unlink(missing_ok=True)
        shard.unlink()
    for split, count in (("train", n - n_val), ("val", n_val)):
        splits[split].update(tokens=count, files=[{
            "name": f"{split}.bin", "tokens": count, "sha256": sha256_file(folder / f"{split}.bin")}])
    splits["val"].update(documents=0, note="the end of the text (too few documents to hold some out)")


def _tqdm(total):
    from tqdm import tqdm

    return tqdm(total=total, unit="B" if total else "char", unit_scale=True, desc="tokenizing",
                disable=None, mininterval=0.5)
