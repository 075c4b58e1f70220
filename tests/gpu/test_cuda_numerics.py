"""On CUDA: gptrain's models against transformers, the attention kernels against the eager
reference, and the fused loss against logits -> cross-entropy.

fp32 comparisons keep TF32 off (PyTorch's default), so both sides compute in true fp32 and agree
within 1e-5. bf16 cannot be compared to a fixed tolerance: each side is compared with the fp32
result, and gptrain's error must be of the same size as the reference implementation's own
(bf16's unit roundoff is 2^-8).
"""

import pytest
import torch
import torch.nn.functional as F

from gptrain.models.base import attention
from gptrain.models.fused_ce import linear_cross_entropy
from gptrain.models.hf import load_hf

DEV = "cuda"


def _ids(n=2, t=48, vocab=50257, seed=1):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed)).to(DEV)


def _pair(model_dir, impl="sdpa", dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=impl).to(DEV, dtype).eval()
    model, _ = load_hf(str(model_dir), attn_implementation=impl)
    return ref, model.to(DEV, dtype).eval()


@pytest.mark.parametrize("which", ["tiny_hf_gpt2", "tiny_hf_llama"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_fp32_logits_match_transformers(request, which, impl):
    ref, model = _pair(request.getfixturevalue(which), impl)
    ids = _ids(vocab=ref.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("which", ["tiny_hf_gpt2", "tiny_hf_llama"])
def test_bf16_logits_within_bf16_roundoff_of_transformers(request, which):
    model_dir = request.getfixturevalue(which)
    ref32, _ = _pair(model_dir)
    ref16, model16 = _pair(model_dir, dtype=torch.bfloat16)
    ids = _ids(vocab=ref32.config.vocab_size)
    with torch.no_grad():
        exact = ref32(ids).logits
        theirs = (ref16(ids).logits.float() - exact).abs()
        ours = (model16(ids).float() - exact).abs()
    scale = exact.abs().max().item()
    assert ours.max().item() <= 2 * theirs.max().item() + 2 ** -8 * scale, (ours.max(), theirs.max())
    assert ours.mean().item() <= 1.5 * theirs.mean().item() + 1e-6, (ours.mean(), theirs.mean())


def _qkv(dtype, B=2, H=4, T=256, D=64, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(B, H, T, D, device=DEV, dtype=dtype, generator=g) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_flash_backend_matches_eager(dtype):
    """PyTorch's own FlashAttention-2 kernel (the SDPA flash backend), forced, against eager in
    fp32; forward and the gradients of q, k, v."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.requires_grad_() for t in _qkv(dtype))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = attention(q, k, v, "sdpa", 0.0)
    out.float().square().sum().backward()
    got = [out.detach().float()] + [t.grad.float() for t in (q, k, v)]
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = attention(q32, k32, v32, "eager", 0.0)
    ref.square().sum().backward()
    want = [ref.detach()] + [t.grad for t in (q32, k32, v32)]
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a - b).abs().max().item() / b.abs().max().item()
        assert err < 2e-2, (name, err)  # a few roundoffs of bf16/fp16 over a softmax of 256 keys


def test_flash_attention_2_matches_eager():
    pytest.importorskip("flash_attn", reason="the flash-attn package is not installed here")
    q, k, v = _qkv(torch.bfloat16)
    got = attention(q, k, v, "flash_attention_2", 0.0).float()
    ref = attention(q.float(), k.float(), v.float(), "eager", 0.0)
    assert (got - ref).abs().max().item() / ref.abs().max().item() < 2e-2


@pytest.mark.parametrize("which", ["tiny_hf_gpt2", "tiny_hf_llama"])
def test_model_sdpa_matches_eager_on_cuda(request, which):
    model_dir = request.getfixturevalue(which)
    _, sdpa = _pair(model_dir, "sdpa")
    _, eager = _pair(model_dir, "eager")
    ids = _ids(vocab=sdpa.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(ids), eager(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_loss_matches_reference_on_cuda(autocast):
    g = torch.Generator(device=DEV).manual_seed(0)
    V, padded, C, N = 50257, 50304, 256, 4096
    h = torch.randn(N, C, device=DEV, generator=g, requires_grad=True)
    w = (0.02 * torch.randn(padded, C, device=DEV, generator=g)).requires_grad_()
    y = torch.randint(0, V, (N,), device=DEV, generator=g)
    y[::7] = -100
    ctx = torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast)
    with ctx:
        loss = linear_cross_entropy(h, w, y, V)
    loss.backward()
    got = (loss.detach(), h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    with ctx:
        ref = F.cross_entropy((h @ w[:V].t()).float(), y, ignore_index=-100)
    ref.backward()
    tol = 2e-2 if autocast else 1e-5
    assert abs(got[0].item() - ref.item()) < tol * ref.item()
    for a, b in zip(got[1:], (h.grad, w.grad)):
        assert (a - b).abs().max().item() <= tol * b.abs().max().item()
