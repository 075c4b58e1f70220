"""A job's metrics.jsonl (written by the built-in trainer), read incrementally.

Each file is read from the byte offset where the last read stopped, whole lines only (a line the
trainer is still writing waits for the next read), so a live chart costs only the new rows per
tick, never a re-parse of the file. A file that shrank or was replaced (a job removed and
submitted again under the same name) is read again from the start. Columns are float arrays
(NaN where a row lacks the value): 10^6 rows of 7 values take 56 MB.
"""

from __future__ import annotations

import json
import os
import threading
from array import array
from pathlib import Path

TRAIN_KEYS = ("loss", "lr", "tokens_per_s", "mfu", "tokens")
CURVES = {"loss": ("train", "loss"), "eval_loss": ("eval", "loss"), "lr": ("train", "lr"),
          "tokens_per_s": ("train", "tokens_per_s"), "mfu": ("train", "mfu")}
XS = ("step", "tokens", "time")
BLOCK = 1 << 20  # bytes parsed at a time (one json.loads holds the GIL: short, so requests interleave)


class MetricsFile:
    """The parsed rows of one metrics.jsonl, as growing columns per prefix (train, eval)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self._reset(None)

    def _reset(self, ident) -> None:
        self.ident, self.offset = ident, 0
        self.cols = {"train": {k: array("d") for k in ("step", "time", *TRAIN_KEYS)},
                     "eval": {k: array("d") for k in ("step", "time", "loss")}}

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
                    while self.offset < st.st_size:  # in blocks: a 10^6-row file never sits whole in memory
                        block = f.read(min(BLOCK, st.st_size - self.offset))
                        end = block.rfind(b"\n") + 1
                        if not end:
                            if len(block) < BLOCK:
                                break  # a row still being written: next time
                            end = len(block)  # a line longer than a block is no metrics row: skipped
                        self._add(block[:end].decode(errors="replace").splitlines())
                        self.offset += end
                        f.seek(self.offset)
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
                values = [r.get(name, NAN) for r in rows]
                try:
                    col.extend(array("d", values))
                except TypeError:  # a null or a string among them: NaN in its place
                    col.extend(_number(v) for v in values)

    def last(self, prefix: str = "train") -> dict:
        cols = self.cols[prefix]
        if not cols["step"]:
            return {}
        return {k: (int(v[-1]) if k == "step" else v[-1]) for k, v in cols.items() if v[-1] == v[-1]}

    def count(self, prefix: str = "train") -> int:
        return len(self.cols[prefix]["step"])

    def curve(self, name: str, x: str = "step", start: int = 0, max_points: int | None = None) -> dict:
        """One curve ({x: [...], y: [...], total: rows}) from row `start` on, downsampled to
        max_points when given. x: step, tokens (from the trainer's count) or time (seconds since
        the first row). Rows without the value are left out."""
        import numpy as np  # here, so `gptrain inspect` (sparkline.py) starts without it

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


def _number(v) -> float:
    return float(v) if isinstance(v, (int, float)) else NAN


NAN = float("nan")
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
