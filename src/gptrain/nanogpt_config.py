"""nanoGPT's config files (its config/train_shakespeare_char.py, train_gpt2.py, ...), read
without running them.

nanoGPT's configurator exec()s such a file: module-level `name = value` lines over train.py's
globals. gptrain never runs a config file's code: each statement must be one assignment of a
nanoGPT config key (hf_flags.NANOGPT_KEYS) to a literal (a number, a string, True/False) or
arithmetic on numbers (`gradient_accumulation_steps = 5 * 8`); anything else is one line naming
the file and its line. The keys then apply as their `--key=value` flags would, before the flags
that follow the file on the command line (as nanoGPT's configurator applies them).

    read("config/train_shakespeare_char.py") -> [("out_dir", "out-shakespeare-char"), ...]
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path

from gptrain.errors import UserError, closest
from gptrain.files import read_user_text, shown
from gptrain.locations import is_url

_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv}
_MAX_MAGNITUDE = 1e30  # past any setting's range: each stays a plain number to check


def is_nanogpt_config(path: str) -> bool:
    """A config file named on the command line is nanoGPT's when it is a .py."""
    return str(path).endswith(".py")


def data_dir(dataset: str) -> str:
    """nanoGPT's `dataset` key names data/DATASET (its train.py reads os.path.join('data', dataset)):
    that folder where it holds nanoGPT's train.bin, else the value as gptrain reads a data path
    (a folder, a URL or a pushed dataset's name)."""
    import os

    folder = os.path.join("data", dataset)
    return folder if not is_url(dataset) and Path(folder, "train.bin").is_file() else dataset


def read(path: str) -> list[tuple[str, str]]:
    """[(key, value as a flag's text)] of a nanoGPT config file, in its order."""
    from gptrain.hf_flags import NANOGPT_KEYS

    where = shown(path)
    text = read_user_text(Path(path), "nanoGPT config file")
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        line = getattr(e, "lineno", None)
        raise UserError(f"nanoGPT config file {where}{f' line {line}' if line else ''} is not Python "
                        "gptrain can read: give NAME = value lines") from None
    out = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise UserError(f"nanoGPT config file {where} line {node.lineno}: only NAME = value lines are read "
                            "(gptrain never runs a config file's code)")
        key = node.targets[0].id
        if key not in NANOGPT_KEYS:
            raise UserError(f"nanoGPT config file {where} line {node.lineno}: {key} is not one of nanoGPT's "
                            f"config keys{closest(key, NANOGPT_KEYS)}")
        try:
            value = _literal(node.value, where, node.lineno)
        except RecursionError:
            raise UserError(f"nanoGPT config file {where} line {node.lineno}: the value nests too deep") from None
        out.append((key, ("true" if value else "false") if isinstance(value, bool) else str(value)))
    return out


def _literal(node, where: str, line: int):
    """A constant, or arithmetic on numbers, of a config line; anything else is one line."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, where, line)
        if _is_number(value):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _literal(node.left, where, line), _literal(node.right, where, line)
        if _is_number(left) and _is_number(right) and not (right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv))):
            value = _ARITHMETIC[type(node.op)](left, right)
            if abs(value) <= _MAX_MAGNITUDE:
                return value
    raise UserError(f"nanoGPT config file {where} line {line}: the value must be a number, a string, True or "
                    "False, or arithmetic on numbers (gptrain never runs a config file's code)")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
