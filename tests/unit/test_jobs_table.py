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
        rows = [{"step": s, "time": time.time() - 60, "total_steps": 3000, "eta_s": 3600.0 + 60, "train/loss": 3.0}
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
