"""Read a DeepSpeed JSON config (`--deepspeed_config FILE`, `--deepspeed FILE`) into gptrain's.

Users coming from DeepSpeed launchers (FMEngine, the HF Trainer's --deepspeed) keep their batch
sizes (micro and global), precision and fp16 loss scaling, optimizer, clipping and warmup
settings in that file. The settings with a gptrain equivalent are applied where the flag stands (later flags override them); "auto" values are
left to gptrain; everything else is named once on stderr, since gptrain does it its own way
(ZeRO stages -> FSDP2 sharding, which is the default; offload, partitioned activations and
logging knobs have no counterpart).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gptrain.errors import UserError


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
    if isinstance(optimizer, dict):
        kind = str(optimizer.get("type", "adamw")).lower()
        if kind not in ("adam", "adamw", "fusedadam"):
            raise UserError(f"DeepSpeed optimizer {optimizer.get('type')!r} is not supported: gptrain "
                            "trains with AdamW; remove the optimizer section or set type AdamW")
        params = optimizer.get("params") or {}
        take("optimizer", "train.lr", params.get("lr"))
        take("optimizer", "train.weight_decay", params.get("weight_decay"))
        betas = params.get("betas")
        if isinstance(betas, list) and len(betas) == 2:
            take("optimizer", "train.beta1", betas[0])
            take("optimizer", "train.beta2", betas[1])
    scheduler = ds.get("scheduler")
    if isinstance(scheduler, dict):
        take("scheduler", "train.warmup_steps", (scheduler.get("params") or {}).get("warmup_num_steps"))
    if "zero_optimization" in ds:
        used.add("zero_optimization")  # parameters and optimizer state are sharded (FSDP2) by default
    nested = [f"fp16.{k}" for k in fp16 if k != "enabled"] if isinstance(fp16, dict) else []
    return out, sorted(k for k in [*ds, *nested] if k not in used)


def apply(cfg, path: str) -> None:
    """Apply the file's settings to cfg (see the module doc)."""
    from gptrain.config import apply_option

    p = Path(path).expanduser()
    try:
        ds = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"DeepSpeed config {p} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"DeepSpeed config {p} is not valid JSON: {e}") from None
    if not isinstance(ds, dict):
        raise UserError(f"DeepSpeed config {p} must hold a JSON object")
    values, left_out = settings(ds)
    for key, value in values.items():
        apply_option(cfg, key, value)
    if left_out:
        print(f"note: gptrain does not use these settings of {p.name}: {', '.join(left_out)}",
              file=sys.stderr)
