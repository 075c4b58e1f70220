"""What a user can do with jobs, once, under both faces: the CLI (cli/jobs.py, cli/checkpoints.py,
cli/run.py) and the console (ui/views.py, ui/routes.py) call these and only parse and format.

Submit, refresh, list, report, read or follow a log, stop, resume, remove, list and copy out
checkpoints, zip a job. Whatever a job printed or was given leaves through here with its secrets
masked (jobs/secrets.py); a name from outside is checked (errors.BadName) and an unknown one is
errors.NotFound, so the console answers 400/404 and the CLI one line, from the same checks.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from gptrain.errors import NotFound, UserError
from gptrain.files import parse_user_text  # noqa: F401 (the console reads what a form posts through it)
from gptrain.home import check_name
from gptrain.jobs import folder, records, secrets, store, submission
from gptrain.jobs.engines.table import SUPERVISED
from gptrain.jobs.schedulers import SCHEDULERS, refresh_job, resume_job, scheduler  # noqa: F401 (the faces' choices)
from gptrain.jobs.found import dataset_tokenizer, model_source  # noqa: F401 (a MODEL named: its source, its data's tokenizer)
from gptrain.jobs.model_use import evaluate, export, generate  # noqa: F401 (a MODEL named, used whole)
from gptrain.jobs.programs.code import add_source, remove_source, sources  # noqa: F401 (`gptrain source`)
from gptrain.jobs.metrics_file import MetricsFile  # noqa: F401 (the console's charts read through it)
from gptrain.jobs.engines.options import OPTIONS as ENGINE_OPTIONS  # noqa: F401 (the faces')
from gptrain.jobs.engines.options import shown as engine_options_shown
from gptrain.jobs.submission import Request  # noqa: F401 (for the faces)
from gptrain.jobs.records import known  # noqa: F401 (a job named: its record, or one line)
from gptrain.jobs.progress import how_far, last_train  # noqa: F401 (the jobs table's progress, ETA and stalls)
from gptrain.jobs.sessions import (  # noqa: F401 (`gptrain session`: a shell in a job's environment)
    attach as attach_session, check_is_session, is_session, names as session_names, parse_duration, run as run_in_session,
    jupyter_of as session_jupyter, start as start_session, wait_ready as wait_session)
from gptrain.jobs.sweeps import (  # noqa: F401 (`gptrain sweep`: trials sampled and pruned by Optuna)
    listed as sweeps, report as sweep_report, resume as resume_sweep, stop_driver)
from gptrain.jobs.job_checkpoints import (  # noqa: F401 (a job's checkpoints, listed and copied out)
    CHECKPOINT_SHOWN, checkpoint, checkpoint_files, checkpoint_zip, checkpoints, export_checkpoint, zip_job)

__all__ = [  # what the faces (cli/, ui/) may use: tests/unit/test_api_surface.py
    "add_source", "checkpoint", "checkpoint_files", "CHECKPOINT_SHOWN", "checkpoint_zip", "checkpoints",
    "database_error", "dataset_tokenizer", "ENGINE_OPTIONS", "FACTS", "evaluate", "export", "generate", "export_checkpoint", "follow_log", "how_far", "job", "known",
    "last_train", "log_pages", "log_path", "log_reader", "loss_line", "metrics_path", "MetricsFile",
    "model_source", "parse_user_text", "PRIVATE", "read_job_file", "read_log", "refresh_all", "remove_dataset",
    "REFRESH_S", "remove", "remove_source", "report", "Request", "rerun", "resume", "rows",
    "ROWS_TTL_S", "SCHEDULERS", "shown", "sources", "stop", "STOP_TIMEOUT_S", "submit",
    "SUPERVISOR_EXIT_S", "zip_job", "attach_session", "is_session", "parse_duration", "run_in_session",
    "start_session", "wait_session", "check_is_session", "session_names", "session_jupyter", "create_sweep", "sweeps", "resume_sweep",
    "stop_sweep", "sweep_report",
]

REFRESH_S = 2.0  # the whole table is brought up to date at most this often (refresh_all)
ROWS_TTL_S = 0.5  # a table asked for again within this is the one computed


# ---- one job ----------------------------------------------------------------------------------

def job(name: str) -> dict:
    """The job, its state first brought up to date by its scheduler (schedulers.refresh_job)."""
    known(name)
    return refresh_job(name)


def submit(request: Request, dry_run: bool = False) -> tuple:
    """Submit what a user asked for (jobs/submission.py: a job file or an earlier job's fields,
    flags or a form on top, the user's defaults); (spec, notes). The scheduler validates the
    job and records it through records.create, all or nothing; dry_run prints it instead."""
    return submission.submit(request, dry_run)


def create_sweep(*args, **kwargs) -> dict:
    """`gptrain sweep NAME ...` (jobs/sweeps.create), its trials' job checked as `gptrain run` checks one."""
    from gptrain.jobs.sweeps import create

    return create(*args, **kwargs, check_trial=submission.check_trial)


def stop_sweep(name: str) -> list[str]:
    """End a sweep's driver and stop its running trials; the trials stopped."""
    running = stop_driver(name)
    for job in running:
        stop(job)
    return running


def database_error(e: BaseException):
    """The one-line UserError for a gptrain.db that cannot be used (damaged, read-only, not
    openable, no space), else None (for a face's last catch: db.unusable)."""
    from gptrain.db import unusable

    return unusable(e)


def rerun(old: str, name: str, args: list[str] | None = None, config: str | None = None) -> tuple:
    """Submit job `old` again as `name` (jobs/submission.fields_of), with its trainer flags or
    program arguments replaced by `args` and its config TOML by `config` when given; the same
    checks and one-line errors as `gptrain run`. (spec, notes)."""
    record = known(old)
    fields = submission.fields_of(record["spec"], secrets.load(old), folder.code_dir(folder.job_dir(old)))
    if args is not None:
        fields["args"] = list(args)
    return submit(Request(fields=fields, name=name, config_text=config))


def read_job_file(path: str) -> dict:
    """A job.yaml's fields (jobs/programs/job_file.py), for a Request."""
    from gptrain.jobs.programs import job_file

    return job_file.from_yaml(path)


STOP_TIMEOUT_S = folder.STOP_TIMEOUT_S
# what a face shows of jobs beyond their rows, from their one owner (the console's page reads it)
FACTS = {"states": [s.value for s in store.JobState], "active": [s.value for s in store.ACTIVE],
         "stop_timeout_s": STOP_TIMEOUT_S, "schedulers": list(SCHEDULERS),
         "engine_options": {name: engine_options_shown().get(name, []) for name in SCHEDULERS}}


MAX_STOP_TIMEOUT_S = 7 * 86400.0  # a stop's grace at most: a week


def stop(name: str, timeout: float = STOP_TIMEOUT_S, wait: bool = False) -> str:
    """Ask the job to save a checkpoint and exit (forced after `timeout` s); its state after.
    With gptrain.db unreadable, a local job is asked through its folder (its supervisor reads
    the request there, and stops its workers by itself when it meets the damage)."""
    import math

    from gptrain.db import CorruptDatabase

    check_name(name, "job")
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 <= timeout <= MAX_STOP_TIMEOUT_S):
        raise UserError(f"--timeout must be 0 to {MAX_STOP_TIMEOUT_S:g} seconds, got {timeout!r}")
    try:
        record = known(name)
    except CorruptDatabase as e:
        if not folder.job_dir(name).is_dir():
            raise
        folder.write_stop_request(folder.job_dir(name), timeout)
        return (f"stopping, asked through {folder.stop_request(folder.job_dir(name))}: {str(e).split(' (')[0]} "
                "(a local job's supervisor saves a checkpoint and stops it; nothing more is recorded)")
    state = scheduler(record["scheduler"]).stop(name, timeout)
    if wait:
        state = _wait_ended(name)
    return state


