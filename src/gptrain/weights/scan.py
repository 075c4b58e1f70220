"""Finding checkpoints of every kind (weights/kinds.py) in a folder, and "the newest" of them.

Under a folder (and in sub-folders, MAX_DEPTH levels deep) each checkpoint is one row: a
directory of any kind is one row (not one per file; the folder itself can be one), and any
other weights file is one row. Everything else (logs, json, txt, tokenizer files, optimizer
states inside the above) is ignored, and so is a name that cannot be listed as it is
(weights/names.py: not UTF-8, a newline, too long), a dot-name, a link and `latest`.
A HF Trainer writes checkpoint-N in place, trainer_state.json last: one without it is skipped.

Reading a nanoGPT file needs torch: `known` passes the rows found before, and a row whose files
have the same size and mtime is reused, so listing again stays light.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptrain import run_layout
from gptrain.weights.hf import HF_WEIGHT_FILES
from gptrain.weights.kinds import kind_of, read_meta
from gptrain.weights.layout import DAMAGED, damaged
from gptrain.weights.names import HF_SHARD, HF_STEP_DIR, NUMBERED_DIR, is_listable, is_weight_file, step_of

MAX_DEPTH = 3  # output/run/checkpoint-N is found; deeper trees are not walked


def scan_folder(folder, name: str = "", known: dict | None = None) -> list[dict]:
    """The checkpoints in one folder (itself included, when it is one), named `name/...`: rows of
    name, kind, path, step, train_loss, eval_loss, time, mtime, size, damaged (why a resume refused
    it, weights/layout.py). `known`: rows found
    before, by name; a checkpoint whose files are unchanged keeps its row."""
    folder, rows = Path(folder), []
    if not folder.is_dir():
        return rows
    row = _known(folder, name or folder.name, known or {})
    if row or kind_of(folder):  # save_model(GPTRAIN_OUTPUT_DIR): the folder itself is a model
        rows.append(row or _row(folder, name or folder.name))
    _walk(folder, name + "/" if name else "", 1, known or {}, rows, dirs_only=bool(rows))
    return rows


def newest(rows: list[dict], tops: tuple = ()) -> dict | None:
    """THE rule for "the newest checkpoint", of any kind: the row with the highest step, or None.
    Passed by: one a resume found damaged, and a gptrain checkpoint above the one its run's
    `latest` names (a branch a resume from an older checkpoint left: weights/layout.py's
    resume_order, which a gptrain run resumes by, gives the same answer). At equal (or unknown)
    steps a checkpoint proper comes before a row named in `tops` (a folder that is itself a
    model: an HF Trainer's final save_model into output/ has the last checkpoint-N's step, but
    not its optimizer state), then the newest in time."""
    tops_of_runs: dict = {}
    rows = [r for r in rows if not r.get("damaged") and not _left_behind(r, tops_of_runs)]
    if not rows:
        return None
    return max(rows, key=lambda r: (r["step"] if r["step"] is not None else -1, r["name"] not in tops,
                                    r["time"] or 0))


def _left_behind(row: dict, tops_of_runs: dict) -> bool:
    """A gptrain checkpoint of a higher step than the one its run resumes from."""
    from gptrain.weights.layout import resume_order, root_of

    if row.get("kind") != "gptrain":
        return False
    path = Path(row["path"])
    run = path.parent.parent  # OUTPUT of OUTPUT/checkpoints/step-N
    if run not in tops_of_runs:
        order = resume_order(run) if path.parent == root_of(run) else []
        tops_of_runs[run] = step_of(order[0].name) if order else None
    top = tops_of_runs[run]
    return top is not None and (step_of(path.name) or -1) > top


def resume_path(row: dict) -> Path:
    """What a restarted program resumes from for a found row: a weights file inside a numbered
    checkpoint folder (checkpoint-8/state.pt) stands for that folder."""
    path = Path(row["path"])
    return path.parent if path.is_file() and NUMBERED_DIR.fullmatch(path.parent.name) else path


def _walk(folder: Path, prefix: str, depth: int, known: dict, rows: list, dirs_only: bool = False) -> None:
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return
    for p in entries:
        if not is_listable(p.name) or p.name.startswith(".") or p.name == run_layout.LATEST or p.is_symlink():
            continue
        name = prefix + p.name
        if p.is_dir():
            if HF_STEP_DIR.fullmatch(p.name) and not (p / "trainer_state.json").is_file() and \
                    ((p / "config.json").is_file() or (p / "optimizer.pt").is_file()):
                continue  # a Trainer writes checkpoint-N in place, trainer_state.json last: not one yet
            row = _known(p, name, known)
            if row or kind_of(p):
                rows.append(row or _row(p, name))
            elif depth < MAX_DEPTH:
                _walk(p, name + "/", depth + 1, known, rows)
        elif p.is_file() and is_weight_file(p.name) \
                and not (dirs_only and (p.name in HF_WEIGHT_FILES or HF_SHARD.fullmatch(p.name))):
            rows.append(_known(p, name, known) or _row(p, name))


def _known(p: Path, name: str, known: dict) -> dict | None:
    """The row found before for this checkpoint when its files are unchanged (same newest
    mtime and total size): a nanoGPT file is not loaded, a trainer_state.json not parsed again."""
    old = known.get(name)
    if not old or not old.get("kind") or old.get("mtime") is None:
        return None
    mtime, size = _mtime_size(p)
    if (old["mtime"], old["size"]) != (mtime, size) or old["path"] != str(p):
        return None
    row = dict(old)
    if old["kind"] == "gptrain":  # a resume's refusal is marked beside its files (they are unchanged)
        row["damaged"] = damaged(p)
    return row


def _row(p: Path, name: str) -> dict:
    mtime, size = _mtime_size(p)
    row = {"name": name, "kind": None, "path": str(p), "step": None, "train_loss": None,
           "eval_loss": None, "time": mtime, "mtime": mtime, "size": size, "damaged": None}
    row.update(read_meta(p))
    if row["step"] is None:
        row["step"] = step_of(name, is_file=p.is_file())
    return row


def _mtime_size(p: Path) -> tuple[float, int]:
    """The newest mtime and the total size of a file or of the files directly in a checkpoint
    directory (all kinds are flat; a file rewritten in place changes them; a folder that is a
    model does not count the checkpoints below it). The mark a resume leaves in a checkpoint it
    refused (layout.DAMAGED) is not the checkpoint's: it changes neither, nor does the folder's
    own mtime, which it moves (a refused checkpoint was taken for one the program rewrote)."""
    if p.is_file():
        st = p.stat()
        return st.st_mtime, st.st_size
    mtime, size, files = None, 0, False
    with os.scandir(p) as entries:
        for e in entries:
            try:
                if e.is_file(follow_symlinks=False) and e.name != DAMAGED:
                    st = e.stat()
                    mtime, size, files = max(mtime or 0.0, st.st_mtime), size + st.st_size, True
            except OSError:
                continue
    return (mtime if files else p.stat().st_mtime), size


LOADABLE = ("gptrain", "hf-trainer", "hf-model", "nanogpt")
KINDS_HINT = "gptrain loads gptrain, Hugging Face (model dirs, Trainer checkpoint-N) and nanoGPT checkpoints"


def newest_loadable(rows: list[dict], what: str, see: str, tops: tuple = ()) -> str:
    """The path of the newest row gptrain can load as a model (`newest`'s rule, other kinds
    left out); one-line UserError saying why there is none."""
    from gptrain.errors import UserError

    if not rows:
        raise UserError(f"{what} has no checkpoint yet; see `{see}`")
    best = newest([r for r in rows if r["kind"] in LOADABLE and not r.get("damaged")], tops)
    if best is None:
        kinds = ", ".join(sorted({f"{r['name']} ({r['kind']})" for r in rows})[:3])
        raise UserError(f"{what} has checkpoints gptrain cannot load as a model ({kinds}); {KINDS_HINT}")
    return best["path"]


def loadable_at(path: Path, ref: str, resume: bool = False) -> Path:
    """What a model path a user gave stands for: a checkpoint of any kind is itself; a gptrain
    training output directory the one it stands for as a model (weights/layout.model_checkpoint:
    the kept best, else the newest), or, to be `resume`d from, itself (the trainer takes its
    checkpoints newest first, each verified: weights/layout.resume_order); any other folder its
    newest loadable checkpoint. One-line UserError when it holds none."""
    from gptrain.errors import UserError
    from gptrain.weights.layout import find_latest, model_checkpoint
    from gptrain.weights.names import WEIGHT_SUFFIXES

    if path.is_file():
        if path.suffix in (".pt", ".pth", ".ckpt"):
            return path  # read as a nanoGPT checkpoint (models/nanogpt.py says if it is not one)
        hint = " (pass the directory holding it and its config.json)" if path.name.endswith(WEIGHT_SUFFIXES) else ""
        raise UserError(f"{ref} is a file, not a model{hint}; {KINDS_HINT}")
    if kind_of(path) or (resume and find_latest(path) is not None):
        return path
    if (ckpt := model_checkpoint(path)) is not None:
        return ckpt
    rows = scan_folder(path)
    if not rows:
        raise UserError(f"{ref} is not a model directory and holds no checkpoint; {KINDS_HINT}")
    return Path(newest_loadable(rows, ref, f"ls {ref}"))
