"""Checkpoint directories on disk, without importing torch (the CLI lists them fast).

A checkpoint is a directory with trainer_state.json and DCP's .metadata; OUTPUT/checkpoints/latest
names the newest complete one (train/checkpoint.py writes them).
"""

from __future__ import annotations

import json
from pathlib import Path

from gptrain.errors import UserError

STATE_FILE = "trainer_state.json"


def is_checkpoint_dir(path) -> bool:
    p = Path(path)
    return (p / STATE_FILE).is_file() and (p / ".metadata").is_file()


def read_state(path) -> dict:
    return json.loads((Path(path) / STATE_FILE).read_text())


def find_latest(output_dir) -> Path | None:
    """The newest complete checkpoint under OUTPUT/checkpoints (None if there is none)."""
    ckpt_root = Path(output_dir) / "checkpoints"
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        candidate = ckpt_root / pointer.read_text().strip()
        if is_checkpoint_dir(candidate):
            return candidate
    done = sorted(p for p in ckpt_root.glob("step-*") if is_checkpoint_dir(p))
    return done[-1] if done else None


def resolve(path) -> Path:
    """A checkpoint directory from a checkpoint directory or a training output directory."""
    p = Path(path)
    if is_checkpoint_dir(p):
        return p
    latest = find_latest(p)
    if latest is None:
        raise UserError(f"{path} is not a gptrain checkpoint (no {STATE_FILE}) and holds none")
    return latest
