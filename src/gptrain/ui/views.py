"""What the console shows, read through the same library calls as the CLI: jobs/store.py for jobs,
events and checkpoints, the job's metrics.jsonl and logs/ files, data/store.py for datasets.
Everything a job printed or was given passes through jobs/secrets.py masking on its way out.

Names from a URL are checked by gptrain.home.check_name (a bad one is a 400, an unknown one a
404) before any file or row is touched; a checkpoint's path must lie inside its job's directory.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from gptrain.errors import UserError
from gptrain.home import check_name
from gptrain.jobs import secrets, store
from gptrain.jobs.folder import job_dir, logs_dir, metrics_files, trainer_config
from gptrain.ui import metrics

REFRESH_S = 2.0


class NotFound(Exception):
    pass


class BadName(Exception):
    pass


def known_job(name: str) -> dict:
    """The job named in a URL (400 for a malformed name, 404 for an unknown one)."""
    try:
        check_name(name, "job")
    except UserError as e:
        raise BadName(str(e)) from None
    try:
        return store.get_job(name)
    except UserError as e:
        raise NotFound(str(e)) from None


_refreshed = {"at": 0.0}
_refresh_lock = threading.Lock()


def refresh_states(force: bool = False) -> None:
    """Bring active jobs' states up to date as `gptrain jobs` does (a dead supervisor's job ended
    or handed over; Slurm asked), at most every REFRESH_S seconds however many pages watch."""
    with _refresh_lock:
        if not force and time.time() - _refreshed["at"] < REFRESH_S:
            return
        _refreshed["at"] = time.time()
    from gptrain.jobs.schedulers import scheduler
    from gptrain.jobs.reconcile import reconcile

    reconcile()  # every local job at once
    for job in store.list_jobs():
        if job["scheduler"] != "local" and job["state"] in store.ACTIVE:
            scheduler(job["scheduler"]).refresh(job["name"])


def metrics_path(name: str) -> Path:
    """The job's metrics.jsonl: the built-in trainer's, else its script's (jobs/progress.py)."""
    from gptrain.jobs.progress import jsonl_path

    d = job_dir(name)
    return jsonl_path(d) or metrics_files(d)[0]


def metrics_of(name: str) -> metrics.Chart:
    return metrics.of(metrics_path(name))


_rows: dict = {}
ROWS_TTL_S = 0.5


def job_rows(state: str | None = None) -> list[dict]:
    """The jobs table: one row per job, with its latest train step and loss. Computed at most
    twice a second however many pages stream it."""
    now = time.monotonic()
    cached = _rows.get(state)
    if cached and now - cached[0] < ROWS_TTL_S:
        return cached[1]
    _rows[state] = (now, _job_rows(state))
    return _rows[state][1]


def _job_rows(state: str | None) -> list[dict]:
    refresh_states()
    rows = []
    for j in store.list_jobs():
        if state and j["state"] != state:
            continue
        last = last_train(j["name"])
        rows.append({"name": j["name"], "state": j["state"], "nodes": j["nodes"], "accels": j["accels"],
                     "scheduler": j["scheduler"], "created": j["created"], "updated": j["updated"],
                     "step": last.get("step"), "loss": last.get("loss")})
    return rows


_tails: dict[str, tuple] = {}


def last_train(name: str) -> dict:
    """The job's latest train row, as `gptrain jobs` finds it (jobs/progress.py: metrics.jsonl
    read from its end, or a HF trainer_state.json), read again only when its metrics.jsonl
    changed: a list of 1,000 jobs reads no whole file."""
    from gptrain.jobs import progress

    path = progress.jsonl_path(job_dir(name))
    if path is None:  # nothing, or a HF Trainer's state: few such jobs, read each time
        return progress.latest(job_dir(name)).get("train", {})
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _tails.get(name)
    if cached is None or cached[0] != key:
        cached = _tails[name] = (key, progress.from_jsonl(path).get("train", {}))
    return cached[1]


WARM_AFTER_S = 2.0
WARM_BYTES = 1 << 20


