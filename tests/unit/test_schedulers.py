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
