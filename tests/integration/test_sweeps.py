"""A hyperparameter sweep (jobs/sweeps.py, its driver jobs/programs/sweep_driver.py, Optuna's
TPE sampler and successive-halving pruner): 8 trials, 2 at once, over a log-uniform learning
rate and an integer warmup on a tiny model, each a normal job. The weak trials are stopped at
their rung (the steps they did not run are the sweep's saving, printed); the driver killed
mid-sweep and resumed goes on with the same study; the sweep's name is its best trial as a MODEL."""

import json
import os
import signal
import time

import pytest

from tests.conftest import run_cli
from tests.job_helpers import job, refused

pytest.importorskip("optuna")
pytestmark = pytest.mark.slow
STEPS, EVERY = 20, 4
FLAGS = [f"--train.max_steps={STEPS}", f"--train.eval_every={EVERY}", "--model.n_layer=1", "--model.n_embd=32",
         "--model.n_head=2", "--model.block_size=32", "--train.precision=fp32", "--train.batch_size=4",
         "--data.max_eval_samples=8", "--checkpoint.every=0", "--metrics.peak_flops=1e11"]


def report(name):
    r = run_cli("sweep", "inspect", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def until(name, timeout=600):
    deadline = time.time() + timeout
    while True:
        rep = report(name)
        ended = [t for t in rep["trials"] if t["state"] in ("complete", "pruned", "fail")]
        if len(ended) == rep["spec"]["trials"] and rep["driver"] == "not running":
            return rep
        assert time.time() < deadline, rep
        time.sleep(1)


def test_a_sweep_prunes_its_weak_trials_resumes_after_its_driver_dies_and_names_its_best(dataset):
    r = run_cli("sweep", "sw", "--dataset", dataset, "--param", "train.lr=loguniform:1e-4:3e-2", "--param",
                "train.warmup_steps=int:0:4", "--trials", "8", "--parallel", "2", "--reduction-factor", "2",
                "--", *FLAGS)
    assert r.returncode == 0, r.stderr
    # the driver dies (kill -9) once two trials are under way; resumed, it goes on where it was
    deadline = time.time() + 300
    while len([t for t in report("sw")["trials"] if t["job"]]) < 3:
        assert time.time() < deadline
        time.sleep(0.5)
    pid = int((run_cli_home() / "sweeps" / "sw" / "driver.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    assert report("sw")["driver"] == "not running"
    refused(run_cli("sweep", "resume", "nosuch"), "no sweep named 'nosuch'")
    assert run_cli("sweep", "resume", "sw").returncode == 0
    rep = until("sw")
    trials = rep["trials"]
    assert len(trials) == 8 and len({t["job"] for t in trials}) == 8
    assert [t["number"] for t in trials if t["state"] == "fail"] == [], trials
    pruned = [t for t in trials if t["state"] == "pruned"]
    complete = [t for t in trials if t["state"] == "complete"]
    assert pruned and complete, trials
    # a pruned trial's job was stopped at its rung: it ran fewer steps than the trials that ended
    for t in pruned:
        assert job(t["job"])["state"] == "stopped" and t["step"] < STEPS, t
    steps_run = sum(t["step"] for t in trials)
    print(f"\nsweep of 8 trials: {steps_run} steps run, {8 * STEPS} had every trial run to the end "
          f"({8 * STEPS - steps_run} saved by pruning {len(pruned)})")
    assert steps_run < 8 * STEPS
    # sorted by the objective, the best named; its name is the best trial as a MODEL
    values = [t["value"] for t in complete]
    assert values == sorted(values) and rep["best"] == complete[0]["job"]
    text = run_cli("sweep", "inspect", "sw").stdout
    assert f"best: {complete[0]['job']}" in text and "pruned" in text
    g = run_cli("generate", "sw", "--prompt", "th", "--max-new-tokens", "3", "--seed", "0")
    assert g.returncode == 0 and g.stdout.startswith("th"), g.stderr
    # a sweep's mistakes are one line, nothing written
    for args, says in ((["sweep", "sw", "--param", "train.lr=uniform:1:1"], "sweep 'sw' already exists"),
                       (["sweep", "s2", "--param", "lr=1,2"], "give SECTION.KEY=SPACE"),
                       (["sweep", "s2", "--param", "train.lr=loguniform:0:1"], "LO > 0"),
                       (["sweep", "s2", "--param", "train.lr=uniform:1:2", "--parallel", "9"], "--parallel 1 to"),
                       (["sweep", "s2", "--param", "train.lr=uniform:1:2", "--seed", "-1", "--", *FLAGS], "--seed"),
                       (["sweep", "s2", "--param", "train.lr=uniform:1:2"], "after --"),
                       (["sweep", "sw-t00", "--param", "train.lr=uniform:1:2", "--", *FLAGS],
                        "a job named sw-t00 exists"),
                       (["sweep", "s2", "--param", "train.lr=uniform:1:2", "--", "--train.do_eval=false"],
                        "ranks its trials by eval loss")):
        refused(run_cli(*args), says)
    assert not (run_cli_home() / "sweeps" / "s2").exists()


def run_cli_home():
    from gptrain.home import home

    return home()
