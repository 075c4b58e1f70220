"""The job store: jobs (one row per job, its state and resources), events (the lifecycle,
timestamped), checkpoints (what each job has written) and sources (named code repositories),
in $GPTRAIN_HOME/gptrain.db.

All SQL about jobs is here, and with it the job state machine's guard: a state is a JobState;
a job in a terminal state never leaves it (only `reopen`, the user's `gptrain resume`, queues it
again); and a supervisor writes with its owner token (the run_id it recorded), so a stale one
(its job ended, taken over, or recreated under the same name) is refused instead of overwriting
a newer record. Every write is one short IMMEDIATE transaction (gptrain/db.py), which waits out
another program's lock instead of failing.
"""

from __future__ import annotations

import json
import time
from enum import Enum

from gptrain.db import fetch_all, fetch_one, recover_once, transaction
from gptrain.errors import NotFound, UserError


class JobState(str, Enum):
    """Where a job is: queued -> starting -> running (-> restarting | preempted -> running) ->
    stopping -> one of the terminal states succeeded, failed, stopped. `preempted`: a signal
    nobody asked for with `gptrain stop` (an eviction, an admin, Slurm's preemption) ended an
    attempt after its checkpoint; the job continues by itself, spending no restart. `held`: a job
    run with --keep-on-failure failed, and its environment is kept (its accelerators too) for
    `gptrain session attach NAME` until `gptrain stop NAME` or its idle timeout: then failed."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    PREEMPTED = "preempted"
    STOPPING = "stopping"
    HELD = "held"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


ACTIVE = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING, JobState.PREEMPTED,
          JobState.STOPPING, JobState.HELD)
TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)
_ACTIVE_SQL = f"({', '.join(repr(s.value) for s in ACTIVE)})"


def add_event(conn, job: str, kind: str, message: str = "") -> None:
    conn.execute("INSERT INTO events (job, time, kind, message) VALUES (?, ?, ?, ?)",
                 (job, time.time(), kind, message))


def create_job(name: str, spec: dict, nodes: int, accels: int, scheduler: str) -> None:
    now = time.time()
    with transaction() as conn:
        if conn.execute("SELECT 1 FROM jobs WHERE name = ?", (name,)).fetchone():
            raise UserError(f"a job named {name!r} already exists; pick another name or "
                            f"`gptrain rm {name}`")
        seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
        conn.execute("INSERT INTO jobs (name, seq, state, scheduler, nodes, accels, spec, created, "
                     "updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (name, seq, JobState.QUEUED.value, scheduler, nodes, accels, json.dumps(spec), now, now))
        add_event(conn, name, "submitted", f"{nodes} node(s) x {accels} accelerator(s), {scheduler}")
        add_event(conn, name, JobState.QUEUED.value)


def set_state(name: str, state: JobState | str, message: str = "", owner: str | None = None,
              engine_job: str | None = None, **fields) -> bool:
    """Move a job to `state` (recording the event) and update other columns; False, with nothing
    written, when the job is gone, already ended, or owned by another run: given an `owner`, a
    supervisor's run id; given an `engine_job`, the engine's id (a Slurm job id) that the new state
    was read from, so an answer about an engine job since replaced (resumed) is never written."""
    state = JobState(state)  # any other string is a bug: ValueError
    now = time.time()
    with transaction() as conn:
        row = conn.execute("SELECT state, run_id, external_id FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None or row["state"] in TERMINAL:
            return False
        if owner is not None and row["run_id"] != owner:
            return False
        if engine_job is not None and row["external_id"] != engine_job:
            return False
        sets = ["state = ?", "updated = ?"] + [f"{k} = ?" for k in fields]
        values = [state.value, now, *fields.values()]
        if state is JobState.RUNNING:
            sets.append("started = COALESCE(started, ?)")
            values.append(now)
        if state in TERMINAL:
            sets.append("ended = ?")
            values.append(now)
        conn.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE name = ?", (*values, name))
        add_event(conn, name, state.value, message)
    if state in TERMINAL:
        _keep_ending(name, {"state": state.value, "message": message, "exit_code": fields.get("exit_code"),
                            "time": now})
    return True


def _keep_ending(name: str, ending: dict | None) -> None:
    """The job folder's record of how the job ended (folder.ended_file), or none (reopened);
    best effort: the database is the record, this is what a database made new reads back."""
    from gptrain.atomic import write_text_atomic
    from gptrain.jobs.folder import ended_file, job_dir

    path = ended_file(job_dir(name))
    try:
        if ending is None:
            path.unlink(missing_ok=True)
        elif path.parent.is_dir():
            write_text_atomic(path, json.dumps(ending))
    except OSError:
        pass


def update(name: str, **fields) -> None:
    with transaction() as conn:
        sets = ", ".join(f"{k} = ?" for k in fields)
        conn.execute(f"UPDATE jobs SET {sets}, updated = ? WHERE name = ?",
                     (*fields.values(), time.time(), name))


def get_job(name: str) -> dict:
    job = fetch_one("SELECT * FROM jobs WHERE name = ?", (name,))
    if job is None:
        recover_once("jobs", _recover_jobs)
        job = fetch_one("SELECT * FROM jobs WHERE name = ?", (name,))
    if job is None:
        raise NotFound(f"no job named {name!r}; see `gptrain jobs`")
    job["spec"] = json.loads(job["spec"])
    job["slots"] = json.loads(job["slots"]) if job["slots"] else []
    return job


def list_jobs() -> list[dict]:
    recover_once("jobs", _recover_jobs)
    return fetch_all("SELECT * FROM jobs ORDER BY seq")


RECOVERED = ("recorded again from its folder after gptrain.db was made new: its state before is not "
             "known (`gptrain resume {name}` continues from its newest checkpoint)")


def _recover_jobs(made: float) -> None:
    """Each job folder whose job.json predates this database (db.recover_once) recorded again:
    ended as its folder says it ended (folder.ended_file, written before `made`), else `failed`
    with RECOVERED as the reason (it may have been running); its spec from job.json, its
    checkpoints found by the next refresh. A folder made since (a submission under way) is not
    touched."""
    from gptrain.files import read_json
    from gptrain.home import NAME_RE
    from gptrain.jobs.folder import ended_file, jobs_root, spec_file

    try:
        folders = sorted(jobs_root().iterdir())
    except OSError:
        return
    for d in folders:
        jfile = spec_file(d)
        try:
            if not NAME_RE.fullmatch(d.name) or jfile.is_symlink() or jfile.stat().st_mtime >= made:
                continue
            spec = read_json(jfile, "job file")
            nodes, accels = int(spec.get("nodes") or 1), int(spec.get("accels") or 1)
            scheduler = str(spec.get("scheduler") or "local")
        except (OSError, UserError, TypeError, ValueError):
            continue  # not a job's folder gptrain can read: left as it is
        if spec.get("name") != d.name:
            continue
        state, why, code, ended = JobState.FAILED, RECOVERED.format(name=d.name), None, time.time()
        try:
            f = ended_file(d)
            ending = read_json(f, "job ending") if f.is_file() and not f.is_symlink() and f.stat().st_mtime < made else None
            if isinstance(ending, dict) and ending.get("state") in TERMINAL:
                state, ended = JobState(ending["state"]), float(ending.get("time") or ended)
                why = str(ending.get("message") or "") if state is not JobState.SUCCEEDED else None
                code = ending.get("exit_code") if isinstance(ending.get("exit_code"), int) else None
        except (OSError, UserError, TypeError, ValueError):
            pass  # (unreadable: not known how it ended)
        with transaction() as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE name = ?", (d.name,)).fetchone():
                continue
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            conn.execute("INSERT INTO jobs (name, seq, state, scheduler, nodes, accels, spec, created, updated, "
                         "ended, error, exit_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (d.name, seq, state.value, scheduler, nodes, accels, json.dumps(spec), jfile.stat().st_mtime,
                          time.time(), ended, why, code))
            add_event(conn, d.name, state.value, why if state is JobState.FAILED and why == RECOVERED.format(name=d.name)
                      else f"recorded again from its folder after gptrain.db was made new: it had ended {state.value}")


def events(name: str) -> list[dict]:
    return fetch_all("SELECT time, kind, message FROM events WHERE job = ? ORDER BY id", (name,))


def checkpoints(name: str) -> list[dict]:
    return fetch_all("SELECT * FROM checkpoints WHERE job = ? ORDER BY step, name", (name,))


def checkpoint_by_id(ckpt_id: str) -> dict:
    row = fetch_one("SELECT * FROM checkpoints WHERE id = ?", (ckpt_id,))
    if row is None:
        raise NotFound(f"no checkpoint with ID {ckpt_id!r}; see `gptrain checkpoints JOB`")
    return row


CHECKPOINT_FIELDS = ("id", "name", "kind", "path", "step", "train_loss", "eval_loss", "time", "mtime", "size",
                     "damaged")


def sync_checkpoints(job: str, found: list[dict], damage: list[dict] = ()) -> None:
    """Make the job's checkpoint rows match what is on disk (jobs/found.py): new ones added,
    rewritten ones (another step, size, time or loss) updated, pruned ones gone; each refusal in
    `damage` (found.damage_reports) an event once. Nothing is written when all already match
    (reads stay reads, even on a full disk)."""
    def rows_of(conn_or_none):
        sql = f"SELECT {', '.join(CHECKPOINT_FIELDS)} FROM checkpoints WHERE job = ?"
        got = conn_or_none.execute(sql, (job,)).fetchall() if conn_or_none else fetch_all(sql, (job,))
        return {r["name"]: tuple(r[k] for k in CHECKPOINT_FIELDS) for r in got}

    wanted = {c["name"]: tuple(c.get(k) for k in CHECKPOINT_FIELDS) for c in found}
    said = [_damage_line(d) for d in damage]
    if said:
        known_lines = {r["message"] for r in fetch_all(
            "SELECT message FROM events WHERE job = ? AND kind = 'warning'", (job,))}
        said = [m for m in said if m not in known_lines]
    if rows_of(None) == wanted and not said:
        return
    with transaction() as conn:
        for message in said:
            add_event(conn, job, "warning", message)
        known = rows_of(conn)
        for c in found:
            if c["name"] not in known:
                conn.execute(f"INSERT INTO checkpoints (job, {', '.join(CHECKPOINT_FIELDS)}) VALUES "
                             f"(:job, {', '.join(':' + k for k in CHECKPOINT_FIELDS)})",
                             {**{k: c.get(k) for k in CHECKPOINT_FIELDS}, "job": job})
                add_event(conn, job, "checkpoint", f"{c['name']} ({c['id']})")
            elif known[c["name"]] != wanted[c["name"]]:
                conn.execute(f"UPDATE checkpoints SET {', '.join(f'{k} = :{k}' for k in CHECKPOINT_FIELDS)} "
                             "WHERE job = :job AND name = :name",
                             {**{k: c.get(k) for k in CHECKPOINT_FIELDS}, "job": job})
                if known[c["name"]][4] != c.get("step"):
                    add_event(conn, job, "checkpoint", f"{c['name']} ({c['id']}) rewritten at step {c.get('step')}")
        for gone in known.keys() - wanted.keys():
            conn.execute("DELETE FROM checkpoints WHERE job = ? AND name = ?", (job, gone))


def _damage_line(report: dict) -> str:
    import datetime

    at = datetime.datetime.fromtimestamp(report["time"]).strftime("%Y-%m-%d %H:%M:%S")
    return (f"checkpoint {report['name']} failed verification when the run resumed at {at} "
            f"({report['why']}): the run did not load it (its log says where it resumed, if anywhere)")


# ---- local scheduler: supervisors, slots, orphans --------------------------------------------

def record_supervisor(name: str, ident: list, run_id: str | None = None) -> bool:
    """The supervisor (pid, start time, boot id) owning a queued job; False if the job is no
    longer queued or another live supervisor was recorded since (then this one must leave)."""
    with transaction() as conn:
        row = conn.execute("SELECT state, supervisor FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None or row["state"] != JobState.QUEUED:
            return False
        if row["supervisor"] and json.loads(row["supervisor"])[:2] != ident[:2] and run_id is not None:
            return False
        sets = {"supervisor": json.dumps(ident), "supervisor_pid": ident[0]}
        if run_id is not None:
            sets["run_id"] = run_id
        conn.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in sets)}, updated = ? WHERE name = ?",
                     (*sets.values(), time.time(), name))
        return True


def active_supervised(schedulers) -> list[dict]:
    """The jobs of these schedulers (those owned by a supervisor on this machine) not yet
    ended (few rows: the reconciler reads /proc for each)."""
    marks = ", ".join("?" * len(schedulers))
    return fetch_all("SELECT name, state, created, updated, started, restarts, spec, supervisor, "
                     f"supervisor_pid, run_id FROM jobs WHERE scheduler IN ({marks}) AND state IN {_ACTIVE_SQL} "
                     "ORDER BY seq", tuple(schedulers))


def claim_slots(name: str, kind: str, total: int, need: int, owner: str) -> list[int] | None:
    """Move a queued job to starting with `need` free slots, if it is first in line and they
    are free: the slots; [] to wait; None when the job is no longer queued (ended meanwhile) or
    no longer `owner`'s."""
    with transaction() as conn:
        rows = conn.execute("SELECT name, state, slots, run_id FROM jobs WHERE scheduler = 'local' AND "
                            f"state IN {_ACTIVE_SQL} ORDER BY seq").fetchall()
        if not any(r["name"] == name and r["state"] == JobState.QUEUED and r["run_id"] == owner for r in rows):
            return None
        used = {s for r in rows if r["state"] != JobState.QUEUED and r["slots"] for s in json.loads(r["slots"])}
        queued = [r["name"] for r in rows if r["state"] == JobState.QUEUED]
        free = [i for i in range(total) if i not in used]
        if queued[0] != name or len(free) < need:
            return []
        slots = free[:need]
        conn.execute("UPDATE jobs SET state = ?, slots = ?, updated = ? WHERE name = ?",
                     (JobState.STARTING.value, json.dumps(slots), time.time(), name))
        add_event(conn, name, JobState.STARTING.value, f"{kind} slots {slots}")
        return slots


