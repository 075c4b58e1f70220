"""The batches of one optimizer step, read before any collective of that step.

The loop reads step N+1's batches right after step N and only then asks every rank whether to
stop (`stop_agreed`): a rank whose read waits on a stalled server (data/remote_shards.py)
is never inside a collective the others wait in, and a stop request cuts its wait short
(stop.Interrupted) so that every rank agrees, at once, to save step N and exit. The position a
checkpoint records is the one before the batches read ahead (`position`): a resume reads them
again, and a read abandoned half-way (its thread may still move the loader on) counts for nothing.
"""

from __future__ import annotations

import threading

from gptrain import stop


class StepReader:
    def __init__(self, loader, per_step: int, remote: bool):
        self.loader, self.per_step, self.remote = loader, per_step, remote
        self.before: dict | None = None  # the loader's position before the batches held
        self.held = False  # batches read ahead and not yet trained on
        self.abandoned = False  # a read cut short by a stop: its thread may still move the loader

    def read(self) -> list | None:
        """The next step's batches, or None when a stop request came while a remote read was
        waited on. Local data is read here; remote data in a thread this one watches."""
        self.before, self.held = self.loader.state_dict(), True
        if not self.remote:
            return [self.loader.next_batch() for _ in range(self.per_step)]
        box: dict = {}

        def run():
            try:
                box["batches"] = [self.loader.next_batch() for _ in range(self.per_step)]
            except BaseException as e:  # raised again below, in the training thread
                box["error"] = e

        worker = threading.Thread(target=run, daemon=True, name="read the next step's batches")
        worker.start()
        try:
            stop.join(worker, "reading the next step's batches")
        except stop.Interrupted:
            self.abandoned = True
            return None
        if isinstance(box.get("error"), stop.Interrupted):  # the read itself saw the stop first
            self.abandoned = True
            return None
        if "error" in box:
            raise box["error"]
        return box["batches"]

    def consume(self) -> None:
        """The held batches are being trained on: the loader's position is the step's."""
        self.held = False

    def unread(self) -> None:
        """Put back the batches read ahead (a stop came before they were trained on)."""
        if self.held and not self.abandoned:
            self.loader.load_state_dict(self.before)
        self.held = False

    def position(self) -> dict:
        """The loader state a checkpoint of the steps trained so far records."""
        return self.before if (self.held or self.abandoned) and self.before is not None else self.loader.state_dict()

    @staticmethod
    def stop_agreed(device, cut_short: bool = False) -> bool:
        """Whether every rank stops now: any rank's stop request, or a read it cut short."""
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():  # no device round trip (a host sync) for one process
            return stop.requested() or cut_short
        flag = torch.tensor(float(stop.requested() or cut_short), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag)
