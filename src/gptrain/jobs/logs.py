"""Reading a job's logs: logs/rank-R.log per rank, logs/agent-nodeN.log per torchrun agent.

Each attempt appends to the same files, after a `--- gptrain: attempt N` line.

The one log reader (as Ray's job_log_storage_client.py), for `gptrain logs [--follow]`, the
console's log API and stream, and `gptrain fetch`'s zip: `read_page` gives whole lines from a
byte offset, at most PAGE_BYTES of them (a log of any size costs one page of memory), masked by
jobs/secrets.py as they are read; `follow` pages on until the job ends; `tail` is the last part
of a log, for failure text.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from gptrain.errors import LOST_PEER

ATTEMPT_MARK = "--- gptrain: attempt"
NO_SPACE = "no space left on device"
PAGE_BYTES = 64 * 1024  # a page of log, and a log view's first look: its last 64 KiB
TAIL_BYTES = 1 << 20  # what failure text is looked for in: the last MiB of a log
_ERROR_LINE = re.compile(r"^(gptrain: error: .*|([A-Za-z_][\w.]*)?(Error|Exception)\b.*|.*\bError: .*)$")


def rank_log(logs: Path, rank: int) -> Path:
    return logs / f"rank-{rank}.log"


def agent_log(logs: Path, node) -> Path:
    """A node's torchrun agent (or command) output; `node` may be Slurm's `%n`."""
    return logs / f"agent-node{node}.log"


def check_rank(text: str, ranks: int) -> int:
    """The rank named by `text` (from a URL or a command line), one of 0..ranks-1; else a
    UserError saying which ranks there are."""
    from gptrain.errors import UserError

    if not (text.isascii() and text.isdigit() and len(text) <= 9) or int(text) >= ranks:
        raise UserError(f"no rank {text!r}: the job has ranks 0..{ranks - 1}")
    return int(text)


def _next_line(f, pos: int, size: int) -> int | None:
    """The offset just past the first newline at or after `pos`, read a page at a time; None if none."""
    while pos < size:
        f.seek(pos)
        block = f.read(min(PAGE_BYTES, size - pos))
        if b"\n" in block:
            return pos + block.index(b"\n") + 1
        pos += len(block)
    return None


def read_page(path: Path, offset: int | None, values, cap: int = PAGE_BYTES,
              final: bool = False) -> tuple[str, int]:
    """(whole lines of `path` from byte `offset`, at most `cap` bytes of them, with the secret
    `values` masked; the offset to read from next). offset None, or past the end: the log's
    last `cap` bytes. An offset inside a line starts at the next line, so no part of a line is
    shown alone; a line longer than `cap` is left out with a note; `final` (the job has ended)
    also gives a last line that has no newline."""
    from gptrain.jobs.secrets import mask

    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return "", 0
    with f:
        size = os.fstat(f.fileno()).st_size
        if offset is None or offset > size:
            offset = max(0, size - cap)
        if offset >= size:
            return "", offset
        if offset:
            f.seek(offset - 1)
            if f.read(1) != b"\n":
                start = _next_line(f, offset, size)
                if start is None:
                    return "", offset
                offset = start
        f.seek(offset)
        chunk = f.read(min(cap, size - offset))
        end = chunk.rfind(b"\n") + 1
        if end == 0 and final and offset + len(chunk) == size:
            end = len(chunk)
        elif end == 0 and len(chunk) == cap:  # one line longer than a page
            after = _next_line(f, offset + cap, size) or (size if final else None)
            if after is not None:
                return f"(a line of {after - offset} bytes left out)\n", after
        if end == 0:
            return "", offset
        # edges: a secret split across this page's first or last line and the next page's
        return mask(chunk[:end].decode(errors="replace"), values, edges=True), offset + end


def follow(path: Path, values, ended, offset: int = 0, poll_s: float = 0.5):
    """Yield pages of `path` from `offset` as they are written, until `ended()` and all is read."""
    while True:
        done = ended()
        text, offset = read_page(path, offset, values, final=done)
        if text:
            yield text
        elif done:
            return
        else:
            time.sleep(poll_s)


def pages(path: Path, values):
    """The whole log, masked, a page at a time (the job may still be writing it)."""
    yield from follow(path, values, ended=lambda: True)


def tail(path: Path, cap: int = TAIL_BYTES) -> str:
    """The last `cap` bytes of a log (from a line start), unmasked: for failure text."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - cap))
        data = f.read()
    if size > cap and b"\n" in data:
        data = data[data.index(b"\n") + 1:]
    return data.decode(errors="replace")


def last_attempt(path: Path) -> str:
    return tail(path).split(ATTEMPT_MARK)[-1]


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torch's excepthook: "[rank0]: Traceback ..."
_FAILURE = re.compile(r"\[\d+\]:\s*\n\s*time\s*:\s*(\S+)\s*\n(?:.*\n)*?\s*rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)")


def failed_rank(logs: Path, code: int) -> tuple[int | None, int]:
    """(the rank that failed first, its exit code) as torchrun reports them, else (None, code).

    torchrun prints a "Failures:" block (the ranks it tore down, often SIGTERM) and a
    "Root Cause (first observed failure):" block: the root cause is taken, and across nodes the
    earliest one that was not torn down (SIGTERM): a rank killed outright (SIGKILL) before
    another node's ranks saw their peer gone is the cause, not their connection errors (also
    within the same second, torchrun's resolution)."""
    causes = []
    for path in sorted(logs.glob(agent_log(logs, "*").name)):
        text = last_attempt(path)
        root = text.rfind("Root Cause")
        m = _FAILURE.search(text, root if root >= 0 else 0)
        if m:
            exitcode = int(m.group(3))
            causes.append((exitcode == -signal.SIGTERM, m.group(1), exitcode >= 0, int(m.group(2)), exitcode))
    if not causes:
        return None, code
    *_, rank, exitcode = min(causes)
    return rank, exitcode


