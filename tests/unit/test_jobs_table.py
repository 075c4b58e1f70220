"""The jobs table and `inspect` show a job's nodes as it was asked for: N, or MIN:MAX for an
elastic job (found by a new-user trial: `jobs` showed an elastic 1:2 job as 2 nodes)."""

from gptrain.cli import main
from gptrain.jobs import api, store
from gptrain.jobs.spec import JobSpec


def record(name, nodes, min_nodes=None):
    spec = JobSpec(name=name, nodes=nodes, min_nodes=min_nodes, args=["--train.max_steps=10"])
    store.create_job(name, spec.to_dict(), nodes, 1, "local")


def test_an_elastic_job_shows_its_range_and_a_fixed_one_its_count(capsys):
    record("el", 2, 1)
    record("fixed", 2)
    rows = {r["name"]: r for r in api.rows(force=True)}
    assert (rows["el"]["min_nodes"], rows["fixed"]["min_nodes"]) == (1, None)
    assert main(["jobs"]) == 0
    table = capsys.readouterr().out
    assert "1:2x1 local" in table and "2x1 local" in table.replace("1:2x1", "")
    assert main(["inspect", "el"]) == 0
    assert "resources  1:2 node(s) x 1 accelerator(s)" in capsys.readouterr().out


def test_a_running_job_shows_step_of_total_and_its_eta_and_a_finished_one_no_eta(capsys):
    """`gptrain jobs` (and the console's table, tests/browser/test_ui_render.py): STEP 120/3000 and
    the time left from the last logged step's estimate, counted down from when it was logged."""
    import json
    import time

    from gptrain.jobs import folder

    for name, state in (("runs", "running"), ("done", "stopped")):
        record(name, 1)
        store.set_state(name, state, "made by the test")
        path = folder.metrics_files(folder.job_dir(name))[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "time": time.time() - 30, "total_steps": 3000, "eta_s": 3600.0 + 30, "train/loss": 3.0}
                for s in (100, 120)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = {r["name"]: r for r in api.rows(force=True)}
    assert rows["runs"]["state"] == "running", rows["runs"]
    assert rows["runs"]["step"] == 120 and rows["runs"]["total_steps"] == 3000
    assert 3590 < rows["runs"]["eta_s"] <= 3600
    assert rows["done"]["total_steps"] == 3000 and rows["done"]["eta_s"] is None
    assert main(["jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[0].split()
    assert head == ["NAME", "STATE", "RESOURCES", "STEP", "LOSS", "ETA", "AGE"], lines[0]
    runs = next(line for line in lines if line.startswith("runs")).split()
    done = next(line for line in lines if line.startswith("done")).split()
    assert runs[4:7] == ["120/3000", "3.0000", "59m"] and done[4:7] == ["120/3000", "3.0000", "-"], lines


def test_a_running_job_that_makes_no_step_shows_stalled_not_an_eta():
    """#49 row 5: the ETA counted down to '0s' and stayed there while a job was stuck. A running
    job whose next train record is well past due (60 s, and 3 of its usual intervals; with one
    record, its projected end passed by 60 s) shows how long it has made no step."""
    from gptrain.cli import render
    from gptrain.jobs.api import how_far

    on = {"time": 100.0, "eta_s": 50.0, "total_steps": 10, "interval_s": 10.0}
    assert how_far(on, "running", now=110.0) == {"total_steps": 10, "eta_s": 40.0, "stalled_s": None}
    stuck = how_far(on, "running", now=221.0)
    assert stuck["eta_s"] is None and stuck["stalled_s"] == 121.0
    assert render.eta(stuck["eta_s"], stuck["stalled_s"]) == "stalled 2m"
    slow = {**on, "interval_s": 100.0}  # records every 100 s: 221 s since the last is not yet stalled
    assert how_far(slow, "running", now=221.0)["stalled_s"] is None
    one = {"time": 100.0, "eta_s": 5.0, "total_steps": 10}  # one record so far: no interval known
    assert how_far(one, "running", now=164.0) == {"total_steps": 10, "eta_s": 0.0, "stalled_s": None}
    assert how_far(one, "running", now=166.0)["stalled_s"] == 66.0
    assert how_far(on, "succeeded", now=221.0) == {"total_steps": 10, "eta_s": None, "stalled_s": None}


def test_inspect_reads_as_the_log_does_and_folds_the_checkpoint_events(capsys):
    """#49 row 5: `inspect` printed raw numbers (tokens_per_s 1.253e+04 mfu 0.04705), no wall
    time, tokens seen or average, and every checkpoint as an event of its own."""
    import json
    import time

    from gptrain.jobs import folder
    from gptrain.weights.layout import step_name

    record("seen", 1)
    store.set_state("seen", "running", "made by the test")
    now = time.time()
    with store.transaction() as conn:
        for step in (100, 200, 300):
            store.add_event(conn, "seen", "checkpoint", f"{step_name(step)} (abc)")
    path = folder.metrics_files(folder.job_dir("seen"))[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "time": now + s / 100, "train/loss": 3.0, "train/lr": 3e-4, "train/tokens_per_s": 12530.4,
             "train/mfu": 0.04705, "train/tokens": s * 512} for s in (100, 200, 300)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["inspect", "seen"]) == 0
    out = capsys.readouterr().out
    assert "train      step 300 | loss 3.0000 | lr 3.00e-04 | tok/s 12,530 | mfu 4.7% | tokens 153,600" in out, out
    assert "153,600 tokens" in out and "tok/s on average" in out and "wall " in out
    events = [line for line in out.splitlines() if " checkpoint " in line]
    assert len(events) == 1 and "step-000300" in events[0] and "(and 2 before it: gptrain checkpoints seen)" in events[0]
