"""Skipping a step whose loss or gradient norm is NaN/inf, without making the host wait for
every step.

Asking "was this step finite?" on the host (`bool(tensor)`) waits for the whole step to finish
on the device, so the next step cannot be queued behind it: on a GPU that idle gap costs
throughput (nanoGPT reads its loss back only when it logs). The fused AdamW kernel instead takes
the answer as a device tensor (`found_inf`, as torch.amp.GradScaler passes it) and leaves the
parameters, moments and step count untouched when it is set. What was skipped is counted on the
device too and read back where the trainer reads values anyway, in the same one read as the
loss and gradient norm (`counters`, the trainer's read_back): when it logs, and before a
checkpoint, so a checkpoint never follows an unreported NaN.

Sharded parameters (FSDP2, tensor parallel) take the foreach AdamW, which has no `found_inf`,
and fp16 needs the answer to adjust its loss scale: both keep deciding on the host.
"""

from __future__ import annotations

import torch


def on_device(optims, scaler) -> bool:
    """Whether every optimizer can skip a step itself (fused AdamW, no fp16 loss scale)."""
    return scaler is None and all(opt.defaults.get("fused") for opt in optims)


class DeviceSkips:
    """Steps skipped on the device since the last read: how many, and the first."""

    def __init__(self, device):
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self.first = torch.full((), -1, dtype=torch.int64, device=device)
        self.last = torch.zeros((), dtype=torch.int64, device=device)  # 1: the latest step was skipped

    def step(self, optims, finite: torch.Tensor, step_number: int) -> None:
        """One optimizer step that each optimizer skips when `finite` (a device bool) is false."""
        bad = ~finite
        found_inf = bad.float()
        for opt in optims:
            opt.found_inf = found_inf
            opt.step()
            opt.zero_grad(set_to_none=True)
            del opt.found_inf
        self.count += bad
        self.first = torch.where(bad & (self.first < 0), step_number, self.first)
        self.last = bad.long()

    def counters(self) -> list:
        """The device's (count, first, last), for the caller to read with its own values in one
        device-to-host read, then give to `settle`."""
        return [self.count, self.first, self.last]

    def settle(self, count, first, last) -> tuple[int, int, bool]:
        """(steps skipped, the first of them, whether the latest step was) from the counters as
        read; the count starts again from there."""
        count, first, last = int(count), int(first), bool(last)
        if count:
            self.count.zero_()
            self.first.fill_(-1)
        return count, first, last

    def take(self) -> tuple[int, int, bool]:
        """`settle` of the counters read alone (a read that waits for the device)."""
        return self.settle(*torch.stack(self.counters()).tolist())
