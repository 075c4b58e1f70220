"""Training metrics: console line, metrics.jsonl, TensorBoard, Weights & Biases; MFU."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# Dense bf16 peak FLOP/s per device (no sparsity), by substring of the CUDA device name.
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12,
                  "L4": 121e12, "RTX 4090": 165e12, "V100": 125e12, "T4": 65e12}


def flops_per_token(model_cfg, n_params: int) -> float:
    """6N (matmuls, forward + backward) + 12 L H Q T (attention), as in the PaLM appendix / nanoGPT."""
    L, H, Q, T = model_cfg.n_layer, model_cfg.n_head, model_cfg.head_dim, model_cfg.block_size
    return 6 * n_params + 12 * L * H * Q * T


def peak_flops(device, configured: float | None) -> float:
    """Per-device peak: configured, a known GPU, or a measured fp32 matmul rate on CPU (cached)."""
    import torch

    if configured:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), 312e12)
    from gptrain.home import home

    cache = home() / "cache" / f"cpu_peak_flops_v2_{torch.get_num_threads()}t.json"
    if cache.is_file():
        return json.loads(cache.read_text())["flops"]
    n = 1024
    gen = torch.Generator().manual_seed(0)  # leave the global RNG (dropout, init) untouched
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    best = float("inf")
    for _ in range(7):  # the best of several: a busy moment must not lower the peak
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    flops = 2 * n**3 / best
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"flops": flops, "threads": torch.get_num_threads()}))
    return flops


class MetricsLogger:
    """Rank 0 writes every sink; other ranks write nothing."""

    def __init__(self, output_dir: Path, mc, enabled: bool, run_name: str, config: dict):
        self.enabled = enabled
        self.jsonl = None
        self.tb = None
        self.wandb = None
        if not enabled:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(output_dir / "metrics.jsonl", "a")
        sinks = set(mc.report_to)
        if "all" in sinks:
            sinks = {"tensorboard", "wandb"}
        if "tensorboard" in sinks:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(output_dir / "tensorboard"))
            except ImportError:
                print("warning: tensorboard is not installed; pip install tensorboard "
                      "(or --report_to none)", file=sys.stderr)
        if "wandb" in sinks:
            from gptrain.errors import UserError

            try:
                import wandb
            except ImportError:
                raise UserError("--report_to wandb needs the wandb package: pip install wandb") from None
            os.environ.setdefault("WANDB_MODE", mc.wandb_mode)
            self.wandb = wandb.init(project=mc.wandb_project, name=run_name, config=config,
                                    dir=str(output_dir), mode=mc.wandb_mode)

    def log(self, step: int, values: dict, prefix: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3),
                  **{f"{prefix}/{k}": v for k, v in values.items()}}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(f"{prefix}/{k}", v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({f"{prefix}/{k}": v for k, v in values.items()}, step=step)

    def close(self) -> None:
        if self.jsonl:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def console_line(step: int, total: int, loss: float, lr: float, tok_s: float, mfu: float,
                 eta_s: float) -> str:
    eta = time.strftime("%H:%M:%S", time.gmtime(max(0, eta_s)))
    return (f"step {step:>6}/{total} | loss {loss:.4f} | lr {lr:.2e} | {tok_s:,.0f} tok/s | "
            f"mfu {100 * mfu:.1f}% | eta {eta}")
