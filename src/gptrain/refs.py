"""ONE resolver for what a user names as MODEL (generate, eval, export, model.init_from,
checkpoint.resume_from): a reference in, a source out, at the CLI edge.

A reference is, in this order:
  a path      a checkpoint (gptrain step-N, HF model dir or Trainer checkpoint-N, nanoGPT
              ckpt.pt) is itself; a folder holding checkpoints (a training output dir, a job's
              directory, an HF Trainer output_dir) means its newest loadable one
  an ID       a checkpoint ID from `gptrain checkpoints JOB`
  a job name  that job's newest loadable checkpoint
  otherwise   a Hugging Face hub id, as is
The source is a path (or the hub id): models/ and train/ load it without knowing of jobs.
"""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import UserError

LOADABLE = ("gptrain", "hf-trainer", "hf-model", "nanogpt")
KINDS_HINT = "gptrain loads gptrain, Hugging Face (model dirs, Trainer checkpoint-N) and nanoGPT checkpoints"


def resolve(ref: str) -> str:
    """The source a MODEL reference names (see the module doc); one-line UserError otherwise."""
    from gptrain.home import NAME_RE, home

    path = Path(ref).expanduser()
    if path.exists():
        return str(_local(path, ref))
    if not NAME_RE.fullmatch(ref) or not (home() / "gptrain.db").is_file():
        return ref
    from gptrain.jobs import found, store

    try:
        row = store.checkpoint_by_id(ref)
    except UserError:
        row = None
    if row is not None:
        if not Path(row["path"]).exists():
            raise UserError(f"checkpoint {ref} ({row['job']}/{row['name']}) is no longer on disk "
                            f"(pruned by keep_last?); see `gptrain checkpoints {row['job']}`")
        return str(_local(Path(row["path"]), ref))
    try:
        store.get_job(ref)
    except UserError:
        return ref
    return newest_loadable(found.scan_job(ref), f"job {ref}", f"gptrain checkpoints {ref}")


def newest_loadable(rows: list[dict], what: str, see: str) -> str:
    """The path of the newest row gptrain can load; UserError saying why there is none."""
    from gptrain.jobs.found import newest

    if not rows:
        raise UserError(f"{what} has no checkpoint yet; see `{see}`")
    best = newest([r for r in rows if r["kind"] in LOADABLE])
    if best is None:
        kinds = ", ".join(sorted({f"{r['name']} ({r['kind']})" for r in rows})[:3])
        raise UserError(f"{what} has checkpoints gptrain cannot load as a model ({kinds}); {KINDS_HINT}")
    return best["path"]


def _local(path: Path, ref: str) -> Path:
    from gptrain.weights.kinds import kind_of
    from gptrain.weights.names import WEIGHT_SUFFIXES
    from gptrain.weights.scan import scan_folder

    if path.is_file():
        if path.suffix in (".pt", ".pth", ".ckpt"):
            return path  # read as a nanoGPT checkpoint (models/nanogpt.py says if it is not one)
        hint = " (pass the directory holding it and its config.json)" if path.name.endswith(WEIGHT_SUFFIXES) else ""
        raise UserError(f"{ref} is a file, not a model{hint}; {KINDS_HINT}")
    if kind_of(path):
        return path
    from gptrain.weights.layout import find_latest

    if find_latest(path) is not None:  # a gptrain training output directory
        return path
    rows = scan_folder(path)
    if not rows:
        raise UserError(f"{ref} is not a model directory and holds no checkpoint; {KINDS_HINT}")
    return Path(newest_loadable(rows, ref, f"ls {ref}"))
