"""The scheduler seam (jobs/schedulers.py): every engine in the table offers every operation."""

import inspect

import pytest

from gptrain.jobs.schedulers import OPERATIONS, SCHEDULERS, Scheduler, scheduler


def test_the_protocol_names_every_operation_a_face_calls():
    assert set(OPERATIONS) == {"submit", "refresh", "stop", "resume", "describe"}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_each_engine_implements_every_operation_with_its_parameters(name):
    engine = scheduler(name)
    for op in OPERATIONS:
        impl = getattr(engine, op, None)
        assert callable(impl), f"{name} lacks {op}"  # was: slurm had no resume
        want = [p for p in inspect.signature(getattr(Scheduler, op)).parameters if p != "self"]
        assert list(inspect.signature(impl).parameters) == want, (name, op)


def test_each_engine_is_declared_once_and_its_declaration_is_what_a_job_gets():
    """jobs/engines/table.py is the one place an engine's facts live: its supervisor module runs
    (a `main`), and what a spec allows follows the descriptor (elastic, paths checked here)."""
    import importlib

    from gptrain.errors import UserError
    from gptrain.jobs.engines.table import ENGINES, SUPERVISED
    from gptrain.jobs.spec import JobSpec

    assert set(SUPERVISED) == {"local", "ray"}
    for name, e in ENGINES.items():
        if e.supervisor:
            assert callable(importlib.import_module(e.supervisor).main), name
        spec = JobSpec(name="j", nodes="1:2", scheduler=name, entry="trainer")
        if e.elastic:
            spec.parse_nodes()
        else:
            with pytest.raises(UserError, match=r"runs on the local and ray schedulers"):
                spec.parse_nodes()
    with pytest.raises(UserError, match="unknown scheduler 'slurn'.*slurm"):
        JobSpec(name="j", scheduler="slurn").validate()
