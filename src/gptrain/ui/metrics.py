"""The console's charts of a job's metrics.jsonl: curves drawn from the library's incremental
reader (jobs/metrics_file.py), one cached reader per file for all the pages that show it."""

from __future__ import annotations

import threading
from pathlib import Path

from gptrain.jobs.api import MetricsFile

CURVES = {"loss": ("train", "loss"), "eval_loss": ("eval", "loss"), "lr": ("train", "lr"),
          "grad_norm": ("train", "grad_norm"),
          "tokens_per_s": ("train", "tokens_per_s"), "mfu": ("train", "mfu")}
XS = ("step", "tokens", "time")


class Chart(MetricsFile):
    """A metrics.jsonl reader that also draws its columns as curves."""

    def curve(self, name: str, x: str = "step", start: int = 0, max_points: int | None = None) -> dict:
        """One curve ({x: [...], y: [...], total: rows}) from row `start` on, downsampled to
        max_points when given. x: step, tokens (from the trainer's count) or time (seconds since
        the first row). Rows without the value are left out."""
        import numpy as np  # here: the console's pages, not its start, need it

        from gptrain.ui.downsample import minmax

        prefix, key = CURVES[name]
        with self.lock:
            cols = self.cols[prefix]
            total = len(cols["step"])
            ya = np.array(cols[key][start:])
            if x == "time":
                xa = np.array(cols["time"][start:]) - (cols["time"][0] if total else 0)
            elif x == "tokens" and prefix == "eval":
                xa = np.array(cols["step"][start:]) * self._tokens_per_step()
            else:
                xa = np.array(cols["tokens" if x == "tokens" else "step"][start:])
        ok = ~(np.isnan(xa) | np.isnan(ya))
        xa, ya = xa[ok], ya[ok]
        if max_points:
            xa, ya = minmax(xa, ya, max_points)
        return {"x": xa.tolist(), "y": ya.tolist(), "total": total}

    def _tokens_per_step(self) -> float:
        """The trainer's tokens per step (constant in a run), from its latest train row."""
        train = self.cols["train"]
        for step, tokens in zip(reversed(train["step"]), reversed(train["tokens"])):
            if step and tokens == tokens:
                return tokens / step
        return float("nan")


_files: dict[Path, Chart] = {}
_files_lock = threading.Lock()


def of(path: Path) -> Chart:
    """The cached reader of a metrics.jsonl, brought up to date."""
    with _files_lock:
        mf = _files.get(path)
        if mf is None:
            mf = _files[path] = Chart(path)
    mf.refresh()
    return mf


def forget(path: Path) -> None:
    with _files_lock:
        _files.pop(path, None)
