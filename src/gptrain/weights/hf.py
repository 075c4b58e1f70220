"""Hugging Face weights on disk: model directories, Trainer checkpoint-N/ folders and the one
reader of a Trainer's trainer_state.json (its global_step and log_history). No torch import."""

from __future__ import annotations

import json
from pathlib import Path

from gptrain.files import is_num, number
from gptrain.weights.names import is_weight_file

# A Hugging Face model directory: config.json beside one of these (models/hf.py reads them).
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")
STATE_FILE = "trainer_state.json"


def is_hf_dir(path) -> bool:
    p = Path(path)
    return (p / "config.json").is_file() and any((p / f).is_file() for f in HF_WEIGHT_FILES)


def is_hf_trainer_dir(path) -> bool:
    """A complete HF Trainer checkpoint-N: trainer_state.json (written last) beside the model's
    weights, a HF model directory or the bare weight files of a model that is not a
    PreTrainedModel (or of a script that keeps the Trainer's layout)."""
    p = Path(path)
    if "global_step" not in read_trainer_state(p / STATE_FILE):
        return False
    return is_hf_dir(p) or any(f.is_file() and is_weight_file(f.name) for f in p.iterdir())


def read_trainer_state(path) -> dict:
    """A trainer_state.json as a dict; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def last_records(state: dict) -> dict:
    """{'train': {...}, 'eval': {...}}: the last train ("loss") and eval ("eval_loss") records of
    a trainer state's log_history, either missing when it has none."""
    out: dict = {}
    history = state.get("log_history")
    for rec in reversed(history if isinstance(history, list) else []):
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            continue
        if "train" not in out and is_num(rec.get("loss")):
            out["train"] = {"step": rec["step"], "loss": rec["loss"],
                            **{k: rec[k] for k in ("learning_rate", "grad_norm", "epoch") if is_num(rec.get(k))}}
        if "eval" not in out and is_num(rec.get("eval_loss")):
            out["eval"] = {"step": rec["step"], "loss": rec["eval_loss"]}
        if len(out) == 2:
            break
    return out


def progress(state_file) -> dict:
    """step, train_loss, eval_loss of a checkpoint from its trainer_state.json ({} when it is
    not readable): the last logged losses, else the run's average train_loss logged at its end."""
    state = read_trainer_state(state_file)
    out = {"step": state["global_step"]} if isinstance(state.get("global_step"), int) else {}
    last = last_records(state)
    if "train" in last:
        out["train_loss"] = last["train"]["loss"]
    else:
        history = state.get("log_history")
        out.update(next(({"train_loss": r["train_loss"]} for r in history if isinstance(r, dict)
                         and number(r.get("train_loss")) is not None), {}) if isinstance(history, list) else {})
    if "eval" in last:
        out["eval_loss"] = last["eval"]["loss"]
    return out


def newest_trainer_state(roots) -> dict | None:
    """The most recently written trainer_state.json with a global_step under these folders (in
    them, in checkpoint-*/ and one level below): what a running Trainer reported last. Ordered by
    mtime, as only that one is read (a long run's log history is large)."""
    found = []
    for base in map(Path, roots):
        for pattern in (STATE_FILE, f"checkpoint-*/{STATE_FILE}", f"*/{STATE_FILE}",
                        f"*/checkpoint-*/{STATE_FILE}"):
            for path in base.glob(pattern):
                try:
                    found.append((path.stat().st_mtime, str(path)))
                except OSError:
                    continue
    for _, path in sorted(found, reverse=True):
        state = read_trainer_state(path)
        if isinstance(state.get("global_step"), int):
            return state
    return None
