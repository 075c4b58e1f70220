"""The job store tells the truth whatever happens to gptrain.db: a stale supervisor cannot write,
a deleted database leaves no orphan, a busy one kills nothing, a corrupt one is one line, and a
failed submit records nothing (real supervisors, real processes, the real SQLite file)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from gptrain.errors import UserError
from tests.conftest import run_cli
from tests.job_helpers import job, kinds, live_with_env, ok, rank_log_path, wait_for, wait_until
def gated_script(tmp_path, after_go="", name="gated.py"):
    """A program that waits for a file `go` beside it, then (after `after_go`) writes `done`."""
    script = tmp_path / name
    script.write_text("import os, time\n"
                      f"d = {str(tmp_path)!r}\n"
                      "print('waiting', flush=True)\n"
                      "while not os.path.exists(os.path.join(d, 'go')):\n    time.sleep(0.1)\n"
                      f"{after_go}"
                      "open(os.path.join(d, 'done'), 'w').write('ok')\n")
    return script


def db_file():
    from gptrain.db import db_path

    return db_path()


def raw(sql, params=()):
    """The database as any other sqlite3 client sees it (not through gptrain)."""
    conn = sqlite3.connect(db_file(), isolation_level=None, timeout=60)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def alive(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] not in "ZX"
    except OSError:
        return False


def tagged(run_id) -> set[int]:
    """The live processes carrying the job's GPTRAIN_RUN_ID (its agents, workers, their children)."""
    return live_with_env(f"GPTRAIN_RUN_ID={run_id}")


@pytest.mark.parametrize("newer", ["ended", "taken over"])
def test_a_stale_supervisor_cannot_write(slots, isolated_home, tmp_path, newer):
    """A supervisor whose job was ended, or handed to another owner, while it was frozen: its
    'succeeded' is refused and the newer record stands."""
    ok("run", "stale", "--", gated_script(tmp_path))
    wait_for("stale", ("running",), timeout=300)
    sup = job("stale")["supervisor_pid"]
    os.kill(sup, signal.SIGSTOP)
    try:
        if newer == "ended":
            raw("UPDATE jobs SET state = 'failed', error = 'ended by a newer owner' WHERE name = 'stale'")
        else:
            raw("UPDATE jobs SET run_id = 'a-newer-supervisor' WHERE name = 'stale'")
    finally:
        os.kill(sup, signal.SIGCONT)
    (tmp_path / "go").write_text("")
    wait_until(lambda: not alive(sup), 60, "the stale supervisor did not leave")
    assert (tmp_path / "done").exists()  # the program itself ran to its end
    j = job("stale")
    assert j["state"] == ("failed" if newer == "ended" else "running"), j
    assert "succeeded" not in kinds("stale")
    log = (isolated_home / "jobs" / "stale" / "supervisor.log").read_text()
    assert "no longer this supervisor's" in log and "Traceback" not in log, log


