"""gptrain's embedded state: SQLite in $GPTRAIN_HOME/gptrain.db, in WAL mode.

Tables: jobs, events, checkpoints and sources (jobs/store.py), datasets (data/store.py), meta
(when this database was made: what the folders held before it is found again, recover_once). A write
waits for the lock as long as another program holds it, up to LOCK_WAIT_S (SQLite's busy timeout,
retried with a growing pause): a backup tool or an sqlite3 shell holding the database never kills
a job's supervisor. A file that is not an SQLite database is one UserError naming it.

A full disk: reads fall back to a read-only connection (WAL needs to write its -shm file even to
read), and a write that fails for lack of space frees a small reserve file kept beside the
database and tries once more, so the last word of a job (failed: no space left) is recorded.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import sys
import time
from contextlib import contextmanager

from gptrain.errors import UserError
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
    external_id TEXT,
    supervisor TEXT,
    run_id TEXT
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
CREATE TABLE IF NOT EXISTS sources (
    name TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    ref TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


# Columns added after the first release: (table, column, type), added to older databases.
MIGRATIONS = (("jobs", "supervisor", "TEXT"), ("jobs", "run_id", "TEXT"), ("checkpoints", "kind", "TEXT"),
              ("checkpoints", "mtime", "REAL"), ("datasets", "kind", "TEXT"),
              ("checkpoints", "damaged", "TEXT"), ("datasets", "state", "TEXT"), ("datasets", "error", "TEXT"),
              ("datasets", "meta_sha256", "TEXT"))
LOCK_WAIT_S = 600.0  # how long a write waits for another program's lock before giving up
BUSY_TIMEOUT_MS = 10000  # one wait inside SQLite; _begin() retries it up to LOCK_WAIT_S
RESERVE = ".disk-reserve"
RESERVE_BYTES = 1 << 20


def db_path():
    return home() / "gptrain.db"


class Pinned:
    """The database file as it was when pinned: a supervisor checks at each poll that its job's
    record is still in that file, not in one deleted or replaced under it.

    It holds the file open for the life of the process: an inode held open cannot be given to a
    new file, so a database deleted and made again at the same path (by any connect, its own
    included: ext4 hands the freed inode straight back) never passes for the old one. The
    descriptor is never closed while the process runs: closing any descriptor of a file drops
    the process's POSIX locks on it, SQLite's among them."""

    def __init__(self):
        path = db_path()
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            connect().close()  # made now, as any first use of gptrain makes it
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)

    def gone(self) -> bool:
        """The pinned file was deleted, or another file now stands at its path."""
        if os.fstat(self.fd).st_nlink == 0:
            return True
        try:
            st = os.stat(db_path())
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.identity


class CorruptDatabase(UserError):
    """gptrain.db is not a database SQLite can read (any more): not a database, malformed."""


def corrupt(e: BaseException) -> CorruptDatabase | None:
    """The CorruptDatabase for a database file SQLite cannot read (not a database, malformed), else None."""
    if isinstance(e, CorruptDatabase):
        return e
    if type(e) is not sqlite3.DatabaseError:  # Operational/Integrity/...: not about the file itself
        return None
    path = db_path()
    return CorruptDatabase(f"{path} is not a usable gptrain database ({e}); move it aside "
                     f"(mv {shlex.quote(str(path))} {shlex.quote(str(path) + '.corrupt')}) and run "
                     "again: a new one is made, and finds the jobs and datasets in their folders again")


def unusable(e: BaseException) -> UserError | None:
    """The one line for a gptrain.db that cannot be used where it is, else None: damaged
    (corrupt), read-only, not openable (a folder, a folder it cannot write), no space, or a file
    that takes no tables (a link to /dev/null). A lock is not one: it is waited out (_begin)."""
    bad = corrupt(e)
    if bad is not None or not isinstance(e, sqlite3.OperationalError) or locked(e):
        return bad
    path, name, text = db_path(), getattr(e, "sqlite_errorname", "") or "", str(e)
    where = f"{path} ({text})"
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return UserError(f"cannot write {where}: $GPTRAIN_HOME ({path.parent}) must be writable by you; "
                         "fix its permissions, or set GPTRAIN_HOME to a folder you can write")
    if name.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
        return UserError(f"cannot open {where}: is it a folder, or in a folder you cannot write? move it "
                         "away, or set GPTRAIN_HOME to a folder you can write")
    if out_of_space(e):
        return UserError(f"no space left on device writing {where}: free some space and run again")
    if "no such table" in text:
        return CorruptDatabase(f"{path} keeps no tables ({text}: a link to /dev/null, or a file replaced "
                               f"under it); move it aside (mv {shlex.quote(str(path))} "
                               f"{shlex.quote(str(path) + '.corrupt')}) and run again")
    return None


def locked(e: BaseException) -> bool:
    """Another connection holds the lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))


