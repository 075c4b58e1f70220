"""Linear + cross-entropy in one pass over row chunks, without materializing the logits.

The reference is `lm_head` -> logits (N, V) -> log_softmax -> nll, whose forward and backward
each stream the whole N x V tensor through memory several times (with GPT-2's 50k vocabulary
that is 400 MB for 2048 tokens). Here each chunk of rows computes its logits, turns them into
the softmax in place (one row-wise kernel whose rows stay in cache), takes the loss from the
row maximum, subtracts the one-hot, and at once does the two gradient matmuls, with the
1/n_valid scale applied to the small operands instead of the large one. Backward only scales
the stored gradients. The matmuls use the whole padded weight (a vocabulary padded to a
multiple of 64 makes the logits matmul ~30% faster on CPU); the padded logits are set to -inf,
so their probabilities, and the padded rows' gradients, are exactly zero.
Tested against the reference in tests/unit/test_fused_ce.py.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 26  # logits per chunk (256 MB in fp32): bigger chunks, faster matmuls


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, vocab_size: int):
        # Under autocast every matmul runs in its dtype, the weight gradient's too: a float32
        # operand would make that product plain fp32 (on a GPU several times slower).
        device = h.device.type
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
        W = weight if weight.dtype == mm_dtype else weight.to(mm_dtype)
        n = h.shape[0]
        valid = targets != -100
        n_valid = valid.sum().clamp_min(1)
        scale = (valid / n_valid).to(h.dtype).unsqueeze(1)  # ignored rows contribute nothing
        safe_targets = targets.clamp_min(0)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if want_h else None
        # the weight gradient, padded rows included (they stay zero: padded probabilities are 0)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if want_w else None
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        chunks = -(-n * W.shape[0] // CHUNK_ELEMENTS)
        rows = -(-n // chunks)  # even chunks: a short last one makes a slow matmul
        for start in range(0, n, rows):
            end = min(start + rows, n)
            hc, tc = h[start:end], safe_targets[start:end, None]
            hm = hc.to(mm_dtype)
            logits = hm @ W.t()
            if logits.dtype != torch.float32:
                logits = logits.float()
            logits[:, vocab_size:] = float("-inf")
            row_max = logits.amax(dim=1)
            target_logit = logits.gather(1, tc).squeeze(1)
            probs = torch.softmax(logits, dim=1, out=logits)
            # log-sum-exp from the probability of the row maximum, which is >= 1/V: never 0
            lse = row_max - probs.amax(dim=1).log()
            loss_sum += ((lse - target_logit) * valid[start:end]).sum()
            if want_h or want_w:
                probs.scatter_add_(1, tc, torch.full_like(target_logit, -1.0)[:, None])
                grad = probs.to(mm_dtype)
                if want_h:
                    grad_h[start:end] = (grad @ W) * scale[start:end]
                if want_w:
                    if grad.dtype == torch.float32:
                        grad_w.addmm_(grad.t(), hc * scale[start:end])
                    else:
                        grad_w += (grad.t() @ (hm * scale[start:end].to(mm_dtype))).float()
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
    """Mean cross-entropy of (h @ weight[:vocab_size].T) against targets (-100 = ignore); rows
    of weight past vocab_size are padding."""
    return LinearCrossEntropy.apply(h.reshape(-1, h.shape[-1]), weight, targets.reshape(-1), vocab_size)
