"""SFT on short examples: rows packed with several examples (data.packing) vs one example per
padded row, side by side, in gptrain itself (the padded form is what gptrain did before packing
and what TRL's SFTTrainer does with packing=False).

    python bench/sft_packing.py [--examples 2000] [--block 256] [--batch 8] [--steps 30] [--warmup 5]

The data: TRL-style prompt-completion rows of about 12 GPT-2 tokens each ("Q: say red blue\n" ->
"ANSWER: red blue", EOS), prepared once. The model: gptrain's gpt2-tiny preset at context --block,
fp32, one process, each side in a process of its own. A side's speed is the median step time
after --warmup steps; it prints steps/s, examples/s and completion tokens/s (the loss-bearing
tokens trained per second) for both and their ratios. The losses themselves are tested equal
(tests/unit/test_sft_packing.py: every example's token losses packed = padded within 1e-5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "fish", "bird"]


def make_data(tmp: Path, n: int) -> Path:
    import random

    from gptrain.data.prepare import prepare

    rnd = random.Random(0)
    rows = []
    for _ in range(n):
        said = " ".join(rnd.sample(WORDS, 2))
        rows.append({"prompt": f"Q: say {said}\n", "completion": f"ANSWER: {said}"})
    (tmp / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare([str(tmp / "sft.jsonl")], str(tmp / "data"), tokenizer="gpt2", val_fraction=0.05, quiet=True)
    return tmp / "data"


def child(args) -> None:
    """One side: train, then print its step times and what its rows held."""
    import numpy as np

    from gptrain.config_options import parse_train_args
    from gptrain.data.formats import open_examples
    from gptrain.data.loader import open_train_loader
    from gptrain.data.remote_shards import open_tokens
    from gptrain.train.trainer import train

    steps = args.steps + args.warmup
    with tempfile.TemporaryDirectory() as out:
        cfg = parse_train_args([
            f"--data.path={args.data}", "--model.preset=gpt2-tiny", f"--model.block_size={args.block}",
            f"--train.batch_size={args.batch}", f"--train.max_steps={steps}", "--train.precision=fp32",
            "--train.do_eval=false", "--checkpoint.every=0", "--metrics.log_every=1", "--report_to=none",
            f"--train.output_dir={out}", f"--data.packing={args.child}", "--checkpoint.resume_from=none"])
        train(cfg)
        times = [json.loads(line)["time"] for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    loader = open_train_loader(args.data, args.block, args.batch, 0, 1, 0, None, 50257,
                               packing=args.child == "true")
    examples = open_examples(args.data, "train", len(open_tokens(args.data, "train")))
    per_row = len(loader.usable) / loader.n_blocks
    targets = float(np.sum(examples[0])) / len(loader.usable)  # loss-bearing tokens per example
    step_s = statistics.median([b - a for a, b in zip(times, times[1:])][args.warmup - 1:])
    print("RESULT " + json.dumps({"packing": args.child, "step_s": step_s, "examples_per_row": per_row,
                                  "targets_per_example": targets,
                                  "example_tokens": float(np.mean(loader.spans[:, 1] - loader.spans[:, 0]))}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--child", choices=["true", "false"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory() as tmp:
        env["GPTRAIN_HOME"] = str(Path(tmp) / "home")
        sys.path.insert(0, str(ROOT / "src"))
        data = make_data(Path(tmp), args.examples)
        results = {}
        for side in ("false", "true"):
            r = subprocess.run([sys.executable, __file__, "--child", side, "--data", str(data),
                                *(f"--{k}={getattr(args, k)}" for k in ("block", "batch", "steps", "warmup"))],
                               capture_output=True, text=True, env=env)
            line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"side packing={side} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
            results[side] = json.loads(line[7:])
    print(f"gpt2-tiny, context {args.block}, batch {args.batch}, fp32, {args.steps} timed steps, "
          f"examples of {results['false']['example_tokens']:.1f} tokens")
    rate = {}
    for side, name in (("false", "padded (one example a row)"), ("true", "packed (data.packing)")):
        r = results[side]
        ex_s = args.batch * r["examples_per_row"] / r["step_s"]
        rate[side] = ex_s
        print(f"{name:28s} {1 / r['step_s']:7.2f} steps/s  {r['examples_per_row']:6.1f} examples/row  "
              f"{ex_s:9,.0f} examples/s  {ex_s * r['targets_per_example']:10,.0f} completion tokens/s")
    print(f"ratio packed / padded: {rate['true'] / rate['false']:.2f}x examples/s")


if __name__ == "__main__":
    main()
