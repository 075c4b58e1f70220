"""What kind of weights a path holds, decided here once, and what its files say about it.

  gptrain     step-N/ with trainer_state.json and DCP's .metadata (weights/layout.py)
  hf-trainer  checkpoint-N/ of a Hugging Face Trainer: step and train/eval loss from its
              trainer_state.json (weights/hf.py)
  hf-model    a HF model directory (config.json + model.safetensors / pytorch_model.bin), such
              as Trainer.save_model's output
  nanogpt     a torch.save file holding iter_num (nanoGPT's ckpt.pt): step and best_val_loss
              read with torch.load(weights_only=True, mmap=True), never executing code
  file        any other .pt/.pth/.bin/.safetensors/.ckpt file
"""

from __future__ import annotations

from pathlib import Path

from gptrain.files import number
from gptrain.weights import hf, layout
from gptrain.weights.names import WEIGHT_SUFFIXES

TORCH_SUFFIXES = (".pt", ".pth", ".ckpt")


def kind_of(path) -> str | None:
    """'gptrain', 'hf-trainer', 'hf-model', 'nanogpt' or 'file' for a checkpoint path, else None
    (a nanoGPT file is told from another .pt by what it holds: see read_nanogpt_meta)."""
    p = Path(path)
    if p.is_dir():
        if layout.is_checkpoint_dir(p):
            return "gptrain"
        if hf.is_hf_trainer_dir(p):
            return "hf-trainer"
        return "hf-model" if hf.is_hf_dir(p) else None
    if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES):
        return "nanogpt" if p.suffix in TORCH_SUFFIXES and read_nanogpt_meta(p) else "file"
    return None


def source_kind(path) -> str | None:
    """What a model is loaded from, for a path resolved at the CLI edge (jobs/api.model_source):
    'nanogpt' for a file (models/nanogpt.py says when it is not one), 'gptrain' for a checkpoint
    or a training output directory holding one, 'hf' for a HF model directory (a Trainer's
    checkpoint-N included), None for a directory that is none of these or no local path (a hub id)."""
    p = Path(path).expanduser()
    if p.is_file():
        return "nanogpt"
    if not p.is_dir():
        return None
    if layout.is_checkpoint_dir(p) or layout.find_latest(p) is not None:
        return "gptrain"
    return "hf" if hf.is_hf_dir(p) else None


def read_meta(p: Path) -> dict:
    """{'kind', and what the files say: 'step', 'train_loss', 'eval_loss', 'time'} of a path
    the scan found (weights/scan.py), each read once."""
    from gptrain.errors import UserError

    if p.is_dir() and layout.is_checkpoint_dir(p):
        damaged = layout.damaged(p)
        try:
            state = layout.read_state(p)
        except UserError:  # listed, step from its name: using it says what is wrong with it
            return {"kind": "gptrain", "damaged": damaged}
        out = {"kind": "gptrain", "step": state["step"], "train_loss": number(state.get("train_loss")),
               "eval_loss": number(state.get("eval_loss")), "damaged": damaged}
        return {**out, "time": state["saved_at"]} if number(state.get("saved_at")) else out
    if p.is_dir() and hf.is_hf_trainer_dir(p):
        return {"kind": "hf-trainer", **hf.progress(p / hf.STATE_FILE)}
    if p.is_dir():
        out = {"kind": "hf-model"}
        if (p / hf.STATE_FILE).is_file():  # Trainer.save_state() beside save_model()
            out.update(hf.progress(p / hf.STATE_FILE))
        return out
    meta = read_nanogpt_meta(p) if p.suffix in TORCH_SUFFIXES else None
    return {"kind": "nanogpt", **meta} if meta else {"kind": "file"}


def read_nanogpt_meta(path) -> dict | None:
    """{'step': iter_num, 'eval_loss': best_val_loss} of a nanoGPT-style torch.save file, read
    with weights_only=True and mmap (no code runs, no tensor is read), None when the file is
    not one (or not loadable as data: a crafted pickle is refused, never run)."""
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("iter_num"), int):
        return None
    loss = ckpt.get("best_val_loss")
    return {"step": ckpt["iter_num"], "eval_loss": number(loss.item() if hasattr(loss, "item") else loss)}
