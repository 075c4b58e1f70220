"""Where gptrain keeps its state: $GPTRAIN_HOME (default ~/.gptrain)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gptrain.errors import BadName

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def home() -> Path:
    return Path(os.environ.get("GPTRAIN_HOME") or Path.home() / ".gptrain").expanduser()


def make_private() -> None:
    """What gptrain writes under $GPTRAIN_HOME (database, jobs, logs, secrets, a job's
    environment file) is the user's alone: files 0600, directories 0700 (a umask for this process
    and what it starts). A home another user owns is refused: they could change what the user's
    jobs run (its secrets/*.env holds a job's PYTHONPATH); one of the user's own that others may
    write is made 0700 again, with a note."""
    import stat
    import sys

    from gptrain.errors import UserError

    os.umask(0o077)
    path = home()
    try:
        path.mkdir(parents=True, mode=0o700)
        os.chmod(path, 0o700)
        return
    except FileExistsError:
        pass  # there already (maybe made a moment ago by another rank of the same job)
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"GPTRAIN_HOME {path} is not a folder; point GPTRAIN_HOME at a folder of your own")
    if st.st_uid != os.getuid():
        raise UserError(f"GPTRAIN_HOME {path} belongs to another user (uid {st.st_uid}), who could change what "
                        "your jobs run; use a folder of your own (GPTRAIN_HOME=~/.gptrain, the default)")
    if st.st_mode & 0o022:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
        print(f"gptrain: note: {path} could be written by other users; it is yours alone again (0700)",
              file=sys.stderr)


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
