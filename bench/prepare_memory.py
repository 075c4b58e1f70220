"""Peak memory of `gptrain data prepare` on one large text file (issue 24), and what a kill costs.

    python bench/prepare_memory.py [--corpus DIR] [--mb 200] [--num-proc 2] [--src SRC_DIR]
                                   [--kill-after SECONDS]

Builds one ~MB-megabyte .txt file by repeating a real text (the .txt files of --corpus, default
the Shakespeare corpus that `gptrain data fetch shakespeare` downloads) and prepares it with the
GPT-2 tokenizer as a subprocess (`python -m gptrain data prepare`, PYTHONPATH=--src, default this
checkout's src/, so an older checkout can be measured the same way). It prints the wall time,
the peak RSS of the largest process (getrusage RUSAGE_CHILDREN) and the peak of the sum of the
RSS of the command and its workers (sampled every 50 ms). With --kill-after, the prepare is
killed (SIGKILL) after that many seconds and run again, and both runs are timed.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def build_file(corpus: Path, path: Path, mb: int) -> Path:
    text = "".join(f.read_text(errors="replace") for f in sorted(corpus.glob("*.txt")))
    with open(path, "w") as f:
        written = 0
        while written < mb * 10**6:
            f.write(text)
            written += len(text.encode())
    return path


def run(src_dir: Path, text: Path, out: Path, num_proc: int, kill_after: float | None = None, extra=()):
    """(seconds, peak tree RSS bytes, exit code, stdout) of one prepare; run.largest: the peak RSS
    of its largest process, as sampled."""
    env = {**os.environ, "PYTHONPATH": str(src_dir)}
    cmd = [sys.executable, "-m", "gptrain", "data", "prepare", str(text), "--out", str(out),
           "--tokenizer", "gpt2", "--num-proc", str(num_proc), *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    parent, peak = psutil.Process(proc.pid), 0
    run.largest = 0
    while proc.poll() is None:
        try:
            procs = [parent] + parent.children(recursive=True)
            rss = [p.memory_info().rss for p in procs if p.is_running()]
            peak, run.largest = max(peak, sum(rss)), max([run.largest, *rss])
        except psutil.Error:
            pass
        if kill_after is not None and time.perf_counter() - start >= kill_after:
            for p in parent.children(recursive=True):
                p.kill()
            proc.kill()
        time.sleep(0.05)
    stdout = proc.stdout.read()
    return time.perf_counter() - start, peak, proc.wait(), stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=None, help="folder of .txt files (default: the Shakespeare corpus)")
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--kill-after", type=float, default=None)
    ap.add_argument("--tmp", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(dir=args.tmp))
    try:
        if args.corpus:
            corpus = Path(args.corpus)
        else:
            sys.path.insert(0, args.src)
            from gptrain.data.fetch import fetch

            corpus = fetch("shakespeare", str(tmp / "corpus"))
        text = build_file(corpus, tmp / "big.txt", args.mb)
        print(f"file: {text.stat().st_size / 1e6:.0f} MB (one document), gpt2, --num-proc {args.num_proc}, "
              f"code: {args.src}")
        seconds, peak, code, stdout = run(Path(args.src), text, tmp / "out", args.num_proc, args.kill_after)
        if args.kill_after is not None:
            print(f"killed after {seconds:.1f} s (exit {code}); running it again")
            seconds2, peak2, code, stdout = run(Path(args.src), text, tmp / "out", args.num_proc)
            print(f"rerun: {seconds2:.1f} s, exit {code}: {stdout.strip()[:300]}")
            seconds, peak = seconds + seconds2, max(peak, peak2)
        largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        print(f"exit {code}; wall {seconds:.1f} s; peak RSS of the largest process {largest / 2**20:,.0f} MiB; "
              f"peak RSS of the command and its workers together {peak / 2**20:,.0f} MiB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
