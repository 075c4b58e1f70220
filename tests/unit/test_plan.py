"""Settings resolved once (train/plan.py), without any process group."""

import pytest
import torch

from gptrain.config_options import parse_train_args
from gptrain.errors import UserError
from gptrain.train import plan


@pytest.mark.parametrize("faster, expected", [("bf16", "bf16"), ("fp32", "fp32")])
def test_auto_precision_on_cpu_is_the_measured_faster_one(monkeypatch, faster, expected):
    from gptrain.train import cpu

    monkeypatch.setattr(cpu, "fastest_precision", lambda: (faster, "measured"))
    p = plan.resolve(parse_train_args([]), "cpu", 1)
    assert (p.precision, p.precision_why) == (expected, f"auto -> {expected}: measured")
    # FSDP gathers parameters in the same dtype autocast computes in: one decision for both
    assert p.compute_dtype == {"bf16": torch.bfloat16, "fp32": None}[expected]


def test_explicit_precision_wins():
    for setting, dtype in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        p = plan.resolve(parse_train_args([f"--train.precision={setting}"]), "cpu", 1)
        assert (p.precision, p.compute_dtype) == (setting, dtype)


def test_global_batch_becomes_accumulation_or_microbatches():
    cfg = parse_train_args(["--train.batch_size=4", "--train.global_batch_size=32",
                            "--parallel.dp_shard=2"])
    p = plan.resolve(cfg, "cpu", 2)
    assert (p.batch_size, p.grad_accum_steps, p.pp_microbatches, p.rows_per_step) == (4, 4, 0, 32)
    assert cfg.train.grad_accum_steps == 4  # the saved config says what ran
    cfg = parse_train_args(["--train.batch_size=2", "--train.global_batch_size=16",
                            "--parallel.pp=2", "--parallel.dp_shard=1"])
    p = plan.resolve(cfg, "cpu", 2)
    assert (p.batch_size, p.grad_accum_steps, p.pp_microbatches, p.rows_per_step) == (16, 1, 8, 16)
    p = plan.resolve(parse_train_args(["--parallel.pp=2", "--parallel.dp_shard=1"]), "cpu", 2)
    assert p.pp_microbatches == 4  # default: 2 per stage


@pytest.mark.parametrize("argv, world, message", [
    (["--parallel.pp=2", "--parallel.dp_shard=1", "--train.grad_accum_steps=2"], 2, "pp_microbatches"),
    (["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_microbatches=3"], 2, "divide"),
    (["--parallel.pp=2", "--parallel.dp_shard=1", "--parallel.pp_microbatches=3",
      "--train.batch_size=6", "--parallel.pp_schedule=interleaved_1f1b"], 2, "multiple of pp"),
    (["--parallel.tp=3"], 2, "world size"),
])
def test_bad_layouts_are_refused_before_any_process_group(argv, world, message):
    with pytest.raises(UserError, match=message):
        plan.resolve(parse_train_args(argv), "cpu", world)


def test_kernels_default_to_what_measured_fastest_and_obey_settings():
    from gptrain.train.plan import resolve_kernels

    assert resolve_kernels(None, None, "cuda") == (True, False)   # compiled plain loss on a GPU
    assert resolve_kernels(None, None, "cpu") == (False, True)    # eager, fused loss on a CPU
    assert resolve_kernels(False, None, "cuda") == (False, True)  # eager on a GPU: fused
    assert resolve_kernels(True, True, "cuda") == (True, True)    # as set
    assert resolve_kernels(True, None, "cpu") == (True, True)

