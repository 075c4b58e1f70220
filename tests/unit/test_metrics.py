"""MFU's denominator: the peak of the precision the run computes in, with the basis it rests on."""

import json

import pytest
import torch

from gptrain.train import cpu
from gptrain.train.metrics import peak_flops


def test_cpu_peak_is_the_kept_per_core_rate_times_the_cores_in_use(isolated_home):
    peak, basis = peak_flops(torch.device("cpu"), None, "fp32")
    assert peak > 0 and f"{cpu.cores_in_use()} core(s) x" in basis and " fp32 per core" in basis
    kept = list((isolated_home / "cache").glob("cpu-*.json"))
    if kept:  # a steady measurement is read back, not taken again (a busy machine keeps none)
        rate = json.loads(kept[0].read_text())["per_core"]["fp32"]
        assert peak_flops(torch.device("cpu"), None, "fp32")[0] == peak == rate * cpu.cores_in_use()


def test_configured_peak_wins_and_gpu_fp32_is_half_the_tensor_core_peak():
    assert peak_flops(torch.device("cpu"), 5e12, "bf16") == (5e12, "metrics.peak_flops as configured")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for the GPU table")
    gpu = torch.device("cuda")
    assert peak_flops(gpu, None, "fp32")[0] == peak_flops(gpu, None, "bf16")[0] / 2


def test_a_kept_measurement_wins_over_this_process_s_unsteady_one(isolated_home, monkeypatch):
    """An unsteady measurement taken earlier in the process (kept in memory only) was returned
    even after a steady one had been kept on disk: MFU's basis then disagreed with the kept rate
    (CI: 84.8 vs 89.5 GFLOP/s, test above)."""
    peak_flops(torch.device("cpu"), None, "fp32")
    kept = list((isolated_home / "cache").glob("cpu-*.json"))
    if not kept:
        pytest.skip("the machine was too busy to keep a steady measurement")
    rate = json.loads(kept[0].read_text())["per_core"]["fp32"]
    monkeypatch.setattr(cpu, "_THIS_PROCESS", {"per_core": {"fp32": rate / 2, "bf16": rate / 4}, "kept": False,
                                               "doubt": "busy", "bound_per_core": {}})
    assert peak_flops(torch.device("cpu"), None, "fp32")[0] == rate * cpu.cores_in_use()