SUPERVISOR_EXIT_S = 60.0  # how long `stop --wait` waits for a supervisor that recorded its end to exit


def _wait_ended(name: str) -> str:
    """The job's end state once it is recorded and its supervisor (which writes that state, then
    reaps what is left) has exited too: when `stop --wait` returns, nothing of the job runs."""
    from gptrain.jobs import procs

    while (row := refresh_job(name))["state"] not in store.TERMINAL:
        time.sleep(0.5)
    ident = json.loads(row["supervisor"]) if row.get("supervisor") else None
    deadline = time.time() + SUPERVISOR_EXIT_S
    while ident and procs.alive(ident) and time.time() < deadline:
        time.sleep(0.1)
    return row["state"]


def resume(name: str, from_id: str | None = None, nodes: str | None = None,
           allow_unverified: bool = False, max_steps: int | None = None) -> None:
    """Start a failed or stopped job again from its newest good checkpoint, or from the one
    `from_id` names (verified first; jobs/records.py), on `nodes` nodes when given (the
    checkpoint is resharded and the data position carried over: docs/multi-host.md);
    `allow_unverified`: its workers may load a checkpoint without a checksum list from now on;
    `max_steps`: a trainer job (one that succeeded too) trains to that step (records.place_on)."""
    known(name)
    records.check_resumable(name, extending=max_steps is not None)
    changed = nodes is not None or allow_unverified or max_steps is not None
    undo, said = records.place_on(name, nodes, allow_unverified, max_steps) if changed else (None, [])
    try:
        if from_id is None:
            resume_job(name)
        else:
            _resume_from(name, checkpoint(from_id, name))
    except BaseException:
        if undo is not None:
            undo()
        raise
    if said:
        with store.transaction() as conn:
            for kind, line in said:
                store.add_event(conn, name, kind, line)


