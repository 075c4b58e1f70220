"""Recorded jobs without running them (for the console's HTTP tests and bench/ui_speed.py): a
row in the real job store (jobs/store.py), a job directory with logs and a metrics.jsonl in the
trainer's own format."""

import json
from pathlib import Path


def record_job(name: str, state: str = "succeeded", rows: int = 100, secrets: dict | None = None,
               log: str = "step 1 | loss 3.0\n", eval_every: int = 10, error: str | None = None) -> Path:
    from gptrain import run_layout
    from gptrain.jobs import secrets as secrets_mod
    from gptrain.jobs import store
    from gptrain.jobs.folder import job_dir, logs_dir
    from gptrain.jobs.logs import rank_log
    from gptrain.jobs.spec import JobSpec

    spec = JobSpec(name=name, accels=2, secrets=secrets or {}, args=["--train.max_steps=100"])
    store.create_job(name, spec.to_dict(), 1, 2, "local")
    secrets_mod.save(name, spec.secrets)
    if state != "queued":
        message = "recorded by a test" if state != "failed" else (error or "rank 0: boom")
        store.set_state(name, state, message, **({"error": error} if error else {}))
    d = job_dir(name)
    logs_dir(d).mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        rank_log(logs_dir(d), rank).write_text(log)
    write_metrics(run_layout.metrics_file(d), rows, eval_every)
    return d


def write_metrics(path: Path, rows: int, eval_every: int = 10, start: int = 1) -> None:
    lines = []
    for s in range(start, start + rows):
        lines.append(json.dumps({"step": s, "time": 1000.0 + s, "train/loss": 3.0 / s ** 0.3,
                                 "train/lr": 1e-3, "train/tokens_per_s": 1000.0 + s % 7,
                                 "train/mfu": 0.01, "train/tokens": s * 128}))
        if eval_every and s % eval_every == 0:
            lines.append(json.dumps({"step": s, "time": 1000.0 + s, "eval/loss": 3.2 / s ** 0.3,
                                     "eval/perplexity": 20.0}))
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")
