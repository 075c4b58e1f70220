"""LoRA (Hu et al. 2021, as peft does it) native in gptrain's own blocks.

A targeted nn.Linear keeps its frozen `weight` (and `bias`) under the same name and gains two
small matrices beside it, `lora_A` (r x in) and `lora_B` (out x r):

    y = x W^T + b + dropout(x) A^T B^T * (alpha / r)

A starts as peft's default (Kaiming-uniform), B at zero, so the adapted model starts as the
base. Every other parameter is frozen (no gradient, no optimizer state). Because the names of
the base weights do not change, HF import, the parallelism plans and checkpoints see the same
model; the adapters are more tensors in the same state dict. The shape of the adapters is part
of the model's config (GPTConfig.lora_*), so a checkpoint of a LoRA run rebuilds them.

Targets are Hugging Face module names, matched as peft matches them: a module whose name is the
target or ends with "." + target (`c_attn`, `q_proj`, `mlp.c_proj`), or `all-linear` (every
Linear in the blocks; not lm_head).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptrain.errors import UserError, closest

ALL_LINEAR = "all-linear"
NF4_BLOCK = 64  # QLoRA's (and torchao's) NF4 block: 64 weights share one scale


def default_targets(arch: str) -> tuple:
    """peft's defaults (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) where no target is
    given: the architecture's spec says them (models/registry.py)."""
    from gptrain.models.registry import spec_of

    return spec_of(arch).lora_targets


class LoRALinear(nn.Linear):
    """An nn.Linear with a low-rank update; made from a Linear in place (`adapt`)."""

    lora_A: nn.Parameter
    lora_B: nn.Parameter

    def forward(self, x):
        out = F.linear(x, self.weight, self.bias)
        h = F.dropout(x, self.lora_dropout, self.training) if self.lora_dropout else x
        return out + F.linear(F.linear(h, self.lora_A), self.lora_B) * self.lora_scaling

    def delta(self) -> torch.Tensor:
        """The update to the weight: (B A) * alpha / r, as the weight's (out, in)."""
        return (self.lora_B @ self.lora_A) * self.lora_scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lora_r={self.lora_A.shape[0]}, lora_scaling={self.lora_scaling}"


def adapt(linear: nn.Linear, r: int, alpha: float, dropout: float) -> None:
    """Turn `linear` into a LoRALinear in place (its weight and bias stay the same objects)."""
    dev = linear.weight.device
    linear.__class__ = LoRALinear
    linear.lora_A = nn.Parameter(torch.empty(r, linear.in_features, device=dev))
    linear.lora_B = nn.Parameter(torch.zeros(linear.out_features, r, device=dev))
    if dev.type != "meta":
        nn.init.kaiming_uniform_(linear.lora_A, a=math.sqrt(5))  # peft's init_lora_weights=True
    linear.lora_scaling = alpha / r
    linear.lora_dropout = dropout


def block_linears(model) -> dict[str, nn.Linear]:
    """Every Linear inside the transformer blocks, by its name relative to the model."""
    return {name: m for name, m in model.named_modules() if name.startswith("transformer.h.")
            and isinstance(m, nn.Linear)}


def resolve_targets(model, targets) -> list[str]:
    """The names of the Linears the targets select; a target that selects none is one line
    naming the module names there are."""
    from gptrain.models.registry import spec_of

    linears = block_linears(model)
    targets = list(targets) or list(default_targets(model.config.arch))
    if ALL_LINEAR in targets:
        return list(linears)
    spec = spec_of(model.config.arch)  # each Linear also by its HF name, as peft matches it
    names = {n: (n, spec.rename(f"{n}.weight", to_ours=False).removesuffix(".weight")) for n in linears}
    chosen = []
    for t in targets:
        hits = [n for n in linears if any(m == t or m.endswith("." + t) for m in names[n])]
        if not hits:
            kinds = sorted({n.rsplit(".", 1)[-1] for n in linears})
            raise UserError(f"LoRA target module {t!r} is not a Linear of this {model.config.arch} model"
                            f"{closest(t, kinds)}; its modules: {', '.join(kinds)}, or {ALL_LINEAR}")
        chosen += [n for n in hits if n not in chosen]
    return chosen


