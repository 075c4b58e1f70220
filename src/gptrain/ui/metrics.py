"""A job's metrics.jsonl (written by the built-in trainer), read incrementally.

Each file is read from the byte offset where the last read stopped, whole lines only (a line the
trainer is still writing waits for the next read), so a live chart costs only the new rows per
tick, never a re-parse of the file. A file that shrank or was replaced (a job removed and
submitted again under the same name) is read again from the start.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np

from gptrain.ui.downsample import minmax

TRAIN_KEYS = ("loss", "lr", "tokens_per_s", "mfu", "tokens")
CURVES = {"loss": ("train", "loss"), "eval_loss": ("eval", "loss"), "lr": ("train", "lr"),
          "tokens_per_s": ("train", "tokens_per_s"), "mfu": ("train", "mfu")}
XS = ("step", "tokens", "time")


class MetricsFile:
    """The parsed rows of one metrics.jsonl, as growing columns per prefix (train, eval)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self._reset(None)

    def _reset(self, ident) -> None:
        self.ident, self.offset = ident, 0
        self.cols = {"train": {k: [] for k in ("step", "time", *TRAIN_KEYS)},
                     "eval": {k: [] for k in ("step", "time", "loss")}}

    def refresh(self) -> int:
        """Read what was appended since the last call; the number of train rows now known."""
        with self.lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._reset(None)
                return 0
            ident = (st.st_dev, st.st_ino)
            if ident != self.ident or st.st_size < self.offset:
                self._reset(ident)
            if st.st_size > self.offset:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    chunk = f.read(st.st_size - self.offset)
                end = chunk.rfind(b"\n") + 1
                if end:
                    self._add(chunk[:end].decode(errors="replace").splitlines())
                    self.offset += end
            return len(self.cols["train"]["step"])

    def _add(self, lines: list[str]) -> None:
        lines = [ln for ln in lines if ln.strip()]
        try:  # one parse for the whole chunk: several times faster than a loads() per line
            records = json.loads("[" + ",".join(lines) + "]")
        except json.JSONDecodeError:
            records = []
            for ln in lines:
                try:
                    records.append(json.loads(ln))
                except json.JSONDecodeError:
                    continue  # a torn or foreign line: skipped, as `gptrain jobs` skips it
        for prefix, cols in self.cols.items():
            rows = [r for r in records if isinstance(r, dict) and f"{prefix}/loss" in r]
            for key, col in cols.items():
                name = key if key in ("step", "time") else f"{prefix}/{key}"
                col.extend(r.get(name) for r in rows)

    def last(self, prefix: str = "train") -> dict:
        cols = self.cols[prefix]
        return {k: v[-1] for k, v in cols.items() if v} if cols["step"] else {}

    def count(self, prefix: str = "train") -> int:
        return len(self.cols[prefix]["step"])

    def curve(self, name: str, x: str = "step", start: int = 0, max_points: int | None = None) -> dict:
        """One curve ({x: [...], y: [...], total: rows}) from row `start` on, downsampled to
        max_points when given. x: step, tokens (from the trainer's count) or time (seconds since
        the first row). Rows without the value are left out."""
        prefix, key = CURVES[name]
        with self.lock:
            cols = self.cols[prefix]
            total = len(cols["step"])
            ys = cols[key][start:]
            if x == "time":
                t0 = cols["time"][0] if cols["time"] else 0
                xs = [t - t0 if t is not None else None for t in cols["time"][start:]]
            elif x == "tokens" and prefix == "eval":
                xs = self._tokens_at(cols["step"][start:])
            else:
                xs = cols["tokens" if x == "tokens" else "step"][start:]
        xa = np.array([v if v is not None else np.nan for v in xs], dtype=float)
        ya = np.array([v if v is not None else np.nan for v in ys], dtype=float)
        ok = ~(np.isnan(xa) | np.isnan(ya))
        xa, ya = xa[ok], ya[ok]
        if max_points:
            xa, ya = minmax(xa, ya, max_points)
        return {"x": xa.tolist(), "y": ya.tolist(), "total": total}

    def _tokens_at(self, steps: list) -> list:
        """Tokens at eval steps: the train rows' tokens per step (the trainer's is constant)."""
        train = self.cols["train"]
        per_step = next((t / s for s, t in zip(reversed(train["step"]), reversed(train["tokens"]))
                         if t and s), None)
        return [s * per_step if per_step and s is not None else None for s in steps]


_files: dict[Path, MetricsFile] = {}
_files_lock = threading.Lock()


def of(path: Path) -> MetricsFile:
    """The cached reader of a metrics.jsonl, brought up to date."""
    with _files_lock:
        mf = _files.get(path)
        if mf is None:
            mf = _files[path] = MetricsFile(path)
    mf.refresh()
    return mf


def forget(path: Path) -> None:
    with _files_lock:
        _files.pop(path, None)
