"""The scheduler seam: what an engine that runs jobs must offer, and the one table of engines.

Each engine is a module implementing `Scheduler` (local: a detached supervisor and torchrun on
this machine; slurm: sbatch/srun). Every face reaches an engine through `scheduler(name)`, the
job's own when it exists, never by importing the module. An engine that owns its processes
elsewhere fits the same shape: `refresh` polls it and records what it says through
jobs/store.py (ray: a supervisor here polls the job's actors on the cluster, jobs/engines/ray_supervisor.py); `create`/`forget` in jobs/records.py make and undo a job's record and
folder for every engine alike.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from gptrain.jobs.engines.table import ENGINES, engine


class Scheduler(Protocol):
    def submit(self, spec, dry_run: bool = False) -> str | None:
        """Record and start the job (or, with dry_run, only show what would run)."""

    def refresh(self, name: str) -> dict:
        """The job, its stored state first brought up to date with the engine's."""

    def stop(self, name: str, timeout: float) -> str:
        """Ask the job to stop (checkpoint, then exit; forced after timeout); the state now."""

    def resume(self, name: str) -> None:
        """Start a failed or stopped job again, to continue from its newest checkpoint."""

    def describe(self, job: dict) -> str | None:
        """The engine's own line about an active job for `inspect`, or None."""


SCHEDULERS = tuple(ENGINES)  # the names `--scheduler` and a job's spec may give (jobs/engines/table.py)
OPERATIONS = tuple(n for n in vars(Scheduler) if not n.startswith("_"))


def scheduler(name: str) -> Scheduler:
    """The engine named `name` (a job's own, or `--scheduler`); an unknown one is one line."""
    return importlib.import_module(engine(name).module)


def refresh_job(name: str) -> dict:
    """The job, with its state first brought up to date by its scheduler (Slurm's view; for a
    local job, reconciling: a dead supervisor's job is ended or handed to a new supervisor)."""
    from gptrain.jobs import store

    return scheduler(store.get_job(name)["scheduler"]).refresh(name)


def resume_job(name: str) -> None:
    """A failed or stopped job started again by the scheduler it ran on, from its newest checkpoint."""
    from gptrain.jobs import store

    scheduler(store.get_job(name)["scheduler"]).resume(name)
