"""The first steps' loss under every parallel layout matches the single-process run.

Same data: a data-parallel run of B rows per rank sees exactly the blocks a single process sees
with B * dp rows (the loader deals each global batch out to the ranks), so the losses agree up
to floating-point reduction order. Tolerance: 1e-4 absolute on losses around 3-4. The final
weights (the checkpoint every run writes at its end) agree within 1e-4 too, whatever layout
wrote them. The Llama rows run the same checks on the llama-tiny preset (RMSNorm, rotary
positions, grouped-query attention, untied head), the Phi-3, OLMo 2 and Gemma 3 rows on theirs.

Every row pins its precision (fp32 through TINY): `auto` means bf16 on CPUs with native bf16
(AVX512-BF16/AMX), and these checks must mean the same on every CPU. The bf16 rows compare with a
single-process bf16 run, with tolerances derived from bf16's unit roundoff u = 2^-8 (8 significand
bits) instead of fp32's: losses within u; the whole model's weights within u in relative norm
(||W - W_ref|| / ||W_ref||: rounding noise in the gradients moves every weight a little); and no
single weight further than Adam can move it in opposite directions (2 x the sum of the learning
rates), which a wrong shard or a missed gradient sync would exceed.
"""

import pytest
import torch

from tests.helpers import TINY, losses, model_tensors, step_dir, train

pytestmark = pytest.mark.slow  # real multi-process runs: `pytest -m slow` runs them alone

STEPS = 5
TOL = 1e-4
BF16_U = 2.0 ** -8
LR = 1e-3  # TINY's peak learning rate (2 warmup steps)


def _args(data, out, rows, n_layer, preset="gpt2-tiny", precision="fp32"):
    return [f"--data.path={data}", f"--train.output_dir={out}", f"--train.batch_size={rows}",
            f"--train.max_steps={STEPS}", "--train.do_eval=false", *TINY, f"--model.n_layer={n_layer}",
            f"--model.preset={preset}", f"--train.precision={precision}"]


def assert_same_losses(run, ref, tol, label):
    got, expected = losses(run), losses(ref)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert abs(got[step] - expected[step]) < tol, (label, step, got[step], expected[step])


def final_weights(run, ref):
    return model_tensors(step_dir(run, STEPS)), model_tensors(step_dir(ref, STEPS))


def assert_same_weights(run, ref, label):
    mine, theirs = final_weights(run, ref)
    for key in theirs:
        torch.testing.assert_close(mine[key], theirs[key], atol=TOL, rtol=0, msg=f"{label}: {key}")


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """Single-process runs with 8 rows per step, made on first use per (preset, layers, precision)."""
    out = {}

    def get(preset, n_layer, precision, *extra):
        key = preset, n_layer, precision, *extra
        if key not in out:
            d = tmp_path_factory.mktemp(f"single-{preset}-{n_layer}-{precision}")
            train(*_args(data, d, 8, n_layer, preset, precision), *extra)
            out[key] = d
        return out[key]
    return get


