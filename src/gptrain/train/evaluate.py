"""Evaluation: mean loss, perplexity and next-token accuracy over the validation blocks
(over their targets: instruction data's prompt tokens and padding, -100, are left out)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


DEFAULT_EVAL_ITERS = 50


def eval_block_limit(cfg) -> int | None:
    """How many validation blocks an evaluation during training reads at most (None: all):
    train.eval_iters batches, data.max_eval_samples blocks, the smaller where both are given."""
    iters, cap = cfg.train.eval_iters, cfg.data.max_eval_samples
    if iters is None:
        return cap if cap is not None else DEFAULT_EVAL_ITERS * cfg.train.eval_batch_size
    if iters == 0:
        return cap
    n = iters * cfg.train.eval_batch_size
    return n if cap is None else min(n, cap)


@torch.no_grad()
def evaluate(logits_of, batches, device, copies: int = 1) -> dict:
    """Metrics over `batches` of (x, y); `logits_of(x, y)` gives logits, or None on ranks that
    do not hold them (pipeline stages before the last). Each rank's sums are counted once per
    data-parallel replica: `copies` ranks (tensor-parallel peers) hold the same sums."""
    total = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, tokens
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = logits_of(x, y)
        if logits is None:
            continue
        logits = logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                                 reduction="sum")
        valid = y != -100  # (instruction data: prompt tokens and padding are no targets)
        total += torch.stack([loss.double(), ((logits.argmax(-1) == y) & valid).sum().double(),
                              valid.sum().double()])
    if dist.is_initialized():
        dist.all_reduce(total)
        total /= copies
    if total[2] == 0:
        return {}
    loss = (total[0] / total[2]).item()
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
            "accuracy": (total[1] / total[2]).item(), "tokens": int(total[2].item())}


def reshard(parts) -> None:
    """FSDP2 keeps the root gathered after a forward with no backward: shard it again so the
    registered parameters are the sharded ones the optimizer holds."""
    from torch.distributed.fsdp import FSDPModule

    for part in parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
