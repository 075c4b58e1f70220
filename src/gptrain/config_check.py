"""The one check of a training configuration, run by `gptrain train` and by every submit before
anything is recorded: each field within its bounds (config.opt's ge/gt/lt/le, every whole number
within int64), the model's shape as the trainer will build it, and the model's size against this
machine's memory. Imports no torch (and nothing from config.py, which calls it)."""

from __future__ import annotations

import dataclasses
import math
import os

from gptrain.errors import UserError, refuse_credentials

INT64 = 2 ** 63 - 1
BYTES_PER_PARAM = 16  # training state: fp32 weights, gradients and AdamW's two moments


def check(cfg):
    """Refuse a config the trainer could not run, before anything runs: one UserError naming
    the first field out of bounds, the shape that cannot be built, or the size that cannot fit."""
    from gptrain.models.registry import check_lora_targets, check_shape

    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            value, m = getattr(getattr(cfg, section.name), f.name), f.metadata
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not within(value, m):
                capped = m["le"] is not None or m["lt"] is not None or not _too_big(value)
                what = bounds(m) if capped else "a whole number that fits in 64 bits"
                raise UserError(f"--{section.name}.{f.name} must be {what}, got {value!r}")
    if cfg.train.min_lr is not None and cfg.train.min_lr > cfg.train.lr and cfg.train.dialect != "nanogpt" \
            and cfg.train.lr_schedule != "constant":  # (the "decay" would climb; nanoGPT's own train.py does)
        raise UserError(f"--train.min_lr ({cfg.train.min_lr:g}) is more than the learning rate ({cfg.train.lr:g}): "
                        "the schedule decays to min_lr; give one at most lr")
    if cfg.lora.r and (cfg.parallel.tp > 1 or cfg.parallel.pp > 1):
        raise UserError(f"LoRA (--lora.r) runs with data parallel and FSDP, not with tensor or pipeline "
                        f"parallel (parallel.tp={cfg.parallel.tp}, parallel.pp={cfg.parallel.pp}); set both to 1")
    if cfg.lora.quantize_base != "none" and not (cfg.lora.r and cfg.model.init_from):
        raise UserError("--lora.quantize_base (QLoRA) quantizes the frozen base of a LoRA run from weights: "
                        "set --lora_r and --model.init_from")
    _check_keep_best(cfg)
    from gptrain.lr_schedules import parse_kwargs

    parse_kwargs(cfg.train.lr_schedule, cfg.train.lr_schedule_kwargs)
    _check_samples(cfg.metrics, cfg.parallel)
    _check_packing(cfg)
    check_no_credentials(cfg)
    from gptrain.data.mixture import check_config

    check_config(cfg.data)  # data.mix: its form, its names, one tokenizer
    if cfg.lora.r:
        check_lora_targets(cfg.model, cfg.lora.target_modules)
    check_shape(cfg.model)
    check_memory(cfg.model)
    return cfg


def _check_keep_best(cfg) -> None:
    """checkpoint.keep_best needs an eval loss at each checkpoint's own step (as HF's
    load_best_model_at_end needs save_steps a multiple of eval_steps)."""
    ck, tr = cfg.checkpoint, cfg.train
    if not ck.keep_best:
        return
    if not tr.do_eval or tr.eval_strategy == "no":
        raise UserError("--checkpoint.keep_best (load_best_model_at_end) picks by eval loss: set --do_eval "
                        "and an --eval_strategy")
    if ck.every and ck.every % tr.eval_every:
        raise UserError(f"--checkpoint.keep_best (load_best_model_at_end) needs an eval at every checkpoint: "
                        f"checkpoint.every ({ck.every}, --save_steps) must be a multiple of train.eval_every "
                        f"({tr.eval_every}, --eval_steps)")


