"""A remote step read and a remote fetch are watched from another thread (train/step_reader.py,
data/remote_shards.py) so that a stop cuts a stalled read short; the watching must not cost the
read itself. It polled every 0.1 s: a step whose batches came in 1 ms waited for the poll, every
step (URL jobs ran at 0.77x the steps/s of local files on 2-4 hosts, bench/host_streaming.py).
Now the watcher joins the thread and wakes when it ends: it never sleeps for a read that is done."""

import threading
import time

import pytest

from gptrain import stop
from gptrain.errors import Interrupted
from gptrain.train.step_reader import StepReader


class Loader:
    """A loader whose batches take 1 ms (a cached shard's read)."""

    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n}

    def next_batch(self):
        threading.Event().wait(0.001)
        self.n += 1
        return self.n


def test_a_remote_step_read_that_is_done_at_once_waits_for_no_poll(monkeypatch):
    slept = []
    real_sleep = time.sleep
    mine = {threading.get_ident()}  # (time.sleep is the process's: other tests' threads sleep too)

    def sleep(s):
        if threading.get_ident() in mine or threading.current_thread().name == "read the next step's batches":
            slept.append(s)
        real_sleep(s)

    monkeypatch.setattr(stop.time, "sleep", sleep)
    reader = StepReader(Loader(), 4, remote=True)
    for _ in range(20):
        assert reader.read() is not None
    assert slept == [], slept  # was: a 0.1 s poll at (nearly) every step


def test_join_returns_when_the_thread_ends_gives_up_and_is_cut_short_by_a_stop(monkeypatch):
    done = threading.Event()
    t = threading.Thread(target=done.wait, daemon=True)
    t.start()
    stop.join(t, "testing", give_up=lambda: True)  # (a stalled read is given up)
    assert t.is_alive()
    monkeypatch.setattr(stop, "_requested", threading.Event())
    stop._requested.set()
    with pytest.raises(Interrupted, match="stopped while testing"):
        stop.join(t, "testing")
    done.set()
    t.join()
    stop.join(t, "testing")  # an ended thread: at once, even with a stop requested


def test_a_stop_the_read_itself_sees_first_is_a_stop_not_an_error():
    """A stalled fetch inside the read (data/remote_read._patiently) watches for a stop too: when it
    raises Interrupted before the watcher of the whole read does, the read ends, and the step's
    read must come back as a stop (None: save the last step, exit 143), not as an error (it went
    up as one: the run exited 143 without its checkpoint, tests/reliability/test_stalled_storage.py)."""

    class Stalled(Loader):
        def next_batch(self):
            raise Interrupted("stopped while reading a shard")

    reader = StepReader(Stalled(), 2, remote=True)
    assert reader.read() is None and reader.abandoned
