"""The job store's guard on the real SQLite file: typed states, terminal states final, only the
owner's writes taken (jobs/store.py)."""

import pytest

from gptrain.jobs import store
from gptrain.jobs.store import JobState


def new_job(name="j"):
    store.create_job(name, {"name": name}, 1, 1, "local")
    return name


def test_states_are_typed_and_terminal_ones_are_known():
    assert [s for s in JobState if s in store.TERMINAL] == [JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED]
    assert f"{JobState.RUNNING}" == "running" and JobState("queued") is JobState.QUEUED
    with pytest.raises(ValueError):
        store.set_state(new_job(), "finished")  # not a state: a bug, not a row
    assert store.get_job("j")["state"] == "queued"


def test_a_terminal_state_is_never_left():
    name = new_job()
    assert store.set_state(name, JobState.RUNNING)
    assert store.set_state(name, JobState.FAILED, "boom", error="boom")
    for later in (JobState.SUCCEEDED, JobState.RUNNING, JobState.FAILED):
        assert store.set_state(name, later) is False
    job = store.get_job(name)
    assert job["state"] == "failed" and job["error"] == "boom"
    assert [e["kind"] for e in store.events(name)].count("failed") == 1


def test_only_the_owner_writes():
    name = new_job()
    assert store.record_supervisor(name, [1, 2, "boot"], run_id="owner-a")
    assert store.set_state(name, JobState.RUNNING, owner="owner-b") is False
    assert store.claim_slots(name, "cpu", 2, 1, owner="owner-b") is None
    assert store.claim_slots(name, "cpu", 2, 1, owner="owner-a") == [0]
    assert store.set_state(name, JobState.RUNNING, owner="owner-a")
    assert store.get_job(name)["state"] == "running"


def test_a_write_to_a_job_that_is_gone_writes_nothing():
    assert store.set_state("nobody", JobState.SUCCEEDED) is False
    assert store.events("nobody") == []


def test_resume_leaves_the_old_engine_id_behind():
    """A resumed Slurm job is `queued` with no engine id until sbatch names the new one: a refresh
    in between must not read the old, cancelled Slurm job and end the new run's record."""
    name = new_job()
    store.update(name, external_id="41")
    assert store.set_state(name, JobState.STOPPED)
    store.reopen(name, "continues")
    job = store.get_job(name)
    assert (job["state"], job["external_id"]) == ("queued", None)


def test_an_engine_answer_about_a_replaced_engine_job_is_not_written():
    """A Slurm refresh reads job 41, asks Slurm (slow) and hears FAILED; meanwhile the user resumed
    and sbatch named job 42. The late answer about 41 must not end the new run's record."""
    name = new_job()
    store.update(name, external_id="41")
    assert store.set_state(name, JobState.RUNNING, engine_job="41")
    assert store.set_state(name, JobState.STOPPED, engine_job="41")
    store.reopen(name, "continues")
    store.update(name, external_id="42")
    assert store.set_state(name, JobState.FAILED, "Slurm FAILED", engine_job="41") is False
    assert store.get_job(name)["state"] == "queued"
    assert store.set_state(name, JobState.RUNNING, engine_job="42")


def test_a_stop_that_comes_as_the_trainer_completes_is_no_stop():
    """The built-in trainer exits 0 only after its last step: a `gptrain stop` that raced its end
    was recorded `stopped` although the run had completed (the state lied)."""
    from gptrain.jobs.engines.supervisor import stopped_by_request

    assert not stopped_by_request(0, True, "trainer")  # it completed: succeeded
    assert stopped_by_request(143, True, "trainer")  # saved and stopped before its last step
    assert stopped_by_request(0, True, "script")  # a user's program may exit 0 when it is stopped
    assert not stopped_by_request(143, False, "trainer")  # a signal nobody asked for: not `stopped`
