"""A job's checkpoints: found on disk under its two roots, whoever wrote them.

checkpoints/ ($GPTRAIN_CHECKPOINT_DIR: the built-in trainer's step-N directories; scripts may
write here too) and output/ ($GPTRAIN_OUTPUT_DIR of a user's script). What counts as a
checkpoint, of which kind, and which is the newest is decided below, in weights/ (scan.py,
kinds.py); this module only names the roots and gives each row its id within the job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gptrain import run_layout
from gptrain.jobs import folder
from gptrain.weights import scan as weights_scan

ROOTS = folder.CHECKPOINT_ROOTS




def checkpoint_id(job: str, name: str) -> str:
    return hashlib.sha1(f"{job}/{name}".encode()).hexdigest()[:12]


def scan(job_dir, known: dict | None = None) -> list[dict]:
    """One row per checkpoint under the job's roots: id, name (its path under the job
    directory, the checkpoints/ prefix left out), kind, path, step, train_loss, eval_loss, time,
    mtime, size. `known`: rows recorded before, by name (unchanged files are not read again)."""
    job_dir = Path(job_dir)
    rows: list[dict] = []
    for root in ROOTS:  # the trainer's checkpoints are named without their folder
        rows += weights_scan.scan_folder(job_dir / root, "" if root == run_layout.CHECKPOINTS else root, known)
    for row in rows:
        row.setdefault("id", checkpoint_id(job_dir.name, row["name"]))
    return rows


def newest(rows: list[dict]) -> dict | None:
    """The newest of a job's checkpoint rows (weights/scan.py), a root that is itself a model
    after a checkpoint of the same step; one a resume found damaged is passed by."""
    return weights_scan.newest(rows, ROOTS)


def choose(job_dir, row: dict):
    """Make checkpoint `row` the one the job's next start resumes from (`gptrain resume --from`):
    it must pass verification; the job's folder then names it (the pin `pinned` reads and, for
    the built-in trainer's own checkpoints, the `latest` it resumes from). Returns what undoes it."""
    from gptrain.atomic import write_text_atomic
    from gptrain.weights import checksums, layout

    jdir, path = Path(job_dir), Path(row["path"])
    if path.is_dir():
        checksums.verify(path)
    own = layout.root_of(jdir) / path.name == path and layout.is_checkpoint_dir(path)
    pointer = layout.root_of(jdir) / run_layout.LATEST
    before = pointer.read_text() if own and pointer.is_file() else None
    write_text_atomic(folder.resume_pin(jdir), row["name"] + "\n")
    if own:
        write_text_atomic(pointer, path.name + "\n")

    def undo():
        folder.resume_pin(jdir).unlink(missing_ok=True)
        if own and before is not None:
            write_text_atomic(pointer, before)
        elif own:
            pointer.unlink(missing_ok=True)
    return undo


def pinned(job_dir, rows: list[dict]) -> dict | None:
    """The row `gptrain resume --from` chose, while the program has written nothing since
    (a checkpoint newer than the choice makes it moot); None when there is none."""
    pin = folder.resume_pin(Path(job_dir))
    try:
        name, since = pin.read_text().strip(), pin.stat().st_mtime
    except OSError:
        return None
    if any(r["mtime"] > since for r in rows):
        return None
    return next((r for r in rows if r["name"] == name and not r.get("damaged")), None)


def latest(job_dir) -> Path | None:
    """The newest checkpoint of a job, what a restarted script is told to resume from; None
    when it has none."""
    return latest_named(job_dir)[0]


def latest_named(job_dir) -> tuple[Path, str] | tuple[None, None]:
    """latest() and the checkpoint's name in the job (its row's); (None, None) when none. The
    rows recorded for the job are reused, so an unchanged nanoGPT file is not loaded again (a
    listing past the supervisor's grace period, which writes a restart line, loaded torch)."""
    rows = scan(job_dir, _recorded(Path(job_dir).name))
    row = pinned(job_dir, rows) or newest(rows)
    return (None, None) if row is None else (weights_scan.resume_path(row), row["name"])


def scan_folder_rows(job_dir) -> list[dict]:
    """Every checkpoint row of the job's folder, damaged ones included (latest_named's scan)."""
    return scan(job_dir, _recorded(Path(job_dir).name))


def _recorded(job: str) -> dict:
    """The job's checkpoint rows as recorded, by name; {} where the database cannot say."""
    import sqlite3

    from gptrain.errors import UserError
    from gptrain.jobs import store

    try:
        return {r["name"]: r for r in store.checkpoints(job)}
    except (sqlite3.Error, OSError, UserError):  # no database here, or not readable: every file is read
        return {}


def damage_reports(job: str) -> list[dict]:
    """The built-in trainer's refusals of this job's checkpoints (weights/layout.py), for its events."""
    from gptrain.weights import layout

    return layout.damage_reports(folder.job_dir(job))


def scan_job(job: str) -> list[dict]:
    """The checkpoints a job wrote, built-in trainer or script, with the rows
    recorded before passed along so unchanged files are not read again."""
    from gptrain.jobs import store

    return scan(folder.job_dir(job), {r["name"]: r for r in store.checkpoints(job)})


