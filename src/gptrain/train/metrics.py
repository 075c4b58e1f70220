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


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the architecture where that is not readable."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown"


def peak_flops(device, configured: float | None, precision: str = "fp32") -> float:
    """Per-device peak FLOP/s of the precision the run computes in: configured, a known GPU's
    (its bf16/fp16 tensor-core table; fp32 runs as TF32 at half of it), or on CPU a measured
    matmul rate in that dtype. A CPU with AMX multiplies bf16 several times faster than fp32, so
    an fp32 peak would put a bf16 run's MFU above 100%. The measurement is cached per CPU model,
    thread count and precision: one $GPTRAIN_HOME on a cluster's shared disk sees many machines."""
    import hashlib

    import torch

    if configured:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), 312e12)
        return peak / 2 if precision == "fp32" else peak
    from gptrain.atomic import write_text_atomic
    from gptrain.home import home

    model = cpu_model()
    threads = torch.get_num_threads()
    key = hashlib.sha1(model.encode()).hexdigest()[:12]
    cache = home() / "cache" / f"cpu_peak_flops_v3_{key}_{threads}t_{precision}.json"
    if cache.is_file():
        return json.loads(cache.read_text())["flops"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    gen = torch.Generator().manual_seed(0)  # leave the global RNG (dropout, init) untouched
    flops = 0.0
    for m, k, n in ((1024, 1024, 1024), (2048, 384, 1536), (4096, 384, 384)):  # square, MLP-like
        a, b = torch.randn(m, k, generator=gen).to(dtype), torch.randn(k, n, generator=gen).to(dtype)
        best = float("inf")
        for _ in range(3):  # the best of several: a busy moment must not lower the peak
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        flops = max(flops, 2 * m * k * n / best)
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(cache, json.dumps({"flops": flops, "threads": threads, "cpu": model,
                                         "precision": precision}))
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