def attach(model) -> None:
    """Add the adapters that model.config.lora_* describe and freeze everything else; with
    lora_quant "nf4" (QLoRA), every block Linear's frozen weight is then held in 4-bit NF4."""
    cfg = model.config
    modules = dict(model.named_modules())
    for name in resolve_targets(model, cfg.lora_targets):
        adapt(modules[name], cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    if cfg.lora_quant:
        quantize_base(model, cfg.lora_quant)


def add_lora(model, r: int, alpha: float, dropout: float, targets, quant: str = "") -> None:
    """LoRA on a built model (its base weights already loaded): the config records it."""
    cfg = model.config
    cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout = r, alpha, dropout
    cfg.lora_targets, cfg.lora_quant = list(targets), quant
    attach(model)


def nf4():
    """torchao's NF4 tensor (QLoRA's 4-bit NormalFloat, blocks of 64 with double-quantized
    scales), or one line saying how to get it."""
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor, to_nf4
    except ImportError:
        raise UserError("QLoRA (--lora.quantize_base nf4) holds the base in torchao's NF4: "
                        "pip install 'gptrain[qlora]' (torchao)") from None
    return NF4Tensor, to_nf4


def quantize_base(model, kind: str) -> None:
    """Every Linear weight in the blocks (frozen) as NF4; F.linear dequantizes it per call to
    the input's dtype (torchao), so the adapters train against the 4-bit base."""
    if kind != "nf4":
        raise UserError(f"unknown base quantization {kind!r}: use nf4")
    _, to_nf4 = nf4()
    for name, m in block_linears(model).items():
        w = m.weight
        if w.device.type == "meta":
            continue
        if w.numel() % NF4_BLOCK:
            raise UserError(f"QLoRA: {name} has {w.numel()} weights, not a multiple of NF4's block of "
                            f"{NF4_BLOCK}; this model cannot be held in NF4")
        scales = w.numel() // NF4_BLOCK  # their own scales are quantized in blocks of up to 256,
        fits = [b for b in (256, 128, 64, 32, 16, 8, 4, 2, 1) if scales % b == 0]  # a count of blocks
        scaler_block = next(b for even in (8, 4, 2, 1) for b in fits if scales // b % even == 0)  # (FSDP2 splits it)
        m.weight = nn.Parameter(to_nf4(w.detach().to(torch.bfloat16), NF4_BLOCK, scaler_block), requires_grad=False)


def hold_base_in(model, dtype: torch.dtype) -> None:
    """Every frozen Linear weight and bias in the blocks held in `dtype`, the run's autocast
    compute dtype: autocast casts them to it in every forward anyway, so the model computes the
    same numbers, while the base takes half the memory and no cast per step (what HF + peft
    pay). Only for a base that checkpoints never hold (adapter-only checkpoints: lora_base)."""
    for m in block_linears(model).values():
        for name in ("weight", "bias"):
            p = getattr(m, name)
            if p is not None and not p.requires_grad and p.dtype != dtype and p.device.type != "meta":
                setattr(m, name, nn.Parameter(p.detach().to(dtype), requires_grad=False))


def dense(t: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """A plain tensor of `t` (an NF4 weight dequantized)."""
    return t.to(dtype) if type(t).__name__ == "NF4Tensor" else t


def base_digest(model) -> str:
    """sha256 of the model's weights without adapters: each tensor's name, dtype, shape and
    bytes, in name order (whatever files they came from)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if ".lora_" in name:
            continue
        t = t.detach().to("cpu").contiguous()
        t = dense(t)  # (a quantized base's digest is never taken: it is computed before)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def base_reference(model, init_from: str) -> dict:
    """What an adapter-only checkpoint keeps of the weights its adapters go on: where they
    were (an absolute path, or the hub id) and their digest, checked whenever they are loaded."""
    from pathlib import Path

    path = Path(init_from).expanduser()
    return {"init_from": str(path.resolve()) if path.exists() else init_from, "sha256": base_digest(model)}


def merged(model):
    """A plain copy of a LoRA model: each adapted weight W + (B A) alpha / r, no adapters,
    config.lora_r = 0 (what `export --format hf` writes); the model itself is left as it is."""
    import copy

    cfg = copy.deepcopy(model.config)
    cfg.lora_r, cfg.lora_quant = 0, ""
    with torch.device("meta"):
        plain = type(model)(cfg)  # (its own architecture's class: models/registry.py built it)
    plain.to_empty(device="cpu")
    state = {}
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, LoRALinear):
                w = dense(m.weight)
                state[f"{name}.weight"] = w + m.delta().to(w.dtype)
        for name, t in model.state_dict().items():
            if ".lora_" not in name:
                state.setdefault(name, dense(t))
    plain.load_state_dict(state, strict=True)
    if cfg.tie_embeddings:
        plain.lm_head.weight = plain.transformer.wte.weight
    return plain.train(model.training)
