"""One transformer block, forward + backward, eager against torch.compile'd, side by side on a CPU.

    python bench/cpu_compile.py [--shape tinyllama|gpt2] [--mode lora|full] [--precision bf16|fp32] [--steps 6]

The evidence behind train/plan.py's `compile_on_cpu` (a CPU run with train.compile unset
compiles the blocks of a model of 500M+ parameters): two copies of the same block (gptrain's own
LlamaBlock / GPT-2 Block, the same weights), one compiled with `block.compile()` as
distributed/parallelize.py does, timed in turn on the same input (batch 4, context 256) so that a
busy machine slows both alike; prints each step's two times, the median ratio and the one-time
compile. `lora`: the frozen base in the compute dtype with r-16 adapters on the attention
projections (as a LoRA run holds it); `full`: every weight trained.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SHAPES = {"tinyllama": dict(n_head=32, n_kv_head=4, n_embd=2048, intermediate_size=5632, targets=("q_proj", "v_proj")),
          "gpt2": dict(n_head=12, n_embd=768, targets=("c_attn",))}
BATCH, BLOCK = 4, 256


def make_block(shape: str, mode: str, dtype):
    import torch

    from gptrain.models import lora
    from gptrain.models.gpt2 import Block
    from gptrain.models.llama import LlamaBlock
    from gptrain.models.shapes import GPTConfig, LlamaConfig

    s = dict(SHAPES[shape])
    targets = s.pop("targets")
    torch.manual_seed(0)
    block = (LlamaBlock(LlamaConfig(n_layer=1, block_size=BLOCK, **s)) if shape == "tinyllama"
             else Block(GPTConfig(n_layer=1, block_size=BLOCK, **s)))
    if mode == "lora":
        for name, module in list(block.named_modules()):
            if name.split(".")[-1] in targets:
                lora.adapt(module, 16, 32, 0.0)
        for name, p in block.named_parameters():
            p.requires_grad_("lora" in name)
        for m in block.modules():  # the frozen base in the compute dtype, as lora.hold_base_in holds it
            if isinstance(m, torch.nn.Linear):
                m.weight = torch.nn.Parameter(m.weight.detach().to(dtype), requires_grad=False)
    return block


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="tinyllama", choices=list(SHAPES))
    ap.add_argument("--mode", default="lora", choices=["lora", "full"])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()

    import torch

    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    eager, compiled = make_block(args.shape, args.mode, dtype), make_block(args.shape, args.mode, dtype)
    compiled.compile()
    x = torch.randn(BATCH, BLOCK, SHAPES[args.shape]["n_embd"], requires_grad=True)

    def step(block) -> float:
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            y = block(x)
        y.float().pow(2).mean().backward()
        return time.perf_counter() - t

    first = step(compiled)
    for _ in range(2):
        step(eager), step(compiled)
    ratios = []
    for i in range(args.steps):
        e, c = step(eager), step(compiled)
        ratios.append(e / c)
        print(f"step {i}: eager {e * 1000:8.1f} ms   compiled {c * 1000:8.1f} ms   ratio {e / c:.3f}")
    print(f"{args.shape} block, {args.mode}, {args.precision}, batch {BATCH} x {BLOCK}: eager/compiled "
          f"median {statistics.median(ratios):.3f}x over {args.steps} steps; first compiled step (compiles) "
          f"{first:.1f} s")


if __name__ == "__main__":
    main()
