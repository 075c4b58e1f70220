"""Make the job store tell the truth about local (and Ray) jobs whose supervisor is gone.

Run by every CLI call that reads or changes jobs, and by supervisors waiting for slots. It reads
/proc only for the few active rows. A job whose supervisor died (kill -9, the OOM killer, a
reboot), or never started (`gptrain run` killed after recording it), has its leftover processes
killed and then is either handed to a new supervisor (it had started, restarts are left, no stop
was asked for: it continues from its latest checkpoint) or ended failed/stopped with the reason.
All writes are compare-and-set calls into jobs/store.py, so concurrent reconcilers agree.
"""

from __future__ import annotations

import json
import sqlite3
import time

from gptrain.db import out_of_space
from gptrain.jobs import folder, procs, resume, store
from gptrain.jobs.engines.table import SUPERVISED
from gptrain.jobs.spec import JobSpec
from gptrain.jobs.store import JobState

GRACE_S = 10.0  # a row may wait this long for its supervisor to be recorded (submit -> Popen)


def reconcile(skip: str | None = None) -> dict[str, dict]:
    """Check every active local job but `skip` (the caller's own). Never raises on a full disk:
    returns the verdicts it could not record, {name: {"state", "error"}}, for display."""
    try:
        rows = store.active_supervised(SUPERVISED)
    except sqlite3.OperationalError as e:
        if out_of_space(e):
            return {}
        raise
    unrecorded = {}
    for row in rows:
        if row["name"] == skip:
            continue
        try:
            _check(row)
        except sqlite3.OperationalError as e:
            if not out_of_space(e):
                raise
            state = JobState.STOPPED if folder.stop_request(folder.job_dir(row["name"])).exists() else JobState.FAILED
            unrecorded[row["name"]] = {"state": state, "error": f"{_how_it_died(_ident(row))} "
                                       "(not recorded yet: no space left on device)"}
    return unrecorded


def supervisor_alive(row: dict) -> bool | None:
    """True/False, or None while a fresh row is still waiting for its supervisor."""
    if row["supervisor"]:
        return procs.alive(json.loads(row["supervisor"]))
    if time.time() - max(row["created"], row["updated"]) < GRACE_S:
        return None
    return False


def _check(row: dict) -> None:
    if supervisor_alive(row) is not False:
        return
    name, ident = row["name"], _ident(row)
    procs.kill_run(row["run_id"])  # workers left behind (they die with it, unless just forked)
    how = _how_it_died(ident)
    spec = json.loads(row["spec"])
    restarts, max_restarts = row["restarts"], spec.get("max_restarts", 0)
    what = resume.restart_line(JobSpec.from_dict(spec), folder.job_dir(name))  # what it is given
    full = folder.full_disk_of(name)  # a new supervisor would die the same way
    if row["state"] == JobState.HELD:  # it had failed; its kept environment went with its supervisor
        store.end_orphan(name, row["supervisor"], JobState.FAILED, f"{row.get('error') or 'failed'} (its kept "
                         f"environment ended: {how})")
    elif folder.stop_request(folder.job_dir(name)).exists():
        store.end_orphan(name, row["supervisor"], JobState.STOPPED, f"stopped ({how})")
    elif full:
        store.end_orphan(name, row["supervisor"], JobState.FAILED, f"{how}; {full}: free some space, "
                         f"then `gptrain resume {name}` restarts it ({what})")
    elif row["started"] and row["state"] == JobState.PREEMPTED:  # (what stopped it also ended its supervisor)
        msg = f"{how} after the job was preempted; continued by a new supervisor (no restart spent): {what}"
        if store.requeue_orphan(name, row["supervisor"], restarts, msg):
            procs.start_supervisor(name)
    elif row["started"] and row["state"] != JobState.STOPPING and restarts < max_restarts:
        msg = f"{how}; restart {restarts + 1} of {max_restarts} by a new supervisor: {what}"
        if store.requeue_orphan(name, row["supervisor"], restarts + 1, msg):
            procs.start_supervisor(name)
    else:
        store.end_orphan(name, row["supervisor"], JobState.FAILED,
                         f"{how} while {row['state']}; `gptrain resume {name}` restarts it ({what})")


def _ident(row: dict) -> list | None:
    return json.loads(row["supervisor"]) if row["supervisor"] else None


def _how_it_died(ident) -> str:
    if ident is None:
        return "its supervisor never started (was `gptrain run` interrupted?)"
    if ident[2] != procs.boot_id():
        return f"its supervisor died (pid {ident[0]}) when the machine restarted"
    return f"its supervisor died (pid {ident[0]}, killed or out of memory)"
