"""Wall time of CLI calls a user makes all day: `gptrain --help`, `gptrain jobs`, `gptrain inspect`.

    python bench/cli_latency.py [--repeat 10]

Runs each command as a fresh process (the installed `gptrain` script), median of --repeat runs,
next to `python -c pass` (the interpreter's own start-up, the floor for any Python CLI). Uses a
throw-away GPTRAIN_HOME with one finished job, so `jobs` and `inspect` read a real store.
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


def timed(cmd, env, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
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
        rows = [("python -c pass", [sys.executable, "-c", "pass"]),
                ("gptrain --help", [exe, "--help"]),
                ("gptrain jobs", [exe, "jobs"]),
                ("gptrain inspect NAME", [exe, "inspect", "bench-job"])]
        print(f"median of {args.repeat} runs, each a new process")
        for name, cmd in rows:
            print(f"{name:<22} {1000 * timed(cmd, env, args.repeat):7.1f} ms")


if __name__ == "__main__":
    main()
