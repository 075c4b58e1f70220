"""The learning-rate schedules of transformers' SchedulerType that a step-driven run can use, as
--lr_scheduler_type names them, with --lr_scheduler_kwargs as transformers takes them (a JSON
object of the schedule function's own keyword arguments). Each is transformers' own formula
(transformers/optimization.py), so a run's rate is get_scheduler's at every step past the warmup;
in the warmup gptrain's step s takes the rate HF gives step s + 1, as its cosine and linear do
(HF's first step runs at rate 0). gptrain's own cosine, linear and constant, with their floor
(train.min_lr_ratio) and nanoGPT's decay span, stay in train/optim.lr_at.

reduce_lr_on_plateau follows an evaluation metric, not the step, and greedy an outside signal:
both are refused in one line (hf_flags.py)."""

from __future__ import annotations

import json
import math

from gptrain.errors import UserError
from gptrain.files import parse_user_text

# schedule -> {its keyword argument: the type it takes}
KWARGS: dict[str, dict[str, type]] = {
    "cosine_with_restarts": {"num_cycles": int},
    "polynomial": {"lr_end": float, "power": float},
    "inverse_sqrt": {"timescale": int},
    "cosine_with_min_lr": {"num_cycles": float, "min_lr": float, "min_lr_rate": float},
    "warmup_stable_decay": {"num_decay_steps": int, "num_stable_steps": int, "warmup_type": str,
                            "decay_type": str, "min_lr_ratio": float, "num_cycles": float},
}
OWN = ("cosine", "linear", "constant")  # train/optim.lr_at's (cosine takes num_cycles here too)
SCHEDULES = (*OWN, *KWARGS)
WSD_SHAPES = ("linear", "cosine", "1-sqrt")


def parse_kwargs(schedule: str, text: str) -> dict:
    """--lr_scheduler_kwargs for `schedule`: a JSON object of the keys its transformers function
    takes, each of its type; one line naming the first that is not."""
    if not text:
        kwargs = {}
    else:
        try:  # (bounded in nesting and items: a 60,000-deep list is one line, not a RecursionError)
            kwargs = parse_user_text(json.loads, text, "--lr_scheduler_kwargs")
        except ValueError:
            raise UserError(f"--lr_scheduler_kwargs must be a JSON object (as transformers takes it), got "
                            f"{text[:80]!r}") from None
        if not isinstance(kwargs, dict):
            raise UserError(f"--lr_scheduler_kwargs must be a JSON object, got {text[:80]!r}")
    allowed = {"cosine": {"num_cycles": float}}.get(schedule, KWARGS.get(schedule, {}))
    for key, value in kwargs.items():
        if key not in allowed:
            takes = ", ".join(allowed) or "none"
            raise UserError(f"--lr_scheduler_kwargs {key!r} is not an argument of the {schedule} schedule "
                            f"(it takes: {takes})")
        want = allowed[key]
        ok = isinstance(value, str) if want is str else (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (want is float or float(value).is_integer()) and value >= 0)
        if not ok:
            raise UserError(f"--lr_scheduler_kwargs {key} must be a {'string' if want is str else 'number >= 0'}"
                            f"{'' if want is not int else ' (whole)'}, got {value!r}")
    if schedule == "warmup_stable_decay":
        if "num_decay_steps" not in kwargs:
            raise UserError("the warmup_stable_decay schedule needs --lr_scheduler_kwargs "
                            "'{\"num_decay_steps\": N}' (transformers' get_wsd_schedule requires it)")
        for key in ("warmup_type", "decay_type"):
            if kwargs.get(key, "linear") not in WSD_SHAPES:
                raise UserError(f"--lr_scheduler_kwargs {key} must be one of {', '.join(WSD_SHAPES)}, got {kwargs[key]!r}")
    if schedule == "cosine_with_min_lr" and ("min_lr" in kwargs) == ("min_lr_rate" in kwargs):
        raise UserError("the cosine_with_min_lr schedule needs one of min_lr and min_lr_rate in "
                        "--lr_scheduler_kwargs (transformers requires exactly one)")
    return kwargs


def factor(schedule: str, step: int, warmup: int, total: int, lr: float, kwargs: dict) -> float:
    """transformers' LambdaLR factor of `schedule` at its step `step` (0-based), as its function
    computes it (the lr its optimizer runs at is lr times this)."""
    if schedule == "warmup_stable_decay":
        return _wsd(step, warmup, total, **kwargs)
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(kwargs.get("num_cycles", 0.5)) * 2.0 * progress)))
    if schedule == "cosine_with_restarts":
        if progress >= 1.0:
            return 0.0
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(kwargs.get("num_cycles", 1)) * progress) % 1.0))))
    if schedule == "polynomial":
        lr_end, power = float(kwargs.get("lr_end", 1e-7)), float(kwargs.get("power", 1.0))
        if lr_end > lr:
            raise UserError(f"--lr_scheduler_kwargs lr_end ({lr_end}) must be smaller than the learning rate ({lr})")
        if step > total:
            return lr_end / lr
        remaining = 1 - (step - warmup) / (total - warmup)
        return ((lr - lr_end) * remaining ** power + lr_end) / lr
    if schedule == "inverse_sqrt":
        timescale = kwargs.get("timescale") or warmup or 10_000
        return 1.0 / math.sqrt((step + timescale - warmup) / timescale)
    if schedule == "cosine_with_min_lr":
        rate = kwargs["min_lr"] / lr if "min_lr" in kwargs else float(kwargs["min_lr_rate"])
        f = 0.5 * (1.0 + math.cos(math.pi * float(kwargs.get("num_cycles", 0.5)) * 2.0 * progress))
        return max(0.0, f * (1 - rate) + rate)
    raise UserError(f"unknown learning-rate schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")


def _wsd(step: int, warmup: int, total: int, num_decay_steps: int, num_stable_steps: int | None = None,
         warmup_type: str = "linear", decay_type: str = "cosine", min_lr_ratio: float = 0.0,
         num_cycles: float = 0.5) -> float:
    """get_wsd_schedule's factor: warmup, a stable phase at the full rate, then the decay."""
    stable = num_stable_steps if num_stable_steps is not None else total - warmup - num_decay_steps
    shape = {"linear": lambda p: p, "cosine": lambda p: 0.5 * (1.0 - math.cos(math.pi * p)),
             "1-sqrt": lambda p: 1.0 - math.sqrt(1.0 - p)}
    if step < warmup:
        f = shape[warmup_type](step / max(1, warmup))
        return max(0.0, f * (1.0 - min_lr_ratio) + min_lr_ratio)
    if step < warmup + stable:
        return 1.0
    if step < warmup + stable + num_decay_steps:
        p = (step - warmup - stable) / max(1, num_decay_steps)
        f = {"linear": 1.0 - p, "cosine": 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * p)),
             "1-sqrt": 1.0 - math.sqrt(p)}[decay_type]
        return max(0.0, f * (1.0 - min_lr_ratio) + min_lr_ratio)
    return min_lr_ratio
