"""`--nodes MIN:MAX`: what is accepted where, the torchrun arguments it gives, and which node
ends are a lost node rather than the job's failure (jobs/elastic.py). The real thing, a host
killed under a running job, is tests/hosts/test_ray_hosts.py."""

import pytest

from gptrain.errors import UserError
from gptrain.jobs import elastic, launch
from gptrain.jobs.spec import JobSpec


def spec(nodes, scheduler="ray", **kw) -> JobSpec:
    s = JobSpec(name="e", nodes=nodes, scheduler=scheduler, **kw)
    s.parse_nodes()
    return s


def test_min_max_parsed_and_a_plain_number_is_not_elastic():
    s = spec("1:3")
    assert (s.nodes, s.min_nodes, s.elastic) == (3, 1, True)
    assert not spec(2).elastic and not spec("2").elastic and spec("2").nodes == 2
    assert not spec("2:2").elastic  # MIN = MAX: a fixed size


@pytest.mark.parametrize("nodes, scheduler, words", [
    ("3:2", "ray", "MIN:MAX needs 1 <= MIN <= MAX"), ("0:2", "local", "MIN:MAX needs 1"),
    ("1-2", "local", "must be N or MIN:MAX"), ("1:2", "slurm", "runs on the local and ray schedulers"),
    ("1:2", "kubernetes", "runs on the local and ray schedulers")])
def test_refused_in_one_line(nodes, scheduler, words):
    with pytest.raises(UserError, match=words):
        spec(nodes, scheduler)


@pytest.mark.parametrize("nodes, accels", [("1:1000000000", 1), (1000000000, 1), (2, 100000)])
def test_a_count_past_any_cluster_is_one_line(nodes, accels):
    """#47 row 8: `run --nodes 1:1000000000` spun at 100% CPU for minutes (check_worlds tried
    every world size) and `resume --nodes 1000000000` was accepted and queued forever."""
    with pytest.raises(UserError, match="more than any cluster"):
        JobSpec(name="e", nodes=nodes, accels=accels, scheduler="ray", entry="trainer").validate()


def test_a_command_entrypoint_cannot_be_elastic():
    with pytest.raises(UserError, match="needs a Python entrypoint"):
        spec("1:2", command="bash")


@pytest.mark.parametrize("nodes, flags, fits", [
    ("2:3", ["--train.global_batch_size=24", "--train.batch_size=4"], True),    # 24 = 4 x 2 x 3 = 4 x 3 x 2
    ("2:3", ["--train.global_batch_size=24", "--train.batch_size=8"], False),   # 3 nodes: 24 / 3 = 8 ok; 2: 12 is not 8 x n
    ("1:3", ["--parallel.tp=2", "--parallel.dp_shard=1"], False),                # 1 node: world 1 cannot hold tp 2
    ("2:3", [], True)])
def test_an_elastic_trainer_job_fits_every_world_it_may_run_at(tmp_path, monkeypatch, nodes, flags, fits):
    """Checked at submit (spec.validate -> elastic.check_worlds): the job would otherwise fail at
    its first node loss (found by a new-user trial with train.global_batch_size)."""
    monkeypatch.chdir(tmp_path)
    s = JobSpec(name="e", nodes=nodes, scheduler="local", accels=1, args=["--data.path=d", *flags])
    if fits:
        s.validate()
        return
    with pytest.raises(UserError, match=f"--nodes {nodes}: with [123] node"):
        s.validate()


def test_torchrun_elastic_form():
    args = launch.torchrun_args(spec("1:2"), nnodes=2, endpoint="h1:29500", rdzv_id="e-0", is_host=1)
    assert "--nnodes=1:2" in args and "--max-restarts=1" in args and "--rdzv-backend=c10d" in args
    assert f"--rdzv-conf=is_host=1,last_call_timeout={launch.ELASTIC_LAST_CALL_S}" in args
    fixed = launch.torchrun_args(spec(2), nnodes=2, endpoint="h1:29500", rdzv_id="e-0", is_host=0)
    assert "--nnodes=2" in fixed and "--max-restarts=0" in fixed


def test_lost_nodes_never_node_0_nor_below_min():
    s, lost = spec("2:4"), set()
    assert elastic.newly_lost(s, [None, 1, None, None], lost) == [1]
    assert elastic.newly_lost(s, [None, 1, None, -9], lost) == [3] and lost == {1, 3}
    assert elastic.newly_lost(s, [None, 1, 1, -9], lost) == []  # 2 left = MIN: node 2 fails the job
    assert elastic.newly_lost(spec("1:2"), [1, None], set()) == []  # node 0 holds the rendezvous
    assert elastic.newly_lost(spec(2), [None, 1], set()) == []  # not elastic
    assert elastic.finished_line(s, lost) == "finished on 2 of 4 nodes (lost: node 1, node 3)"


def test_job_file_nodes_min_max_quoted_or_not(tmp_path):
    from gptrain.jobs.programs.job_file import from_yaml

    for text in ("name: e\nnodes: 1:2\n", "name: e\nnodes: '1:2'  # elastic\n"):
        (tmp_path / "job.yaml").write_text(text)
        assert from_yaml(str(tmp_path / "job.yaml"))["nodes"] == "1:2"  # not YAML 1.1's 62


@pytest.mark.cpu_unmeasured  # (nothing written: not even the home)
def test_a_negative_looking_value_is_one_line_naming_the_way_to_write_it(isolated_home):
    from tests.conftest import run_cli

    r = run_cli("run", "x", "--nodes", "-1:2", "--", "--model.n_layer=1")
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == ["gptrain run: error: argument --nodes: expected one argument; a value that "
                                     "starts with '-' is written --nodes=VALUE (see gptrain run --help)"], r.stderr
    assert not isolated_home.exists()
    r = run_cli("run", "x", "--nodes=-1:2", "--", "--model.n_layer=1")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "MIN:MAX" in r.stderr, r.stderr
    assert not (isolated_home / "jobs" / "x").exists()
