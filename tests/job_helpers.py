"""What tests of jobs share: the CLI called as a user would (`ok`, `refused`), a job's record
and folder, waits, and the processes of a job found from /proc independently of the code under
test. Test modules import these from here, never from one another (tests/unit/test_import_graph.py)."""

import json
import os
import sqlite3
import time

from tests.conftest import run_cli

# a tiny model for jobs (the trainer's own flags; TINY in tests/helpers.py also pins precision etc.)
TRAIN = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32",
         "--train.batch_size=4", "--report_to=none", "--metrics.log_every=1", "--train.lr=1e-3"]
DONE = ("succeeded", "failed", "stopped")


def ok(*args) -> str:
    """`gptrain ARGS`, which must exit 0; its stdout."""
    r = run_cli(*args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def refused(r, *words) -> None:
    """A user error as gptrain gives one: exit 2, one line "gptrain: error: ...", naming `words`."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gptrain: error: "), r.stderr[-3000:]
    for word in words:
        assert word in lines[0], (word, lines[0])


def nothing_recorded(home) -> None:
    """No job folder and no job row in GPTRAIN_HOME `home`."""
    jobs = home / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir()), list(jobs.iterdir())
    if (home / "gptrain.db").exists():
        with sqlite3.connect(home / "gptrain.db") as conn:
            assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0


def job(name) -> dict:
    from gptrain.jobs import store

    return store.get_job(name)


def kinds(name) -> list[str]:
    from gptrain.jobs import store

    return [e["kind"] for e in store.events(name)]


def job_dir(name):
    from gptrain.jobs.folder import job_dir as folder

    return folder(name)


def logs_dir(name):
    """A job's logs/ folder (jobs/folder.py names it)."""
    from gptrain.jobs import folder

    return folder.logs_dir(job_dir(name))


def rank_log_path(name, rank=0):
    """The path of a job's rank-R.log (jobs/logs.py names it)."""
    from gptrain.jobs.logs import rank_log as named

    return named(logs_dir(name), rank)


def agent_log_path(name, node=0):
    """The path of a node's torchrun agent output in a job's logs (jobs/logs.py names it)."""
    from gptrain.jobs.logs import agent_log

    return agent_log(logs_dir(name), node)


def checkpoints_dir(name):
    """A job's checkpoints/ folder, its GPTRAIN_CHECKPOINT_DIR (jobs/folder.py names it)."""
    from gptrain.jobs import folder

    return folder.checkpoints_dir(job_dir(name))


def zip_name(name, path) -> str:
    """The name `gptrain fetch NAME` gives a file of the job's folder in its zip: NAME/, then the
    file's path inside the folder."""
    return f"{name}/{path.relative_to(job_dir(name)).as_posix()}"


def logs_tail(name) -> dict:
    """Each log file of a job: its last 1500 characters (what an assertion shows)."""
    logs = logs_dir(name)
    return {p.name: p.read_text(errors="replace")[-1500:] for p in logs.glob("*")} if logs.is_dir() else {}


def stop_all() -> None:
    """Leave no supervisor behind: stop whatever is still active."""
    from gptrain.jobs import store

    for j in store.list_jobs():
        if j["state"] in store.ACTIVE:
            run_cli("stop", j["name"], "--timeout", "5", "--wait")


def wait_for(name, states=DONE, timeout=300) -> dict:
    """The job's record once it is in one of `states` (read from the store)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = job(name)
        if j["state"] in states:
            if j["state"] == "failed":  # shown with the test's output when an assertion then fails
                print(f"job {name} failed (exit {j.get('exit_code')}): {j.get('error')}\n" + "\n".join(
                    f"--- {log} (end)\n{tail}" for log, tail in sorted(logs_tail(name).items())))
            return j
        time.sleep(0.3)
    raise AssertionError(f"job {name} still {job(name)['state']} after {timeout}s")


def wait_until(cond, timeout=60, what="condition") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} after {timeout}s")


def wait_until_done(name, timeout=180) -> dict:
    """`gptrain inspect NAME --json` (as a user polls) until the job has ended: its report."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        report = json.loads(ok("inspect", name, "--json"))
        if report["job"]["state"] in DONE:
            return report
        time.sleep(0.5)
    raise AssertionError(f"{name} did not finish")


def states_until_done(name, timeout=600) -> list[str]:
    """Poll `gptrain inspect` (as a user would) and return the states it showed."""
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        state = json.loads(ok("inspect", name, "--json"))["job"]["state"]
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in DONE:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"{name} still {seen[-1]} after {timeout}s")


