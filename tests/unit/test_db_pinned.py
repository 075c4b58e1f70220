"""A supervisor's pin on gptrain.db (db.Pinned) tells a database deleted or replaced under its
job from the same file written to, also when a new database takes the old one's inode number."""

import os

from gptrain import db
from gptrain.jobs import store


def _delete_database():
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(f"{db.db_path()}{suffix}")
        except FileNotFoundError:
            pass


def test_writes_keep_the_pin_and_a_deletion_is_seen_even_when_a_new_database_is_made_at_once():
    store.create_job("a", {"entry": "trainer"}, 1, 1, "local")
    pin = db.Pinned()
    store.create_job("b", {"entry": "trainer"}, 1, 1, "local")  # writes (and WAL checkpoints) change nothing
    assert not pin.gone()
    _delete_database()
    # what the supervisor's own next sync did: connect, which makes a new, empty database; ext4
    # gives a freed inode straight back, so before the pin held the file open, the new file had
    # the old one's (device, inode) and the job ran on, writing to a database nobody else reads
    db.connect().close()
    assert db.db_path().exists() and pin.gone()
    assert store.fetch_all("SELECT name FROM jobs") == []  # (the job's record is gone with the file)


def test_a_database_moved_over_the_path_is_seen(tmp_path):
    pin = db.Pinned()
    other = tmp_path / "other.db"
    os.environ["GPTRAIN_HOME"], home = str(tmp_path / "elsewhere"), os.environ["GPTRAIN_HOME"]
    try:
        db.connect().close()  # a database made by gptrain elsewhere
        os.replace(db.db_path(), other)
    finally:
        os.environ["GPTRAIN_HOME"] = home
    os.replace(other, db.db_path())
    assert pin.gone()
