"""What every architecture shares: attention kernels and the causal-LM shell.

    transformer.wte -> (positions) -> transformer.h.0 .. h.{L-1} -> transformer.ln_f -> lm_head

An architecture (models/gpt2.py, models/llama.py) builds its own modules into that shell and
says how tokens become the first hidden states (`embed`); the forward pass, the init, the
parameter count and the fused loss are the same for all, and so are the names the trainer,
the parallelism plans, checkpoints and generation rely on. models/registry.py says which
architectures exist. No parallelism in here (distributed/parallelize.py adds that).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptrain.errors import UserError
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the shape (models/registry.py, torch-free): a type here, never an import
    from gptrain.models.shapes import GPTConfig


CAUSAL = "causal"


class Packed:
    """Rows packed with several examples (data/loader.py, data.packing): from each token's
    example number, the positions that restart at each example and the block-diagonal causal
    mask (a token sees the tokens before it in its own example only). So each example's
    logits are those it has alone in a row of its own, padded."""

    def __init__(self, segments: torch.Tensor):
        B, T = segments.shape
        idx = torch.arange(T, device=segments.device).expand(B, T)
        starts = torch.ones_like(segments, dtype=torch.bool)
        starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
        self.positions = idx - torch.cummax(torch.where(starts, idx, 0), dim=1).values  # (B, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
        self.mask = ((segments[:, :, None] == segments[:, None, :]) & causal)[:, None]  # (B, 1, T, T)


def attention(q, k, v, impl: str, dropout_p: float, mask=CAUSAL, scale: float | None = None,
              softcap: float | None = None):
    """softmax(q k^T * scale) v over (B, heads, T, head_dim) tensors; scale 1/sqrt(d) unless
    given; with `softcap` the scores are capped softly first, softcap * tanh(scores / softcap)
    (Gemma 2's; computed as `eager` does, which no fused kernel here takes).

    mask: CAUSAL for a square block (training, prefill), None when every query sees every key
    (one-token decode), or a boolean tensor broadcast to (B, heads, T, S) (a cache's (T, S), a
    packed batch's (B, 1, T, T), a sliding window's). `eager` is the reference that the fast
    kernels are tested against.
    """
    causal = isinstance(mask, str)
    if impl == "sdpa" and softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask,
                                              dropout_p=dropout_p, is_causal=causal, scale=scale)
    if impl in ("eager", "sdpa"):
        att = (q @ k.transpose(-2, -1)) * (scale or 1.0 / math.sqrt(q.size(-1)))
        if softcap is not None:
            att = torch.tanh(att / softcap) * softcap
        if causal:
            mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            att = att.masked_fill(~mask, float("-inf"))
        att = F.dropout(F.softmax(att.float(), dim=-1).to(q.dtype), dropout_p)
        return att @ v
    if impl == "flash_attention_2":
        from gptrain.models.flash import flash_attention

        if mask is not None and not causal:  # (config_check refuses data.packing with it)
            raise UserError("flash_attention_2 takes no attention mask (packed rows, a sliding window "
                            "shorter than the context): use sdpa")
        if scale is not None or softcap is not None:
            raise UserError("flash_attention_2 does not compute this model's attention scale or "
                            "soft-capping here: use sdpa")

        return flash_attention(q, k, v, dropout_p, causal=mask is not None)
    raise UserError(f"unknown attention implementation {impl!r}: use sdpa, eager or flash_attention_2")


def within_window(mask, T: int, S: int, window: int | None, device):
    """`mask` (as attention takes it) for the last T of S positions, narrowed to a sliding window:
    a query sees a key at most window - 1 positions before it (Hugging Face's sliding-window mask).
    A window no shorter than S changes nothing."""
    if window is None or S <= window:
        return mask
    q = torch.arange(S - T, S, device=device)[:, None]
    k = torch.arange(S, device=device)[None, :]
    near = (q - k) < window  # (T, S)
    if mask is None:
        return near
    return near & (k <= q) if isinstance(mask, str) else mask & near


class CausalLM(nn.Module):
    """The shell every architecture fills: `transformer` (wte, h, ln_f and any extras) and
    lm_head, tied to wte when config.tie_embeddings."""

    RESIDUAL_PROJECTIONS: tuple[str, ...] = ()  # output projections scaled down at init
    NORM_WEIGHT_INIT = 1.0  # a norm's weight at init (Gemma's norms scale by 1 + weight: 0)

    def __init__(self, cfg: GPTConfig, modules: dict):
        super().__init__()
        cfg.validate()
        self.config = cfg
        # A ModuleDict keyed "0".."L-1" keeps HF's names (transformer.h.0...) and lets the
        # pipeline splitter delete blocks without renumbering the rest.
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.fused_loss = True  # False: the reference logits -> cross-entropy path
        self.softcap = getattr(cfg, "final_softcap", None)  # Gemma 2's logits, capped softly
        self.loss_fn = cross_entropy  # that path's loss (compiled by parallelize when asked)
        self.init_weights()  # (adapters: models/lora.py attaches them to a built model)

    def block_slots(self) -> list:
        """(container, key) of each transformer block: what FSDP shards, activation checkpointing
        wraps and compile compiles one by one (models/generic.py has its own)."""
        return [(self.transformer.h, name) for name in self.transformer.h]

    def embed(self, idx, start_pos: int, positions=None):
        """The first hidden states of tokens at positions start_pos.., or at `positions` (B, T)."""
        raise NotImplementedError

    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)."""
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(self.RESIDUAL_PROJECTIONS):
                _normal(p, resid_std, gen)
            elif p.dim() >= 2:
                _normal(p, 0.02, gen)
            elif "ln_" in name or "norm" in name:  # (ln_1, input_layernorm, q_norm...)
                nn.init.constant_(p, self.NORM_WEIGHT_INIT) if name.endswith("weight") else nn.init.zeros_(p)
            else:
                nn.init.zeros_(p)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters; non_embedding leaves out the lookup-only tables (as nanoGPT, for 6N
        FLOPs): learned positions, and the token embedding when lm_head has its own weight."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            tr = self.transformer
            for key in ("wpe",) if self.config.tie_embeddings else ("wpe", "wte"):
                if key in tr and tr[key] is not None:
                    n -= tr[key].weight.numel()
        return n

    def forward(self, idx, targets=None, cache=None, start_pos: int = 0, last_only: bool = False,
                segments=None):
        """Logits over the real vocabulary; with targets, (logits, mean loss), where logits is
        None when the fused loss computed the loss without them. `segments` (B, T): each token's
        example number in rows packed with several examples (see Packed).

        Under pipeline parallel a stage may lack wte (then `idx` is hidden states) or ln_f and
        lm_head (then the hidden states are returned).
        """
        tr = self.transformer
        if tr["wte"] is not None and start_pos + idx.size(1) > self.config.block_size:
            raise UserError(f"sequence of {start_pos + idx.size(1)} tokens is longer than the model's "
                            f"context ({self.config.block_size})")
        packed = Packed(segments) if segments is not None else None
        if tr["wte"] is not None:
            x = self.embed(idx, start_pos, packed.positions if packed else None)
        else:
            x = idx
        for block in tr.h.values():
            x = block(x, cache=cache) if packed is None else block(x, packed=packed)
        if tr["ln_f"] is None:
            return x
        if targets is not None:
            if self.fused_loss and self.softcap is None and _plain(x, self.lm_head.weight):
                # the loss without materializing the logits (models/fused_ce.py); logits are None
                from gptrain.models.fused_ce import linear_cross_entropy

                return None, linear_cross_entropy(tr.ln_f(x), self.lm_head.weight, targets, self.config.vocab_size)
            logits, loss = self.head_loss(x, targets)
            return logits[..., : self.config.vocab_size], loss  # (a view: nothing of it in the backward)
        x = tr.ln_f(x)
        if last_only:  # generation needs the next-token logits only
            x = x[:, -1:]
        logits = self.capped(self.lm_head(x))
        if logits.size(-1) != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]  # padded rows are never predicted
        return logits.contiguous()

    def head_loss(self, x, targets):
        """(padded logits, loss) of the last hidden states: ln_f, lm_head and the loss, the
        region distributed/parallelize.py compiles as one (the weight's cast, the norm and the
        softmax fuse)."""
        logits = self.capped(self.lm_head(self.transformer.ln_f(x)))
        return logits, self.loss_fn(logits, targets, self.config.vocab_size)

    def capped(self, logits):
        """The logits, soft-capped where the architecture caps them: softcap * tanh(logits / softcap)."""
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap


def _plain(*tensors) -> bool:
    """Ordinary tensors (the fused loss does not handle tensor-parallel DTensors)."""
    from torch.distributed.tensor import DTensor

    return not any(isinstance(t, DTensor) for t in tensors)


def cross_entropy(logits, targets, vocab_size: int | None = None):
    """Mean next-token loss in fp32; targets of -100 are ignored. Logits padded past the
    vocabulary (`vocab_size`: the real one) have their padded columns masked out, never sliced
    off: the values and gradients are those of the real columns alone (the padded ones get
    probability 0, so gradient 0), where a slice's backward would write a zero tensor the size of
    the logits and copy into it (1.6 GB for GPT-2 at batch 16 x 1024 in bf16)."""
    copied = logits.dtype != torch.float32
    logits = logits.float()
    if vocab_size is not None and logits.size(-1) > vocab_size:
        padded = torch.arange(logits.size(-1), device=logits.device) >= vocab_size
        # in place on the fp32 copy of low-precision logits (no pass over a new tensor); never on
        # the head's own output, which its caller is handed
        logits = logits.masked_fill_(padded, float("-inf")) if copied else logits.masked_fill(padded, float("-inf"))
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)


def _normal(p, std, gen):
    with torch.no_grad():
        if gen is None:
            p.normal_(0.0, std)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * std)
