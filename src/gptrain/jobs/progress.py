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

from pathlib import Path

from gptrain.jobs.folder import metrics_files
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

