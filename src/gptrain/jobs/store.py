"""The job store: jobs (one row per job, its state and resources), events (the lifecycle,
timestamped) and checkpoints (what each job has written), in $GPTRAIN_HOME/gptrain.db.

Every write is one short IMMEDIATE transaction (gptrain/db.py), so concurrent CLI calls wait
on the busy timeout instead of failing.
"""

from __future__ import annotations

import json
import time

from gptrain.db import fetch_all, fetch_one, transaction
from gptrain.errors import UserError

ACTIVE = ("queued", "starting", "running", "restarting", "stopping")
TERMINAL = ("succeeded", "failed", "stopped")


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
                     "updated) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?)",
                     (name, seq, scheduler, nodes, accels, json.dumps(spec), now, now))
        add_event(conn, name, "submitted", f"{nodes} node(s) x {accels} accelerator(s), {scheduler}")
        add_event(conn, name, "queued")


def set_state(name: str, state: str, message: str = "", **fields) -> None:
    """Move a job to `state` (recording the event) and update other columns."""
    now = time.time()
    with transaction() as conn:
        sets = ["state = ?", "updated = ?"] + [f"{k} = ?" for k in fields]
        values = [state, now, *fields.values()]
        if state == "running":
            sets.append("started = COALESCE(started, ?)")
            values.append(now)
        if state in TERMINAL:
            sets.append("ended = ?")
            values.append(now)
        conn.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE name = ?", (*values, name))
        add_event(conn, name, state, message)


def update(name: str, **fields) -> None:
    with transaction() as conn:
        sets = ", ".join(f"{k} = ?" for k in fields)
        conn.execute(f"UPDATE jobs SET {sets}, updated = ? WHERE name = ?",
                     (*fields.values(), time.time(), name))


def get_job(name: str) -> dict:
    job = fetch_one("SELECT * FROM jobs WHERE name = ?", (name,))
    if job is None:
        raise UserError(f"no job named {name!r}; see `gptrain jobs`")
    job["spec"] = json.loads(job["spec"])
    job["slots"] = json.loads(job["slots"]) if job["slots"] else []
    return job


def list_jobs() -> list[dict]:
    return fetch_all("SELECT * FROM jobs ORDER BY seq")


def events(name: str) -> list[dict]:
    return fetch_all("SELECT time, kind, message FROM events WHERE job = ? ORDER BY id", (name,))


def checkpoints(name: str) -> list[dict]:
    return fetch_all("SELECT * FROM checkpoints WHERE job = ? ORDER BY step, name", (name,))


def checkpoint_by_id(ckpt_id: str) -> dict:
    row = fetch_one("SELECT * FROM checkpoints WHERE id = ?", (ckpt_id,))
    if row is None:
        raise UserError(f"no checkpoint with ID {ckpt_id!r}; see `gptrain checkpoints JOB`")
    return row


def sync_checkpoints(job: str, found: list[dict]) -> None:
    """Make the job's checkpoint rows match what is on disk (new ones added, pruned ones gone)."""
    with transaction() as conn:
        known = {r["name"] for r in conn.execute("SELECT name FROM checkpoints WHERE job = ?", (job,))}
        names = {c["name"] for c in found}
        for c in found:
            if c["name"] not in known:
                conn.execute("INSERT INTO checkpoints (id, job, name, step, train_loss, eval_loss, "
                             "time, size, path) VALUES (:id, :job, :name, :step, :train_loss, "
                             ":eval_loss, :time, :size, :path)", {**c, "job": job})
                add_event(conn, job, "checkpoint", f"{c['name']} ({c['id']})")
        for gone in known - names:
            conn.execute("DELETE FROM checkpoints WHERE job = ? AND name = ?", (job, gone))


def delete_job(name: str) -> None:
    with transaction() as conn:
        for table, col in (("jobs", "name"), ("events", "job"), ("checkpoints", "job")):
            conn.execute(f"DELETE FROM {table} WHERE {col} = ?", (name,))