# GPT-2 from scratch under the layouts its fine-tuning rows below do not run (ddp, fsdp+tp, 1F1B,
# interleaved and pp+fsdp are there, from HF weights: the same step code, another init).
@pytest.mark.parametrize("name, nproc, rows, n_layer, layout", [
    ("fsdp", 2, 4, 2, ["--parallel.dp_shard=2"]),
    ("tp", 2, 8, 2, ["--parallel.tp=2", "--parallel.dp_shard=1"]),
    ("hsdp", 4, 2, 2, ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"]),
    ("pp-gpipe", 2, 8, 4, ["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_schedule=gpipe"]),
    ("pp+tp", 4, 8, 4, ["--parallel.pp=2", "--parallel.tp=2", "--parallel.dp_shard=1"]),
    ("llama-fsdp+tp", 4, 4, 2, ["--parallel.tp=2", "--parallel.dp_shard=2"]),
    ("llama-pp+tp", 4, 8, 4, ["--parallel.pp=2", "--parallel.tp=2",
                              "--parallel.dp_shard=1"]),
    ("phi3-fsdp", 2, 4, 2, ["--parallel.dp_shard=2"]),  # (fused projections: no TP yet)
    ("olmo2-fsdp", 2, 4, 2, ["--parallel.dp_shard=2"]),  # (norms after each sub-layer)
    ("gemma3-fsdp", 2, 4, 2, ["--parallel.dp_shard=2"]),  # (windowed layers, norms by 1 + weight)
])
def test_loss_and_weights_match_single_process(data, reference, tmp_path, name, nproc, rows, n_layer, layout):
    preset = f"{name.split('-')[0]}-tiny" if name.startswith(("llama", "phi3", "olmo2", "gemma3")) else "gpt2-tiny"
    ref_dir = reference(preset, n_layer, "fp32")
    train(*_args(data, tmp_path, rows, n_layer, preset), *layout, nproc=nproc)
    assert_same_losses(tmp_path, ref_dir, TOL, name)
    assert_same_weights(tmp_path, ref_dir, name)


@pytest.mark.parametrize("name, nproc, rows, n_layer, layout", [  # bf16 is slow on CPUs without bf16 units
    ("fsdp", 2, 4, 2, ["--parallel.dp_shard=2"]),
    ("pp-1f1b", 2, 8, 4, ["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_schedule=1f1b"]),
])
def test_bf16_layouts_match_single_process_within_bf16_precision(data, reference, tmp_path, name, nproc,
                                                                  rows, n_layer, layout):
    ref_dir = reference("gpt2-tiny", n_layer, "bf16")
    r = train(*_args(data, tmp_path, rows, n_layer, precision="bf16"), *layout, nproc=nproc)
    assert " in bf16: " in r.stdout
    assert_same_losses(tmp_path, ref_dir, BF16_U, name)
    mine, ref = final_weights(tmp_path, ref_dir)
    diff = torch.cat([(mine[k] - ref[k]).flatten() for k in ref])
    weights = torch.cat([ref[k].flatten() for k in ref])
    assert (diff.norm() / weights.norm()).item() < BF16_U, name
    assert diff.abs().max().item() < 2 * LR * STEPS, name


@pytest.mark.parametrize("name, nproc, rows, layout", [
    ("pp+fsdp", 4, 4, ["--parallel.pp=2", "--parallel.dp_shard=2", "--parallel.pp_microbatches=2"]),
    ("fsdp", 2, 4, ["--parallel.dp_shard=2"]),
])
def test_layouts_across_an_epoch_end(data, reference, tmp_path, name, nproc, rows, layout):
    """20 blocks, 8 per step: epochs end inside steps 3 and 5, where the batch takes the last
    blocks of one epoch and the first of the next (a pipeline needs B rows every step)."""
    short = "--data.max_train_samples=20"
    ref_dir = reference("gpt2-tiny", 4, "fp32", short)
    train(*_args(data, tmp_path, rows, 4), short, *layout, nproc=nproc)
    assert_same_losses(tmp_path, ref_dir, TOL, name)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """Tiny Hugging Face model directories saved by transformers, per (model, layers)."""
    from tests.conftest import save_tiny_hf_gpt2, save_tiny_hf_llama

    out = {}

    def get(model, n_layer):
        if (model, n_layer) not in out:
            save = save_tiny_hf_gpt2 if model == "gpt2" else save_tiny_hf_llama
            out[model, n_layer] = save(tmp_path_factory.mktemp("hf") / f"tiny-{model}-{n_layer}l", n_layer)
        return out[model, n_layer]
    return get


@pytest.fixture(scope="module")
def hf_reference(data, tmp_path_factory):
    """Single-process fine-tuning runs from a Hugging Face model directory, one per directory."""
    out = {}

    def get(model_dir, n_layer):
        if model_dir not in out:
            d = tmp_path_factory.mktemp(f"single-hf-{model_dir.name}")
            train(*_args(data, d, 8, n_layer), f"--model.init_from={model_dir}")
            out[model_dir] = d
        return out[model_dir]
    return get


HF_LAYOUTS = [  # (name, processes, rows per rank, layers, flags)
    ("ddp", 2, 4, 2, ["--parallel.dp_replicate=2", "--parallel.dp_shard=1"]),
    ("fsdp", 2, 4, 2, ["--parallel.dp_shard=2"]),
    ("hsdp", 4, 2, 2, ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"]),
    ("tp", 2, 8, 2, ["--parallel.tp=2", "--parallel.dp_shard=1"]),
    ("fsdp+tp", 4, 4, 2, ["--parallel.tp=2", "--parallel.dp_shard=2"]),
    ("pp-gpipe", 2, 8, 2, ["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_schedule=gpipe"]),
    ("pp-1f1b", 2, 8, 2, ["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_schedule=1f1b"]),
    ("pp-interleaved", 2, 8, 4, ["--parallel.pp=2", "--parallel.dp_shard=1",
                                 "--parallel.pp_schedule=interleaved_1f1b"]),
    ("pp+fsdp", 4, 4, 2, ["--parallel.pp=2", "--parallel.dp_shard=2", "--parallel.pp_microbatches=2"]),
    ("pp+tp", 4, 8, 2, ["--parallel.pp=2", "--parallel.tp=2", "--parallel.dp_shard=1"]),
]


# Each model under half the layouts, so that each model meets replication, sharding, tensor
# parallel and a pipeline (GPT-2 two schedules and pp+fsdp, Llama gpipe and pp+tp), and each layout
# meets one model: the other half costs ten multi-process runs on the suite's two cores.
HF_CASES = [(model, *row) for row in HF_LAYOUTS for model in ("gpt2", "llama")
            if (model == "gpt2") == (row[0] in ("ddp", "fsdp+tp", "pp-1f1b", "pp+fsdp", "pp-interleaved"))]


@pytest.mark.parametrize("model, name, nproc, rows, n_layer, layout", HF_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in HF_CASES])
def test_layouts_from_hf_weights_match_single_process(data, hf_model, hf_reference, tmp_path, model,
                                                      name, nproc, rows, n_layer, layout):
    """Fine-tuning HF weights (GPT-2's Conv1D weights are stored transposed) under each layout
    (interleaved 1F1B needs two stages per rank: 4 layers)."""
    model_dir = hf_model(model, n_layer)
    ref_dir = hf_reference(model_dir, n_layer)
    train(*_args(data, tmp_path, rows, n_layer), f"--model.init_from={model_dir}", *layout, nproc=nproc)
    assert_same_losses(tmp_path, ref_dir, TOL, f"{model} {name}")
    assert_same_weights(tmp_path, ref_dir, f"{model} {name}")
