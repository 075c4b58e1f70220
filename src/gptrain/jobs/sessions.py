"""Interactive sessions: a shell in the environment a job of the same spec gets (its code, its
datasets at /input/NAME, its checkpoint folder at /output-checkpoint, its environment and
secrets), reserved through the same queue as jobs. A session IS a job whose program is
jobs/programs/session_shell.py: the queue holds its accelerators while it lives and frees them
when it ends, and every job command works on it (`jobs`, `logs`, `checkpoints`, `stop`,
`generate NAME` of what it saved in /output-checkpoint).

This module starts one, says which jobs are sessions, and is the client of the session's socket:
`attach` relays a terminal, `run` runs one command and gives back its output and exit status.
The local engine only, for now; the others are refused in one line.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import time

from gptrain.errors import UserError
from gptrain.jobs.programs.session_shell import PROGRAM, SOCKET, shell_command

DEFAULT_IDLE_S = 3600.0
READY_WAIT_S = 120.0


def parse_duration(text: str, flag: str = "--idle-timeout") -> float:
    """Seconds of '90', '90s', '30m', '2h' (at most a week), given as `flag`."""
    units = {"s": 1, "m": 60, "h": 3600}
    t = str(text).strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = -1.0
    if not 0 < value <= 7 * 86400:
        raise UserError(f"{flag} {text!r}: give a duration such as 90s, 30m or 2h (at most a week)")
    return value


def start(request, idle_timeout: float = DEFAULT_IDLE_S, jupyter: bool = False):
    """Submit the session `request` (a jobs.submission.Request without an entry): its program is
    the session's shell (and a Jupyter Server when `jupyter`), its code this folder unless it
    names one. Returns the job's spec."""
    import shutil

    from gptrain.jobs.submission import submit
    from gptrain.jobs.folder import job_dir

    if request.scheduler not in (None, "local"):
        raise UserError(f"sessions run on the local engine for now; --scheduler {request.scheduler} is not "
                        "supported yet (docs/sessions.md)")
    if shutil.which("bwrap") is None:
        raise UserError("sessions need bubblewrap to mount /input and /output-checkpoint: apt-get install bubblewrap")
    if not request.name:
        raise UserError("a session needs a name: gptrain session start NAME")
    if jupyter:
        try:
            import ipykernel  # noqa: F401
            import jupyter_server  # noqa: F401
        except ImportError:
            raise UserError("--jupyter needs Jupyter Server and a kernel: pip install 'gptrain[session]'") from None
    request.entry = shell_command(job_dir(request.name), idle_timeout, request.datasets or [], jupyter)
    request.scheduler, request.nodes, request.max_restarts = "local", "1", 0
    if not (request.code or request.source or request.repository_url):
        request.code = request.cwd  # a snapshot of the current folder, as a job's
    spec, notes = submit(request)
    return spec, notes


def is_session(row: dict) -> bool:
    """Whether a job's record (its spec a dict or the database's JSON) is a session's."""
    spec = row.get("spec") or {}
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            return False
    return isinstance(spec, dict) and PROGRAM in (spec.get("args") or [])


def names() -> set[str]:
    """The names of the jobs that are sessions."""
    from gptrain.jobs import store

    return {r["name"] for r in store.list_jobs() if is_session(r)}


def wait_ready(name: str, timeout: float = READY_WAIT_S) -> None:
    """Until the session's socket is there; one line when its job ended first (why) or never started."""
    from gptrain.jobs import store
    from gptrain.jobs.folder import job_dir

    deadline = time.time() + timeout
    while time.time() < deadline:
        if (job_dir(name) / SOCKET).exists():
            return
        row = store.get_job(name)
        if row["state"] in store.TERMINAL:
            raise UserError(f"session {name} ended before it was ready ({row['state']}): "
                            f"{row.get('error') or 'see gptrain logs ' + name}")
        time.sleep(0.1)
    raise UserError(f"session {name} is not ready after {timeout:.0f} s (still waiting for accelerators?): "
                    f"see `gptrain jobs`; attach later with `gptrain session attach {name}`")


