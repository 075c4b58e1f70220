"""Many short 2-rank `gptrain train` runs under real torchrun, beside busy processes, counting the
runs that finished their last step but did not exit 0 (issue #47 row 0: a rank that aborted with
"terminate called without an active exception" at interpreter exit after "completed").

    .venv/bin/python scripts/exit_stress.py --runs 40 --parallel 2 --busy 1 [-- TRAINER FLAGS]

Prints one line per run that went wrong (with the end of its output) and a summary line:
`runs N, finished M, aborted at exit A, other failures F`. Exit 1 when any run went wrong.
Each run's output folder and log are kept under --work (a temporary folder by default).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32",
        "--train.lr=1e-3", "--train.warmup_steps=2", "--metrics.log_every=1", "--report_to=none",
        "--train.precision=fp32", "--train.batch_size=4", "--train.do_eval=false"]


def prepare(work: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.helpers import make_dataset

    return make_dataset(work)


def _pin(cpus):
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def one(i: int, data: Path, work: Path, extra: list[str], steps: int, cpus: set[int] | None) -> tuple[int, str, str]:
    out = work / f"run-{i}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GPTRAIN_HOME=str(work / "home"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "-m", "gptrain", "train", f"--data.path={data}", f"--train.output_dir={out}",
           f"--train.max_steps={steps}", "--checkpoint.every=2", *TINY, *extra]
    p = subprocess.run(cmd, env=env, cwd=work, preexec_fn=_pin(cpus), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       errors="replace")
    (work / f"run-{i}.log").write_text(p.stdout)
    finished = "completed" in p.stdout
    if p.returncode == 0:
        kind = "ok"
    elif finished and ("terminate called" in p.stdout or "SIGABRT" in p.stdout or "Signals.SIGABRT" in p.stdout):
        kind = "aborted at exit"
    else:
        kind = "other failure"
    return p.returncode, kind, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--parallel", type=int, default=2, help="runs at once")
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes beside the runs")
    ap.add_argument("--cpus", type=lambda s: {int(c) for c in s.split(",")}, default=None,
                    help="pin the runs and the busy loops to these CPUs (e.g. 0): more waiting for a core")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("extra", nargs="*", help="more trainer flags for every run (after --), e.g. "
                    "--parallel.dp_replicate=2 --parallel.dp_shard=1 for DDP; the default layout is FSDP2")
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="exit-stress-"))
    work.mkdir(parents=True, exist_ok=True)
    data = prepare(work)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_pin(a.cpus)) for _ in range(a.busy)]
    counts = {"ok": 0, "aborted at exit": 0, "other failure": 0}
    start = time.time()
    try:
        with ThreadPoolExecutor(a.parallel) as pool:
            futures = [pool.submit(one, i, data, work, a.extra, a.steps, a.cpus) for i in range(a.runs)]
            for i, f in enumerate(futures):
                rc, kind, out = f.result()
                counts[kind] += 1
                if kind != "ok":
                    tail = "\n    ".join(out.strip().splitlines()[-12:])
                    print(f"run {i}: {kind} (rc {rc}), log {work}/run-{i}.log:\n    {tail}", flush=True)
    finally:
        for b in busy:
            b.kill()
    bad = counts["aborted at exit"] + counts["other failure"]
    print(f"runs {a.runs}, finished {a.runs - counts['other failure']}, aborted at exit {counts['aborted at exit']}, "
          f"other failures {counts['other failure']} ({time.time() - start:.0f} s, flags {' '.join(a.extra) or 'default'}, "
          f"{a.parallel} at once, {a.busy} busy; work {work})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
