"""Where gptrain's training step goes: time per op, at 1 thread and at N, on the CPU workload.

    python bench/step_profile.py [--steps 3] [--threads 2]

Runs gptrain's GPT (the bench/train_throughput.py CPU shape, fused loss, fused AdamW, clipping)
under torch.profiler, first with one thread, then with --threads, and prints the ops that take
the most time with their speed-up from the extra threads, then the share of the step spent in
matrix multiplies and the rate they run at. An op that does not speed up is a serial section;
a step that is nearly all matmuls at the machine's GEMM rate has little left to gain.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

MATMULS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps per thread count")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=20)
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile
    from train_throughput import workload

    from gptrain.models.shapes import GPTConfig
    from gptrain.models.gpt2 import GPT
    from gptrain.train.cpu import keep_freed_memory

    keep_freed_memory()  # as the trainer does on CPU
    w = workload("cpu")
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=w["n_layer"], n_head=w["n_head"], n_embd=w["n_embd"],
                    block_size=w["block_size"], vocab_size=50257)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, cfg.vocab_size, (w["batch"], w["block_size"]))
    y = torch.randint(0, cfg.vocab_size, (w["batch"], w["block_size"]))

    def step():
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    per_op, step_s = {}, {}
    for threads in (1, args.threads):
        torch.set_num_threads(threads)
        step(), step()  # warm up the allocator and kernels
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            step_s[threads] = (time.perf_counter() - start) / args.steps
        per_op[threads] = {e.key: e.self_cpu_time_total / 1e3 / args.steps for e in prof.key_averages()}

    one, many = per_op[1], per_op[args.threads]
    print(f"{'op (ms per step)':<52} {'1 thread':>9} {f'{args.threads} threads':>10} {'speed-up':>8}")
    for name, ms in sorted(many.items(), key=lambda kv: -kv[1])[:args.rows]:
        base = one.get(name, 0.0)
        print(f"{name[:52]:<52} {base:9.1f} {ms:10.1f} {base / ms if ms else 0:8.2f}")
    mm_ms = sum(many.get(k, 0.0) for k in MATMULS)
    total_ms = sum(many.values())
    gflop = 6 * model.num_params() * x.numel() / 1e9  # the matmuls' share of flops_per_token
    print(f"step {step_s[args.threads]:.2f} s with {args.threads} threads (profiled), {step_s[1]:.2f} s with 1")
    print(f"matmuls: {mm_ms / total_ms:.0%} of op time, {mm_ms / 1e3:.2f} s per step, "
          f"{gflop:.0f} GFLOP (6 N tokens) at {gflop / (mm_ms / 1e3):.0f} GFLOP/s")


if __name__ == "__main__":
    main()
