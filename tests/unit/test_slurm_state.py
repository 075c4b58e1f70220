"""What `gptrain inspect` makes of Slurm's job state (jobs/slurm.seen_state)."""

from gptrain.jobs.engines.slurm import seen_state


def info(state, reason="None", restarts=0):
    return {"state": state, "reason": reason, "exit_code": 0, "restarts": restarts}


def test_pending_after_running_with_a_restart_counted_is_a_requeue():
    # h2 killed (tests/hosts/test_slurm_hosts.py): the next look found PENDING, Restarts=1
    assert seen_state(info("PENDING", "BeginTime", 1), "running") == (
        "restarting", "requeued the job (restart 1), now PENDING (BeginTime)")
    assert seen_state(info("PENDING", "BeginTime", 2), "starting")[0] == "restarting"


def test_other_states_are_slurms_own():
    assert seen_state(info("PENDING", "Resources"), "queued") == ("queued", "PENDING (Resources)")
    assert seen_state(info("PENDING", "BeginTime", 1), "restarting") == ("queued", "PENDING (BeginTime)")
    assert seen_state(info("PENDING", "BeginTime", 1), "queued")[0] == "queued"  # already said
    assert seen_state(info("REQUEUED", restarts=1), "running") == ("restarting", "REQUEUED")
    assert seen_state(info("RUNNING"), "queued") == ("running", "RUNNING")
    assert seen_state(info("NODE_FAIL"), "running") == ("failed", "NODE_FAIL")
    assert seen_state({"state": "COMPLETED", "reason": "None", "exit_code": 0}, "running")[0] == "succeeded"
