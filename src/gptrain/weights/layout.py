"""gptrain's own checkpoint layout, without importing torch (the CLI lists checkpoints fast).

    OUTPUT/checkpoints/step-000100/   trainer_state.json and DCP's .metadata (weights/dcp.py)
    OUTPUT/checkpoints/latest         the name of the newest complete one

train/checkpoint.py writes them. "Which is newer" among them is `by_step`: the number in the
name (weights/names.py's step_of, as weights/scan.py orders every kind), compared as a number,
never as text (step-10 is newer than step-9 whatever the padding).
"""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import UserError
from gptrain.files import is_plain_name, read_json
from gptrain.weights.names import step_of

STATE_FILE = "trainer_state.json"


def root_of(output_dir) -> Path:
    """OUTPUT/checkpoints: where a training run's checkpoints and `latest` live."""
    return Path(output_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def complete(root) -> list[Path]:
    """The complete checkpoints in OUTPUT/checkpoints, oldest to newest."""
    return by_step(p for p in Path(root).glob("step-*") if is_checkpoint_dir(p))


def by_step(paths) -> list[Path]:
    """Paths oldest to newest by the step in their names (then by name)."""
    return sorted(paths, key=lambda p: (step_of(Path(p).name) or -1, str(p)))


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
    """The newest complete checkpoint under OUTPUT/checkpoints (None if there is none): the one
    `latest` names, else the highest step."""
    ckpt_root = root_of(output_dir)
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        name = pointer.read_text(errors="replace").strip()
        if is_plain_name(name) and is_checkpoint_dir(ckpt_root / name):  # never a path outside
            return ckpt_root / name
    done = complete(ckpt_root)
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
