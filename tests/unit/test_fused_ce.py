"""The fused linear + cross-entropy against the reference logits -> cross_entropy path."""

import pytest
import torch

from gptrain.models.fused_ce import linear_cross_entropy
from gptrain.models.base import cross_entropy
from gptrain.models.shapes import GPTConfig
from gptrain.models.gpt2 import GPT


@pytest.mark.parametrize("vocab, padded, chunk", [(101, 128, 1 << 24), (101, 101, 300), (1000, 1024, 2000)])
def test_loss_and_gradients_match_reference(vocab, padded, chunk, monkeypatch):
    import gptrain.models.fused_ce as fused

    monkeypatch.setattr(fused, "CHUNK_ELEMENTS", chunk)  # several chunks, uneven last one
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(padded, 16, generator=g, requires_grad=True)
    t = torch.randint(0, vocab, (37,), generator=g)
    t[5] = -100  # ignored position
    loss = linear_cross_entropy(h, w, t, vocab)
    (loss * 3.0).backward()
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = cross_entropy((h2 @ w2.t())[:, :vocab], t)
    (ref * 3.0).backward()
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(h.grad, h2.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w.grad, w2.grad, atol=1e-6, rtol=1e-5)
    assert (w.grad[vocab:] == 0).all()


def test_model_fused_path_matches_reference_path():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=300, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(0, 300, (3, 33))
    grads = []
    for fused in (True, False):
        model.zero_grad()
        model.fused_loss = fused
        logits, loss = model(x[:, :-1], x[:, 1:])
        assert (logits is None) == fused
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-6, rtol=1e-6)
    for name in grads[0][1]:
        torch.testing.assert_close(grads[0][1][name], grads[1][1][name], atol=1e-6, rtol=1e-5, msg=name)


def test_target_probability_below_fp32_range_gives_finite_exact_loss():
    """A target whose softmax probability underflows to 0 in fp32 (logit gap > 104)."""
    h = torch.tensor([[30.0, 0.0], [0.0, 1.0]], requires_grad=True)
    w = torch.tensor([[5.0, 0.0], [-5.0, 0.0], [0.0, 1.0]], requires_grad=True)
    t = torch.tensor([1, 2])  # row 0: logits 150 vs -150 for its target
    loss = linear_cross_entropy(h, w, t, 3)
    loss.backward()
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = cross_entropy(h2 @ w2.t(), t)
    ref.backward()
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(h.grad, h2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
