"""Pipeline parallel: cut the GPT into stages and run them with torch.distributed.pipelining.

Every stage is the full GPT class with the modules it does not own removed, so parameter names
stay those of the whole model (transformer.h.5... stays transformer.h.5...) and checkpoints are
the same with or without pipelining. The first stage owns the embeddings, the last one ln_f and
lm_head. GPT-2 ties lm_head to wte; across stages each end keeps its own copy, and their
gradients are summed before every optimizer step so the copies stay identical. (Llama-2's
lm_head is its own weight: nothing to share.)
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from gptrain.errors import UserError


def stage_layers(n_layer: int, n_stages: int) -> list[range]:
    """Contiguous, as even as possible layer ranges, earlier stages taking the extra layers."""
    base, extra = divmod(n_layer, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def stage_ids(pp_rank: int, pp: int, schedule: str) -> list[int]:
    """Stages this rank runs: one, or two looped (r and r + pp) for interleaved 1F1B."""
    return [pp_rank, pp_rank + pp] if schedule == "interleaved_1f1b" else [pp_rank]


def split(model, pp_rank: int, pp: int, schedule: str):
    """(stage modules, their stage indices, total stages) for this rank."""
    n_stages = pp * (2 if schedule == "interleaved_1f1b" else 1)
    if n_stages > model.config.n_layer:
        raise UserError(f"{n_stages} pipeline stages ({schedule}, pp={pp}) but only "
                        f"{model.config.n_layer} layers; use fewer stages or more layers")
    layers = stage_layers(model.config.n_layer, n_stages)
    parts, ids = [], stage_ids(pp_rank, pp, schedule)
    for s in ids:
        part = copy.deepcopy(model)
        tr = part.transformer
        for name in list(tr.h.keys()):
            if int(name) not in layers[s]:
                del tr.h[name]
        if s != 0:
            for key in ("wte", "wpe", "drop"):
                if key in tr:
                    tr[key] = None
        if s != n_stages - 1:
            tr.ln_f = None
            part.lm_head = None
        elif s != 0 and model.config.tie_embeddings:
            # the last stage keeps its own copy of the tied embedding as lm_head
            part.lm_head.weight = torch.nn.Parameter(part.lm_head.weight.detach().clone())
        parts.append(part)
    return parts, ids, n_stages


def is_first(part) -> bool:
    return part.transformer["wte"] is not None


def is_last(part) -> bool:
    return part.lm_head is not None


def build_schedule(parts, ids, n_stages, device, pp_group, schedule: str, microbatches: int, loss_fn):
    from torch.distributed.pipelining import PipelineStage, schedules

    stages = [PipelineStage(p, s, n_stages, device, group=pp_group) for p, s in zip(parts, ids)]
    if schedule == "interleaved_1f1b":
        return schedules.ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss_fn)
    cls = schedules.ScheduleGPipe if schedule == "gpipe" else schedules.Schedule1F1B
    return cls(stages[0], microbatches, loss_fn=loss_fn)


def tied_embedding(parts):
    """This rank's copy of the tied embedding (first stage's wte or last stage's lm_head)."""
    if not parts[0].config.tie_embeddings:
        return None
    for part in parts:
        if is_first(part):
            return part.transformer.wte.weight
        if is_last(part):
            return part.lm_head.weight
    return None


def embedding_group(mesh):
    """A process group of the first and last stage of this rank's pipeline (all ranks must
    call this, in the same order, since every group is created everywhere)."""
    lines = mesh.mesh.reshape(mesh.mesh.size(0), -1).T.tolist()  # pp is the outermost dim
    mine = None
    for line in lines:
        group = dist.new_group([line[0], line[-1]])
        if dist.get_rank() in (line[0], line[-1]):
            mine = group
    return mine


def sync_tied_grads(parts, group) -> None:
    """Sum the tied embedding's gradient over the first and last stage."""
    weight = tied_embedding(parts)
    if group is None or weight is None or weight.grad is None:
        return
    grad = weight.grad
    if hasattr(grad, "placements") and grad.placements != weight.placements:
        # under tensor parallel the embedding's gradient can come out Replicate while the
        # lm_head copy's is Shard(0): bring both to the parameter's own layout first
        grad = weight.grad = grad.redistribute(weight.device_mesh, weight.placements)
    dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)


def share_from_last(value: torch.Tensor, parts, pp_group) -> torch.Tensor:
    """The last stage's value on every stage of this pipeline."""
    if not any(is_last(p) for p in parts):
        value = torch.zeros_like(value)
    dist.all_reduce(value, group=pp_group)
    return value
