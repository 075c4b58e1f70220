"""Graceful stop on SIGTERM: remember the request; the training loop acts on it.

Installed first thing by `gptrain train`, before torch is imported, so a stop that arrives
while the process is still starting is not lost: the run saves a checkpoint after its next step.
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


def _handler(signum, frame):
    if not _requested.is_set():
        print("gptrain: SIGTERM received; saving a checkpoint at the end of this step",
              file=sys.stderr, flush=True)
    _requested.set()


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)


def requested() -> bool:
    return _requested.is_set()


def wait(done, what: str, poll_s: float = 0.1) -> None:
    """Return once `done()` is true; raise Interrupted (naming `what`) as soon as a stop is requested."""
    while not done():
        if _requested.is_set():
            raise Interrupted(f"stopped while {what}")
        time.sleep(poll_s)


def sleep(seconds: float, what: str) -> None:
    """time.sleep that a stop request cuts short (Interrupted)."""
    end = time.monotonic() + seconds
    wait(lambda: time.monotonic() >= end, what, poll_s=min(0.1, max(seconds, 0.0)))
