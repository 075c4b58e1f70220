"""What a polled engine saw, written once for Slurm and Kubernetes (jobs/records.record_seen):
typed states, a failure's error from the failing rank's log unless the engine gave one, and
nothing written over a record that moved on (the real job store; Kubernetes' JobSet read by
the pure mapping kube._state)."""

from gptrain.jobs import folder, records, store
from gptrain.jobs.engines import kube
from gptrain.jobs.logs import rank_log
from gptrain.jobs.store import JobState


def _job(name="polled", external_id="1001"):
    store.create_job(name, {"name": name}, 1, 1, "slurm")
    store.update(name, external_id=external_id)
    logs = folder.logs_dir(folder.job_dir(name))
    logs.mkdir(parents=True)
    rank_log(logs, 0).write_text("step 3\nTraceback (most recent call last):\nValueError: bad shard 7\n")
    return store.get_job(name)


def test_a_failure_gets_the_failing_ranks_error_in_its_record_and_its_event():
    job = _job()
    after = records.record_seen("polled", job, "failed", "Slurm FAILED", {"exit_code": 1})
    assert after["state"] == JobState.FAILED and "bad shard 7" in after["error"]
    assert any("Slurm FAILED: " in e["message"] and "bad shard 7" in e["message"] for e in store.events("polled"))


def test_the_engines_own_error_is_kept():
    job = _job()
    after = records.record_seen("polled", job, JobState.FAILED, "Slurm TIMEOUT",
                                {"exit_code": 0, "error": "its time limit ended 3 attempts"})
    assert after["error"] == "its time limit ended 3 attempts"


def test_nothing_is_written_over_a_record_that_moved_on():
    job = _job()
    store.update("polled", external_id="2002")  # resumed meanwhile as another Slurm job
    after = records.record_seen("polled", job, JobState.SUCCEEDED, "Slurm COMPLETED", {"exit_code": 0})
    assert after["state"] == JobState.QUEUED and after["external_id"] == "2002"


def test_a_jobsets_status_reads_as_typed_states():
    job = {"restarts": 0}
    done = {"metadata": {"labels": {}}, "status": {"conditions": [
        {"type": "Completed", "status": "True"}]}}
    assert kube._state(job, done, [], False) == (JobState.SUCCEEDED, "JobSet Completed")
    assert kube._state(job, None, [], True)[0] is JobState.STOPPED
    assert kube._state(job, None, [], False)[0] is JobState.FAILED
    restarted = {"metadata": {"labels": {}}, "status": {"restarts": 1, "conditions": []}}
    assert kube._state(job, restarted, [], False)[0] is JobState.RESTARTING