def test_a_deleted_database_leaves_no_orphan(slots, isolated_home, tmp_path):
    """gptrain.db deleted while a job runs: its supervisor notices, stops the job's processes and
    says so in its log; resubmitting the name is one line, and no junk row is left."""
    ok("run", "ghost", "--", gated_script(tmp_path))
    wait_for("ghost", ("running",), timeout=300)
    j = job("ghost")
    sup, run_id = j["supervisor_pid"], j["run_id"]
    # "running" is recorded as the launch starts: the program's processes carry the job's run id
    # once they have been exec'd, which a loaded machine can put off for a while.
    wait_until(lambda: tagged(run_id), 60, "the job's processes were not found")
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(f"{db_file()}{suffix}")
        except FileNotFoundError:
            pass
    wait_until(lambda: not alive(sup) and not tagged(run_id), 60,
               "the job ran on after its database was deleted")
    log = (isolated_home / "jobs" / "ghost" / "supervisor.log").read_text()
    assert "was deleted or replaced" in log and "Traceback" not in log, log
    r = run_cli("run", "ghost", "--", gated_script(tmp_path, name="again.py"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (r.stdout, r.stderr)
    assert "already there" in r.stderr and "Traceback" not in r.stderr
    assert raw("SELECT name FROM jobs") == []


@pytest.mark.slow
def test_a_database_locked_past_the_busy_timeout_kills_nothing(slots, isolated_home, tmp_path):
    """Another sqlite3 client holds `BEGIN EXCLUSIVE` longer than SQLite's busy timeout while the
    job runs and finishes: the program is untouched and the job is recorded succeeded once the
    lock is gone (the write retried past one busy timeout)."""
    from gptrain.db import BUSY_TIMEOUT_MS

    hold_s = BUSY_TIMEOUT_MS / 1000 + 8
    ok("run", "busy", "--", gated_script(tmp_path, after_go="time.sleep(5)\n"))
    wait_for("busy", ("running",), timeout=300)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(float(sys.argv[2]))\n"
         "c.execute('COMMIT')\n", str(db_file()), str(hold_s)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        (tmp_path / "go").write_text("")
        wait_until(lambda: (tmp_path / "done").exists(), 60, "the program did not finish")
        assert holder.wait(timeout=120) == 0
    finally:
        holder.kill()
    j = wait_for("busy", timeout=300)
    assert j["state"] == "succeeded" and j["exit_code"] == 0, j
    log = (isolated_home / "jobs" / "busy" / "supervisor.log").read_text()
    assert "Traceback" not in log and "is locked by another program; waiting" in log, log


@pytest.mark.parametrize("args", [("jobs",), ("data", "list"), ("inspect", "x"), ("run", "x", "--", "SCRIPT")])
def test_a_corrupt_database_is_one_line(isolated_home, tmp_path, args):
    """Every command: one line naming the file and what to do, exit 2, the file left as it was."""
    args = [str(gated_script(tmp_path)) if a == "SCRIPT" else a for a in args]
    isolated_home.mkdir(parents=True, exist_ok=True)
    db = isolated_home / "gptrain.db"
    junk = b"this is not an SQLite database\n" * 200
    db.write_bytes(junk)
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(db) in lines[0] and "move it aside" in lines[0], r.stderr
    assert db.read_bytes() == junk


def test_a_failed_submit_records_nothing(slots, isolated_home, tmp_path):
    """The job's folder cannot be made ($GPTRAIN_HOME/jobs is a file): one line, no row."""
    ok("jobs")  # the database exists
    (isolated_home / "jobs").write_text("not a folder")
    r = run_cli("run", "nope", "--", gated_script(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (r.stdout, r.stderr)
    assert "nothing was recorded" in r.stderr
    assert raw("SELECT name FROM jobs") == [] and raw("SELECT job FROM events") == []


@pytest.mark.slow
def test_a_database_corrupted_under_a_running_job_costs_no_step(slots, isolated_home, tmp_path):
    """gptrain.db overwritten with garbage past its header while the trainer runs: the supervisor
    says why in one line and stops the job's processes after their checkpoint of the step they
    reached (was: it died on DatabaseError, the workers with it, no checkpoint); `gptrain stop`
    still answers, through the job's folder."""
    import re

    from tests.job_helpers import TRAIN
    from tests.helpers import make_dataset

    data = make_dataset(tmp_path)
    ok("run", "rot", "--", f"--data.path={data}", "--train.max_steps=100000", "--checkpoint.every=100000",
       "--train.precision=fp32", "--train.do_eval=false", *TRAIN)
    wait_for("rot", ("running",), timeout=300)
    j = job("rot")
    sup, run_id = j["supervisor_pid"], j["run_id"]
    jdir = isolated_home / "jobs" / "rot"
    log0 = rank_log_path("rot")
    wait_until(lambda: log0.is_file() and re.search(r"step\s+\d+/", log0.read_text(errors="replace")),
               120, "no step logged")
    for suffix, keep in (("", 100), ("-wal", 32)):
        path = f"{db_file()}{suffix}"
        if os.path.exists(path):
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                f.seek(keep)
                f.write(b"\x5a" * max(size - keep, 4096))
    r = run_cli("stop", "rot")
    assert r.returncode == 0 and "stopping" in r.stdout and len(r.stdout.strip().splitlines()) == 1, (r.stdout, r.stderr)
    wait_until(lambda: not alive(sup) and not tagged(run_id), 120, "the job ran on past its corrupt database")
    log = (jdir / "supervisor.log").read_text()
    assert "became unreadable while the job ran" in log and "Traceback" not in log, log
    rank0 = rank_log_path("rot").read_text(errors="replace")
    trained = max(int(s) for s in re.findall(r"step\s+(\d+)/", rank0))
    saved = int(re.findall(r"saved checkpoint \S*step-(\d+)", rank0)[-1])
    assert saved == trained, rank0[-3000:]
    for suffix in ("", "-wal", "-shm"):  # as the one line says: moved aside, a new one is made
        if os.path.exists(f"{db_file()}{suffix}"):
            os.rename(f"{db_file()}{suffix}", f"{db_file()}{suffix}.corrupt")
    assert run_cli("jobs").returncode == 0


def test_a_database_moved_aside_as_advised_finds_the_jobs_and_datasets_again(dataset, isolated_home, tmp_path):
    """#47 row 7: following the corrupt-database line (`mv gptrain.db gptrain.db.corrupt`)
    stranded the job ("no job named 'j'" for resume and checkpoints) and its dataset (push said
    it exists, rm/list/run that it does not). The new database records again, from their folders,
    what they held before it was made: a finished job as it ended (its folder's ended.json), one
    whose ending is not known `failed` with why, resumable; the dataset usable."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello from the job')\n")
    ok("run", "j", "--dataset", dataset, "--", str(script))
    assert wait_for("j")["state"] == "succeeded"
    ok("run", "k", "--", str(script))  # its ending lost: as a job that was running when the database went
    assert wait_for("k")["state"] == "succeeded"
    from gptrain.jobs.folder import ended_file, job_dir

    ended_file(job_dir("k")).unlink()
    for suffix in ("", "-wal", "-shm"):  # what the one line advises, the -wal and -shm with it
        if os.path.exists(f"{db_file()}{suffix}"):
            os.rename(f"{db_file()}{suffix}", f"{db_file()}{suffix}.corrupt")
    assert dataset in ok("data", "list")
    j = job("j")  # a finished job is found finished (round 3: it came back `failed`)
    assert j["state"] == "succeeded" and j["error"] is None, j
    assert "it had ended succeeded" in [e["message"] for e in json.loads(ok("inspect", "j", "--json"))["events"]][-1]
    k = job("k")
    assert k["state"] == "failed" and "recorded again from its folder" in k["error"], k
    ok("resume", "k")
    assert wait_for("k")["state"] == "succeeded"
    ok("data", "rm", dataset)
    assert not (isolated_home / "datasets" / dataset).exists()


def test_a_dataset_a_running_job_reads_is_not_removed_under_it(slots, dataset, isolated_home, tmp_path):
    """`data rm` of the dataset a running job reads removed it at once (the job, or its resume,
    failed later: #47 round 3): refused in one line naming the job; --force removes it."""
    ok("run", "reader", "--dataset", dataset, "--", gated_script(tmp_path))
    wait_for("reader", ("running",), timeout=300)
    r = run_cli("data", "rm", dataset)
    assert r.returncode == 2 and "reader (running)" in r.stderr and "--force" in r.stderr, r.stderr
    assert dataset in ok("data", "list")
    (tmp_path / "go").write_text("")
    assert wait_for("reader")["state"] == "succeeded"
    ok("data", "rm", dataset)
    assert dataset not in ok("data", "list")


@pytest.mark.parametrize("args", [["--data.path", "tiny"], ["--tokenized_dataset_load_dir=tiny"],
                                  ["--data.mix=tiny:1"]])
def test_a_dataset_named_by_any_spelling_of_the_trainer_is_in_use(dataset, isolated_home, args):
    """The in-use check reads the job's trainer config, not one spelling of one flag."""
    from gptrain.jobs import api, store
    from gptrain.jobs.spec import JobSpec

    store.create_job("user", JobSpec(name="user", args=[*args, "--train.max_steps=1"]).to_dict(), 1, 1, "local")
    store.set_state("user", "running", "made by the test")
    with pytest.raises(UserError, match=r"read by job\(s\) not yet ended: user \(running\)"):
        api.remove_dataset("tiny")