def _owned_by(conn, name: str, supervisor: str | None) -> bool:
    """The job is still active and still recorded with this supervisor (compare-and-set)."""
    row = conn.execute("SELECT state, supervisor FROM jobs WHERE name = ?", (name,)).fetchone()
    return row is not None and row["state"] in ACTIVE and row["supervisor"] == supervisor


def free_lost_slots(name: str, run_id: str, kept: list[int] | None, kind: str, message: str) -> bool:
    """A lost node's record, by the supervisor of the job's run `run_id`: the slots it keeps
    (None: unchanged) and the event, in one write; False (nothing written) for another run."""
    with transaction() as conn:
        row = conn.execute("SELECT run_id FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None or row["run_id"] != run_id:
            return False
        if kept is not None:
            conn.execute("UPDATE jobs SET slots = ? WHERE name = ?", (json.dumps(kept), name))
        add_event(conn, name, kind, message)
        return True


def end_orphan(name: str, supervisor: str | None, state: JobState, message: str) -> bool:
    """End a job whose supervisor is gone (slots freed); False if someone else got there first."""
    state, now = JobState(state), time.time()
    assert state in TERMINAL, state
    with transaction() as conn:
        if not _owned_by(conn, name, supervisor):
            return False
        conn.execute("UPDATE jobs SET state = ?, error = ?, slots = NULL, ended = ?, updated = ? WHERE name = ?",
                     (state.value, message if state is JobState.FAILED else None, now, now, name))
        add_event(conn, name, state.value, message)
        return True


def requeue_orphan(name: str, supervisor: str | None, restarts: int, message: str) -> bool:
    """Hand a job whose supervisor died to a new one: queued again at its place in line, slots
    freed, one restart used; False if someone else got there first."""
    with transaction() as conn:
        if not _owned_by(conn, name, supervisor):
            return False
        conn.execute("UPDATE jobs SET state = ?, slots = NULL, supervisor = NULL, supervisor_pid = NULL, "
                     "restarts = ?, updated = ? WHERE name = ?", (JobState.QUEUED.value, restarts, time.time(), name))
        add_event(conn, name, JobState.RESTARTING.value, message)
        return True


def reopen(name: str, message: str) -> None:
    """A failed or stopped job queued again (`gptrain resume`), at the end of the line; or one
    that succeeded, extended (jobs/records.place_on is the judge of that)."""
    with transaction() as conn:
        row = conn.execute("SELECT state FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no job named {name!r}; see `gptrain jobs`")
        if row["state"] not in (JobState.FAILED, JobState.STOPPED, JobState.SUCCEEDED):
            raise UserError(f"job {name} is {row['state']}; only a failed or stopped job can be resumed")
        seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
        conn.execute("UPDATE jobs SET state = ?, seq = ?, slots = NULL, supervisor = NULL, "
                     "supervisor_pid = NULL, run_id = NULL, external_id = NULL, ended = NULL, error = NULL, exit_code = NULL, "
                     "restarts = 0, updated = ? WHERE name = ?", (JobState.QUEUED.value, seq, time.time(), name))
        add_event(conn, name, "resumed", message)
        add_event(conn, name, JobState.QUEUED.value)
    _keep_ending(name, None)


def delete_job(name: str) -> None:
    with transaction() as conn:
        for table, col in (("jobs", "name"), ("events", "job"), ("checkpoints", "job")):
            conn.execute(f"DELETE FROM {table} WHERE {col} = ?", (name,))


# ---- code sources: named git repositories (`gptrain source add`) ------------------------------

def add_source(name: str, url: str, ref: str | None) -> None:
    with transaction() as conn:
        if conn.execute("SELECT 1 FROM sources WHERE name = ?", (name,)).fetchone():
            raise UserError(f"a source named {name!r} already exists; `gptrain source rm {name}` first")
        conn.execute("INSERT INTO sources (name, url, ref, created) VALUES (?, ?, ?, ?)",
                     (name, url, ref, time.time()))


def get_source(name: str) -> dict:
    row = fetch_one("SELECT * FROM sources WHERE name = ?", (name,))
    if row is None:
        raise UserError(f"no source named {name!r}; see `gptrain source list`")
    return row


def list_sources() -> list[dict]:
    return fetch_all("SELECT * FROM sources ORDER BY name")


def remove_source(name: str) -> None:
    get_source(name)
    with transaction() as conn:
        conn.execute("DELETE FROM sources WHERE name = ?", (name,))
