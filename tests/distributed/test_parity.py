"""The first steps' loss under every parallel layout matches the single-process run.

Same data: a data-parallel run of B rows per rank sees exactly the blocks a single process sees
with B * dp rows (the loader deals each global batch out to the ranks), so the losses agree up
to floating-point reduction order. Tolerance: 1e-4 absolute on losses around 3-4.
"""

import pytest

from tests.helpers import TINY, losses, make_dataset, train

STEPS = 5
TOL = 1e-4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("parity"))


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    out = {}
    for rows in (8,):
        d = tmp_path_factory.mktemp(f"single{rows}")
        train(f"--data.path={data}", f"--train.output_dir={d}", f"--train.batch_size={rows}",
              f"--train.max_steps={STEPS}", "--train.do_eval=false", *TINY)
        out[rows] = losses(d)
    return out


@pytest.mark.parametrize("name, nproc, rows, layout", [
    ("ddp", 2, 4, ["--parallel.dp_replicate=2", "--parallel.dp_shard=1"]),
    ("fsdp", 2, 4, ["--parallel.dp_shard=2"]),
    ("tp", 2, 8, ["--parallel.tp=2", "--parallel.dp_shard=1"]),
    ("fsdp+tp", 4, 4, ["--parallel.tp=2", "--parallel.dp_shard=2"]),
    ("hsdp", 4, 2, ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"]),
])
def test_loss_matches_single_process(data, reference, tmp_path, name, nproc, rows, layout):
    train(f"--data.path={data}", f"--train.output_dir={tmp_path}", f"--train.batch_size={rows}",
          f"--train.max_steps={STEPS}", "--train.do_eval=false", *TINY, *layout, nproc=nproc)
    got = losses(tmp_path)
    expected = reference[8]
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert abs(got[step] - expected[step]) < TOL, (name, step, got[step], expected[step])
