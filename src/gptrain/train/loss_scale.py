"""Dynamic loss scaling for fp16, with one decision for all ranks.

fp16 gradients underflow unless the loss is multiplied by a large factor before backward; when
the scaled gradients overflow instead, the step is skipped and the factor halved, and after
`interval` good steps in a row it doubles (the scheme of torch.amp.GradScaler and Megatron).
GradScaler decides from the gradients each rank holds; with sharded (FSDP2, tensor parallel) or
pipelined gradients one rank can hold an inf that the others do not, and the ranks would part
ways. Here the decision is taken from the global gradient norm (train/optim.clip_grads), which
is the same number on every rank.
"""

from __future__ import annotations

import torch


class LossScaler:
    def __init__(self, scale: float = 2.0**16, growth: float = 2.0, backoff: float = 0.5,
                 interval: int = 2000):
        self.scale, self.growth, self.backoff, self.interval = scale, growth, backoff, interval
        self.good_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale_(self, parts) -> None:
        """Divide every gradient by the scale, in place."""
        grads = [p.grad for part in parts for p in part.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def update(self, finite: bool) -> None:
        """After a step: back off on overflow (the step was skipped), grow after a good run."""
        if not finite:
            self.scale *= self.backoff
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.interval:
            self.scale *= self.growth
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        # (checkpoints of earlier versions hold torch.amp.GradScaler state: _growth_tracker)
        self.scale = float(state["scale"])
        self.good_steps = int(state.get("good_steps", state.get("_growth_tracker", 0)))
