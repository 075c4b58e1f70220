"""What the console shows beyond jobs/api.py (which it calls for every job, as the CLI does):
the curves of a job's metrics.jsonl (one cached reader per file, ui/metrics.py), the sweeps
(`gptrain sweep inspect`'s report, each trial's eval-loss curve) and the datasets list with a
sample of each.
"""

from __future__ import annotations

import time

from gptrain.data import api as data_api
from gptrain.errors import UserError
from gptrain.jobs import api
from gptrain.ui import metrics


def metrics_of(name: str) -> metrics.Chart:
    return metrics.of(api.metrics_path(name))


WARM_AFTER_S = 2.0
WARM_BYTES = 1 << 20


def warm() -> None:
    """Read the long runs' metrics once, newest first, in the background shortly after the
    console starts (after its first pages), so the first look at a long run does not wait for
    its file to be parsed; files under 1 MiB take milliseconds when asked."""
    time.sleep(WARM_AFTER_S)
    for j in reversed(api.rows()):
        path = api.metrics_path(j["name"])
        if path.is_file() and path.stat().st_size >= WARM_BYTES:
            metrics_of(j["name"])


def curves(name: str, x: str, max_points: int | None) -> dict:
    mf = metrics_of(name)
    return {key: mf.curve(key, x, max_points=max_points) for key in metrics.CURVES}


def forget(name: str) -> None:
    """Remove job `name` (as `gptrain rm` does) and drop the console's reader of its metrics."""
    path = api.metrics_path(name)
    api.remove(name)
    metrics.forget(path)


# ---- sweeps -----------------------------------------------------------------------------------

def sweeps() -> list[dict]:
    """Each sweep as `gptrain sweep list` shows it: its report without the trials' rows (a sweep
    whose files are damaged shows its one line instead)."""
    out = []
    for name in api.sweeps():
        try:
            report = api.sweep_report(name)
        except UserError as e:
            out.append({"name": name, "error": str(e)})
            continue
        out.append({**{k: v for k, v in report.items() if k not in ("trials", "spec")},
                    "trials": report["spec"]["trials"], "params": list(report["spec"]["params"])})
    return out


def sweep(name: str, max_points: int | None) -> dict:
    """`gptrain sweep inspect NAME`'s report, each trial with its eval-loss curve by step."""
    report = api.sweep_report(name)
    for t in report["trials"]:
        t["curve"] = curves(t["job"], "step", max_points)["eval_loss"] if t["job"] and t["job_state"] else None
    return report


# ---- datasets ---------------------------------------------------------------------------------

def datasets() -> list[dict]:
    """The named datasets (data/api.py), each prepared one with a decoded sample of its first tokens."""
    return [{**{k: d.get(k) for k in ("name", "kind", "tokenizer", "tokens", "bytes", "created", "state")},
             "sample": sample(d["path"]) if d["kind"] == "prepared" and not d["remote"] else None}
            for d in data_api.datasets()]


def sample(path: str, tokens: int = 160) -> str:
    try:
        return data_api.sample(path, tokens)
    except (UserError, OSError, KeyError, ValueError) as e:
        return f"(no sample: {e})"
