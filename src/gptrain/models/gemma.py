"""Gemma 2 and Gemma 3 (text), read top to bottom: norm -> attention -> MLP -> block -> Gemma.

Llama's pieces (grouped-query attention, rotary positions in HF's rotate-half layout, a gated
MLP) with what Gemma does its own way (models/shapes.py, Gemma2Config): four norms a block, each
scaling by 1 + weight in fp32; embeddings multiplied by sqrt(n_embd); queries scaled by
query_scale^-1/2; attention scores and the final logits soft-capped (Gemma 2; the logits' cap is
the shell's, models/base.py); windowed layers between the global ones, each with its rotary base
(Gemma 3), and Gemma 3's norm over each query and key head. Inside a block the names are Hugging
Face's Gemma2DecoderLayer / Gemma3DecoderLayer names, so HF import renames the outer prefixes only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptrain.models.base import CausalLM
from gptrain.models.llama import rotary_attention

if TYPE_CHECKING:  # a type only (models/shapes.py)
    from gptrain.models.shapes import Gemma2Config


class GemmaNorm(nn.Module):
    """RMSNorm in fp32, scaled by 1 + weight (the weight starts at 0), cast back to the input's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GemmaAttention(nn.Module):
    def __init__(self, cfg: Gemma2Config, layer: int):
        super().__init__()
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * d, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * d, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * d, bias=cfg.bias)
        self.o_proj = nn.Linear(cfg.n_head * d, cfg.n_embd, bias=cfg.bias)
        if cfg.qk_norm:  # (Gemma 3's: each head's query and key, before the rotation)
            self.q_norm = GemmaNorm(d, cfg.layer_norm_eps)
            self.k_norm = GemmaNorm(d, cfg.layer_norm_eps)
        everything = cfg.attends_to_all(layer)
        self.window = None if everything else cfg.sliding_window
        self.theta = cfg.rope_theta if everything or cfg.local_rope_theta is None else cfg.local_rope_theta
        self.head_dim, self.scale = d, (cfg.query_scale or d) ** -0.5
        self.softcap, self.impl, self.dropout = cfg.attn_softcap, cfg.attn_implementation, cfg.dropout

    def forward(self, x, cache=None, packed=None):
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        y = rotary_attention(self, q, k, v, cache, packed, scale=self.scale, softcap=self.softcap)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class GemmaMLP(nn.Module):
    def __init__(self, cfg: Gemma2Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.ffn_size, bias=cfg.bias)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.ffn_size, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.n_embd, bias=cfg.bias)
        self.approximate = "tanh" if cfg.gelu == "tanh" else "none"

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate=self.approximate) * self.up_proj(x))


class GemmaBlock(nn.Module):
    def __init__(self, cfg: Gemma2Config, layer: int):
        super().__init__()
        eps = cfg.layer_norm_eps
        self.input_layernorm = GemmaNorm(cfg.n_embd, eps)
        self.self_attn = GemmaAttention(cfg, layer)
        self.post_attention_layernorm = GemmaNorm(cfg.n_embd, eps)
        self.pre_feedforward_layernorm = GemmaNorm(cfg.n_embd, eps)
        self.mlp = GemmaMLP(cfg)
        self.post_feedforward_layernorm = GemmaNorm(cfg.n_embd, eps)

    def forward(self, x, cache=None, packed=None):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cache=cache, packed=packed))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma(CausalLM):
    RESIDUAL_PROJECTIONS = ("o_proj.weight", "down_proj.weight")
    NORM_WEIGHT_INIT = 0.0  # (GemmaNorm scales by 1 + weight)

    def __init__(self, cfg: Gemma2Config):
        super().__init__(cfg, dict(
            wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd),
            h=nn.ModuleDict({str(i): GemmaBlock(cfg, i) for i in range(cfg.n_layer)}),
            ln_f=GemmaNorm(cfg.n_embd, cfg.layer_norm_eps),
        ))

    def embed(self, idx, start_pos: int, positions=None):
        x = self.transformer.wte(idx)  # positions enter through the rotary embeddings
        return x * torch.tensor(self.config.n_embd ** 0.5, dtype=x.dtype)  # (rounded to x's dtype, as HF)
