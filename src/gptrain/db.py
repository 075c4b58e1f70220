"""gptrain's embedded state: SQLite in $GPTRAIN_HOME/gptrain.db, in WAL mode.

Tables: jobs, events and checkpoints (jobs/store.py), datasets (data/store.py). Connections
wait up to a minute for the write lock, so many CLI calls can run at once.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager

from gptrain.home import home

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    scheduler TEXT NOT NULL DEFAULT 'local',
    nodes INTEGER NOT NULL,
    accels INTEGER NOT NULL,
    spec TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    started REAL,
    ended REAL,
    restarts INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    error TEXT,
    supervisor_pid INTEGER,
    slots TEXT,
    external_id TEXT
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_job ON events (job, id);
CREATE TABLE IF NOT EXISTS datasets (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    tokenizer TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    name TEXT NOT NULL,
    step INTEGER,
    train_loss REAL,
    eval_loss REAL,
    time REAL NOT NULL,
    size INTEGER NOT NULL,
    path TEXT NOT NULL,
    UNIQUE (job, name)
);
"""


def db_path():
    return home() / "gptrain.db"


def connect() -> sqlite3.Connection:
    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 60000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.executescript(SCHEMA)
    return conn


@contextmanager
def transaction():
    """One IMMEDIATE transaction: the write lock is taken up front, so readers never upgrade."""
    conn = connect()
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


def fetch_all(sql: str, params=()) -> list[dict]:
    conn = connect()
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def fetch_one(sql: str, params=()) -> dict | None:
    rows = fetch_all(sql, params)
    return rows[0] if rows else None