def warm() -> None:
    """Read the long runs' metrics once, newest first, in the background shortly after the
    console starts (after its first pages), so the first look at a long run does not wait for
    its file to be parsed; files under 1 MiB take milliseconds when asked."""
    time.sleep(WARM_AFTER_S)
    for j in reversed(store.list_jobs()):
        path = metrics_path(j["name"])
        if path.is_file() and path.stat().st_size >= WARM_BYTES:
            metrics_of(j["name"])


def sync_checkpoints(name: str) -> None:
    """The job's checkpoint rows made to match its directory (what `gptrain checkpoints` does)."""
    from gptrain.jobs import records

    records.sync_checkpoints(name)


def job_detail(name: str) -> dict:
    """Everything the job page shows but the curves and logs."""
    known_job(name)
    refresh_states()
    job = store.get_job(name)
    sync_checkpoints(name)
    cfg = trainer_config(job_dir(name))
    values = secrets.load(name).values()
    spec = json.loads(secrets.mask(json.dumps(job.pop("spec")), values))
    ranks = job["nodes"] * job["accels"]
    for key in ("supervisor", "supervisor_pid", "run_id"):
        job.pop(key, None)
    if job.get("error"):
        job["error"] = secrets.mask(job["error"], values)
    events = [{**e, "message": secrets.mask(e["message"], values)} for e in store.events(name)]
    return {"job": job, "spec": spec, "ranks": ranks, "events": events,
            "checkpoints": checkpoints(name),
            "config": secrets.mask(cfg.read_text(), values) if cfg.is_file() else None}


def checkpoints(name: str) -> list[dict]:
    return [{k: c.get(k) for k in ("id", "name", "kind", "step", "train_loss", "eval_loss", "time", "size")}
            for c in store.checkpoints(name)]


def checkpoint_row(name: str, ckpt_id: str) -> dict:
    """The row of one of the job's checkpoints, its path checked to lie in its job dir."""
    known_job(name)
    if not ckpt_id.isascii() or not ckpt_id.isalnum():
        raise BadName(f"invalid checkpoint ID {ckpt_id!r}")
    row = next((c for c in store.checkpoints(name) if c["id"] == ckpt_id), None)
    if row is None:
        raise NotFound(f"job {name} has no checkpoint {ckpt_id}")
    path = Path(row["path"]).resolve()
    if not path.is_relative_to(job_dir(name).resolve()) or not path.exists():
        raise NotFound(f"checkpoint {ckpt_id} is no longer on disk")
    return row


def checkpoint_dir(name: str, ckpt_id: str) -> Path:
    """The directory (or file) of one of the job's checkpoints, checked to lie in its job dir."""
    return Path(checkpoint_row(name, ckpt_id)["path"]).resolve()


def log_path(name: str, rank: str) -> Path:
    """The log of a job's rank named in a URL (404 for junk such as `²` or `-1`, or a rank the job lacks)."""
    from gptrain.jobs.logs import check_rank, rank_log

    job = known_job(name)
    try:
        return rank_log(logs_dir(job_dir(name)), check_rank(rank, job["nodes"] * job["accels"]))
    except UserError as e:
        raise NotFound(f"job {name}: {e}") from None


def curves(name: str, x: str, max_points: int | None) -> dict:
    known_job(name)
    mf = metrics_of(name)
    return {key: mf.curve(key, x, max_points=max_points) for key in metrics.CURVES}


# ---- datasets ---------------------------------------------------------------------------------

_samples: dict[tuple, str] = {}


def datasets() -> list[dict]:
    from gptrain.data import store as data_store

    return [{**{k: d.get(k) for k in ("name", "kind", "tokenizer", "tokens", "bytes", "created")},
             "sample": sample(d["name"], d["path"]) if d.get("kind") in (None, "prepared") else None}
            for d in data_store.list_all()]


def sample(name: str, path: str, tokens: int = 160) -> str:
    """The first tokens of the dataset's train split, decoded (cached per dataset directory)."""
    key = (name, path)
    if key not in _samples:
        try:
            from gptrain.data.formats import open_split, read_meta
            from gptrain.tokenizers import from_spec

            split = "train" if "train" in read_meta(path)["splits"] else "val"
            ids = open_split(path, split)[:tokens].tolist()
            _samples[key] = from_spec(read_meta(path)["tokenizer"]).decode(ids)
        except (UserError, OSError, KeyError, ValueError) as e:
            return f"(no sample: {e})"
    return _samples[key]
