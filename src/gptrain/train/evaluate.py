"""Evaluation: mean loss, perplexity and next-token accuracy over the validation blocks."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from gptrain.data.loader import eval_batches


@torch.no_grad()
def evaluate(model, tokens, block_size: int, batch_size: int, dp_rank: int, dp_world: int,
             device, autocast, max_blocks: int | None = None) -> dict:
    was_training = model.training
    model.eval()
    total = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, tokens
    for x, y in eval_batches(tokens, block_size, batch_size, dp_rank, dp_world, max_blocks):
        x, y = x.to(device), y.to(device)
        with autocast():
            logits = model(x)
        logits = logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                                 reduction="sum")
        total += torch.stack([loss.double(), (logits.argmax(-1) == y).sum().double(),
                              torch.tensor(float(y.numel()), dtype=torch.float64, device=device)])
    if dist.is_initialized():
        # every rank of a data-parallel group holds the same sums under TP: count each group once
        dist.all_reduce(total)
        total /= dist.get_world_size() // dp_world
    model.train(was_training)
    _reshard(model)
    if total[2] == 0:
        return {}
    loss = (total[0] / total[2]).item()
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
            "accuracy": (total[1] / total[2]).item(), "tokens": int(total[2].item())}


def _reshard(model) -> None:
    """FSDP2 keeps the root gathered after a forward with no backward: shard it again so the
    registered parameters are the sharded ones the optimizer holds."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
