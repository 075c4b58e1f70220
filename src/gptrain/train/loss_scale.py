"""Dynamic loss scaling for fp16, with one decision for all ranks.

fp16 gradients underflow unless the loss is multiplied by a large factor before backward; when
the scaled gradients overflow instead, the step is skipped and the factor halved, and after
`interval` good steps in a row it doubles (the scheme of torch.amp.GradScaler and Megatron).
GradScaler decides from the gradients each rank holds; with sharded (FSDP2, tensor parallel) or
pipelined gradients one rank can hold an inf that the others do not, and the ranks would part
ways. Here the decision is taken from the global gradient norm (train/optim.clip_grads), which
is the same number on every rank.

The knobs are DeepSpeed's fp16 section (config keys train.loss_scale*): a fixed scale instead of
dynamic scaling, the initial scale, the growth window, a floor, and hysteresis (how many
overflows are tolerated, each step still skipped, before the scale is halved; reset when the
scale grows).
"""

from __future__ import annotations

import torch


class LossScaler:
    def __init__(self, scale: float = 2.0**16, growth: float = 2.0, backoff: float = 0.5,
                 interval: int = 2000, hysteresis: int = 1, min_scale: float = 1.0,
                 dynamic: bool = True):
        self.scale, self.growth, self.backoff, self.interval = scale, growth, backoff, interval
        self.hysteresis, self.min_scale, self.dynamic = hysteresis, min_scale, dynamic
        self.good_steps = 0
        self.overflows_left = hysteresis

    @classmethod
    def from_config(cls, tc) -> "LossScaler":
        """From train.loss_scale (0: dynamic, else a fixed scale) and the train.loss_scale_* keys
        (their bounds are checked with the rest of the config: config.check)."""
        if tc.loss_scale > 0:
            return cls(scale=float(tc.loss_scale), dynamic=False)
        return cls(scale=max(float(tc.loss_scale_initial), tc.loss_scale_min),
                   interval=tc.loss_scale_window, hysteresis=tc.loss_scale_hysteresis,
                   min_scale=float(tc.loss_scale_min))

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale_(self, parts) -> None:
        """Divide every gradient by the scale, in place."""
        grads = [p.grad for part in parts for p in part.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def update(self, finite: bool) -> None:
        """After a step: back off on overflow (the step was skipped), grow after a good run."""
        if not self.dynamic:
            return
        if not finite:
            if self.overflows_left > 1:
                self.overflows_left -= 1
            else:
                self.scale = max(self.scale * self.backoff, self.min_scale)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.interval:
            self.scale *= self.growth
            self.good_steps = 0
            self.overflows_left = self.hysteresis

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "overflows_left": self.overflows_left}

    def load_state_dict(self, state: dict) -> None:
        # (checkpoints of earlier versions hold torch.amp.GradScaler state: _growth_tracker)
        self.scale = float(state["scale"])
        self.good_steps = int(state.get("good_steps", state.get("_growth_tracker", 0)))
        self.overflows_left = int(state.get("overflows_left", self.hysteresis))
