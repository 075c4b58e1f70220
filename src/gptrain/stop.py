"""Graceful stop on SIGTERM, and on the first Ctrl-C (SIGINT) of a foreground run: remember the
request; the training loop acts on it (saves a checkpoint at the end of the step). A second
Ctrl-C aborts at once, without one. The process then exits 128 + the signal (`exit_code`).

Installed first thing by `gptrain train`, before torch is imported, so a stop that arrives
while the process is still starting is not lost. Until the loop begins (`training()`) the run has
nothing of its own to save: a stop then ends it at once (Interrupted, raised where the process
is, exit 128 + the signal), even while it waits on a pipe, a config file that is a FIFO or a
server that never answers; from the first step on, it saves at the end of the step.
Whatever waits on something outside the process (a remote read: data/remote_shards.py) waits
through `wait`, which a stop cuts short with `Interrupted`, so a stalled server never holds a
stop past the grace period Slurm or Kubernetes give.
"""

import signal
import sys
import threading
import time

from gptrain.errors import Interrupted

_requested = threading.Event()
_first = [signal.SIGTERM]  # the signal that asked first


def _handler(signum, frame):
    if signum == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts
    if not _requested.is_set() and _setting_up[0]:
        _first[0] = signum
        _requested.set()
        raise Interrupted(f"{'Ctrl-C' if signum == signal.SIGINT else 'SIGTERM'} before the first step: nothing "
                          "of this run to save; exiting")
    if not _requested.is_set():
        _first[0] = signum
        what = ("Ctrl-C; saving a checkpoint at the end of this step (Ctrl-C again: abort without it)"
                if signum == signal.SIGINT else "SIGTERM received; saving a checkpoint at the end of this step")
        print(f"gptrain: {what}", file=sys.stderr, flush=True)
    _requested.set()


_setting_up = [True]  # before the loop's first step


def training() -> None:
    """The loop begins: from here a stop saves a checkpoint at the end of the step."""
    _setting_up[0] = False


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
            signal.signal(signal.SIGINT, _handler)


def exit_code() -> int:
    """What a run stopped before its last step exits with: 143 after SIGTERM, 130 after Ctrl-C."""
    return 128 + int(_first[0])


def requested() -> bool:
    return _requested.is_set()


def wait(done, what: str, poll_s: float = 0.1) -> None:
    """Return once `done()` is true; raise Interrupted (naming `what`) as soon as a stop is requested."""
    while not done():
        if _requested.is_set():
            raise Interrupted(f"stopped while {what}")
        time.sleep(poll_s)


def join(thread: threading.Thread, what: str, give_up=lambda: False, poll_s: float = 0.1) -> None:
    """Return as soon as `thread` has ended, or once `give_up()` is true (checked every poll_s);
    raise Interrupted (naming `what`) as soon as a stop is requested. Unlike `wait`, a thread
    that ends at once costs no poll: a remote read of 2 ms waited 100 ms through `wait`."""
    while thread.is_alive() and not give_up():
        if _requested.is_set():
            raise Interrupted(f"stopped while {what}")
        thread.join(poll_s)


def sleep(seconds: float, what: str) -> None:
    """time.sleep that a stop request cuts short (Interrupted)."""
    end = time.monotonic() + seconds
    wait(lambda: time.monotonic() >= end, what, poll_s=min(0.1, max(seconds, 0.0)))