SIGTERM_CODES = (-signal.SIGTERM, 128 + signal.SIGTERM)  # killed by it, or exited after saving (cli/train.py)
_AGENT_SIGNALLED = re.compile(r"Received (?:Signals\.)?(SIG[A-Z]+|\d+) death signal")  # torchrun's agent


def failed_on_its_own(logs: Path) -> str | None:
    """'rank R: ERROR' for the first rank whose last attempt logged an error of its own, else None.
    srun (--kill-on-bad-exit) and torchrun end the other ranks of a failed attempt with SIGTERM,
    so a SIGTERM after such an error is their teardown, never a preemption."""
    for path in sorted(logs.glob(rank_log(logs, "*").name)):
        errors = [e for e in error_lines(path) if LOST_PEER not in e]  # its peer died: not a cause
        if errors:
            return f"{path.stem.replace('-', ' ')}: {errors[-1]}"
    return None


def signal_ended(logs: Path, code: int) -> str | None:
    """Who a SIGTERM ended this attempt through, when one did ('rank 1 got SIGTERM'...): the
    program or agent itself (`code`), a torchrun agent that received it (its log says so), or
    the worker torchrun names as the first failure. None when the attempt failed otherwise (a
    crash, a SIGKILL, the OOM killer's kill; a rank's own error, after which the SIGTERMs are
    the teardown of the others: a failing 2-node Slurm job was requeued as preempted 13 times)."""
    if failed_on_its_own(logs):
        return None
    if code in SIGTERM_CODES:
        return "its process got SIGTERM"
    for path in sorted(logs.glob(agent_log(logs, "*").name)):
        m = _AGENT_SIGNALLED.search(last_attempt(path))
        if m:
            sig = m.group(1)
            sig = signal.Signals(int(sig)).name if sig.isdigit() and int(sig) in signal.Signals._value2member_map_ else sig
            return f"the torchrun agent of {path.stem.removeprefix('agent-')} got {sig}"
    rank, worker_code = failed_rank(logs, code)
    if rank is not None and worker_code in SIGTERM_CODES:
        return f"rank {rank} got SIGTERM"
    return None


CHILD_FAILED = "ChildFailedError"  # what torchrun raises when one of its workers failed


def error_lines(log: Path) -> list[str]:
    """The error lines of a rank's last attempt, without torch's `[rankN]:` prefix. When the
    program ran a torchrun of its own (a wrapper script), that torchrun's ChildFailedError is not
    the error: its workers' are (the root cause's rank's, when their lines carry its prefix)."""
    text = last_attempt(log)
    raw = [ln.strip() for ln in text.splitlines()]
    if any(CHILD_FAILED in ln for ln in raw):
        raw = _inner_worker_lines(text, raw)
    lines = (_RANK_PREFIX.sub("", ln).strip() for ln in raw)
    return [ln for ln in lines if _ERROR_LINE.match(ln)]


def _inner_worker_lines(text: str, raw: list[str]) -> list[str]:
    """A wrapper's torchrun failed: the lines of its root-cause worker when they hold an error
    (else all lines), without the ChildFailedError itself."""
    root = _FAILURE.search(text, max(text.rfind("Root Cause"), 0))
    if root:
        own = [ln for ln in raw if ln.startswith(f"[rank{root.group(2)}]:")]
        if any(_ERROR_LINE.match(_RANK_PREFIX.sub("", ln).strip()) for ln in own):
            raw = own
    return [ln for ln in raw if CHILD_FAILED not in ln]


def mentions_no_space(logs: Path) -> bool:
    """A rank's or agent's last attempt ran out of disk space (ENOSPC)."""
    return any(NO_SPACE in last_attempt(p).lower() for p in sorted(logs.glob("*.log")))


def failure_summary(logs: Path, code: int, node: int | None = None) -> str:
    """The failing rank's last error line, or what torchrun says of it, or else what became of
    the agent of `node` (the first to fail, when known), with the job's secret values masked
    (logs is $GPTRAIN_HOME/jobs/NAME/logs)."""
    from gptrain.jobs.secrets import masked

    return masked(logs.parent.name, _failure_summary(logs, code, node))


def _failure_summary(logs: Path, code: int, node: int | None) -> str:
    rank, exitcode = failed_rank(logs, code)
    # the root cause's own error; when it was torn down by SIGTERM (or is unknown), another
    # rank's that failed meanwhile; a root cause killed otherwise (SIGKILL: out of memory?) is that
    others = sorted(int(p.stem.split("-")[1]) for p in logs.glob("rank-*.log"))
    if rank is not None and exitcode != -signal.SIGTERM:
        others = []
    for r in ([rank] if rank is not None else []) + [r for r in others if r != rank]:
        path = rank_log(logs, r)
        errors = error_lines(path) if path.is_file() else []
        if errors:
            return f"rank {r}: {errors[-1]}"
    how = f"was killed by {_signal_name(-exitcode)}" if exitcode < 0 else f"exited with code {exitcode}"
    if rank is not None:
        return f"rank {rank} {how}"
    if node is not None:  # no rank's failure was reported: the node's agent itself died
        return f"the agent of node {node} (torchrun, or the node's command) {how}"
    return f"the job {how}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
