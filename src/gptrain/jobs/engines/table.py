"""What each engine is and allows, declared once: the job core asks this table (jobs/spec.py
for what a job may ask of its engine, jobs/schedulers.py for the module that implements the
Scheduler protocol, jobs/procs.py and jobs/reconcile.py for the supervisor that owns a job on
this machine). Data only: nothing here imports an engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str  # what `--scheduler` and a job's spec say
    module: str  # implements jobs/schedulers.Scheduler
    supervisor: str | None  # the module run (detached, on this machine) to own each job; None: the engine's own daemon does
    elastic: bool  # --nodes MIN:MAX: a lost node and the job goes on
    workers_here: bool  # its workers run on this machine: every path they open is checked at submit


ENGINES = {e.name: e for e in (
    Engine("local", "gptrain.jobs.engines.local", "gptrain.jobs.engines.supervisor", elastic=True, workers_here=True),
    Engine("slurm", "gptrain.jobs.engines.slurm", None, elastic=False, workers_here=False),
    Engine("kubernetes", "gptrain.jobs.engines.kube", None, elastic=False, workers_here=False),
    Engine("ray", "gptrain.jobs.engines.ray_cluster", "gptrain.jobs.engines.ray_supervisor", elastic=True,
           workers_here=False),
)}
SUPERVISED = tuple(name for name, e in ENGINES.items() if e.supervisor)  # a supervisor here owns their jobs


def engine(name: str) -> Engine:
    """The engine named `name`; an unknown one is one line."""
    if name not in ENGINES:
        from gptrain.errors import UserError, closest

        raise UserError(f"unknown scheduler {name!r}{closest(name, ENGINES)}: use one of {', '.join(ENGINES)}")
    return ENGINES[name]
