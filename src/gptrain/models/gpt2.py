"""GPT-2, read top to bottom: attention -> MLP -> Block -> GPT (the shell is models/base.py).

A plain nn.Module with no parallelism inside (distributed/parallelize.py adds that). Parameter
names match Hugging Face's GPT2LMHeadModel, so weight import (models/hf.py) is a short list of
transposes. One layout difference, on purpose: `c_attn` stores its output rows per head as
(head, q|k|v, head_dim) instead of HF's (q|k|v, head, head_dim). With that order a plain
column split of c_attn hands every tensor-parallel rank whole heads (as in Megatron-LM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptrain.models.base import CAUSAL, CausalLM, attention

if TYPE_CHECKING:  # a type only (models/shapes.py)
    from gptrain.models.shapes import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # rows: (head, qkv, d)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.head_dim = cfg.head_dim
        self.impl = cfg.attn_implementation
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, cache=None, packed=None):
        B, T, _ = x.shape
        # -1 heads: under tensor parallel this rank holds only its share of the heads.
        qkv = self.c_attn(x).view(B, T, -1, 3, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=3))  # (B, heads, T, d)
        mask = CAUSAL if packed is None else packed.mask
        if cache is not None:
            k, v, mask = cache.update(self, k, v)
        p = self.dropout if self.training else 0.0
        y = attention(q, k, v, self.impl, p, mask)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        # GPT-2's "gelu_new" is the tanh approximation; nanoGPT's nn.GELU() the exact one
        self.approximate = "tanh" if cfg.gelu == "tanh" else "none"

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, cache=None, packed=None):
        x = x + self.attn(self.ln_1(x), cache=cache, packed=packed)
        return x + self.mlp(self.ln_2(x))


class GPT(CausalLM):
    RESIDUAL_PROJECTIONS = ("c_proj.weight",)  # scaled down at init (GPT-2)

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg, dict(
            wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)}),
            ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias),
        ))

    def embed(self, idx, start_pos: int, positions=None):
        tr = self.transformer
        pos = torch.arange(start_pos, start_pos + idx.size(1), device=idx.device) if positions is None else positions
        return tr.drop(tr.wte(idx) + tr.wpe(pos))