def _check_samples(metrics_cfg, parallel_cfg) -> None:
    """metrics.sample_every (train/samples.py) needs the whole model in each process's forward."""
    if metrics_cfg.sample_every and (parallel_cfg.tp > 1 or parallel_cfg.pp > 1):
        raise UserError(f"--metrics.sample_every needs the whole model in each process's forward; it does not "
                        f"work with tensor or pipeline parallel (parallel.tp={parallel_cfg.tp}, "
                        f"parallel.pp={parallel_cfg.pp}): sample from a checkpoint with `gptrain generate`")


def packing_possible(cfg) -> str | None:
    """Why rows packed with several examples cannot be trained here, or None: the pipeline
    schedule passes one tensor between stages, and flash_attention_2 takes no mask."""
    if cfg.parallel.pp > 1:
        return f"pipeline parallel (parallel.pp={cfg.parallel.pp}) passes no example boundaries between stages"
    if cfg.model.attn_implementation == "flash_attention_2":
        return "flash_attention_2 takes no block-diagonal mask: use model.attn_implementation=sdpa"
    return None


def _check_packing(cfg) -> None:
    if cfg.data.packing and (why := packing_possible(cfg)):
        raise UserError(f"--data.packing=true: {why}; or set --data.packing=false (one example per row)")


# Trainer settings that name a file, folder or URL (besides datasets by name and hub ids): made
# absolute at submit (jobs/spec.py), and a URL among them refused when it holds a credential.
PATH_KEYS = ("data.path", "data.tokenizer", "model.init_from", "checkpoint.resume_from", "checkpoint.remote")


def check_no_credentials(cfg) -> None:
    """No URL in a path setting holds a credential (errors.refuse_credentials; data.mix's names:
    data/mixture.check_config)."""
    for key in PATH_KEYS:
        section, name = key.split(".")
        refuse_credentials(getattr(getattr(cfg, section), name), f"--{key}")


def within(value: float, m) -> bool:
    if value == m["special"]:
        return True
    return math.isfinite(value) and not _too_big(value) and (m["ge"] is None or value >= m["ge"]) and (
        m["gt"] is None or value > m["gt"]) and (m["lt"] is None or value < m["lt"]) and (
        m["le"] is None or value <= m["le"])


def _too_big(value) -> bool:
    return isinstance(value, int) and abs(value) > INT64


def bounds(m) -> str:
    """'>= 1', '>= 0 and < 1', '>= 1 (or -1)': the allowed range of a field, in words."""
    words = [f"{op} {m[key]}" for key, op in (("ge", ">="), ("gt", ">"), ("lt", "<"), ("le", "<="))
             if m[key] is not None]
    text = " and ".join(words) or "a finite number"
    return text + (f" (or {m['special']})" if m["special"] is not None else "")


def check_memory(model_cfg) -> None:
    """A model built from a preset and --model.* overrides (not from weights, whose size is
    theirs) must fit its training state in this machine's memory, unless GPTRAIN_ALLOW_LARGE_MODEL
    says it is sharded over more (several nodes, FSDP): a typo'd n_layer never starts a worker
    that allocates without bound."""
    from gptrain.models.registry import build_model_config
    from gptrain.models.shapes import ALLOW_LARGE, machine_memory

    if model_cfg.init_from or os.environ.get(ALLOW_LARGE, "") not in ("", "0"):
        return
    params = build_model_config(model_cfg).param_estimate()
    need, have = params * BYTES_PER_PARAM, machine_memory()
    if have and need > have:
        raise UserError(f"the model ({model_cfg.preset} with the --model.* overrides) has about "
                        f"{params:.3g} parameters: training it needs about {need / 2 ** 30:,.0f} GiB "
                        f"({BYTES_PER_PARAM} bytes a parameter: weights, gradients, AdamW), more than "
                        f"this machine's {have / 2 ** 30:,.0f} GiB; make it smaller, or set "
                        f"{ALLOW_LARGE}=1 when it is sharded over more memory (several nodes)")
