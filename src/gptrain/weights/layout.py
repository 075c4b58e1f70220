"""gptrain's own checkpoint layout, without importing torch (the CLI lists checkpoints fast).

    OUTPUT/checkpoints/step-000100/   trainer_state.json and DCP's .metadata (weights/dcp.py)
    OUTPUT/checkpoints/step-000100/damaged.txt   why a resume refused it (weights/checksums.py)
    OUTPUT/checkpoints/latest         the name of the newest complete one
    OUTPUT/checkpoints/best           the one evaluated lowest at its step (checkpoint.keep_best)
    OUTPUT/checkpoints/damaged.jsonl  each refusal (name, why, time): kept when the step is rewritten

train/checkpoint.py writes them. "Which is newer" among them is `by_step`: the number in the
name (weights/names.py's step_of, as weights/scan.py orders every kind), compared as a number,
never as text (step-10 is newer than step-9 whatever the padding).
"""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import UserError
from gptrain.files import is_plain_name, read_json
from gptrain.weights.checksums import verify_small
from gptrain import run_layout
from gptrain.weights.names import step_of

STATE_FILE = "trainer_state.json"
BEST = "best"  # names the checkpoint the run stands for as a model, with checkpoint.keep_best
DAMAGED = "damaged.txt"  # written into a checkpoint that failed verification when a run resumed


def root_of(output_dir) -> Path:
    """OUTPUT/checkpoints: where a training run's checkpoints and `latest` live."""
    return run_layout.checkpoints_dir(output_dir)


def step_name(step: int) -> str:
    return f"{run_layout.STEP_PREFIX}{step:06d}"


def complete(root) -> list[Path]:
    """The complete checkpoints in OUTPUT/checkpoints, oldest to newest."""
    return by_step(p for p in Path(root).glob(run_layout.STEP_PREFIX + "*") if is_checkpoint_dir(p))


def by_step(paths) -> list[Path]:
    """Paths oldest to newest by the step in their names (then by name)."""
    return sorted(paths, key=lambda p: (step_of(Path(p).name) or -1, str(p)))


def is_checkpoint_dir(path) -> bool:
    """A complete checkpoint folder of the run's own: a link (to a folder outside the run, or
    anywhere) is never one, so a resume or a listing never loads from where it points."""
    p = Path(path)
    return not p.is_symlink() and (p / STATE_FILE).is_file() and (p / ".metadata").is_file()


def read_state(path) -> dict:
    """trainer_state.json of a checkpoint, verified against its checksums.json when it has one
    (UserError naming it when it is corrupt)."""
    verify_small(path, STATE_FILE)
    state = read_json(Path(path) / STATE_FILE, "checkpoint state")
    if not isinstance(state.get("step"), int):
        raise UserError(f"checkpoint state {Path(path) / STATE_FILE} has no integer 'step'; "
                        "it is corrupt: use another checkpoint")
    return state


def find_latest(output_dir) -> Path | None:
    """The newest complete checkpoint under OUTPUT/checkpoints that is not marked damaged (None
    if there is none): the first of `resume_order`."""
    order = resume_order(output_dir)
    return order[0] if order else None


def best_checkpoint(output_dir) -> Path | None:
    """The checkpoint `best` names (checkpoint.keep_best: HF's load_best_model_at_end) while it
    is complete and not marked damaged; None otherwise."""
    root = root_of(output_dir)
    try:
        name = (root / BEST).read_text(errors="replace").strip()
    except OSError:
        return None
    path = root / name
    ok = is_plain_name(name) and is_checkpoint_dir(path) and damaged(path) is None  # never a path outside
    return path if ok else None


def lowest_eval(paths) -> Path | None:
    """Of these checkpoints, the one whose eval loss was measured at its own step and is the
    lowest (the later one at a tie); None when none was evaluated at its step."""
    scored = []
    for p in by_step(paths):
        try:
            state = read_state(p)
        except UserError:
            continue
        loss = state.get("eval_loss")
        if state.get("eval_step") == state["step"] and isinstance(loss, (int, float)) and loss == loss:
            scored.append((loss, -(step_of(p.name) or 0), p))
    return min(scored)[2] if scored else None


