"""Wall time of CLI calls a user makes all day, and of the refusals a typo gets, beside
`python -c "import torch"` (what a command that loads torch pays before it can say anything).

    python bench/cli_latency.py [--repeat 10]

Runs each command as a fresh process (the installed `gptrain` script), median of --repeat runs,
next to `python -c pass` (the interpreter's own start-up, the floor for any Python CLI) and
`python -c "import torch"`; the last column is each command's time over the torch import's
(a refusal must answer well before torch could have loaded: under 0.2x). Uses a throw-away
GPTRAIN_HOME with one finished job, so `jobs` and `inspect` read a real store. A refused command
exits 2 by design; any other exit code stops the bench.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd, env, repeat, codes=(0,)):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - start)
        if r.returncode not in codes:
            raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    exe = shutil.which("gptrain") or str(Path(sys.executable).parent / "gptrain")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "GPTRAIN_HOME": home}
        script = Path(home) / "noop.py"
        script.write_text("pass\n")
        subprocess.run([exe, "run", "bench-job", "--", str(script)], env=env, check=True, capture_output=True)
        while "succeeded" not in subprocess.run([exe, "jobs"], env=env, capture_output=True, text=True).stdout:
            time.sleep(0.2)
        refused = (2,)
        rows = [("python -c pass", [sys.executable, "-c", "pass"], (0,)),
                ("python -c 'import torch'", [sys.executable, "-c", "import torch"], (0,)),
                ("gptrain --help", [exe, "--help"], (0,)),
                ("gptrain train --help", [exe, "train", "--help"], (0,)),
                ("gptrain jobs", [exe, "jobs"], (0,)),
                ("gptrain inspect NAME", [exe, "inspect", "bench-job"], (0,)),
                ("gptrain train --nope.x=1", [exe, "train", "--nope.x=1"], refused),
                ("gptrain run x -- --nope=1", [exe, "run", "x", "--", "--nope=1"], refused)]
        print(f"median of {args.repeat} runs, each a new process")
        measured = {name: timed(cmd, env, args.repeat, codes) for name, cmd, codes in rows}
        torch_s = measured["python -c 'import torch'"]
        print(f"{'command':<28} {'ms':>8} {'/ import torch':>15}")
        for name, took in measured.items():
            print(f"{name:<28} {1000 * took:8.1f} {took / torch_s:14.2f}x")


if __name__ == "__main__":
    main()
