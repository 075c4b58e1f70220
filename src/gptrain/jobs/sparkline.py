"""A loss curve in one line of text, for `gptrain inspect` (and any face that wants one): ▇▅▄▃▂▂▁▁ (each character the mean of
its share of the train rows, scaled between the lowest and highest of them)."""

from __future__ import annotations

from pathlib import Path

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 48) -> str:
    values = [v for v in values if v is not None and v == v]  # no None, no NaN
    if not values:
        return ""
    n = min(width, len(values))
    means = [sum(part) / len(part) for part in
             (values[i * len(values) // n:(i + 1) * len(values) // n] for i in range(n))]
    lo, hi = min(means), max(means)
    span = (hi - lo) or 1.0
    return "".join(BARS[round((m - lo) / span * (len(BARS) - 1))] for m in means)


def loss_line(metrics_file: Path | None, width: int = 48) -> str | None:
    """'▇▅▃▂▁ 3.41 -> 1.87 (120 steps)' for a job's metrics.jsonl, or None without train rows."""
    from gptrain.jobs.metrics_file import MetricsFile

    if metrics_file is None:
        return None
    mf = MetricsFile(metrics_file)
    if not mf.refresh():
        return None
    cols = mf.cols["train"]
    losses = [v for v in cols["loss"] if v == v]
    return f"{sparkline(losses, width)}  {losses[0]:.4g} -> {losses[-1]:.4g} ({int(cols['step'][-1])} steps)"