def worker_pids(name) -> dict[int, int]:
    """Training worker pids of a job, by rank (the processes that opened rank-R.log)."""
    logs = str(logs_dir(name))
    pids = {}
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{proc}/fd"):
                target = os.readlink(f"/proc/{proc}/fd/{fd}")
                if target.startswith(logs + "/rank-"):
                    pids[int(target.rsplit("-", 1)[1].split(".")[0])] = int(proc)
        except OSError:
            continue
    return pids


def trainer_pids(output_dir) -> list[int]:
    """The trainer processes (not the torchrun agents, not the log tee) of this machine's (or this
    container's) /proc whose command line names `output_dir` as --train.output_dir."""
    want, found = f"--train.output_dir={output_dir}".encode(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if want in cmd and b"train" in cmd and b"gptrain.jobs.rank_log" not in cmd \
                    and b"torch.distributed.run" not in cmd:
                found.append(int(d))
    return found


def job_processes(name) -> set[int]:
    """Every live process of a job, found independently of the code under test: the supervisor
    recorded for it and whatever runs with the job's GPTRAIN_CHECKPOINT_DIR in its environment."""
    found = live_with_env(f"GPTRAIN_CHECKPOINT_DIR={checkpoints_dir(name)}")
    sup = job(name)["supervisor_pid"]
    if sup and os.path.exists(f"/proc/{sup}") and not _zombie(sup):
        found.add(sup)
    return found


def live_with_env(entry: str) -> set[int]:
    """The live processes whose environment holds `entry` (NAME=value)."""
    needle, found = entry.encode(), set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0") and not _zombie(int(d)):
                        found.add(int(d))
            except OSError:
                pass
    return found


def _zombie(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] in "ZX"
    except OSError:
        return True


def parent_of(pid) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[1])
    except OSError:
        return -1


def identity_of(pid) -> list:
    """[pid, start time, boot id]: what a supervisor records to know its process again."""
    with open(f"/proc/{pid}/stat") as f:
        start = int(f.read().rsplit(") ", 1)[1].split()[19])
    with open("/proc/sys/kernel/random/boot_id") as f:
        return [pid, start, f.read().strip()]


def record_job(name, script, state, supervisor) -> None:
    """A job row as a supervisor left it (what `gptrain run` + the supervisor record)."""
    from gptrain.jobs import store
    from gptrain.jobs.spec import JobSpec

    store.create_job(name, JobSpec(name=name, script=str(script)).to_dict(), 1, 1, "local")
    job_dir(name).mkdir(parents=True)
    if supervisor:
        store.update(name, supervisor_pid=supervisor[0], supervisor=json.dumps(supervisor))
    if state != "queued":
        store.set_state(name, state)


def rank_log(name, rank=0) -> str:
    """A job's rank-R.log (which raises where it is not written yet)."""
    return rank_log_path(name, rank).read_text()


def succeeded(name) -> dict:
    """The job's record once it has ended, which must be `succeeded` (else its logs are shown)."""
    j = wait_for(name)
    assert j["state"] == "succeeded", (j, rank_log(name)[-3000:] if rank_log_path(name).exists() else "",
                                       agent_log_path(name).read_text()[-3000:])
    return j


def requeue_when_written(name, path, slurm, timeout=300) -> list[str]:
    """(Slurm) `scontrol requeue` the job once `path` exists; the states it then goes through."""
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, logs_tail(name)
        time.sleep(0.2)
    slurm.run("scontrol", "requeue", json.loads(ok("inspect", name, "--json"))["job"]["external_id"])
    return states_until_done(name)
