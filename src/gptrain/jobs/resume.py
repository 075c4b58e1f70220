"""What a restarted program is told, and whether it really continued: the job's `resume_args`.

    gptrain run NAME --resume-args '--resume_from_checkpoint {checkpoint}' -- train.py ARGS
    gptrain run NAME --resume-args hf -- train.py ARGS          (the same, ready-made)
    gptrain run NAME --resume-args nanogpt -- train.py ARGS     (--init_from=resume)

On a restart (`--max-restarts`, a Slurm requeue, `gptrain resume`) that finds a checkpoint
(jobs/found.py), these words are appended to the program's arguments, `{checkpoint}` replaced by
the checkpoint's path. The words are split once, as a shell would, and the path goes into its
word as it is: the program gets an argv, no shell ever reads it (jobs/rank_log.py appends them at
launch, on every scheduler; the Slurm script only carries the template, quoted). A first
attempt, or a restart with no checkpoint, gets nothing.

Here too: the line of the restart event (what the program was given), and the warning when a
restarted program writes a checkpoint below the step the job had reached (it started over).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from gptrain.errors import UserError

PRESETS = {"hf": "--resume_from_checkpoint {checkpoint}", "nanogpt": "--init_from=resume"}
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
ENV = "GPTRAIN_RESUME_ARGS"  # the template, as the workers' launch reads it (jobs/launch.py)
NANOGPT_FILE = "ckpt.pt"
NO_ARGS = "the program was given no resume arguments (see --resume-args)"


def template(value: str) -> str:
    """The words a job's resume_args stands for (a preset's, or as typed)."""
    return PRESETS.get(value.strip(), value)


def check(value) -> None:
    """A job's resume_args, refused with one line: empty, unbalanced quotes, or a placeholder
    other than {checkpoint}."""
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"--resume-args needs the program's resume arguments, e.g. "
                        f"'--resume_from_checkpoint {{checkpoint}}', or a preset: {', '.join(PRESETS)}")
    try:
        words = shlex.split(template(value))
    except ValueError as e:
        raise UserError(f"--resume-args {value!r}: {e}") from None
    unknown = sorted({m for w in words for m in PLACEHOLDER.findall(w) if m != "checkpoint"})
    if unknown:
        raise UserError(f"--resume-args {value!r}: unknown placeholder {{{unknown[0]}}}; the one "
                        "placeholder is {checkpoint} (the path of the checkpoint found)")
    if not words:
        raise UserError(f"--resume-args {value!r} holds no arguments")


def words(value: str | None, checkpoint: Path | None) -> tuple[list[str], str | None]:
    """(the arguments to append, why none when they are empty) for a launch that found
    `checkpoint` (None: none found)."""
    if not value:
        return [], NO_ARGS
    if checkpoint is None:
        return [], "no checkpoint yet"
    if value.strip() == "nanogpt" and Path(checkpoint).name != NANOGPT_FILE:
        return [], (f"--resume-args nanogpt resumes from its out_dir's {NANOGPT_FILE}, and the newest "
                    f"checkpoint is {checkpoint}")
    return [w.replace("{checkpoint}", str(checkpoint)) for w in shlex.split(template(value))], None


def restart_line(spec, jdir) -> str:
    """What a restarted job's program is given, for the restart event; the same decision as
    the launch's (jobs/launch.finish)."""
    from gptrain.jobs import found

    latest, name = found.latest_named(jdir)
    if latest is None:
        damaged = [r["name"] for r in found.scan_folder_rows(jdir) if r.get("damaged")]
        if damaged:  # (not "no checkpoint yet": the run refuses to start over on top of them)
            return (f"has no checkpoint that passes verification ({len(damaged)} refused: "
                    f"`gptrain checkpoints {Path(jdir).name} --verify`); the run will not start over on them")
        from gptrain.weights.layout import gone_latest

        gone = gone_latest(jdir)
        if gone:  # (its checkpoints removed: not "no checkpoint yet")
            return f"has no checkpoint on disk (checkpoints/latest names {gone}, which is gone); the run will not start over"
        return "starts again (no checkpoint yet)"
    if spec.entry == "trainer":
        return f"continues from {name} (or the newest one before it that passes verification)"
    args, why = words(spec.resume_args, latest)
    if args:
        return f"resumes with {shlex.join(args)}"
    return f"restarted from scratch: {why} (unless it reads GPTRAIN_RESUME_FROM, {latest})"


def baseline(rows: list[dict]) -> dict:
    """The checkpoints a job had when it was restarted: by name, (mtime, size, step)."""
    return {r["name"]: (r["mtime"], r["size"], r["step"]) for r in rows}


def rewinds(before: dict, rows: list[dict]) -> list[tuple[str, str]]:
    """(name, warning) for each checkpoint the restarted program wrote below the newest step the
    job had reached before the restart: a new one, or one it rewrote (it started over)."""
    reached = max((s for _, _, s in before.values() if s is not None), default=None)
    out = []
    for r in rows:
        if reached is None or r["step"] is None or r["step"] >= reached:
            continue
        old = before.get(r["name"])
        if old is None:
            out.append((r["name"], f"{r['name']} written at step {r['step']} after the restart, below "
                        f"step {reached} the job had reached: the program started over"))
        elif old[:2] != (r["mtime"], r["size"]):
            out.append((r["name"], f"{r['name']} rewritten at step {r['step']} after the restart "
                        f"(it held step {old[2]}; the job had reached step {reached}): the program "
                        "started over"))
    return out
