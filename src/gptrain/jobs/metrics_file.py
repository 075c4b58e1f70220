"""The one reader of a job's metrics.jsonl (the built-in trainer's, or a script's), read
incrementally: the console's charts (ui/metrics.py), the jobs row and `inspect` (jobs/progress.py)
and its sparkline (jobs/sparkline.py) all read through MetricsFile.

Each file is read from the byte offset where the last read stopped, whole lines only (a line the
trainer is still writing waits for the next read), so a live chart costs only the new rows per
tick, never a re-parse of the file. A file that shrank or was replaced (a job removed and
submitted again under the same name) is read again from the start. Columns are float arrays
(NaN where a row lacks the value): 10^6 rows of 8 values take 64 MB. With `tail_bytes` only the
file's last that many bytes are read at first (the first, partial line dropped): a jobs list of
long runs reads no whole file.
"""

from __future__ import annotations

import json
import os
import threading
from array import array
from pathlib import Path

from gptrain.files import is_num

TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "tokens")
PROGRESS_KEYS = ("time", "total_steps", "eta_s")  # a row's own (train/metrics.py): how far the run is
BLOCK = 1 << 20  # bytes parsed at a time (one json.loads holds the GIL: short, so requests interleave)


class MetricsFile:
    """The parsed rows of one metrics.jsonl, as growing columns per prefix (train, eval)."""

    def __init__(self, path: Path, tail_bytes: int | None = None):
        self.path, self.tail_bytes = path, tail_bytes
        self.lock = threading.Lock()
        self._reset(None)

    def _reset(self, ident, size: int = 0) -> None:
        self.ident, self.offset, self.skip_partial = ident, 0, False
        if self.tail_bytes is not None and size > self.tail_bytes:
            self.offset, self.skip_partial = size - self.tail_bytes, True
        self.records: dict[str, dict] = {}  # per prefix: the last record's {step, prefix/* numbers}
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
                self._reset(ident, st.st_size)
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
                        lines = block[:end].decode(errors="replace").splitlines()
                        if self.skip_partial:  # started inside a line: not a whole record
                            lines, self.skip_partial = lines[1:], False
                        self._add(lines)
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
            for r in reversed(rows):
                if isinstance(r.get("step"), int) and is_num(r[f"{prefix}/loss"]):
                    progress = {k: r[k] for k in PROGRESS_KEYS if is_num(r.get(k))}
                    self.records[prefix] = {"step": r["step"], **{k.split("/", 1)[1]: v for k, v in r.items()
                                                                  if k.startswith(prefix + "/") and is_num(v)},
                                            **({"progress": progress} if progress else {})}
                    break
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

    def last_record(self, prefix: str = "train") -> dict:
        """The last record with an integer step and a numeric PREFIX/loss: its step, every
        numeric PREFIX/* value (the prefix left out) and its `progress`: the row's time,
        total_steps and eta_s, when it has any ({} when there is no such record)."""
        return dict(self.records.get(prefix, {}))

    def count(self, prefix: str = "train") -> int:
        return len(self.cols[prefix]["step"])

def _number(v) -> float:
    return float(v) if isinstance(v, (int, float)) else NAN


NAN = float("nan")
