"""Apply parallelism to a plain GPT, in torchtitan's order: TP -> activation checkpointing ->
compile -> FSDP2 / DDP. Each step works on the whole model or per transformer block; the model
file knows nothing of this.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gptrain.errors import UserError
from gptrain.models.shapes import ARCH_GENERIC, WHY_GENERIC


def check_layout(model_cfg, dims) -> None:
    """Refuse layouts that cannot work before any work starts."""
    if dims.tp > 1:
        if model_cfg.n_head % dims.tp or model_cfg.kv_heads % dims.tp:
            raise UserError(f"the attention heads (n_head={model_cfg.n_head}, key/value heads "
                            f"{model_cfg.kv_heads}) are not divisible by parallel.tp={dims.tp}")
        if model_cfg.padded_vocab_size % dims.tp or model_cfg.block_size % dims.tp:
            raise UserError(f"the (padded) vocabulary {model_cfg.padded_vocab_size} and the context "
                            f"{model_cfg.block_size} must be divisible by parallel.tp={dims.tp}; "
                            "set model.pad_vocab_multiple to a multiple of tp")
    why = model_cfg.not_tensor_parallel()
    if dims.tp > 1 and why:
        raise UserError(f"tensor parallel of a {model_cfg.arch} model ({why}) is not supported yet; "
                        "shard it with parallel.dp_shard (FSDP2) instead")
    if dims.pp > 1 and model_cfg.arch == ARCH_GENERIC:
        raise UserError(f"pipeline parallel of {WHY_GENERIC} is not supported; shard it with parallel.dp_shard "
                        "(FSDP2) instead")
    if dims.pp > 1 and dims.pp > model_cfg.n_layer:
        raise UserError(f"parallel.pp={dims.pp} stages but the model has only {model_cfg.n_layer} "
                        "layers; use at most one stage per layer")


def apply_tp(model, tp_mesh) -> None:
    """Megatron-style tensor parallel with sequence parallel between the blocks.

    Activations outside attention/MLP are sharded along the sequence (Shard(1)); the input
    projections (GPT-2's c_attn and c_fc, Llama's q/k/v and gate/up) split their output columns
    (GPT-2's c_attn rows are stored per head, so every rank gets whole heads), the projections
    after them split their input rows and reduce-scatter back to sequence shards. Logits are
    gathered whole so the loss is the same on every rank.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    tr = model.transformer
    plan = {}
    if tr["wte"] is not None:
        plan["transformer.wte"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if "wpe" in tr and tr["wpe"] is not None:
        # positions (T,) -> (T, C) sharded over T, which broadcasts onto the (B, T/tp, C) shard
        plan["transformer.wpe"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
    if tr["ln_f"] is not None:
        plan["transformer.ln_f"] = SequenceParallel()
        plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    parallelize_module(model, tp_mesh, plan)
    from gptrain.models.registry import spec_of

    block_plan = {}  # the architecture's sub-layers: (norm, sub-module, column-split, row-split)
    for norm, sub, inputs, output in spec_of(model.config.arch).tp_sublayers:
        block_plan[norm] = SequenceParallel()
        block_plan[sub] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        block_plan.update({f"{sub}.{name}": ColwiseParallel() for name in inputs})
        block_plan[f"{sub}.{output}"] = RowwiseParallel(output_layouts=Shard(1))
    for block in tr.h.values():
        parallelize_module(block, tp_mesh, block_plan)
    if model.config.tie_embeddings and tr["wte"] is not None and tr["ln_f"] is not None:
        model.lm_head.weight = tr.wte.weight  # both are Shard(0) over the vocabulary: still tied


def apply_ac(model, mode: str) -> None:
    """Recompute block activations in backward: every block (full) or every other (selective)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, (container, key) in enumerate(model.block_slots()):
        if mode == "full" or (mode == "selective" and i % 2 == 0):
            container[key] = checkpoint_wrapper(container[key], preserve_rng_state=True)


def apply_compile(model) -> None:
    """Compile each block in place (names and state-dict keys stay the same), and the head of
    the unfused loss path: ln_f, lm_head and the loss as one region (models/base.py head_loss),
    so the norm, the weight's cast, the padded columns' mask and the softmax fuse. Under tensor
    parallel the head's modules carry DTensor hooks: only the loss is compiled there."""
    for container, key in model.block_slots():
        container[key].compile()
    from gptrain.models.base import cross_entropy

    if getattr(model, "transformer", None) is None or model.transformer["ln_f"] is None:
        return  # transformers' own module (the generic path), or a pipeline stage without the head
        return
    if _sharded(model.lm_head.weight):
        model.loss_fn = torch.compile(cross_entropy)
    else:
        model.head_loss = torch.compile(model.head_loss)


def _sharded(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def apply_fsdp(model, dp_mesh, param_dtype, reduce_dtype) -> None:
    """FSDP2: shard each block, then the rest (embeddings, final norm) at the root."""
    import warnings

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # GPT returns logits sliced to the real vocabulary (a view); nothing modifies them in place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = [container[key] for container, key in model.block_slots()]
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again at once by backward: keep them gathered
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def parallelize(model, dims, mesh, cfg, device, param_dtype=None, compile_=False) -> nn.Module:
    """The model ready to train on this rank (wrapped by DDP when pure data parallel);
    FSDP gathers parameters in `param_dtype` (the plan's compute dtype; None: fp32); blocks and
    loss are compiled when `compile_` (the plan's)."""
    if dims.tp > 1:
        apply_tp(model, mesh["tp"])
    if cfg.train.activation_checkpointing != "none":
        apply_ac(model, cfg.train.activation_checkpointing)
    if compile_:
        apply_compile(model)
    if dims.dp_shard > 1:
        names = ("dp_replicate", "dp_shard") if dims.dp_replicate > 1 else ("dp_shard",)
        apply_fsdp(model, mesh[names], param_dtype, torch.float32)
    elif dims.dp_replicate > 1:
        if dims.tp > 1:
            raise UserError("DDP with tensor parallel is not supported; use parallel.dp_shard for "
                            "the data-parallel degree together with tp")
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                        process_group=mesh["dp_replicate"].get_group())
    return model