def check_is_session(name: str) -> None:
    """One line when job `name` is not a session (nor a held job's kept environment)."""
    from gptrain.jobs import store

    row = store.get_job(name)
    if not is_session(row) and row["state"] != store.JobState.HELD:
        kept = "" if row["state"] != store.JobState.FAILED else \
            " (a job run with --keep-on-failure keeps its environment when it fails)"
        raise UserError(f"{name} is a job, not a session{kept}: `gptrain logs {name}`")


def jupyter_of(name: str) -> dict:
    """{url, token} of session `name`'s Jupyter Server (programs/session_jupyter.py); one line
    when it has none (not started with --jupyter, or ended)."""
    from gptrain.jobs import store
    from gptrain.jobs.folder import job_dir
    from gptrain.jobs.programs.session_jupyter import shown

    row = store.get_job(name)
    found = shown(job_dir(name)) if row["state"] not in store.TERMINAL else None
    if found is None:
        raise UserError(f"session {name} has no Jupyter Server running ({row['state']}; "
                        "`gptrain session start NAME --jupyter` starts one)")
    return found


def _connect(name: str, request: dict) -> socket.socket:
    from gptrain.jobs import store
    from gptrain.jobs.folder import job_dir

    check_is_session(name)
    row = store.get_job(name)
    jdir = job_dir(name)
    if row["state"] in store.TERMINAL or not (jdir / SOCKET).exists():
        raise UserError(f"session {name} is {row['state']}" + ("" if row["state"] in store.TERMINAL else
                                                                 " and not ready yet") + ": nothing to attach to")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    here = os.getcwd()
    os.chdir(jdir)  # (relative: a socket path may not exceed 107 bytes)
    try:
        sock.connect(SOCKET)
    except OSError as e:
        raise UserError(f"cannot reach session {name} ({e.strerror}): it may just have ended; see `gptrain jobs`") \
            from None
    finally:
        os.chdir(here)
    sock.sendall(json.dumps(request).encode() + b"\n")
    return sock


def run(name: str, argv: list[str], out=None) -> int:
    """Run `argv` in the session's sandbox; its output written to `out` (bytes), its exit status returned."""
    if not argv:
        raise UserError("gptrain session exec NAME -- COMMAND [ARGS]: give the command after --")
    out = out or sys.stdout.buffer
    sock = _connect(name, {"op": "exec", "argv": argv})
    reader = sock.makefile("rb")
    while True:
        head = reader.read(5)
        if len(head) < 5:
            raise UserError(f"session {name} ended while the command ran")
        kind, size = head[:1], struct.unpack(">I", head[1:])[0]
        body = reader.read(size)
        if kind == b"X":
            return struct.unpack(">i", body)[0]
        out.write(body)
        out.flush()


def attach(name: str, stdin=None, stdout=None) -> None:
    """Relay a terminal to the session's shell until either side closes (the shell's `exit`
    ends the session; closing this terminal only detaches)."""
    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout.buffer
    rows, cols = _size(stdin)
    sock = _connect(name, {"op": "attach", "rows": rows, "cols": cols})
    raw = _raw(stdin)
    try:
        fds = [sock, stdin.fileno()]
        while True:
            ready, _, _ = select.select(fds, [], [])
            if sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                stdout.write(data)
                stdout.flush()
            if stdin.fileno() in ready:
                data = os.read(stdin.fileno(), 65536)
                if not data:  # this side's input ended: detach, the shell goes on
                    fds = [sock]
                    sock.shutdown(socket.SHUT_WR)
                    continue
                sock.sendall(data)
    finally:
        raw()
        sock.close()


def _size(stdin) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(stdin.fileno())
        return size.lines, size.columns
    except (OSError, ValueError):
        return 24, 80


def _raw(stdin):
    """The terminal in raw mode (keys reach the shell as typed, ^C included); the undo."""
    import termios
    import tty

    try:
        saved = termios.tcgetattr(stdin.fileno())
    except (termios.error, OSError, ValueError):
        return lambda: None
    tty.setraw(stdin.fileno(), termios.TCSANOW)  # (what was typed ahead is kept, not flushed)
    return lambda: termios.tcsetattr(stdin.fileno(), termios.TCSADRAIN, saved)
