"""Autoregressive generation with a KV cache: greedy, temperature, top-k, top-p, seed, EOS stop."""

from __future__ import annotations

import torch

from gptrain.errors import UserError
from gptrain.models.base import CAUSAL


class KVCache:
    """Keys and values of every attention layer, each allocated on its first update."""

    def __init__(self, batch: int, max_len: int, dtype, device):
        self.batch, self.max_len, self.dtype, self.device = batch, max_len, dtype, device
        self.buffers = {}
        self.pos = 0  # tokens cached so far

    def update(self, attn, k, v):
        """Store this step's k, v; return all keys/values so far and the attention mask."""
        if id(attn) not in self.buffers:  # (batch, key/value heads, max_len, head_dim)
            shape = (self.batch, k.size(1), self.max_len, k.size(3))
            self.buffers[id(attn)] = tuple(torch.empty(shape, dtype=self.dtype, device=self.device)
                                           for _ in range(2))
        kbuf, vbuf = self.buffers[id(attn)]
        T = k.size(2)
        end = self.pos + T
        kbuf[:, :, self.pos:end] = k
        vbuf[:, :, self.pos:end] = v
        if self.pos == 0:
            mask = CAUSAL
        elif T == 1:
            mask = None  # one new token sees everything cached
        else:
            mask = torch.ones(T, end, dtype=torch.bool, device=k.device).tril(self.pos)
        return kbuf[:, :, :end], vbuf[:, :, :end], mask


MAX_NEW_TOKENS = 1 << 16
MAX_SAMPLES = 1024


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
                   num_samples: int = 1, seed: int | None = None) -> None:
    """The sampling settings, before any model is loaded: one UserError naming the first that is
    out of range (negative, NaN or unbounded ones would be silently ignored or run for ever)."""
    import math

    for ok, what in ((1 <= max_new_tokens <= MAX_NEW_TOKENS, f"--max-new-tokens must be 1..{MAX_NEW_TOKENS}, "
                      f"got {max_new_tokens}"),
                     (1 <= num_samples <= MAX_SAMPLES, f"--num-samples must be 1..{MAX_SAMPLES}, got {num_samples}"),
                     (math.isfinite(temperature) and temperature >= 0,
                      f"--temperature must be >= 0 (0: greedy), got {temperature}"),
                     (top_k is None or top_k >= 0, f"--top-k must be >= 0 (0: off), got {top_k}"),
                     (top_p is None or 0 < top_p <= 1, f"--top-p must be > 0 and <= 1, got {top_p}"),
                     (seed is None or 0 <= seed < 2 ** 63, f"--seed must be 0 to 2^63-1, got {seed}")):
        if not ok:
            raise UserError(what)


def sample_next(logits, temperature: float, top_k: int | None, top_p: float | None, generator):
    """Next token ids (B,) from last-position logits (B, V)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > top_p  # keep the smallest set reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    try:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    except RuntimeError:  # (probabilities that are NaN or inf: logits that went so since the prompt)
        raise UserError(NOT_FINITE) from None


NOT_FINITE = ("the model computes logits that are not finite numbers (NaN or inf): its weights are damaged or "
              "its training diverged; use an earlier checkpoint")


@torch.no_grad()
def generate(model, prompt, max_new_tokens: int, temperature: float = 0.0, top_k=None,
             top_p=None, eos_id: int | None = None, seed: int | None = None):
    """Token ids (B, T + n): the prompt (B, T) followed by up to max_new_tokens new tokens.

    Rows that emit eos_id are padded with eos_id until every row has finished. While the
    sequence fits the context, keys and values are cached; past it, each step sees the last
    block_size tokens (recomputed, as nanoGPT does), since positions are absolute.
    """
    model.eval()
    B, T = prompt.shape
    ctx = model.config.block_size
    if T == 0:
        raise UserError("the prompt is empty: give at least one token of text")
    if T > ctx:
        prompt = prompt[:, -ctx:]  # only the last block_size tokens can be seen
        T = ctx
    generator = None
    if seed is not None:
        generator = torch.Generator(device=prompt.device).manual_seed(seed)
    dtype = next(model.parameters()).dtype
    cache = KVCache(B, min(ctx, T + max_new_tokens), dtype, prompt.device)
    logits = model(prompt, cache=cache, last_only=True)[:, -1]
    if not bool(torch.isfinite(logits).all()):  # once, on the prompt: NaN weights show here, not per token
        raise UserError(NOT_FINITE)
    cache.pos = T
    out = [prompt]
    finished = torch.zeros(B, dtype=torch.bool, device=prompt.device)
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            nxt = torch.where(finished, torch.full_like(nxt, eos_id), nxt)
            finished |= nxt == eos_id
        out.append(nxt[:, None])
        if i == max_new_tokens - 1 or (eos_id is not None and bool(finished.all())):
            break
        if cache.pos < ctx:
            logits = model(nxt[:, None], cache=cache, start_pos=cache.pos)[:, -1]
            cache.pos += 1
        else:
            logits = model(torch.cat(out, dim=1)[:, -ctx:], last_only=True)[:, -1]
    return torch.cat(out, dim=1)
