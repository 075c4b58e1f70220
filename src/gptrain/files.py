"""Reading files that someone else wrote (checkpoints, datasets, model directories).

Any file may be truncated, garbage or hostile. The readers here turn every way of failing to
decode one into a single UserError that names the file, and file names taken from such files
must be plain base names, so that nothing they list reaches outside their own directory.
No heavy imports at module level: the CLI's listing commands use this.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

from gptrain.errors import UserError


def is_plain_name(name) -> bool:
    """A file name with no directory part: not empty, '.', '..', absolute, or holding '/', '\\' or NUL."""
    return (isinstance(name, str) and name not in ("", ".", "..")
            and not any(c in name for c in "/\\\0"))


def shown(name) -> str:
    """A file name or path from disk as text any terminal, JSON, SQLite or zip takes: bytes that
    are not UTF-8 as \\xNN, a newline or another control character escaped (\\n, \\x1b)."""
    text = os.fsencode(str(name)).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def check_plain_name(name, where) -> str:
    if not is_plain_name(name):
        raise UserError(f"{where} names the file {name!r}, which is not a plain file name in its "
                        "own directory; the file was not written by gptrain or was tampered with")
    return name


def is_num(v) -> bool:
    """A number read from a file: an int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def number(v) -> float | None:
    """v as a float when it is a real number (not a bool, not NaN), else None."""
    return float(v) if is_num(v) and v == v else None


def within(path, root) -> bool:
    """Whether `path`, links followed, lies inside `root`: what a copy or a zip of a job's files
    may take (a link a job's program made to /etc/shadow is left out)."""
    try:
        return Path(path).resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


@contextmanager
def reading(path, what: str = "file"):
    """Turn any error decoding `path` (or interpreting what was decoded) into one UserError.

    A UserError raised inside keeps its message, prefixed with the file when it does not name it.
    """
    try:
        yield
    except UserError as e:
        if str(path) in str(e):
            raise
        raise UserError(f"{what} {path}: {e}") from None
    except FileNotFoundError:
        raise UserError(f"{what} {path} is missing") from None
    except Exception as e:  # decoders raise many types: JSONDecodeError, SafetensorError, KeyError...
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UserError(f"{what} {path} is corrupt or not what gptrain expects "
                        f"({type(e).__name__}{': ' + detail if detail else ''})") from None


def read_json(path, what: str = "file") -> dict:
    """A JSON object from `path`; UserError naming the file when it is missing, not JSON or not an object."""
    with reading(path, what):
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    return data


def read_safetensors(path, what: str = "safetensors file") -> dict:
    """The tensors of a safetensors file (never code); UserError naming it when it is corrupt."""
    from safetensors.torch import load_file

    with reading(path, what):
        return load_file(path)


class SafetensorsFile:
    """The tensors of a safetensors file as a read-only mapping, each read from the file when
    it is asked for (the file is mapped only while one tensor is read): a model loads tensor by
    tensor, never whole twice in memory. Never code; UserError naming the file when corrupt."""

    def __init__(self, path, what: str = "safetensors file"):
        from safetensors import safe_open

        self.path, self.what = path, what
        with reading(path, what), safe_open(path, "pt") as f:
            self._keys = list(f.keys())
        self._known = set(self._keys)

    def __getitem__(self, key: str):
        from safetensors import safe_open

        if key not in self._known:
            raise KeyError(key)
        with reading(self.path, self.what), safe_open(self.path, "pt") as f:
            return f.get_tensor(key)

    def __contains__(self, key) -> bool:
        return key in self._known

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self):
        return list(self._keys)

    def items(self):
        return ((k, self[k]) for k in self._keys)


def read_torch_weights(path, what: str = "weights file") -> dict:
    """A torch.save file loaded with weights_only=True (tensors and plain containers only)."""
    import torch

    with reading(path, what):
        return torch.load(path, map_location="cpu", weights_only=True)