def _resume_from(name: str, row: dict) -> None:
    """resume() from the checkpoint `row` rather than the newest (jobs/found.choose: verified,
    then named in the job's folder), undone when the scheduler refuses the resume."""
    from gptrain.jobs import found

    undo = found.choose(folder.job_dir(name), row)
    try:
        resume_job(name)
    except BaseException:
        undo()
        raise


def remove(name: str) -> None:
    known(name)
    records.remove(name, refresh_job(name))


def remove_dataset(name: str, force: bool = False) -> None:
    """`gptrain data rm NAME`: the dataset deleted (data/api.py), unless a job not yet ended
    reads it (its --dataset, or its trainer's data.path or data.mix however they were spelled:
    flags, aliases, a config file) and `force` is not given: removing it under a running job
    failed that job, or its resume, later (#47 round 3)."""
    from gptrain.data import api as data_api

    users = [f"{row['name']} ({row['state']})" for row in store.list_jobs()
             if row["state"] in store.ACTIVE and _reads(row["spec"], name)]
    if users and not force:
        raise UserError(f"dataset {name} is read by job(s) not yet ended: {', '.join(users)}; stop them first, "
                        "or remove it anyway with --force")
    data_api.remove(name)


def _reads(spec_field, dataset: str) -> bool:
    """Whether a job of this spec reads the named dataset."""
    from gptrain.data.mixture import parse_mix
    from gptrain.jobs.spec import JobSpec

    spec = JobSpec.from_dict(json.loads(spec_field) if isinstance(spec_field, str) else spec_field)
    if dataset in spec.datasets:
        return True
    if spec.entry != "trainer":
        return False
    try:
        data = spec.trainer_config().data
        return dataset in ([n for n, _ in parse_mix(data.mix)] if data.mix else [data.path])
    except UserError:  # (a spec recorded before a check it would fail now: not this dataset's to say)
        return False


def report(name: str, fresh: bool = True) -> dict:
    """Everything known of a job but its curves and logs, secrets masked: the record, its spec,
    events, checkpoints and trainer config. `fresh` (`inspect`): this job's state asked of its
    scheduler now, with the engine's own line on it (`describe`: squeue, the API server) and the
    latest train/eval metrics; else (a page that asks each second, and streams the metrics
    itself) the state as refresh_all last found it, and neither."""
    from gptrain.jobs import progress

    if fresh:
        full = job(name)
    else:
        known(name)
        unrecorded = refresh_all().get(name, {})
        full = {**known(name), **unrecorded}
    values = secrets.load(name).values()
    spec = json.loads(secrets.mask(json.dumps(full["spec"]), values))
    if spec.get("repository_url"):  # stored before credentials in URLs were refused: never shown
        from gptrain.errors import redact

        spec["repository_url"] = redact(spec["repository_url"])
    row = shown(full, values)
    d = folder.job_dir(name)
    cfg = folder.trainer_config(d)
    from gptrain.jobs.spec import JobSpec

    runs = JobSpec.from_dict(spec)
    out = {"job": row, "spec": spec, "ranks": row["nodes"] * row["accels"],
           "runs": {"entry": runs.entry, "argv": runs.argv, "args": runs.args, "commit": runs.commit},
           "events": [{**e, "message": secrets.mask(e["message"], values)} for e in store.events(name)],
           "checkpoints": [{k: c.get(k) for k in CHECKPOINT_SHOWN} for c in checkpoints(name)],
           "config": secrets.mask(cfg.read_text(), values) if cfg.is_file() else None,
           "trainer": _run_info(folder.trainer_run_info(d))}
    if fresh:
        describe = scheduler(full["scheduler"]).describe(full)  # the whole record: engines read its spec
        out.update(metrics=progress.latest(d), describe=secrets.mask(describe, values) if describe else None,
                   summary=progress.summary(d, row.get("started"), row.get("ended"), time.time()))
    return out


PRIVATE = ("spec", "supervisor", "supervisor_pid", "run_id")  # kept to the engines


