"""Training on CUDA, end to end through `gptrain train`: every precision, compile, the fused
loss, two processes sharing one GPU, and a checkpoint moved between the GPU and the CPU."""

import json
import math

import pytest

from gptrain import run_layout
from tests.helpers import TINY, losses, train

STEPS = 6


def _args(data, out, *extra, steps=STEPS, rows=8):
    return [f"--data.path={data}", f"--train.output_dir={out}", f"--train.batch_size={rows}",
            f"--train.max_steps={steps}", "--train.do_eval=false", *TINY, *extra]


def test_cuda_fp32_matches_cpu_fp32(data, tmp_path):
    """The same run on the GPU and the CPU (fp32, no TF32): the same losses."""
    train(*_args(data, tmp_path / "gpu", "--train.device=cuda"))
    train(*_args(data, tmp_path / "cpu", "--train.device=cpu"))
    gpu, cpu = losses(tmp_path / "gpu"), losses(tmp_path / "cpu")
    assert sorted(gpu) == list(range(1, STEPS + 1))
    for step in cpu:
        assert abs(gpu[step] - cpu[step]) < 1e-4, (step, gpu[step], cpu[step])


@pytest.fixture(scope="module")
def fp32_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp32")
    train(*_args(data, out, "--train.device=cuda"))
    return losses(out)


@pytest.mark.parametrize("precision,compiled,fused", [
    ("bf16", True, True), ("bf16", False, False), ("bf16", True, False),
    ("fp16", False, True), ("fp16", True, True)])
def test_mixed_precision_follows_fp32(data, fp32_run, tmp_path, precision, compiled, fused):
    """bf16/fp16 autocast (fp16 with its loss scaler), compiled blocks or not, fused loss or
    not: the run trains, and its losses stay within a few bf16 roundoffs of the fp32 run's."""
    run = tmp_path / "run"
    r = train(*_args(data, run, "--train.device=cuda", f"--train.precision={precision}",
                     f"--train.compile={str(compiled).lower()}", f"--train.fused_loss={str(fused).lower()}"))
    assert f" in {precision}: " in r.stdout
    got = losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, ref in fp32_run.items():
        assert math.isfinite(got[step])
        assert abs(got[step] - ref) < 0.05 * ref, (step, got[step], ref)


def test_auto_precision_is_bf16_on_the_gpu(data, tmp_path):
    r = train(*_args(data, tmp_path / "run", "--train.device=cuda", "--train.precision=auto"))
    precision = json.loads(run_layout.run_info_file(tmp_path / "run").read_text())["precision"]  # (what inspect shows)
    assert " in bf16: " in r.stdout and "auto: the GPU supports bf16" in precision, precision


@pytest.mark.parametrize("layout", ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"])
def test_two_processes_on_one_gpu_match_one(data, tmp_path, layout):
    """DDP and FSDP2 with two ranks on the one GPU (NCCL refuses two ranks per device, so they
    meet over gloo on CUDA tensors) take the same steps as one process with the whole batch."""
    train(*_args(data, tmp_path / "one", "--train.device=cuda", rows=8))
    r = train(*_args(data, tmp_path / "two", "--train.device=cuda", layout, rows=4), nproc=2)
    assert "share" in r.stdout + r.stderr  # the note saying why gloo
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    for step in one:
        assert abs(one[step] - two[step]) < 1e-4, (layout, step, one[step], two[step])


def test_checkpoint_moves_between_gpu_and_cpu(data, tmp_path):
    """Saved on the GPU, resumed on the CPU, resumed on the GPU again; then generated from on
    the CPU. Each resume continues at the next step of one run's schedule."""
    from gptrain.models.generate import generate
    from gptrain.models.load import load_for_inference

    out = tmp_path / "run"
    every = ["--checkpoint.every=2", "--train.lr_schedule=constant"]
    train(*_args(data, out, "--train.device=cuda", *every, steps=4))
    train(*_args(data, out, "--train.device=cpu", *every, steps=6))
    train(*_args(data, out, "--train.device=cuda", *every, steps=8))
    seen = losses(out)
    assert sorted(seen) == list(range(1, 9))
    straight = tmp_path / "straight"
    train(*_args(data, straight, "--train.device=cuda", "--train.lr_schedule=constant", steps=8))
    for step, loss in losses(straight).items():
        assert abs(seen[step] - loss) < 1e-3, (step, seen[step], loss)
    model, _ = load_for_inference(out)
    import torch

    ids = generate(model, torch.tensor([[1, 2, 3]]), 5)
    assert ids.shape == (1, 8)


@pytest.mark.parametrize("policy", ["skip", "stop"])
def test_a_non_finite_step_on_the_gpu(data, tmp_path, policy):
    """The fused AdamW skips a NaN/inf step on the GPU itself (train/finite.py): `skip` trains on,
    `stop` ends with exit 2 before any checkpoint follows the NaN."""
    from gptrain.weights.layout import find_latest, read_state

    out = tmp_path / "run"
    r = train(*_args(data, out, "--train.device=cuda", "--train.precision=fp32", "--train.lr=1e30",
                     "--train.warmup_steps=0", "--train.grad_clip=0", f"--train.nan_policy={policy}",
                     "--checkpoint.every=1"), check=False)
    if policy == "skip":
        assert r.returncode == 0 and "skipped" in r.stdout, r.stdout + r.stderr
        return
    assert r.returncode == 2 and "NaN/inf" in r.stderr, r.stderr
    latest = find_latest(out)
    assert latest is None or math.isfinite(read_state(latest)["train_loss"])


def test_logged_memory_is_the_run_peak_and_the_process_peak_is_left_alone(data, tmp_path):
    """Every logged step carries `mem_gib`, the peak memory allocated so far, and training in a
    process leaves that process's own peak counter alone: was, each logged step reset it, so a
    bench around `train` read 1.5 GiB for GPT-2 124M (the state after the last step) where
    nanoGPT's side read 11.8."""
    import torch

    from gptrain.config_options import parse_train_args
    from gptrain.train.trainer import train as train_here

    torch.cuda.reset_peak_memory_stats()
    run = tmp_path / "run"
    train_here(parse_train_args(_args(data, run, "--train.device=cuda", "--metrics.log_every=1",
                                      "--report_to=none", "--checkpoint.every=0")))
    rows = [json.loads(line) for line in run_layout.metrics_file(run).read_text().splitlines()]
    mem = [r["train/mem_gib"] for r in rows if "train/loss" in r]
    assert len(mem) == STEPS and mem == sorted(mem) and mem[0] > 0, rows
    assert torch.cuda.max_memory_allocated() / 2**30 >= mem[-1]
