"""What a file name says about weights: a weights file or a side file, the step it holds, and
whether the name can be listed at all.

File names are bytes from elsewhere (a job's program, a download): a name that is not UTF-8
(Python holds it with surrogates, which neither SQLite nor JSON nor a terminal can take), that
holds a newline or another control character, or that is absurdly long is not listed: the
checkpoint scan skips it, so it can never crash a running job or a command that lists it.
"""

from __future__ import annotations

import re

from gptrain.files import shown

WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
HF_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")
# never a model: a Trainer's side files (pickled arguments, optimizer, scheduler, RNG states) and
# nanoGPT-style token files (train.bin / val.bin)
NOT_WEIGHTS = re.compile(r"training_args\.bin|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth"
                         r"|(train|val|test)(-\d+)?\.bin")
HF_STEP_DIR = re.compile(r"checkpoint-(\d+)")
NUMBERED_DIR = re.compile(r"(checkpoint|step|ckpt|epoch|iter)[-_]?\d+")
MAX_NAME = 255  # characters: no file system makes a longer one; anything beyond is not a name we list


def is_listable(name: str) -> bool:
    """Whether a file name from disk can be shown and recorded as it is: valid UTF-8, printable
    (no newline, tab or escape), not empty and not longer than MAX_NAME."""
    return bool(name) and len(name) <= MAX_NAME and shown(name) == name  # not UTF-8: held as surrogates


def is_weight_file(name: str) -> bool:
    """A file name that may hold a model's weights (not a Trainer's optimizer or a token file)."""
    return name.endswith(WEIGHT_SUFFIXES) and not NOT_WEIGHTS.fullmatch(name)


def step_of(name: str, is_file: bool = False) -> int | None:
    """The step a checkpoint's name says (its last number: step-000100, checkpoint-8,
    out/ckpt_12.pt), or None when it holds no number. A file's suffix (.pth) does not count."""
    stem = name.rsplit(".", 1)[0] if is_file else name
    digits = re.findall(r"\d+", stem)
    return int(digits[-1]) if digits else None