def _run_info(path: Path) -> dict | None:
    """The built-in trainer's run.json (its precision, kernels, MFU basis), or None."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def shown(row: dict, values=None) -> dict:
    """A job's record as the faces show it: the engines' own fields left out, the failure reason
    masked with the job's secret `values` (read when not given)."""
    out = {k: v for k, v in row.items() if k not in PRIVATE}
    spec = json.loads(row["spec"]) if isinstance(row.get("spec"), str) else row.get("spec") or {}
    # elastic (`--nodes MIN:MAX`): the fewest nodes it goes on with, shown as MIN:MAX
    out["min_nodes"] = spec.get("min_nodes") if isinstance(spec.get("min_nodes"), int) else None
    if out.get("error"):
        out["error"] = secrets.mask(out["error"], secrets.load(row["name"]).values() if values is None else values)
    return out


def loss_line(name: str) -> str | None:
    """The job's loss curve as one line of text (jobs/sparkline.py), or None."""
    from gptrain.jobs.progress import jsonl_path
    from gptrain.jobs.sparkline import loss_line as line

    return line(jsonl_path(folder.job_dir(name)))


def metrics_path(name: str) -> Path:
    """The job's metrics.jsonl: the built-in trainer's, else its script's (jobs/progress.py)."""
    from gptrain.jobs.progress import jsonl_path

    d = folder.job_dir(known(name)["name"])
    return jsonl_path(d) or folder.metrics_files(d)[0]


# ---- every job --------------------------------------------------------------------------------

_refreshed = {"at": 0.0, "unrecorded": {}}
_refresh_lock = threading.Lock()


def refresh_all(force: bool = False) -> dict[str, dict]:
    """Bring every active job's state up to date (a dead supervisor's job ended or handed over;
    Slurm asked), at most every REFRESH_S seconds however many readers ask. Returns what was
    learnt but could not be recorded (a full disk), by job, for readers to show all the same."""
    with _refresh_lock:
        if not force and time.time() - _refreshed["at"] < REFRESH_S:
            return _refreshed["unrecorded"]
        _refreshed["at"] = time.time()
    from gptrain.jobs.reconcile import reconcile

    unrecorded = reconcile()  # every job owned by a supervisor here (local, ray) at once
    for row in store.list_jobs():
        if row["scheduler"] not in SUPERVISED and row["state"] in store.ACTIVE:
            scheduler(row["scheduler"]).refresh(row["name"])
    _refreshed["unrecorded"] = unrecorded
    return unrecorded


_rows: dict = {}


def rows(state: str | None = None, force: bool = False) -> list[dict]:
    """The jobs table: one row per job (oldest first) with its latest train step and loss,
    computed at most every ROWS_TTL_S however many readers ask (`force`: now)."""
    now = time.monotonic()
    cached = _rows.get(state)
    if not force and cached and now - cached[0] < ROWS_TTL_S:
        return cached[1]
    unrecorded = refresh_all(force)
    out = []
    for row in store.list_jobs():
        row = {**row, **unrecorded.get(row["name"], {})}
        if state and row["state"] != state:
            continue
        last = last_train(row["name"])
        out.append(shown(row) | {"step": last.get("step"), "loss": last.get("loss"),
                                 **how_far(last.get("progress") or {}, row["state"])})
    _rows[state] = (now, out)
    return out


# ---- logs -------------------------------------------------------------------------------------

def log_path(name: str, rank) -> Path:
    """The log of one of the job's ranks; a rank it lacks (or junk such as `²`) is NotFound."""
    from gptrain.jobs.logs import check_rank, rank_log

    row = known(name)
    try:
        r = check_rank(str(rank), row["nodes"] * row["accels"])
    except UserError as e:
        raise NotFound(f"job {name}: {e}") from None
    return rank_log(folder.logs_dir(folder.job_dir(name)), r)


def log_reader(name: str, rank):
    """read(offset) -> (text, next offset): one page of a rank's log from `offset` (None: its last
    page), whole lines, capped, masked (jobs/logs.read_page). The job is looked up once."""
    from gptrain.jobs import logs

    path, values = log_path(name, rank), secrets.load(name).values()
    return lambda offset: logs.read_page(path, offset, values)


def read_log(name: str, rank, offset: int | None) -> tuple[str, int]:
    """One page of a rank's log (log_reader)."""
    return log_reader(name, rank)(offset)


def log_pages(name: str, rank):
    """The whole log of a rank, a masked page at a time ([] when it has none yet)."""
    from gptrain.jobs import logs

    path = log_path(name, rank)
    return logs.pages(path, secrets.load(name).values()) if path.is_file() else iter(())


def follow_log(name: str, rank):
    """A rank's log, masked, as it is written, until the job ends (then `job(name)` says how)."""
    from gptrain.jobs import logs

    def ended() -> bool:
        return refresh_job(name)["state"] in store.TERMINAL

    return logs.follow(log_path(name, rank), secrets.load(name).values(), ended)
