"""The flash-attn package (FlashAttention-2) behind the `flash_attention_2` backend."""

from __future__ import annotations

import torch

from gptrain.errors import UserError


def check_available() -> None:
    """Raise the clear error now (before a run starts) if flash-attn cannot be used here."""
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        raise UserError("attn_implementation=flash_attention_2 needs the flash-attn package "
                        "(pip install flash-attn, CUDA only); use sdpa, which runs PyTorch's "
                        "own flash kernel where the hardware has one") from None
    if not torch.cuda.is_available():
        raise UserError("attn_implementation=flash_attention_2 runs on CUDA GPUs only; use sdpa on CPU")


def flash_attention(q, k, v, dropout_p: float, causal: bool):
    """flash_attn_func on (B, heads, T, d) tensors; needs CUDA and fp16/bf16."""
    check_available()
    from flash_attn import flash_attn_func

    if q.dtype not in (torch.float16, torch.bfloat16):
        raise UserError("flash_attention_2 needs fp16 or bf16: add --torch_dtype bfloat16 "
                        "(or --train.precision=bf16)")
    # With a KV cache the queries are the last T positions; flash-attn aligns a causal mask
    # to the bottom-right corner, which is exactly that case.
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          dropout_p=dropout_p, causal=causal)
    return out.transpose(1, 2)
