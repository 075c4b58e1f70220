"""What a job left behind that is a checkpoint: found on disk, whoever wrote it.

A job's checkpoints live under two roots of its directory: checkpoints/ ($GPTRAIN_CHECKPOINT_DIR:
the built-in trainer's step-N directories; scripts may write here too) and output/
($GPTRAIN_OUTPUT_DIR of a user's script). Under each root (and in sub-folders, a few levels
deep) these are recognised, one row each:

  gptrain     step-N/ with trainer_state.json and DCP's .metadata (train/checkpoint.py)
  hf-trainer  checkpoint-N/ of a Hugging Face Trainer: step and train/eval loss from its
              trainer_state.json (global_step, log_history); one still being written (the
              Trainer writes it in place, trainer_state.json last) is skipped
  hf-model    a HF model directory (config.json + model.safetensors / pytorch_model.bin), such
              as Trainer.save_model's output: ONE row, not one per file (a root can be one)
  nanogpt     a torch.save file holding iter_num (nanoGPT's ckpt.pt): step and best_val_loss
              read with torch.load(weights_only=True, mmap=True), never executing code
  file        any other .pt/.pth/.bin/.safetensors/.ckpt file: the step from its name when it
              has one (the last number in its path under the root)

Everything else (logs, json, txt, tokenizer files, optimizer states inside the above) is ignored.
Reading a nanoGPT file needs torch: `scan` takes the rows recorded before and reuses a row whose
files have the same size and mtime, so listing stays light (no torch, no large trainer_state.json
parsed again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from gptrain.files import HF_WEIGHT_FILES, is_hf_dir

ROOTS = ("checkpoints", "output")
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
HF_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")
# never a model: a Trainer's side files (pickled arguments, optimizer, scheduler, RNG states) and
# nanoGPT-style token files (train.bin / val.bin)
NOT_WEIGHTS = re.compile(r"training_args\.bin|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth"
                         r"|(train|val|test)(-\d+)?\.bin")
HF_STEP_DIR = re.compile(r"checkpoint-(\d+)")
NUMBERED_DIR = re.compile(r"(checkpoint|step|ckpt|epoch|iter)[-_]?\d+")
MAX_DEPTH = 3  # output/run/checkpoint-N is found; deeper trees are not walked


def checkpoint_id(job: str, name: str) -> str:
    return hashlib.sha1(f"{job}/{name}".encode()).hexdigest()[:12]


def is_hf_trainer_dir(path) -> bool:
    """A complete HF Trainer checkpoint-N: trainer_state.json (written last) beside the model's
    weights, a HF model directory or the bare weight files of a model that is not a
    PreTrainedModel (or of a script that keeps the Trainer's layout)."""
    p = Path(path)
    state = p / "trainer_state.json"
    if not state.is_file() or "global_step" not in json_or_empty(state):
        return False
    return is_hf_dir(p) or any(f.is_file() and f.name.endswith(WEIGHT_SUFFIXES) and not NOT_WEIGHTS.fullmatch(f.name)
                               for f in p.iterdir())


def kind_of(path) -> str | None:
    """'gptrain', 'hf-trainer', 'hf-model', 'nanogpt' or 'file' for a checkpoint path, else None
    (a nanoGPT file is told from another .pt by what it holds: see read_nanogpt_meta)."""
    from gptrain.train.checkpoint_files import is_checkpoint_dir

    p = Path(path)
    if p.is_dir():
        if is_checkpoint_dir(p):
            return "gptrain"
        if is_hf_trainer_dir(p):
            return "hf-trainer"
        return "hf-model" if is_hf_dir(p) else None
    if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES):
        return "nanogpt" if p.suffix in (".pt", ".pth", ".ckpt") and read_nanogpt_meta(p) else "file"
    return None


def scan(job_dir, known: dict | None = None) -> list[dict]:
    """One row per checkpoint under the job's roots: id, name (its path under the job
    directory, the checkpoints/ prefix left out), kind, path, step, train_loss, eval_loss, time,
    mtime, size. `known`: rows recorded before, by name; a checkpoint whose files are unchanged
    (size, mtime) keeps its row instead of being read again."""
    job_dir = Path(job_dir)
    rows: list[dict] = []
    for root in ROOTS:
        rows += scan_folder(job_dir / root, "" if root == "checkpoints" else root, job_dir.name, known)
    return rows


def scan_folder(folder, name: str = "", job: str = "", known: dict | None = None) -> list[dict]:
    """The checkpoints in one folder (itself included, when it is one), named `name/...`."""
    folder, rows = Path(folder), []
    if not folder.is_dir():
        return rows
    row = _known(folder, name or folder.name, known or {})
    if row or kind_of(folder):  # save_model(GPTRAIN_OUTPUT_DIR): the root itself is a model
        rows.append(row or _row(job, folder, name or folder.name))
    _walk(job, folder, name + "/" if name else "", 1, known or {}, rows, dirs_only=bool(rows))
    return rows


def latest(job_dir) -> Path | None:
    """The newest checkpoint of a job (see newest), what a restarted script is told to resume
    from; None when it has none."""
    row = newest(scan(job_dir))
    if row is None:
        return None
    path = Path(row["path"])
    # a weights file inside a numbered checkpoint folder (checkpoint-8/state.pt): the folder is
    # the checkpoint a program resumes from
    return path.parent if path.is_file() and NUMBERED_DIR.fullmatch(path.parent.name) else path


