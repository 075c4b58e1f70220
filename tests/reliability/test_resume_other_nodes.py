"""`gptrain resume NAME --nodes N`: a stopped job goes on on another number of nodes (the local
engine here: its nodes are agents on this machine; tests/hosts/test_streaming_hosts.py does it
on real hosts under Slurm, with the data each step reads checked against an uninterrupted run).
The record, its nodes and job.json say N from then on, an event says what changed; what is
refused (a bad N, a job still running, a resume the engine refuses) changes nothing."""

import json
import re
import shutil

import pytest

from tests.conftest import run_cli
from tests.job_helpers import TRAIN, job, job_dir, ok, rank_log, refused, wait_for, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def home(slots, isolated_home):
    """Two local slots (conftest.slots), the job's home."""
    return isolated_home


def log(name) -> str:
    """Rank 0's log so far ("" before it is made)."""
    try:
        return rank_log(name)
    except OSError:
        return ""


def spec_on_disk(name) -> dict:
    from gptrain.jobs.folder import spec_file

    return json.loads(spec_file(job_dir(name)).read_text())


def test_a_stopped_job_resumes_on_fewer_nodes(home, tmp_path):
    from tests.helpers import make_dataset

    ok("data", "push", "tiny", make_dataset(tmp_path))
    ok("run", "two", "--nodes", "2", "--accels", "1", "--dataset", "tiny", "--", *TRAIN,
       "--train.max_steps=600", "--train.global_batch_size=8", "--train.do_eval=false", "--checkpoint.every=1000")
    wait_until(lambda: re.search(r"^step\s+20/", log("two"), re.M), timeout=180, what="step 20 logged")
    refused(run_cli("resume", "two", "--nodes", "1"), "two is running", "only a failed or stopped job")
    ok("stop", "two", "--wait")
    assert job("two")["state"] == "stopped"

    for bad, words in (("0", "--nodes"), ("two", "--nodes must be N or MIN:MAX"),
                       # more than this machine's 2 slots, or than any cluster: it was accepted and
                       # queued forever, blocking every later job (#47 row 8)
                       ("3", "needs 3 x 1 = 3 cpu slots but this machine has 2"),
                       ("1000000000", "more than any cluster"), ("1:1000000000", "more than any cluster")):
        refused(run_cli("resume", "two", "--nodes", bad), *words)
    assert job("two")["nodes"] == 2 and job("two")["spec"]["nodes"] == 2 and spec_on_disk("two")["nodes"] == 2
    away = shutil.move(job_dir("two"), tmp_path / "away")  # the engine refuses: no folder
    refused(run_cli("resume", "two", "--nodes", "1"), "has no directory")
    shutil.move(away, job_dir("two"))
    assert job("two")["state"] == "stopped" and job("two")["nodes"] == 2 and job("two")["spec"]["nodes"] == 2

    out = ok("resume", "two", "--nodes", "1")
    assert "resumed job two on 1 node(s)" in out, out
    assert wait_for("two")["state"] == "succeeded", rank_log("two")[-3000:]
    record = job("two")
    assert record["nodes"] == 1 and record["spec"]["nodes"] == 1 and spec_on_disk("two")["nodes"] == 1
    events = [e for e in json.loads(ok("inspect", "two", "--json"))["events"] if e["kind"] == "placed"]
    assert [e["message"] for e in events] == ["to run on 1 node(s) from its next start (was 2)"], events
    heads = [line for line in rank_log("two").splitlines() if line.startswith("--- gptrain:")]
    assert "world 2" in heads[0] and "world 1" in heads[-1], heads
    assert "resumed from" in rank_log("two") and "completed at step 600" in rank_log("two")
