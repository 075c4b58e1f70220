"""Training metrics: console line, metrics.jsonl, TensorBoard, Weights & Biases; MFU."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from gptrain import run_layout

# Dense bf16 peak FLOP/s per device (no sparsity), by substring of the CUDA device name.
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12,
                  "L4": 121e12, "RTX 4090": 165e12, "V100": 125e12, "T4": 65e12}


def flops_per_token(model_cfg, n_params: int) -> float:
    """6N (matmuls, forward + backward) + 12 L H Q T (attention), as in the PaLM appendix / nanoGPT."""
    L, H, Q, T = model_cfg.n_layer, model_cfg.n_head, model_cfg.head_dim, model_cfg.block_size
    return 6 * n_params + 12 * L * H * Q * T


def peak_flops(device, configured: float | None, precision: str = "fp32") -> tuple[float, str]:
    """Per-device peak FLOP/s of the precision the run computes in, and its basis: configured,
    a known GPU's (its bf16/fp16 tensor-core table; fp32 runs as TF32 at half of it), or on a
    CPU the kept per-core matmul rate in that dtype times the cores in use (train/cpu.py). A
    CPU with AMX multiplies bf16 several times faster than fp32, so an fp32 peak would put a
    bf16 run's MFU above 100%."""
    if configured:
        return configured, "metrics.peak_flops as configured"
    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
        known = next((k for k in GPU_PEAK_FLOPS if k in name), None)
        peak = GPU_PEAK_FLOPS.get(known, 312e12)
        basis = f"{name}: dense bf16 {peak / 1e12:.0f} TFLOP/s" + ("" if known else " (unknown GPU: A100's)")
        return (peak / 2, basis + ", fp32 as TF32 at half") if precision == "fp32" else (peak, basis)
    from gptrain.train import cpu

    return cpu.peak(precision)


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
        self.jsonl = open(run_layout.metrics_file(output_dir), "a")
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

    def log(self, step: int, values: dict, prefix: str = "train", progress: dict | None = None) -> None:
        """One row of metrics.jsonl (and TensorBoard, W&B). `progress`: how far the run is
        ({"total_steps", "eta_s"}), in the row only, for `gptrain jobs` and the console."""
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 6), **(progress or {}),
                  **{f"{prefix}/{k}": v for k, v in values.items()}}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(f"{prefix}/{k}", v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({f"{prefix}/{k}": v for k, v in values.items()}, step=step)

    def rewind(self, step: int) -> None:
        """A run resumed at `step`: metrics.jsonl's records of later steps (logged before a kill,
        after the checkpoint) are dropped, since those steps run again, and a last line cut by
        the kill is ended; the file is rewritten line by line and swapped in whole."""
        if not self.enabled:
            return
        path = Path(self.jsonl.name)
        self.jsonl.close()
        tmp, changed = path.with_name(".metrics.jsonl.rewind"), 0
        with open(path) as src, open(tmp, "w") as out:
            for line in src:
                try:
                    later = json.loads(line).get("step", 0) > step
                except (ValueError, AttributeError, TypeError):
                    later = False  # a torn or foreign line stays as it was
                changed += later
                if not later:
                    changed += not line.endswith("\n")  # a line cut by a kill: ended, or the next joins it
                    out.write(line if line.endswith("\n") else line + "\n")
            out.flush()
            os.fsync(out.fileno())
        if changed:
            os.replace(tmp, path)
        else:
            tmp.unlink()
        self.jsonl = open(path, "a")

    def close(self) -> None:
        if self.jsonl:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def progress_bar(total: int, done: int, is_main: bool):
    """A tqdm bar of the run's steps (percent, elapsed, left, rate), as the HF Trainer shows one,
    where rank 0's output is a terminal; None elsewhere (a job's log, a pipe), where the step
    lines say the same."""
    if not (is_main and sys.stdout.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="step", dynamic_ncols=True, file=sys.stdout)


def step_health(grad_norm, device) -> dict:
    """What a logged step says besides its loss: the global gradient norm before clipping
    (`grad_norm`, as torchtitan and the HF Trainer log it) and, on a GPU, the peak memory
    allocated so far (`mem_gib`). The peak is never reset: it is the process's, and whatever
    else runs in it (a bench, a user's own code around `train`) may be measuring it too."""
    import torch

    out = {}
    if grad_norm is not None and math.isfinite(grad_norm):  # (a float: read with the loss)
        out["grad_norm"] = grad_norm
    if device.type == "cuda":
        out["mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def console_line(step: int, total: int, loss: float, lr: float, tok_s: float, mfu: float,
                 eta_s: float, grad_norm: float | None = None, mem_gib: float | None = None) -> str:
    eta = time.strftime("%H:%M:%S", time.gmtime(max(0, eta_s)))
    grad = f" | grad {grad_norm:.3g}" if grad_norm is not None else ""
    mem = f" | mem {mem_gib:.1f} GiB" if mem_gib is not None else ""
    return (f"step {step:>6}/{total} | loss {loss:.4f} | lr {lr:.2e}{grad}{mem} | {tok_s:,.0f} tok/s | "
            f"mfu {100 * mfu:.1f}% | eta {eta}")