def connect() -> sqlite3.Connection:
    try:
        return _connect()
    except sqlite3.DatabaseError as e:
        bad = corrupt(e)
        if bad is None:
            raise
        raise bad from None


def _connect() -> sqlite3.Connection:
    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        fresh = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone() is None
        conn.executescript(SCHEMA)
        if fresh:  # what the folders hold from before this moment is found again (recover_once)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('made', ?)", (repr(time.time()),))
        for table, column, kind in MIGRATIONS:
            if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    except BaseException:
        conn.close()
        raise
    _keep_reserve(path.parent)
    return conn


def connect_readonly() -> sqlite3.Connection:
    """For reads when a normal connection cannot be had (a full disk): read-only, and if even
    that needs a write (WAL's -shm), immutable (the database file as it is)."""
    last = None
    for mode in ("mode=ro", "immutable=1"):
        conn = sqlite3.connect(f"file:{db_path()}?{mode}", uri=True, timeout=60, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()
            return conn
        except sqlite3.OperationalError as e:
            conn.close()
            last = e
    raise last


def out_of_space(e: Exception) -> bool:
    """A write failed for lack of disk space (SQLITE_FULL, or an I/O error on a full disk)."""
    name = getattr(e, "sqlite_errorname", "") or ""
    return isinstance(e, sqlite3.OperationalError) and (
        name.startswith(("SQLITE_FULL", "SQLITE_IOERR")) or "disk" in str(e))


def _keep_reserve(root) -> None:
    """Keep RESERVE_BYTES set aside beside the database while the disk has room to spare."""
    reserve = os.path.join(root, RESERVE)
    if os.path.exists(reserve):
        return
    try:
        st = os.statvfs(root)
        if st.f_bavail * st.f_frsize < 8 * RESERVE_BYTES:
            return
        fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError:
        os.unlink(reserve)
    finally:
        os.close(fd)


def _free_reserve(only_if_low: bool = False) -> bool:
    root = db_path().parent
    try:
        if only_if_low:
            st = os.statvfs(root)
            if st.f_bavail * st.f_frsize >= RESERVE_BYTES // 2:
                return False
        os.unlink(root / RESERVE)
        return True
    except OSError:
        return False


@contextmanager
def transaction():
    """One IMMEDIATE transaction: the write lock is taken up front, so readers never upgrade.
    On a (nearly) full disk the reserve is freed first, so the write can land."""
    _free_reserve(only_if_low=True)
    conn = _begin()
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


def _begin() -> sqlite3.Connection:
    """A connection inside BEGIN IMMEDIATE: waits out another program's lock (each try waits
    the busy timeout; then a pause, doubling to 5 s) until LOCK_WAIT_S, then one clear error."""
    deadline, pause, freed, said = time.monotonic() + LOCK_WAIT_S, 0.05, False, False
    while True:
        conn = None
        try:
            conn = connect()
            conn.execute("BEGIN IMMEDIATE")
            return conn
        except sqlite3.OperationalError as e:
            if conn is not None:
                conn.close()
            if out_of_space(e) and not freed and _free_reserve():
                freed = True
                continue
            if not locked(e):
                raise
            if time.monotonic() > deadline:
                raise UserError(f"{db_path()} has been locked by another program for over "
                                f"{LOCK_WAIT_S:.0f} s ({e}); end it (`fuser {shlex.quote(str(db_path()))}` "
                                "names it) and run again") from None
            if not said:  # once per write (a supervisor's goes to its supervisor.log)
                said = True
                print(f"gptrain: {db_path()} is locked by another program; waiting for it "
                      f"(up to {LOCK_WAIT_S / 60:.0f} minutes)", file=sys.stderr, flush=True)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


def fetch_all(sql: str, params=()) -> list[dict]:
    try:
        conn = connect()
    except sqlite3.OperationalError as e:
        if not out_of_space(e):
            raise
        conn = connect_readonly()
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def fetch_one(sql: str, params=()) -> dict | None:
    rows = fetch_all(sql, params)
    return rows[0] if rows else None


def recover_once(kind: str, recover) -> None:
    """`recover(made)` once per database for `kind` ('jobs', 'datasets'): in a database made new
    (the old one moved aside as its error advises, or lost), the records of what the folders held
    before it was made (`made`, a time) are written again from the folders. A database that
    predates this record, or one already recovered, is left as it is."""
    try:
        rows = {r["key"]: r["value"] for r in fetch_all("SELECT key, value FROM meta WHERE key IN ('made', ?)",
                                                         (f"recovered {kind}",))}
    except sqlite3.OperationalError:  # read-only (a full disk) on a database from before the table
        return
    if f"recovered {kind}" in rows:
        return
    try:
        if "made" in rows:
            recover(float(rows["made"]))  # (writes each record with INSERT OR IGNORE: two at once agree)
        with transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                         (f"recovered {kind}", repr(time.time())))
    except (OSError, sqlite3.OperationalError):  # a full disk: the reads go on; tried again next time
        pass
