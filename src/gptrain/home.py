"""Where gptrain keeps its state: $GPTRAIN_HOME (default ~/.gptrain)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gptrain.errors import BadName

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def home() -> Path:
    return Path(os.environ.get("GPTRAIN_HOME") or Path.home() / ".gptrain").expanduser()


def check_name(name: str, kind: str) -> str:
    """Dataset and job names: lowercase letters, digits, '.', '_', '-'; 1-64 chars."""
    if not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise BadName(f"invalid {kind} name {name!r}: use 1-64 characters from a-z 0-9 . _ - "
                        "starting with a letter or digit")
    return name


def sweep_leftovers() -> None:
    """What a killed `data push` / `data rm` / `run` left half-made is removed by the next command."""
    from gptrain.atomic import sweep_leftovers as sweep

    sweep(home() / "datasets", home() / "jobs")
