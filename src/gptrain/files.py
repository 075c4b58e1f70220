"""Reading files that someone else wrote (checkpoints, datasets, model directories).

Any file may be truncated, garbage or hostile. The readers here turn every way of failing to
decode one into a single UserError that names the file, and file names taken from such files
must be plain base names, so that nothing they list reaches outside their own directory.
The files a user names (a job file, a TOML or DeepSpeed config) are read here too, bounded:
`read_user_text` (a capped read, UTF-8) and `parse_user_text` (nesting and size checked).
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


USER_FILE_CAP = 4 << 20  # a job file, a TOML or DeepSpeed config, a requirements file: a few KiB each
MAX_NESTING = 32  # a job file nests 4 deep ({config: {data: {mix: {web: 0.7}}}})
MAX_ITEMS = 100_000  # items in a parsed file, an item reached twice (a YAML alias) counted twice


def read_user_text(path, what: str, cap: int = USER_FILE_CAP) -> str:
    """The text of a file the user named (a job file, a config): at most `cap` + 1 bytes are
    read, so /dev/zero, an endless pipe or a huge file cost `cap` and give one line; UTF-8 (a
    leading byte order mark dropped), else one line naming the first byte that is not. A pipe
    (`--config <(...)`) is read like a file."""
    shown_path = shown(path)
    try:
        with open(Path(path).expanduser(), "rb") as f:
            data = f.read(cap + 1)
    except FileNotFoundError:
        raise UserError(f"cannot read {what} {shown_path}: it does not exist") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {shown_path}: {e.strerror}") from None
    if len(data) > cap:
        raise UserError(f"{what} {shown_path} is larger than {cap >> 20} MiB, the most gptrain reads of one "
                        f"(a {what} is a few KiB): name the file you meant")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {shown_path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                        f"{e.start}): save it as UTF-8") from None


def parse_user_text(parse, text: str, what: str):
    """`parse(text)` (yaml.safe_load, tomllib.loads, json.loads) of a user's file, as plain
    data no deeper than MAX_NESTING and of at most MAX_ITEMS items: nesting past Python's
    recursion limit, or a YAML alias bomb, is one line instead of a traceback or a hang. The
    parser's own errors are the caller's to word."""
    try:
        data = parse(text)
    except RecursionError:
        raise UserError(f"{what} nests deeper than Python can read (more than {MAX_NESTING} levels "
                        "is never a gptrain setting)") from None
    check_shape(data, what)
    return data


def check_shape(data, what: str, depth: int = MAX_NESTING, items: int = MAX_ITEMS) -> None:
    """One UserError when `data` (parsed from a user's file) nests deeper than `depth` levels or
    holds more than `items` items; looked at without recursion, stopping at the limit."""
    stack, seen = [(data, 1)], 0
    while stack:
        value, level = stack.pop()
        if not isinstance(value, (dict, list)):
            continue
        children = list(value.values()) if isinstance(value, dict) else value
        if level > depth:
            raise UserError(f"{what} nests deeper than {depth} levels, which is never a gptrain setting")
        seen += len(children)
        if seen > items:
            raise UserError(f"{what} holds more than {items} items (YAML aliases counted each time they "
                            "are used), which is never a gptrain setting")
        stack.extend((child, level + 1) for child in children)


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
