"""Linear + cross-entropy in one pass over row chunks, without materializing the logits.

The reference is `lm_head` -> logits (N, V) -> log_softmax -> nll, whose forward and backward
each stream the whole N x V tensor through memory several times (with GPT-2's 50k vocabulary
that is 400 MB for 2048 tokens). Here each chunk of rows computes its logits, the loss and the
gradient softmax - onehot in place, and at once the two gradient matmuls; backward only scales
the stored gradients. Only the first `vocab_size` rows of a padded weight are used, so padded
logits never exist. Tested against the reference in tests/unit/test_fused_ce.py.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 25  # logits per chunk (128 MB in fp32)


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, vocab_size: int):
        W = weight[:vocab_size]
        n, _ = h.shape
        valid = targets != -100
        n_valid = valid.sum().clamp_min(1)
        safe_targets = targets.clamp_min(0)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if want_h else None
        # the weight gradient, padded rows included (they stay zero: padded logits never exist)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if want_w else None
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        rows = max(1, CHUNK_ELEMENTS // vocab_size)
        for start in range(0, n, rows):
            hc, tc, vc = h[start:start + rows], safe_targets[start:start + rows], valid[start:start + rows]
            logits = (hc @ W.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            target_logit = logits.gather(1, tc[:, None]).squeeze(1)
            loss_sum += ((lse - target_logit) * vc).sum()
            if want_h or want_w:
                grad = logits.sub_(lse[:, None]).exp_()  # softmax, in place
                grad[torch.arange(len(tc), device=h.device), tc] -= 1.0
                grad.mul_((vc / n_valid).unsqueeze(1))
                grad = grad.to(h.dtype)
                if want_h:
                    grad_h[start:start + rows] = grad @ W.to(h.dtype)
                if want_w:
                    grad_w[:vocab_size] += (grad.t() @ hc).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss_sum / n_valid

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        dh = dw = None
        if grad_h is not None:
            dh = grad_h * grad_out.to(grad_h.dtype)
        if grad_w is not None:
            dw = (grad_w * grad_out).to(ctx.weight_dtype)
        return dh, dw, None, None


def linear_cross_entropy(h, weight, targets, vocab_size: int):
    """Mean cross-entropy of (h @ weight[:vocab_size].T) against targets (-100 = ignore)."""
    return LinearCrossEntropy.apply(h.reshape(-1, h.shape[-1]), weight, targets.reshape(-1), vocab_size)
