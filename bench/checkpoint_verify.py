"""What verified checkpoints cost: save and load with checksums vs without, side by side.

    python bench/checkpoint_verify.py [--shape gpt2-124m|tinyllama-1.1b|both] [--repeat 3] [--dir DIR]

A checkpoint holds a model's tensors and AdamW's two moments (fp32: 12 bytes a parameter; 1.5 GB
for GPT-2 124M, 13.2 GB for TinyLlama 1.1B), written into --dir (a real disk: default a folder
under /var/tmp, never tmpfs). `without` is what gptrain did before verified checkpoints: DCP's
FileSystemWriter, trainer_state.json, the rename; and DCP's load through the allowlist reader.
`with` is train/checkpoint.save (each file hashed as it is written, checksums.json sealed and
fsync'd with the folder) and weights/dcp.load_tensors (hashing in threads beside DCP's read).
Each of the --repeat rounds runs both, alternating which goes first; medians are printed, and
their ratio (the goal: <= 1.10). Page cache as a user has it: a load follows its save.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"gpt2-124m": 124_439_808, "tinyllama-1.1b": 1_100_048_384}  # parameters
CHUNK = 32 << 20  # parameters per tensor (a large Linear's size class)


def tensors(n_params: int) -> dict:
    import torch

    sizes = [CHUNK] * (n_params // CHUNK) + ([n_params % CHUNK] if n_params % CHUNK else [])
    gen = torch.Generator().manual_seed(0)
    model = {f"layer{i}.weight": torch.randn(n, generator=gen) for i, n in enumerate(sizes)}
    optim = {f"layer{i}.weight": {"exp_avg": torch.randn(n, generator=gen), "exp_avg_sq": torch.rand(n, generator=gen),
                                  "step": torch.tensor(10.0)} for i, n in enumerate(sizes)}
    return {"model": model, "optim": optim}


def save_without(out: Path, step: int, state: dict) -> Path:
    """Before verified checkpoints: DCP, trainer_state.json, the rename."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    root = out / "checkpoints"
    tmp, final = root / f".tmp-step-{step:06d}", root / f"step-{step:06d}"
    tmp.mkdir(parents=True)
    dcp.save(state, storage_writer=FileSystemWriter(tmp))
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    os.rename(tmp, final)
    return final


def save_with(out: Path, step: int, state: dict) -> Path:
    from gptrain.train import checkpoint

    return checkpoint.save(out, step, state, {"loader": {}}, keep_last=None).path


def load_without(path: Path, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    from gptrain.weights.dcp import SafeReader

    dcp.load(state, storage_reader=SafeReader(path))


def load_with(path: Path, state: dict) -> None:
    from gptrain.weights.dcp import load_tensors

    load_tensors(path, state)


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def run(shape: str, repeat: int, where: Path) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    state = tensors(SHAPES[shape])
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values()) * 3
    times = {k: [] for k in ("save without", "save with", "load without", "load with")}
    for r in range(repeat):
        order = ("without", "with") if r % 2 == 0 else ("with", "without")
        for side in order:
            out = where / f"{shape}-{side}-{r}"
            save, load = (save_with, load_with) if side == "with" else (save_without, load_without)
            ckpt = None
            times[f"save {side}"].append(timed(lambda: globals().__setitem__("_last", save(out, 1, state))))
            ckpt = globals()["_last"]
            times[f"load {side}"].append(timed(load, ckpt, state))
            shutil.rmtree(out)
    return {"shape": shape, "gigabytes": nbytes / 1e9, **{k: statistics.median(v) for k, v in times.items()}}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    shapes = list(SHAPES) if args.shape == "both" else [args.shape]
    print(f"{cpu_model()}, {os.cpu_count()} cores; checkpoints in {args.dir}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="gptrain-ckpt-bench-") as where:
        for shape in shapes:
            res = run(shape, args.repeat, Path(where))
            for op in ("save", "load"):
                a, b = res[f"{op} without"], res[f"{op} with"]
                print(f"{shape:15} {res['gigabytes']:5.1f} GB  {op}: without {a:7.2f} s ({res['gigabytes'] / a:5.2f} GB/s)"
                      f"   with checksums {b:7.2f} s ({res['gigabytes'] / b:5.2f} GB/s)   ratio {b / a:5.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
