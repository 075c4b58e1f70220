"""Does training from a URL wait on the network? (issue 24, data/remote_shards.py)

    python bench/remote_prefetch.py [--delay 0.2] [--shards-held 4] [--step 0.01]
    python bench/remote_prefetch.py --train DATASET --cache-mb 16 [--steps 100] [--repeat 2]
                                    [--skip 10] [--model-arg=--model.n_embd=64 ...]

Loader mode (no --train): prepares a char dataset of 21 train shards (20,000 tokens each) in a
temporary folder, serves it over HTTP on 127.0.0.1 with every shard request delayed by --delay
seconds (a slow network), and reads one epoch through a ShardedLoader (block 64, batch 8) with
a cache of --shards-held shards, sleeping --step seconds per batch (the step's compute). It
prints how many shards the reader downloaded itself, how many the prefetch thread did, and how
many batches waited longer than delay/2 for their data, and the cache's largest size after a batch.

Training mode (--train DATASET, a folder `gptrain data prepare --shard-tokens T` wrote): serves
the folder on 127.0.0.1 (the server counts the bytes it sends, with their times) and runs
`python -m gptrain train` on a tiny model, alternating, from the local folder and from the URL
with --data.cache_bytes = --cache-mb MiB (each run its own process and fresh $GPTRAIN_HOME;
metrics.jsonl logs every step's time). Per URL run: bytes sent before step 1 was logged, as a
fraction of the dataset's bytes; the cache's shards/ folder's size sampled every 20 ms (in both sides'
runs) and its peak against the bound; for both sides the time to step 1 and the steady-state
tokens/s, steps --skip..--steps from the logged times. Prints each side's median and the ratio.
First, the data side of a step alone: the trainer's loader over each, in this process
(--loader-batches, ms per batch); --repeat 0 runs only that.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gptrain.data.remote_shards import cached_bytes  # noqa: E402  (what data.cache_bytes bounds)


def serve(directory, delay: float = 0.0):
    """A threaded HTTP server on 127.0.0.1 for `directory`; (server, base URL, sent): `sent` is
    a list of (time, bytes) for every chunk of a response body written."""
    sent: list = []
    lock = threading.Lock()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if delay and self.path.endswith(".bin"):
                time.sleep(delay)
            super().do_GET()

        def copyfile(self, source, outputfile):
            while block := source.read(1 << 16):
                outputfile.write(block)
                with lock:
                    sent.append((time.time(), len(block)))

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}", sent


def loader_mode(args) -> None:
    tmp = Path(tempfile.mkdtemp())
    os.environ["GPTRAIN_HOME"] = str(tmp / "home")
    os.environ["GPTRAIN_CACHE_DIR"] = str(tmp / "cache")
    from gptrain.data import remote_shards as rs
    from gptrain.data.loader import ShardedLoader
    from gptrain.data.prepare import prepare
    from tests.helpers import write_corpus

    prepare([str(write_corpus(tmp / "c.txt", 400000))], str(tmp / "ds"), tokenizer="char",
            val_fraction=0.01, shard_tokens=20000, quiet=True)
    srv, base, _ = serve(tmp, args.delay)
    folder = rs.open_remote(f"{base}/ds", args.shards_held * 40000)
    counts = {"reader": 0, "prefetch": 0}
    download = rs.ShardCache._download

    def counted(self, f, size, path):
        counts["reader" if threading.current_thread() is threading.main_thread() else "prefetch"] += 1
        return download(self, f, size, path)

    rs.ShardCache._download = counted
    tokens = rs.open_remote_split(folder, "train")
    loader = ShardedLoader(tokens, 64, 8, seed=1)
    batches, waits, peak, t = int(loader.n_blocks / 8), 0, 0, time.time()
    for _ in range(batches):
        t0 = time.time()
        loader.next_batch()
        waits += time.time() - t0 > args.delay / 2
        peak = max(peak, cached_bytes(tmp / "cache"))
        time.sleep(args.step)
    print(f"shards {len(tokens.files)}, batches {batches}, cache {args.shards_held} shards: downloads by the "
          f"reader {counts['reader']}, by prefetch {counts['prefetch']}, batches that waited {waits}, "
          f"wall {time.time() - t:.1f}s; cache after each batch at most {peak:,} B of {args.shards_held * 40000:,}")
    srv.shutdown()


def train_once(data_path: str, cache_bytes: int, tmp: Path, args, tokens_per_step: int, sent=None) -> dict:
    """One `gptrain train` process; its numbers (class doc)."""
    home, out, cache = tmp / "home", tmp / "out", tmp / "cache"
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "gptrain", "train", f"--data.path={data_path}", f"--data.cache_bytes={cache_bytes}",
           "--model.preset=gpt2-mini", *args.model_arg, f"--train.max_steps={args.steps}",
           "--train.do_eval=false", "--checkpoint.every=0", "--metrics.log_every=1", "--report_to=none",
           f"--train.output_dir={out}", "--checkpoint.resume_from=none", "--train.warmup_steps=2"]
    env = {**os.environ, "GPTRAIN_HOME": str(home), "GPTRAIN_CACHE_DIR": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    peak, first_sent = 0, len(sent) if sent is not None else 0
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()
    threading.Thread(target=lambda: (proc.wait(), done.set()), daemon=True).start()
    while not done.wait(0.02):  # both sides sample, so both pay for it
        peak = max(peak, cached_bytes(cache))
    log = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"gptrain train failed ({proc.returncode}):\n{log[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if "train/loss" in r}
    first = times[min(times)]
    lo, hi = args.skip, max(times)
    res = {"first_step_s": first - start, "steady_tok_s": tokens_per_step * (hi - lo) / (times[hi] - times[lo]),
           "cache_peak": peak, "wall_s": time.time() - start}
    if sent is not None:
        chunks = sent[first_sent:]
        res["bytes_before_first"] = sum(n for t, n in chunks if t <= first)
        res["bytes_total"] = sum(n for _, n in chunks)
    return res


def loader_times(data: Path, url: str, cache_bytes: int, args, tmp: Path) -> None:
    """The data side of a step alone: the trainer's loader (open_train_loader) over the local
    folder and over the URL, in this process, --loader-batches batches each, twice, alternating."""
    os.environ["GPTRAIN_HOME"] = str(tmp / "loader-home")
    from gptrain.data.loader import open_train_loader
    from gptrain.data.remote_shards import open_remote

    opts = dict(a.split("=", 1) for a in args.model_arg)
    for side in ("local", "url", "local", "url"):
        start = time.perf_counter()
        path = data if side == "local" else open_remote(url, cache_bytes)
        loader = open_train_loader(path, int(opts["--model.block_size"]), int(opts["--train.batch_size"]), 0, 1,
                                   1337, None, 50257)
        loader.next_batch()
        first = time.perf_counter()
        for _ in range(args.loader_batches):
            loader.next_batch()
        print(f"loader {side:<5}: open + first batch {first - start:.2f} s, then "
              f"{(time.perf_counter() - first) / args.loader_batches * 1000:.2f} ms per batch", flush=True)


def train_mode(args) -> None:
    data = Path(args.train).resolve()
    meta = json.loads((data / "meta.json").read_text())
    size = sum(f.stat().st_size for f in data.glob("*.bin"))
    nfiles = sum(len(s["files"]) for s in meta["splits"].values())
    opts = dict(a.split("=", 1) for a in args.model_arg)
    tokens_per_step = int(opts["--train.batch_size"]) * int(opts["--model.block_size"])
    cache_bytes = int(args.cache_mb * 2**20)
    srv, base, sent = serve(data.parent)
    url = f"{base}/{data.name}"
    tmp = Path(tempfile.mkdtemp(dir=args.tmp))
    print(f"dataset {data}: {size / 1e9:.3f} GB in {nfiles} shard files (+ meta.json {(data / 'meta.json').stat().st_size:,} B); "
          f"cache bound {cache_bytes:,} B ({cache_bytes / size:.1%} of it); {tokens_per_step:,} tokens/step, "
          f"{args.steps} steps, steady state from step {args.skip}; {' '.join(args.model_arg)}")
    runs = {"local": [], "url": []}
    try:
        if args.loader_batches:
            loader_times(data, url, cache_bytes, args, tmp)
        for i in range(args.repeat):
            for side in ("local", "url") if i % 2 == 0 else ("url", "local"):
                r = train_once(str(data) if side == "local" else url, cache_bytes, tmp, args, tokens_per_step,
                               sent if side == "url" else None)
                runs[side].append(r)
                extra = (f", fetched before step 1 {r['bytes_before_first']:,} B ({r['bytes_before_first'] / size:.2%}), "
                         f"in all {r['bytes_total']:,} B, cache peak {r['cache_peak']:,} B "
                         f"({'within' if r['cache_peak'] <= cache_bytes else 'ABOVE'} the bound)") if side == "url" else ""
                print(f"run {i + 1} {side:<5}: step 1 after {r['first_step_s']:.2f} s, steady {r['steady_tok_s']:,.0f} "
                      f"tokens/s, wall {r['wall_s']:.1f} s{extra}", flush=True)
    finally:
        srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.repeat:
        return
    med = {s: statistics.median(r["steady_tok_s"] for r in rs) for s, rs in runs.items()}
    print(f"steady tokens/s (median of {args.repeat}): local {med['local']:,.0f}, url {med['url']:,.0f}, "
          f"url / local {med['url'] / med['local']:.3f}; per round (the two runs back to back): "
          + ", ".join(f"{u['steady_tok_s'] / loc['steady_tok_s']:.3f}" for u, loc in zip(runs["url"], runs["local"])))
    print("time to step 1 (median): " + ", ".join(f"{s} {statistics.median(r['first_step_s'] for r in rs):.1f} s"
                                                for s, rs in runs.items()))
    print(f"fetched before step 1: at most {max(r['bytes_before_first'] for r in runs['url']) / size:.2%} of the dataset; "
          f"cache peak {max(r['cache_peak'] for r in runs['url']):,} B of {cache_bytes:,} B bound")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay", type=float, default=0.2)
    ap.add_argument("--shards-held", type=int, default=4)
    ap.add_argument("--step", type=float, default=0.01)
    ap.add_argument("--train", default=None, help="a prepared folder to serve and train from (training mode)")
    ap.add_argument("--cache-mb", type=float, default=16)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skip", type=int, default=10, help="steps before the steady state")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--model-arg", action="append", default=None)
    ap.add_argument("--loader-batches", type=int, default=300, help="batches of the loader-only timing (0: none)")
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    if args.model_arg is None:
        args.model_arg = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=64", "--model.block_size=128",
                          "--train.batch_size=32"]
    train_mode(args) if args.train else loader_mode(args)


if __name__ == "__main__":
    main()
