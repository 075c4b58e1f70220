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
