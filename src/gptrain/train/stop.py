"""Graceful stop on SIGTERM: remember the request; the training loop acts on it.

Installed first thing by `gptrain train`, before torch is imported, so a stop that arrives
while the process is still starting is not lost: the run saves a checkpoint after its next step.
"""

import signal
import sys
import threading

_requested = threading.Event()


def _handler(signum, frame):
    if not _requested.is_set():
        print("gptrain: stop requested; saving a checkpoint at the end of this step",
              file=sys.stderr, flush=True)
    _requested.set()


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)


def requested() -> bool:
    return _requested.is_set()
