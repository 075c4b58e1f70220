"""Reading a job's logs: logs/rank-R.log per rank, logs/agent-nodeN.log per torchrun agent.

Each attempt appends to the same files, after a `--- gptrain: attempt N` line.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

ATTEMPT_MARK = "--- gptrain: attempt"
NO_SPACE = "no space left on device"
_ERROR_LINE = re.compile(r"^(gptrain: error: .*|([A-Za-z_][\w.]*)?(Error|Exception)\b.*|.*\bError: .*)$")


def last_attempt(path: Path) -> str:
    return path.read_text(errors="replace").split(ATTEMPT_MARK)[-1]


def failed_rank(logs: Path, code: int) -> tuple[int | None, int]:
    """(the first failing rank, its exit code) as torchrun reports them, else (None, code)."""
    for agent_log in sorted(logs.glob("agent-node*.log")):
        m = re.search(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", last_attempt(agent_log))
        if m:
            return int(m.group(1)), int(m.group(2))
    return None, code


def mentions_no_space(logs: Path) -> bool:
    """A rank's or agent's last attempt ran out of disk space (ENOSPC)."""
    return any(NO_SPACE in last_attempt(p).lower() for p in sorted(logs.glob("*.log")))


def failure_summary(logs: Path, code: int) -> str:
    """The failing rank's last error line, or what torchrun says of it, with the job's secret
    values masked (logs is $GPTRAIN_HOME/jobs/NAME/logs)."""
    from gptrain.jobs.secrets import masked

    return masked(logs.parent.name, _failure_summary(logs, code))


def _failure_summary(logs: Path, code: int) -> str:
    rank, exitcode = failed_rank(logs, code)
    ranks = [rank] if rank is not None else sorted(int(p.stem.split("-")[1]) for p in logs.glob("rank-*.log"))
    for r in ranks:
        path = logs / f"rank-{r}.log"
        if path.is_file():
            errors = [ln.strip() for ln in last_attempt(path).splitlines() if _ERROR_LINE.match(ln.strip())]
            if errors:
                return f"rank {r}: {errors[-1]}"
    if rank is not None and exitcode < 0:
        return f"rank {rank} was killed by {signal.Signals(-exitcode).name}"
    return f"rank {rank if rank is not None else '?'} exited with code {exitcode}"
