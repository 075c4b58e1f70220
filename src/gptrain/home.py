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


def user_setting(section: str, key: str):
    """A value from the user's settings, $GPTRAIN_HOME/config.toml ([defaults], [local], [slurm],
    [kubernetes], [ray]), or None."""
    import tomllib

    from gptrain.errors import UserError
    from gptrain.files import parse_user_text, read_user_text

    path = home() / "config.toml"
    if not path.is_file():
        return None
    try:
        settings = parse_user_text(tomllib.loads, read_user_text(path, "settings file"), str(path))
        return settings.get(section, {}).get(key)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {e}") from None
