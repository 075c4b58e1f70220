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


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torch's excepthook: "[rank0]: Traceback ..."
_FAILURE = re.compile(r"\[\d+\]:\s*\n\s*time\s*:\s*(\S+)\s*\n(?:.*\n)*?\s*rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)")


def failed_rank(logs: Path, code: int) -> tuple[int | None, int]:
    """(the rank that failed first, its exit code) as torchrun reports them, else (None, code).

    torchrun prints a "Failures:" block (the ranks it tore down, often SIGTERM) and a
    "Root Cause (first observed failure):" block: the root cause is taken, and across nodes the
    earliest one that exited with an error rather than a signal."""
    causes = []
    for agent_log in sorted(logs.glob("agent-node*.log")):
        text = last_attempt(agent_log)
        root = text.rfind("Root Cause")
        m = _FAILURE.search(text, root if root >= 0 else 0)
        if m:
            causes.append((int(m.group(3)) < 0, m.group(1), int(m.group(2)), int(m.group(3))))
    if not causes:
        return None, code
    _, _, rank, exitcode = min(causes)
    return rank, exitcode


def error_lines(log: Path) -> list[str]:
    """The error lines of a rank's last attempt, without torch's `[rankN]:` prefix."""
    lines = (_RANK_PREFIX.sub("", ln).strip() for ln in last_attempt(log).splitlines())
    return [ln for ln in lines if _ERROR_LINE.match(ln)]


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
    # the root cause's own error; when it was torn down by SIGTERM (or is unknown), another
    # rank's that failed meanwhile; a root cause killed otherwise (SIGKILL: out of memory?) is that
    others = sorted(int(p.stem.split("-")[1]) for p in logs.glob("rank-*.log"))
    if rank is not None and exitcode != -signal.SIGTERM:
        others = []
    for r in ([rank] if rank is not None else []) + [r for r in others if r != rank]:
        path = logs / f"rank-{r}.log"
        errors = error_lines(path) if path.is_file() else []
        if errors:
            return f"rank {r}: {errors[-1]}"
    if rank is not None and exitcode < 0:
        return f"rank {rank} was killed by {signal.Signals(-exitcode).name}"
    return f"rank {rank if rank is not None else '?'} exited with code {exitcode}"
