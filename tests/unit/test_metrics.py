"""MFU's denominator: the peak of the precision the run computes in, cached per CPU model."""

import json

import pytest
import torch

from gptrain.train.metrics import cpu_model, peak_flops
from gptrain.train.plan import cpu_has_bf16


def test_cpu_peak_is_measured_per_precision_and_cached_per_cpu_model(isolated_home):
    cpu = torch.device("cpu")
    peaks = {p: peak_flops(cpu, None, p) for p in ("fp32", "bf16")}
    files = sorted((isolated_home / "cache").glob("cpu_peak_flops_*.json"))
    assert len(files) == 2
    records = [json.loads(f.read_text()) for f in files]
    assert {r["precision"] for r in records} == {"fp32", "bf16"}
    assert all(r["cpu"] == cpu_model() and r["flops"] > 0 for r in records)
    assert peak_flops(cpu, None, "bf16") == peaks["bf16"]  # read back from the cache
    if cpu_has_bf16():
        # AMX / AVX512-BF16 multiply bf16 several times faster than fp32: a bf16 run measured
        # against the fp32 peak reported MFU above 100%
        assert peaks["bf16"] > 2 * peaks["fp32"], peaks


def test_configured_peak_wins_and_gpu_fp32_is_half_the_tensor_core_peak():
    assert peak_flops(torch.device("cpu"), 5e12, "bf16") == 5e12
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for the GPU table")
    gpu = torch.device("cuda")
    assert peak_flops(gpu, None, "fp32") == peak_flops(gpu, None, "bf16") / 2
