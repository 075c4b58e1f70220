"""Checkpoint directories on disk, without importing torch (the CLI lists them fast).

A checkpoint is a directory with trainer_state.json and DCP's .metadata; OUTPUT/checkpoints/latest
names the newest complete one (train/checkpoint.py writes them).
"""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import UserError
from gptrain.files import is_plain_name, read_json

STATE_FILE = "trainer_state.json"


def is_checkpoint_dir(path) -> bool:
    p = Path(path)
    return (p / STATE_FILE).is_file() and (p / ".metadata").is_file()


def read_state(path) -> dict:
    """trainer_state.json of a checkpoint (UserError naming it when it is corrupt)."""
    state = read_json(Path(path) / STATE_FILE, "checkpoint state")
    if not isinstance(state.get("step"), int):
        raise UserError(f"checkpoint state {Path(path) / STATE_FILE} has no integer 'step'; "
                        "it is corrupt: use another checkpoint")
    return state


def find_latest(output_dir) -> Path | None:
    """The newest complete checkpoint under OUTPUT/checkpoints (None if there is none)."""
    ckpt_root = Path(output_dir) / "checkpoints"
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        name = pointer.read_text(errors="replace").strip()
        if is_plain_name(name) and is_checkpoint_dir(ckpt_root / name):  # never a path outside
            return ckpt_root / name
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
