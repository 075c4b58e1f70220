"""AdamW with decay/no-decay groups, and the learning-rate schedule."""

from __future__ import annotations

import math

import torch

from gptrain.lr_schedules import OWN, factor, parse_kwargs


def build_optimizer(model, tc, device) -> torch.optim.AdamW:
    """Matrices (and embeddings) decay; biases and norm weights do not (as nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # the fused kernel (CUDA, and CPU since torch 2.4) updates every parameter in one pass;
    # DTensor parameters (FSDP2, tensor parallel) take the multi-tensor foreach path
    from torch.distributed.tensor import DTensor

    sharded = any(isinstance(p, DTensor) for p in params)
    extra = {"foreach": True} if sharded else {"fused": True}
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=1e-8, **extra)


def lr_at(step: int, tc, total_steps: int) -> float:
    """Linear warmup to lr (warmup_steps, else warmup_ratio of the steps), then cosine/linear
    decay to min_lr (else lr * min_lr_ratio) by decay_steps (else the last step), or constant;
    transformers' other schedules (or one given --lr_scheduler_kwargs) as lr_schedules.py
    computes them."""
    warmup = tc.warmup_steps or math.ceil(tc.warmup_ratio * total_steps)  # HF's rounding
    if tc.lr_schedule not in OWN or tc.lr_schedule_kwargs:  # transformers' own (lr_schedules.py)
        kwargs = parse_kwargs(tc.lr_schedule, tc.lr_schedule_kwargs)
        return tc.lr * factor(tc.lr_schedule, step + 1 if step < warmup else step, warmup, total_steps, tc.lr, kwargs)
    if warmup and step < warmup:
        return tc.lr * (step + 1) / warmup
    if tc.lr_schedule == "constant":
        return tc.lr
    min_lr = tc.min_lr if tc.min_lr is not None else tc.lr * tc.min_lr_ratio
    span = max(1, (tc.decay_steps or total_steps) - warmup)
    progress = min(1.0, (step - warmup) / span)
    if tc.lr_schedule == "linear":
        return tc.lr - (tc.lr - min_lr) * progress
    return min_lr + 0.5 * (tc.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def clip_grads(parts, max_norm: float, pp_group=None) -> torch.Tensor:
    """Clip all gradients to a global norm (0: measure only); returns the norm before clipping.

    Sharded gradients (DTensor) give their global norm; pipeline stages add their squares over
    pp_group. The last stage's copy of the tied embedding is left out of the norm (its gradient
    equals the first stage's), so the norm is that of the unpipelined model.
    """
    import torch.distributed as dist

    params = [p for part in parts for p in part.parameters() if p.grad is not None]
    skip = set()
    if pp_group is not None:
        for part in parts:
            gpt = getattr(part, "module", part)
            if gpt.config.tie_embeddings and gpt.lm_head is not None and gpt.transformer["wte"] is None:
                skip.add(id(gpt.lm_head.weight))
    grads = [p.grad for p in params if id(p) not in skip]
    if grads:
        norm = torch.nn.utils.get_total_norm(grads)
    else:
        norm = torch.zeros((), device=params[0].device if params else "cpu")
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    if pp_group is not None:
        squared = norm.float() ** 2
        dist.all_reduce(squared, group=pp_group)
        norm = squared.sqrt()
    if max_norm > 0 and params:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
