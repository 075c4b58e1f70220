"""How far a job got, for `gptrain jobs` / `inspect`: its last train and eval records.

Read, without torch, from the first of:
  jobs/NAME/metrics.jsonl          the built-in trainer's
  jobs/NAME/output/metrics.jsonl   a script's $GPTRAIN_OUTPUT_DIR/metrics.jsonl: one JSON object
                                   a line, {"step": 100, "train/loss": 2.31, "eval/loss": 2.40,
                                   ...} as the built-in trainer writes (docs/script-outputs.md)
  a Hugging Face trainer_state.json  the newest among output/ and the checkpoint-N/ folders
                                   under output/ and checkpoints/: its log_history's last "loss"
                                   and "eval_loss" records (weights/hf.py reads it)
"""

from __future__ import annotations

import time
from pathlib import Path

from gptrain.jobs.folder import job_dir, metrics_files
from gptrain.jobs.found import ROOTS
from gptrain.jobs.metrics_file import MetricsFile
from gptrain.weights import hf

TAIL_BYTES = 65536


def latest(job_dir) -> dict:
    """{'train': {'step', 'loss', ...}, 'eval': {...}}, either missing when nothing says."""
    job_dir = Path(job_dir)
    path = jsonl_path(job_dir)
    if path is not None:
        return from_jsonl(path)
    state = hf.newest_trainer_state(job_dir / root for root in ROOTS)
    return hf.last_records(state) if state else {}


def jsonl_path(job_dir: Path) -> Path | None:
    """The job's metrics.jsonl (the built-in trainer's, else its script's), or None."""
    for path in metrics_files(job_dir):
        if path.is_file():
            return path
    return None


def from_jsonl(path: Path) -> dict:
    """The last train and eval records of a metrics.jsonl (read from its last TAIL_BYTES by
    jobs/metrics_file.py; bad lines skipped)."""
    mf = MetricsFile(path, tail_bytes=TAIL_BYTES)
    mf.refresh()
    out = {prefix: rec for prefix in ("train", "eval") if (rec := mf.last_record(prefix))}
    times = mf.cols["train"]["time"]
    if "train" in out and len(times) >= 2 and times[-1] > times[-2]:  # how often a train record comes
        out["train"] = {**out["train"], "progress": {**out["train"].get("progress", {}),
                                                     "interval_s": times[-1] - times[-2]}}
    return out


def summary(job_dir, started: float | None, ended: float | None, now: float) -> dict:
    """What `inspect` sums up of a run: its wall time (started to ended, or now), the tokens it
    has trained on and their average rate since the job started, the mean of its logged
    MFU (the records of the last TAIL_BYTES), and the checkpoint it keeps as its best
    (checkpoint.keep_best); each left out when nothing says."""
    from gptrain.weights.layout import best_checkpoint

    job_dir, out = Path(job_dir), {}
    if started:
        out["wall_s"] = (ended or now) - started
    path = jsonl_path(job_dir)
    if path is not None:
        mf = MetricsFile(path, tail_bytes=TAIL_BYTES)
        mf.refresh()
        cols = mf.cols["train"]
        seen = [(t, n) for t, n in zip(cols["time"], cols["tokens"]) if n == n and t == t]
        if seen:
            last_time, tokens = seen[-1]
            out["tokens_seen"] = int(tokens)
            if started and last_time > started:  # since the job first started (restarts' waits included)
                out["avg_tokens_per_s"] = tokens / (last_time - started)
        mfu = [m for m in cols["mfu"] if m == m]
        if mfu:
            out["mean_mfu"] = sum(mfu) / len(mfu)
    best = best_checkpoint(job_dir)
    if best is not None:
        out["best_checkpoint"] = best.name
    return out


_tails: dict[str, tuple] = {}  # job -> (its metrics.jsonl's identity, its last train record)
STALL_AFTER_S = 60.0  # no train record for this long past the expected one: the job is stalled
STALL_INTERVALS = 3  # ... and for this many of its usual intervals between records


def how_far(progress: dict, state: str, now: float | None = None) -> dict:
    """The jobs table's total_steps, eta_s (seconds left, counted from the last logged step's
    time and estimate; only while the job runs) and stalled_s: while it runs, the seconds since
    its last train record once that is well past the next one's due (STALL_AFTER_S, and
    STALL_INTERVALS of its usual interval; with one record, its projected end passed by
    STALL_AFTER_S), when the ETA would say 0s or count down a job that makes no step."""
    total, eta, at, interval = (progress.get(k) for k in ("total_steps", "eta_s", "time", "interval_s"))
    now = time.time() if now is None else now
    left = stalled = None
    if state == "running" and at is not None:
        quiet = now - at
        if interval:  # records come every `interval`: the next is due well before this
            due = max(STALL_AFTER_S, STALL_INTERVALS * interval)
        else:  # one record: its projected end
            due = eta + STALL_AFTER_S if eta is not None else None
        if due is not None and quiet > due:
            stalled = quiet
        elif eta is not None:
            left = max(0.0, at + eta - now)
    return {"total_steps": int(total) if total is not None else None, "eta_s": left, "stalled_s": stalled}


def last_train(name: str) -> dict:
    """The job's latest train record, read again only when its metrics.jsonl
    changed: a table of 1,000 jobs reads no whole file."""
    d = job_dir(name)
    path = jsonl_path(d)
    if path is None:  # nothing, or a HF Trainer's state: few such jobs, read each time
        return latest(d).get("train", {})
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _tails.get(name)
    if cached is None or cached[0] != key:
        cached = _tails[name] = (key, from_jsonl(path).get("train", {}))
    return cached[1]
