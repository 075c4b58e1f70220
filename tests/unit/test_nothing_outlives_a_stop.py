"""What a stop leaves behind: nothing. `gptrain stop --wait` returns once the job's supervisor
has exited too, and procs.kill_run returns once every process of the run is gone, the ones
forked while it was killing them included (real processes, the real job store)."""

import os
import subprocess
import sys
import time

from gptrain.jobs import api, procs, store


def test_stop_wait_returns_only_once_the_supervisor_has_exited():
    supervisor = subprocess.Popen(["sleep", "2"])  # a supervisor that recorded the end, still exiting
    store.create_job("done", {"name": "done"}, 1, 1, "local")
    assert store.record_supervisor("done", procs.identity(supervisor.pid), "run-1")
    assert store.set_state("done", store.JobState.STOPPED, "stopped on request", owner="run-1")
    t0 = time.time()
    # was: `stop --wait` returned at once on the recorded state, the supervisor still there
    assert api.stop("done", wait=True) == "stopped"
    assert not procs.alive(procs.identity(supervisor.pid) or [supervisor.pid, 0, procs.boot_id()])
    assert time.time() - t0 > 1
    supervisor.wait()


FORKER = """
import os, time
open(os.environ["READY"], "w").close()
for _ in range(3000):  # a worker forking helpers as fast as it can (until it is killed)
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    time.sleep(0.002)
"""


def test_kill_run_leaves_no_process_of_the_run_even_one_forked_while_it_killed(tmp_path):
    run_id = "run-forking"
    env = {**os.environ, procs.RUN_ID_ENV: run_id, "READY": str(tmp_path / "ready")}
    parent = subprocess.Popen([sys.executable, "-c", FORKER], env=env)
    while not (tmp_path / "ready").exists():
        time.sleep(0.01)
    time.sleep(0.5)  # some hundreds of helpers by now, more coming every 2 ms
    try:
        assert procs.kill_run(run_id) > 100
        # was: the helpers forked between kill_run's /proc scan and the parent's SIGKILL lived on
        assert procs.tagged(run_id) == []
    finally:
        for ident in procs.tagged(run_id):
            procs.kill(ident)
        parent.wait()