def model_checkpoint(path) -> Path | None:
    """The gptrain checkpoint `path` stands for as a model (generate, eval, export, init_from):
    itself when it is one; a run's folder: the one `best` names when the run keeps it, else the
    newest (find_latest); None when it holds none. A resume always continues from the newest.
    (jobs/found.model_source, the one chooser of what a user names, asks this for a path.)"""
    p = Path(path)
    p = p.resolve() if p.is_symlink() else p
    if is_checkpoint_dir(p):
        return p
    return best_checkpoint(p) or find_latest(p)


def resume_order(output_dir) -> list[Path]:
    """The checkpoints a run resumes from, in the order it tries them: the one `latest` names
    (else the highest step), then every complete one of a lower step, newest first; those
    marked damaged left out. Checkpoints above `latest`'s are a branch a resume from an older
    one abandoned: never taken by themselves."""
    ckpt_root = root_of(output_dir)
    done = complete(ckpt_root)
    pointer, top = ckpt_root / run_layout.LATEST, None
    if pointer.is_file():
        name = pointer.read_text(errors="replace").strip()
        if is_plain_name(name) and is_checkpoint_dir(ckpt_root / name):  # never a path outside
            top = ckpt_root / name
    if top is None and done:
        top = done[-1]
    if top is None:
        return []
    below = [p for p in done if (step_of(p.name) or -1) < (step_of(top.name) or -1)]
    return [p for p in [top, *reversed(below)] if damaged(p) is None]


def gone_latest(output_dir) -> str | None:
    """The checkpoint `latest` names when its folder is gone (removed by hand, a disk lost), else
    None: a run that finds no checkpoint there had some, and must not start over silently."""
    pointer = root_of(output_dir) / run_layout.LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text(errors="replace").strip()
    return name if is_plain_name(name) and not is_checkpoint_dir(root_of(output_dir) / name) else None


def damaged(path) -> str | None:
    """Why a run refused this checkpoint (its damaged.txt), None when it did not."""
    f = Path(path) / DAMAGED
    if not f.is_file():
        return None
    return f.read_bytes()[:500].decode(errors="replace").strip() or "failed verification"


DAMAGE_LOG = "damaged.jsonl"


def mark_damaged(path, why: str) -> None:
    """Mark a checkpoint that failed verification: resumes pass it by and listings show why, and
    the refusal is added to the run's DAMAGE_LOG (the job's events come from it). Its files are
    kept as they are (for a look, or a repair) until a new save of its step replaces them."""
    import json
    import time

    path = Path(path)
    try:
        (path / DAMAGED).write_text(why.strip() + "\n")
        with open(path.parent / DAMAGE_LOG, "a") as log:
            log.write(json.dumps({"name": path.name, "why": why.strip(), "time": time.time()}) + "\n")
    except OSError:
        pass  # a read-only copy: the refusal itself still stands


def damage_reports(output_dir) -> list[dict]:
    """The refusals of a run's checkpoints, oldest first ({name, why, time}); lines that are not
    one (cut short, edited) are skipped."""
    import json

    try:
        text = (root_of(output_dir) / DAMAGE_LOG).read_bytes()[-(1 << 20):].decode(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            r = json.loads(line)
            out.append({"name": str(r["name"])[:300], "why": str(r["why"])[:500], "time": float(r["time"])})
        except (ValueError, KeyError, TypeError):
            continue
    return out


def resolve(path, as_model: bool = False) -> Path:
    """A checkpoint directory from a checkpoint directory or a training output directory: its
    newest, to resume from; `as_model`: the one it stands for as a model (model_checkpoint). A
    link the user names is followed (theirs to make); links inside a run are not (is_checkpoint_dir)."""
    p = Path(path)
    p = p.resolve() if p.is_symlink() else p
    if is_checkpoint_dir(p):
        return p
    latest = model_checkpoint(p) if as_model else find_latest(p)
    if latest is None:
        raise UserError(f"{path} is not a gptrain checkpoint (no {STATE_FILE}) and holds none")
    return latest
