"""How a Slurm job's attempt ended, decided by its batch script (jobs/engines/slurm.py) before it exits:
requeue it (a preemption, or its time limit near: the program saved a checkpoint on SIGTERM and
continues from it), or let it end.

A time limit is the same every attempt: one too short for the program to reach a new checkpoint
(start-up longer than the time left after the --signal lead, a script that saves only every N
steps and not on SIGTERM) would be requeued forever, each attempt starting from the same place.
After STALLED_LIMIT such attempts in a row the job is not requeued and fails with the reason
(read by slurm.refresh). Preemptions by other jobs are requeued however often they come: each
one is somebody else's, and the next attempt may run longer.

    python -m gptrain.jobs.engines.slurm_attempt JOB_DIR EXIT_CODE [near-limit]

prints the line for the job's output and exits 0 when the job is to be requeued, 1 when the
attempt simply ended (a success, a crash: the exit code says which), 3 when it gave up.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gptrain.atomic import write_text_atomic
from gptrain.jobs import folder, found
from gptrain.jobs.logs import signal_ended

STALLED_LIMIT = 3  # time-limit requeues in a row without a new checkpoint: then the job fails
NEAR_LIMIT = "its time limit was near"
REQUEUE, ENDED, GAVE_UP = 0, 1, 3


def _newest(jdir: Path) -> list | None:
    """The job's newest checkpoint as [name, mtime] (a script may rewrite the same file)."""
    row = found.newest(found.scan(jdir))
    return None if row is None else [row["name"], row["mtime"]]


def _history(jdir: Path) -> dict:
    try:
        seen = json.loads(folder.slurm_requeues(jdir).read_text())
        return {"checkpoint": seen.get("checkpoint"), "stalled": int(seen.get("stalled", 0))}
    except (OSError, ValueError, TypeError, AttributeError):
        return {"checkpoint": None, "stalled": 0}


def decide(jdir: Path, code: int, near_limit: bool) -> tuple[int, str]:
    """(REQUEUE, ENDED or GAVE_UP, the line to print). A requeue writes the marker slurm.refresh
    shows as the preemption's reason; giving up writes the failure's reason."""
    why = NEAR_LIMIT if near_limit else (signal_ended(folder.logs_dir(jdir), code) if code else None)
    if not why:
        return ENDED, ""
    newest, seen = _newest(jdir), _history(jdir)
    progressed = newest is not None and newest != seen["checkpoint"]
    stalled = 0 if progressed or not near_limit else seen["stalled"] + 1
    where = f"the newest is still {newest[0]}" if newest else "there is none yet"
    if stalled >= STALLED_LIMIT:
        reason = (f"{NEAR_LIMIT} in {stalled} attempts in a row before a new checkpoint ({where}); "
                  "not requeued again: give it a longer --time, or a shorter lead in --signal=B:USR1@SECONDS")
        write_text_atomic(folder.slurm_gave_up(jdir), reason + "\n")
        return GAVE_UP, f"--- gptrain: {reason}"
    write_text_atomic(folder.slurm_requeues(jdir), json.dumps({"checkpoint": newest, "stalled": stalled}) + "\n")
    saved = f"checkpoint {newest[0]} saved" if progressed else f"no new checkpoint ({where})"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_text_atomic(folder.slurm_preempted(jdir), f"{why} ({when}): {saved}, requeued\n")
    return REQUEUE, f"--- gptrain: {why}: {saved}, job requeued"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or not args[1].lstrip("-").isdigit() or args[2:] not in ([], ["near-limit"], [""]):
        print("usage: python -m gptrain.jobs.engines.slurm_attempt JOB_DIR EXIT_CODE [near-limit]", file=sys.stderr)
        return 2
    verdict, line = decide(Path(args[0]), int(args[1]), args[2:] == ["near-limit"])
    if line:
        print(line)
    return verdict


if __name__ == "__main__":
    raise SystemExit(main())
