"""Llama (Llama-2, TinyLlama and their kin: Qwen2/2.5 with its query/key/value biases, Qwen3 with
its per-head query/key norms, Mistral with its sliding window, Phi-3 with its fused projections,
OLMo 2 with its norms after each sub-layer): RMSNorm, rotary positions, grouped-query attention,
SwiGLU MLP, and an output head of its own unless tie_embeddings.

It fills the same shell as GPT-2 (models/base.py: transformer.wte / transformer.h /
transformer.ln_f / lm_head, one forward), so the trainer, the parallelism plans, checkpoints and
generation treat both the same. Inside a block the names are Hugging Face's LlamaDecoderLayer names (self_attn.q_proj,
mlp.gate_proj, ...), so HF import (models/hf.py) only renames the outer prefixes. Rotary
embeddings use HF's rotate-half convention, so q_proj/k_proj need no permutation either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptrain.models.base import CAUSAL, CausalLM, attention, within_window

if TYPE_CHECKING:  # a type only (models/shapes.py)
    from gptrain.models.shapes import GPTConfig


def rotary(q, k, start_pos: int, theta: float, positions=None):
    """Rotate (B, heads, T, d) queries and keys by their positions start_pos.., or by
    `positions` (B, T) (HF's layout: the first and second halves of each head are the pairs)."""
    d, T = q.size(-1), q.size(-2)
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=q.device).float() / d)
    if positions is None:
        pos = torch.arange(start_pos, start_pos + T, device=q.device, dtype=torch.float32)
    else:  # (B, 1, T, d/2): one rotation per row and position, the same for every head
        pos = positions.to(torch.float32)[:, None]
    freqs = pos[..., None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_attention(attn, q, k, v, cache=None, packed=None, scale=None, softcap=None):
    """(B, heads, T, d) queries, keys and values after their projections: rotated by their
    positions (attn.theta), through the generation cache, within attn.window, each key/value head
    serving its group of query heads; the attention's output. Llama's kin and Gemma share it."""
    q, k = rotary(q, k, cache.pos if cache is not None else 0, attn.theta,
                  packed.positions if packed is not None else None)
    mask = CAUSAL if packed is None else packed.mask
    if cache is not None:
        k, v, mask = cache.update(attn, k, v)
    mask = within_window(mask, q.size(2), k.size(2), attn.window, q.device)
    group = q.size(1) // k.size(1)
    if group > 1:  # each key/value head serves `group` query heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return attention(q, k, v, attn.impl, attn.dropout if attn.training else 0.0, mask, scale=scale, softcap=softcap)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.head_dim
        qkv_bias = cfg.bias or cfg.qkv_bias
        q_width, kv_width = cfg.n_head * d, cfg.kv_heads * d
        if cfg.fused_projections:  # (Phi-3's one qkv_proj: the query, key and value rows in turn)
            self.qkv_proj = nn.Linear(cfg.n_embd, q_width + 2 * kv_width, bias=qkv_bias)
            self.widths = (q_width, kv_width, kv_width)
        else:
            self.q_proj = nn.Linear(cfg.n_embd, q_width, bias=qkv_bias)
            self.k_proj = nn.Linear(cfg.n_embd, kv_width, bias=qkv_bias)
            self.v_proj = nn.Linear(cfg.n_embd, kv_width, bias=qkv_bias)
        self.o_proj = nn.Linear(q_width, cfg.n_embd, bias=cfg.bias)
        self.head_dim, self.theta = d, cfg.rope_theta
        self.impl, self.dropout = cfg.attn_implementation, cfg.dropout
        self.window = cfg.sliding_window
        self.norm_per_head = cfg.qk_norm_per_head
        if cfg.qk_norm:  # (HF's names: self_attn.q_norm, self_attn.k_norm): each head's, or OLMo 2's over all
            self.q_norm = nn.RMSNorm(d if self.norm_per_head else q_width, eps=cfg.layer_norm_eps)
            self.k_norm = nn.RMSNorm(d if self.norm_per_head else kv_width, eps=cfg.layer_norm_eps)

    def forward(self, x, cache=None, packed=None):
        B, T, _ = x.shape
        if hasattr(self, "qkv_proj"):
            q, k, v = self.qkv_proj(x).split(self.widths, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if hasattr(self, "q_norm") and not self.norm_per_head:  # the query (key) heads normalized together
            q, k = self.q_norm(q), self.k_norm(k)
        # -1 heads: under tensor parallel this rank holds only its share of the heads.
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if hasattr(self, "q_norm") and self.norm_per_head:  # each head's query and key normalized, then rotated
            q, k = self.q_norm(q), self.k_norm(k)
        y = rotary_attention(self, q, k, v, cache, packed)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.fused_projections:  # (Phi-3's one gate_up_proj: the gate rows, then the up rows)
            self.gate_up_proj = nn.Linear(cfg.n_embd, 2 * cfg.ffn_size, bias=cfg.bias)
        else:
            self.gate_proj = nn.Linear(cfg.n_embd, cfg.ffn_size, bias=cfg.bias)
            self.up_proj = nn.Linear(cfg.n_embd, cfg.ffn_size, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class LlamaBlock(nn.Module):
    """A norm before each sub-layer (Llama's); with cfg.post_norm (OLMo 2's) each sub-layer's
    output is normalized instead, before it joins the residual (post_feedforward_layernorm)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.post_norm = cfg.post_norm
        if not self.post_norm:
            self.input_layernorm = nn.RMSNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.mlp = LlamaMLP(cfg)
        if self.post_norm:
            self.post_feedforward_layernorm = nn.RMSNorm(cfg.n_embd, eps=cfg.layer_norm_eps)

    def forward(self, x, cache=None, packed=None):
        if self.post_norm:
            x = x + self.post_attention_layernorm(self.self_attn(x, cache=cache, packed=packed))
            return x + self.post_feedforward_layernorm(self.mlp(x))
        x = x + self.self_attn(self.input_layernorm(x), cache=cache, packed=packed)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(CausalLM):
    RESIDUAL_PROJECTIONS = ("o_proj.weight", "down_proj.weight")

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg, dict(
            wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd),
            h=nn.ModuleDict({str(i): LlamaBlock(cfg) for i in range(cfg.n_layer)}),
            ln_f=nn.RMSNorm(cfg.n_embd, eps=cfg.layer_norm_eps),
        ))

    def embed(self, idx, start_pos: int, positions=None):
        return self.transformer.wte(idx)  # positions enter through the rotary embeddings