def newest(rows: list[dict]) -> dict | None:
    """The row with the highest step, or None. At equal (or unknown) steps a checkpoint proper
    comes before a root that is itself a model (an HF Trainer's final save_model/save_state
    into output/ has the last checkpoint-N's step, but not its optimizer state), then the newest."""
    if not rows:
        return None
    return max(rows, key=lambda r: (r["step"] if r["step"] is not None else -1, r["name"] not in ROOTS,
                                    r["time"]))


def _walk(job: str, folder: Path, prefix: str, depth: int, known: dict, rows: list,
          dirs_only: bool = False) -> None:
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(".") or p.name == "latest" or p.is_symlink():
            continue
        name = prefix + p.name
        if p.is_dir():
            if HF_STEP_DIR.fullmatch(p.name) and not (p / "trainer_state.json").is_file() and \
                    ((p / "config.json").is_file() or (p / "optimizer.pt").is_file()):
                continue  # a Trainer writes checkpoint-N in place, trainer_state.json last: not one yet
            row = _known(p, name, known)
            if row or kind_of(p):
                rows.append(row or _row(job, p, name))
            elif depth < MAX_DEPTH:
                _walk(job, p, name + "/", depth + 1, known, rows)
        elif p.is_file() and p.name.endswith(WEIGHT_SUFFIXES) and not NOT_WEIGHTS.fullmatch(p.name) \
                and not (dirs_only and (p.name in HF_WEIGHT_FILES or HF_SHARD.fullmatch(p.name))):
            rows.append(_known(p, name, known) or _row(job, p, name))


def _known(p: Path, name: str, known: dict) -> dict | None:
    """The row recorded before for this checkpoint when its files are unchanged (same newest
    mtime and total size): a nanoGPT file is not loaded, a trainer_state.json not parsed again."""
    old = known.get(name)
    if not old or not old.get("kind") or old.get("mtime") is None:
        return None
    mtime, size = _mtime_size(p)
    return dict(old) if (old["mtime"], old["size"]) == (mtime, size) and old["path"] == str(p) else None


def _row(job: str, p: Path, name: str) -> dict:
    mtime, size = _mtime_size(p)
    row = {"id": checkpoint_id(job, name), "name": name, "kind": None, "path": str(p),
           "step": None, "train_loss": None, "eval_loss": None, "time": mtime, "mtime": mtime,
           "size": size}
    row.update(_read_meta(p))
    if row["step"] is None:
        digits = re.findall(r"\d+", name.rsplit(".", 1)[0] if p.is_file() else name)
        row["step"] = int(digits[-1]) if digits else None
    return row


def _read_meta(p: Path) -> dict:
    from gptrain.errors import UserError
    from gptrain.train.checkpoint_files import is_checkpoint_dir, read_state

    if p.is_dir() and is_checkpoint_dir(p):
        try:
            state = read_state(p)
        except UserError:  # listed, step from its name: using it says what is wrong with it
            return {"kind": "gptrain"}
        out = {"kind": "gptrain", "step": state["step"], "train_loss": _num(state.get("train_loss")),
               "eval_loss": _num(state.get("eval_loss"))}
        return {**out, "time": state["saved_at"]} if _num(state.get("saved_at")) else out
    if p.is_dir() and is_hf_trainer_dir(p):
        return {"kind": "hf-trainer", **hf_trainer_progress(p / "trainer_state.json")}
    if p.is_dir():
        out = {"kind": "hf-model"}
        if (p / "trainer_state.json").is_file():  # Trainer.save_state() beside save_model()
            out.update(hf_trainer_progress(p / "trainer_state.json"))
        return out
    meta = read_nanogpt_meta(p) if p.suffix in (".pt", ".pth", ".ckpt") else None
    return {"kind": "nanogpt", **meta} if meta else {"kind": "file"}


def hf_trainer_progress(state_file) -> dict:
    """step, train_loss, eval_loss from a HF Trainer trainer_state.json (its log_history's last
    'loss' and 'eval_loss', as `gptrain jobs` reads them: jobs/progress.py); {} when it is not
    readable."""
    from gptrain.jobs.progress import from_trainer_state

    state = json_or_empty(state_file)
    out = {"step": state["global_step"]} if isinstance(state.get("global_step"), int) else {}
    last = from_trainer_state(state)
    if "train" in last:
        out["train_loss"] = last["train"]["loss"]
    else:  # no step losses logged: the run's average, logged at its end
        history = state.get("log_history")
        out.update(next(({"train_loss": r["train_loss"]} for r in history if isinstance(r, dict)
                         and _num(r.get("train_loss")) is not None), {}) if isinstance(history, list) else {})
    if "eval" in last:
        out["eval_loss"] = last["eval"]["loss"]
    return out


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
    return {"step": ckpt["iter_num"], "eval_loss": _num(loss.item() if hasattr(loss, "item") else loss)}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def json_or_empty(path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime_size(p: Path) -> tuple[float, int]:
    """The newest mtime and the total size of a file or of the files directly in a checkpoint
    directory (all kinds are flat; a file rewritten in place changes them, not the directory's
    own mtime; a root that is a model does not count the checkpoints below it)."""
    if p.is_file():
        st = p.stat()
        return st.st_mtime, st.st_size
    mtime, size = p.stat().st_mtime, 0
    with os.scandir(p) as entries:
        for e in entries:
            try:
                if e.is_file(follow_symlinks=False):
                    st = e.stat()
                    mtime, size = max(mtime, st.st_mtime), size + st.st_size
            except OSError:
                continue
    return mtime, size
