"""The first steps' loss under every parallel layout matches the single-process run.

Same data: a data-parallel run of B rows per rank sees exactly the blocks a single process sees
with B * dp rows (the loader deals each global batch out to the ranks), so the losses agree up
to floating-point reduction order. Tolerance: 1e-4 absolute on losses around 3-4. The final
weights (the checkpoint every run writes at its end) agree within 1e-4 too, whatever layout
wrote them. The Llama rows run the same checks on the llama-tiny preset (RMSNorm, rotary
positions, grouped-query attention, untied head).
"""

import pytest
import torch

from tests.helpers import TINY, losses, make_dataset, model_tensors, train

pytestmark = pytest.mark.slow  # real multi-process runs: `pytest -m slow` runs them alone

STEPS = 5
TOL = 1e-4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("parity"))


def _args(data, out, rows, n_layer, preset="gpt2-tiny"):
    return [f"--data.path={data}", f"--train.output_dir={out}", f"--train.batch_size={rows}",
            f"--train.max_steps={STEPS}", "--train.do_eval=false", *TINY, f"--model.n_layer={n_layer}",
            f"--model.preset={preset}"]


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """Single-process runs with 8 rows per step, made on first use per (preset, layers)."""
    out = {}

    def get(preset, n_layer):
        if (preset, n_layer) not in out:
            d = tmp_path_factory.mktemp(f"single-{preset}-{n_layer}")
            train(*_args(data, d, 8, n_layer, preset))
            out[preset, n_layer] = d
        return out[preset, n_layer]
    return get


@pytest.mark.parametrize("name, nproc, rows, n_layer, layout", [
    ("ddp", 2, 4, 2, ["--parallel.dp_replicate=2", "--parallel.dp_shard=1"]),
    ("fsdp", 2, 4, 2, ["--parallel.dp_shard=2"]),
    ("tp", 2, 8, 2, ["--parallel.tp=2", "--parallel.dp_shard=1"]),
    ("fsdp+tp", 4, 4, 2, ["--parallel.tp=2", "--parallel.dp_shard=2"]),
    ("hsdp", 4, 2, 2, ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"]),
    ("pp-gpipe", 2, 8, 4, ["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_schedule=gpipe"]),
    ("pp-1f1b", 2, 8, 4, ["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_schedule=1f1b"]),
    ("pp-interleaved", 2, 8, 4, ["--parallel.pp=2", "--parallel.dp_shard=1",
                                 "--parallel.pp_schedule=interleaved_1f1b"]),
    ("pp+fsdp", 4, 4, 4, ["--parallel.pp=2", "--parallel.dp_shard=2", "--parallel.pp_microbatches=2"]),
    ("pp+tp", 4, 8, 4, ["--parallel.pp=2", "--parallel.tp=2", "--parallel.dp_shard=1"]),
    ("llama-fsdp+tp", 4, 4, 2, ["--parallel.tp=2", "--parallel.dp_shard=2"]),
    ("llama-pp+tp", 4, 8, 4, ["--parallel.pp=2", "--parallel.tp=2",
                              "--parallel.dp_shard=1"]),
])
def test_loss_and_weights_match_single_process(data, reference, tmp_path, name, nproc, rows, n_layer, layout):
    preset = "llama-tiny" if name.startswith("llama") else "gpt2-tiny"
    ref_dir = reference(preset, n_layer)
    train(*_args(data, tmp_path, rows, n_layer, preset), *layout, nproc=nproc)
    got, expected = losses(tmp_path), losses(ref_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert abs(got[step] - expected[step]) < TOL, (name, step, got[step], expected[step])
    final = f"checkpoints/step-{STEPS:06d}"
    mine, ref = model_tensors(tmp_path / final), model_tensors(ref_dir / final)
    for key in ref:
        torch.testing.assert_close(mine[key], ref[key], atol=TOL, rtol=0, msg=f"{name}: {key}")
