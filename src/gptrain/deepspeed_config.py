"""Read a DeepSpeed JSON config (`--deepspeed_config FILE`, `--deepspeed FILE`) into gptrain's.

Users coming from DeepSpeed launchers (FMEngine, the HF Trainer's --deepspeed) keep their batch
sizes (micro and global), precision and fp16 loss scaling, optimizer (lr, betas, weight decay),
clipping and learning-rate schedule (WarmupLR, WarmupDecayLR, WarmupCosineLR) in that file. The
settings with a gptrain equivalent are applied where the flag stands (later flags override
them); "auto" values are left to gptrain; everything else is named once on stderr, since gptrain does it its own way
(ZeRO stages -> FSDP2 sharding, which is the default; offload, partitioned activations and
logging knobs have no counterpart).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gptrain.errors import UserError
from gptrain.files import parse_user_text, read_user_text


def _precision(ds: dict):
    for name, value in (("bf16", "bf16"), ("fp16", "fp16")):
        section = ds.get(name)
        if isinstance(section, dict) and section.get("enabled") is True:
            return value
    return None


def settings(ds: dict) -> tuple[dict[str, object], list[str]]:
    """({gptrain key: value}, [DeepSpeed keys left out]) for a parsed DeepSpeed config."""
    out: dict[str, object] = {}
    used = set()

    def take(ds_key, key, value):
        used.add(ds_key)
        if value is not None and value != "auto":
            out[key] = value

    take("train_micro_batch_size_per_gpu", "train.batch_size", ds.get("train_micro_batch_size_per_gpu"))
    take("gradient_accumulation_steps", "train.grad_accum_steps", ds.get("gradient_accumulation_steps"))
    take("train_batch_size", "train.global_batch_size", ds.get("train_batch_size"))
    take("gradient_clipping", "train.grad_clip", ds.get("gradient_clipping"))
    for name in ("bf16", "fp16"):
        take(name, "train.precision", _precision(ds))
    fp16 = ds.get("fp16")
    if isinstance(fp16, dict):
        power = fp16.get("initial_scale_power")
        for ds_key, key, value in (("loss_scale", "train.loss_scale", fp16.get("loss_scale")),
                                   ("initial_scale_power", "train.loss_scale_initial",
                                    2.0 ** power if isinstance(power, (int, float)) else power),
                                   ("loss_scale_window", "train.loss_scale_window", fp16.get("loss_scale_window")),
                                   ("hysteresis", "train.loss_scale_hysteresis", fp16.get("hysteresis")),
                                   ("min_loss_scale", "train.loss_scale_min", fp16.get("min_loss_scale"))):
            take(f"fp16.{ds_key}", key, value)
    optimizer = ds.get("optimizer")
    nested = [f"fp16.{k}" for k in fp16 if k != "enabled"] if isinstance(fp16, dict) else []
    if isinstance(optimizer, dict):
        kind = str(optimizer.get("type", "adamw")).lower()
        if kind not in ("adam", "adamw", "fusedadam"):
            raise UserError(f"DeepSpeed optimizer {optimizer.get('type')!r} is not supported: gptrain "
                            "trains with AdamW; remove the optimizer section or set type AdamW")
        params = optimizer.get("params") or {}
        take("optimizer.params.lr", "train.lr", params.get("lr"))
        take("optimizer.params.weight_decay", "train.weight_decay", params.get("weight_decay"))
        betas = params.get("betas")
        if isinstance(betas, list) and len(betas) == 2:
            take("optimizer.params.betas", "train.beta1", betas[0])
            take("optimizer.params.betas", "train.beta2", betas[1])
        used.add("optimizer")
        nested += [f"optimizer.params.{k}" for k in params]
    scheduler = ds.get("scheduler")
    if isinstance(scheduler, dict):
        _scheduler(scheduler, take)
        used.add("scheduler")
        nested += [f"scheduler.params.{k}" for k in scheduler.get("params") or {}]
    if "zero_optimization" in ds:
        used.add("zero_optimization")  # parameters and optimizer state are sharded (FSDP2) by default
    return out, sorted(k for k in [*ds, *nested] if k not in used)


# DeepSpeed's warmup schedulers -> train.lr_schedule: WarmupLR warms up to warmup_max_lr and stays;
# WarmupDecayLR then decays linearly to warmup_min_lr at total_num_steps; WarmupCosineLR decays
# the optimizer's lr along a cosine to cos_min_ratio of it.
SCHEDULES = {"warmuplr": "constant", "warmupdecaylr": "linear", "warmupcosinelr": "cosine"}


def _scheduler(scheduler: dict, take) -> None:
    kind = str(scheduler.get("type", "")).lower()
    if kind not in SCHEDULES:
        raise UserError(f"DeepSpeed scheduler {scheduler.get('type')!r} is not supported: use "
                        "WarmupLR, WarmupDecayLR or WarmupCosineLR, or remove the scheduler section")
    params = scheduler.get("params") or {}
    take("scheduler.type", "train.lr_schedule", SCHEDULES[kind])
    take("scheduler.params.warmup_num_steps", "train.warmup_steps", params.get("warmup_num_steps"))
    if kind == "warmupcosinelr":
        take("scheduler.params.cos_min_ratio", "train.min_lr_ratio", params.get("cos_min_ratio", 1e-4))
        if params.get("warmup_min_ratio", 0) in (0, 0.0, "auto"):
            take("scheduler.params.warmup_min_ratio", "", None)  # gptrain warms up from 0 too
    else:
        max_lr, min_lr = params.get("warmup_max_lr"), params.get("warmup_min_lr", 0)
        take("scheduler.params.warmup_max_lr", "train.lr", max_lr)
        if kind == "warmupdecaylr" and isinstance(max_lr, (int, float)) and isinstance(min_lr, (int, float)):
            take("scheduler.params.warmup_min_lr", "train.min_lr_ratio", min_lr / max_lr if max_lr else 0.0)
        elif min_lr in (0, 0.0, "auto"):
            take("scheduler.params.warmup_min_lr", "", None)  # gptrain warms up from 0 too
    if kind != "warmuplr":
        take("scheduler.params.total_num_steps", "train.max_steps", params.get("total_num_steps"))
    if params.get("warmup_type", "linear") in ("linear", "auto") and kind != "warmupcosinelr":
        take("scheduler.params.warmup_type", "", None)  # DeepSpeed's default is log: named if so


def read(path: str) -> dict[str, object]:
    """{gptrain key: value} from a DeepSpeed JSON file; the keys gptrain leaves out are named on
    stderr. This module knows nothing of gptrain's Config: config.py applies the values."""
    p = Path(path).expanduser()
    try:
        ds = parse_user_text(json.loads, read_user_text(p, "DeepSpeed config"), f"DeepSpeed config {p}")
    except json.JSONDecodeError as e:
        raise UserError(f"DeepSpeed config {p} is not valid JSON: {e}") from None
    if not isinstance(ds, dict):
        raise UserError(f"DeepSpeed config {p} must hold a JSON object")
    values, left_out = settings(ds)
    if left_out:
        print(f"note: gptrain does not use these settings of {p.name}: {', '.join(left_out)}",
              file=sys.stderr)
    return values