def model_source(ref: str, resume: bool = False) -> str:
    """THE chooser of "which checkpoint": what a user names as MODEL (generate, eval, export,
    model.init_from, checkpoint.resume_from), as the path or hub id models/ and train/ load, in
    this order:
    - `hf:NAME`: the hub model NAME, whatever is here;
    - a path (weights/scan.loadable_at): a checkpoint of any kind is itself; a gptrain run's
      folder the checkpoint it stands for as a model (weights/layout.model_checkpoint: the kept
      best, else the newest), or, to be resumed from, the folder (the trainer takes its newest
      that passes verification); any other folder its newest loadable checkpoint;
    - a checkpoint ID: that checkpoint (a folder as above);
    - a sweep's name: its best complete trial's job, as below (jobs/sweeps.py);
    - a job name: the best with checkpoint.keep_best unless it is to be resumed from, else its
      newest loadable checkpoint (weights/scan.newest: damaged ones and a branch above the run's
      `latest` passed by);
    - else a hub id as it is.
    A remote copy (checkpoint.remote) is the trainer's to fetch when it resumes (train/remote.py). A checkpoint ID or job name that cannot be loaded is one line, and so is a name
    close to a job's that is not a hub model cached here (a typo: "did you mean", before any
    network request); `hf:NAME` is the hub model NAME whatever is here."""
    from gptrain.errors import NotFound, UserError
    from gptrain.home import NAME_RE, home
    from gptrain.jobs import store

    if ref.startswith("hf:"):
        return ref[3:]
    path = Path(ref).expanduser()
    if path.exists():
        return str(weights_scan.loadable_at(path, ref, resume))
    if not NAME_RE.fullmatch(ref) or not (home() / "gptrain.db").is_file():
        return ref
    try:
        row = store.checkpoint_by_id(ref)
    except UserError:
        row = None
    if row is not None:
        if not Path(row["path"]).exists():
            raise NotFound(f"checkpoint {ref} ({row['job']}/{row['name']}) is no longer on disk "
                           f"(pruned by keep_last?); see `gptrain checkpoints {row['job']}`")
        return str(weights_scan.loadable_at(Path(row["path"]), ref, resume))
    try:
        store.get_job(ref)
    except UserError:
        from gptrain.jobs.sweeps import best_job, is_sweep

        if is_sweep(ref):  # a sweep: its best trial's job
            best_trial = best_job(ref)
            if best_trial is None:
                raise NotFound(f"sweep {ref} has no complete trial yet: `gptrain sweep inspect {ref}`") from None
            return model_source(best_trial, resume)
        _not_a_typo(ref, [j["name"] for j in store.list_jobs()])
        return ref
    from gptrain.weights.layout import best_checkpoint

    best = None if resume else best_checkpoint(folder.job_dir(ref))  # checkpoint.keep_best's
    if best is not None:
        return str(best)
    return weights_scan.newest_loadable(scan_job(ref), f"job {ref}", f"gptrain checkpoints {ref}", ROOTS)


def _not_a_typo(ref: str, job_names: list[str]) -> None:
    """Refuse a bare name one letter or two from a job's, unless the hub model of that name is
    in the local Hugging Face cache: asking the hub first cost 5 s and ended in a traceback."""
    import difflib
    import os

    from gptrain.errors import NotFound

    near = difflib.get_close_matches(ref, job_names, n=1, cutoff=0.85)
    if not near:
        return
    hub_cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    if os.path.isdir(os.path.join(hub_cache, "models--" + ref.replace("/", "--"))):
        return
    raise NotFound(f"no job, checkpoint or model named {ref!r} here (did you mean {near[0]!r}?); "
                   f"for the Hugging Face model of that name write hf:{ref}")


def dataset_tokenizer(ref: str) -> dict | None:
    """The tokenizer of the dataset the job `ref` (a job name, or the ID of one of its
    checkpoints) trained on, its first --dataset: for a model of that job that carries none of
    its own (a nanoGPT program's ckpt.pt trained on a pushed char dataset). A tokenizer spec
    (tokenizers.from_spec), or None when `ref` is no job or its dataset cannot say."""
    from gptrain.data import nanogpt_dir
    from gptrain.data.formats import read_meta
    from gptrain.data.store import resolve
    from gptrain.errors import UserError
    from gptrain.home import NAME_RE, home
    from gptrain.jobs import store

    if not NAME_RE.fullmatch(ref) or not (home() / "gptrain.db").is_file():
        return None
    try:
        try:
            job = store.get_job(ref)
        except UserError:
            row = store.checkpoint_by_id(ref)
            job = store.get_job(row["job"]) if row else None
        datasets = (job or {}).get("spec", {}).get("datasets") or []
        if not datasets:
            return None
        path = resolve(datasets[0])
        if nanogpt_dir.is_nanogpt_dir(path):
            path = nanogpt_dir.cached(path)
        return read_meta(path)["tokenizer"]
    except (UserError, OSError, KeyError, TypeError):
        return None
