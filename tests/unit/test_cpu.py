"""What a CPU is, which dtype `auto` picks on it, and when a measurement is kept (train/cpu.py).

No test here asserts a speed: the measurements are injected where a decision is tested, and the
one real measurement (on a loaded machine) is checked for what it records, not how fast it was."""

import json
import multiprocessing as mp

import pytest

from gptrain.config_options import parse_train_args
from gptrain.train import cpu, plan

G = 1e9
XEON_NO_AMX = ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: Intel(R) Xeon(R) Processor\n"
               "cpu MHz\t\t: 2400.000\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16 avx512_fp16\n\n"
               "processor\t: 1\nflags\t\t: fpu\n")
XEON_AMX = XEON_NO_AMX.replace("avx512_fp16", "avx512_fp16 amx_bf16 amx_tile")
EPYC_ZEN4 = ("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.126\n"
             "flags\t\t: fpu avx2 fma avx512f avx512_bf16\n")
EPYC_ZEN2 = ("vendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel name\t: AMD EPYC 7B12\n"
             "cpu MHz\t\t: 2250.000\nflags\t\t: fpu avx2 fma\n")

pytestmark = pytest.mark.cpu_unmeasured  # these tests measure (or fake) the CPU in an empty home


def test_a_cpu_kind_is_read_from_its_first_processor_entry():
    xeon = cpu.CpuKind.from_cpuinfo(XEON_NO_AMX)
    assert (xeon.model, xeon.vendor, xeon.family, xeon.mhz) == ("Intel(R) Xeon(R) Processor", "GenuineIntel", 6, 2400.0)
    assert xeon.units == ("avx512_bf16", "avx512f", "avx2", "fma")
    assert cpu.CpuKind.from_cpuinfo(XEON_AMX).units[0] == "amx_bf16"
    assert cpu.CpuKind.from_cpuinfo(EPYC_ZEN4, max_khz="3700000").mhz == 3700.0  # cpufreq's max wins
    assert cpu.CpuKind.from_cpuinfo("").units == ()  # no /proc/cpuinfo: nothing claimed
    assert xeon.key != cpu.CpuKind.from_cpuinfo(XEON_AMX).key  # kinds are kept apart


@pytest.mark.parametrize("text, fp32, bf16", [
    (XEON_NO_AMX, 2400e6 * 64, 2400e6 * 128),   # two 512-bit FMA units; vdpbf16ps doubles it
    (XEON_AMX, 2400e6 * 64, 2400e6 * 1024),     # AMX tiles
    (EPYC_ZEN4, 2596.126e6 * 32, 2596.126e6 * 64),  # AVX-512 on 256-bit units
    (EPYC_ZEN2, 2250e6 * 32, 2250e6 * 32),      # AVX2 FMA; bf16 computed in fp32
])
def test_the_bound_per_core_comes_from_the_units_and_the_clock(text, fp32, bf16):
    kind = cpu.CpuKind.from_cpuinfo(text)
    assert kind.bound_per_core("fp32") == pytest.approx(fp32)
    assert kind.bound_per_core("bf16") == pytest.approx(bf16)
    assert cpu.CpuKind.from_cpuinfo(text.replace("cpu MHz", "no MHz")).bound_per_core("fp32") is None


@pytest.fixture
def fake_cpu(monkeypatch):
    """A Xeon without AMX whose measurements the test decides: [(fp32, bf16) per round]."""
    rounds = []

    def measure(precisions):
        fp32, bf16 = rounds.pop(0)
        return {p: {"fp32": fp32, "bf16": bf16, "fp16": fp32 / 10}[p] for p in precisions}

    monkeypatch.setattr(cpu, "cpu_kind", lambda: cpu.CpuKind.from_cpuinfo(XEON_NO_AMX))
    monkeypatch.setattr(cpu, "measure_per_core", measure)
    monkeypatch.setattr(cpu, "_THIS_PROCESS", {})  # each test is a process of its own
    return rounds


@pytest.mark.parametrize("fp32, bf16, expected", [
    (141 * G, 79 * G, "fp32"),   # the Xeon without AMX of the issue: bf16 at half the fp32 rate
    (98 * G, 209 * G, "bf16"),   # AMD EPYC (Zen 4): bf16 twice as fast
    (100 * G, 120 * G, "fp32"),  # a small edge does not pay for autocast's casts
])
def test_auto_takes_the_dtype_whose_matmuls_are_faster_here(fake_cpu, isolated_home, fp32, bf16, expected):
    fake_cpu += [(fp32, bf16), (fp32, bf16)]
    choice, why = cpu.fastest_precision()
    assert choice == expected
    assert f"bf16 matmuls {bf16 / G:.0f} vs fp32 {fp32 / G:.0f} GFLOP/s per core" in why and "kept in" in why
    assert cpu.fastest_precision()[0] == expected and fake_cpu == []  # kept: not measured again


def test_a_kept_measurement_holds_its_numbers_and_serves_the_peak(fake_cpu, isolated_home, monkeypatch):
    fake_cpu += [(140 * G, 80 * G), (141 * G, 79 * G)]
    rec = cpu.profile()
    kept = json.loads(next((isolated_home / "cache").glob("cpu-*.json")).read_text())
    assert kept == rec and rec["kept"] and rec["per_core"] == {"fp32": 141 * G, "bf16": 80 * G}
    assert rec["bound_per_core"]["fp32"] == pytest.approx(2400e6 * 64)
    monkeypatch.setattr(cpu, "cores_in_use", lambda: 2)
    peak, basis = cpu.peak("fp32")
    assert peak == 282 * G and basis.startswith("2 core(s) x 141 GFLOP/s fp32 per core")


def test_the_mfu_peak_of_a_bf16_run_is_the_faster_of_bf16_and_fp32(fake_cpu, isolated_home, monkeypatch):
    """An AVX2 CPU measured 2 GFLOP/s per core in bf16 one-thread matmuls and 85 in fp32; a bf16
    run there showed 'mfu 829.8%' against the bf16 rate (issue 39)."""
    fake_cpu += [(85 * G, 2 * G), (85 * G, 2 * G)]
    monkeypatch.setattr(cpu, "cores_in_use", lambda: 1)
    peak, basis = cpu.peak("bf16")
    assert peak == 85 * G and "85 GFLOP/s fp32 per core" in basis and "faster here than bf16's 2" in basis
    fake_cpu += [(85 * G, 209 * G), (85 * G, 209 * G)]  # a CPU with bf16 units: its bf16 rate
    (isolated_home / "cache").joinpath(next(p.name for p in (isolated_home / "cache").glob("cpu-*.json"))).unlink()
    assert cpu.peak("bf16")[0] == 209 * G


@pytest.mark.parametrize("rounds, doubt", [
    ([(140 * G, 80 * G), (70 * G, 80 * G)], "fp32 rounds disagree"),           # a busy moment
    ([(20 * G, 10 * G), (20 * G, 10 * G)], "implausible against 154 at most"),  # 13% of the bound
])
def test_an_unsteady_or_implausible_measurement_is_used_by_its_process_and_never_kept(fake_cpu, isolated_home,
                                                                                     rounds, doubt):
    fake_cpu += rounds
    rec = cpu.profile()
    assert not rec["kept"] and doubt in rec["doubt"]
    assert not list((isolated_home / "cache").glob("cpu-*.json"))
    assert f"(not kept: {rec['doubt']})" in cpu.fastest_precision()[1]  # this run still decides,
    assert cpu.peak("fp32")[0] > 0 and fake_cpu == []  # on what it measured: not measured again
    cpu._THIS_PROCESS.clear()  # the next run (a process of its own) measures again, and keeps it
    fake_cpu += [(140 * G, 80 * G), (141 * G, 79 * G)]
    assert cpu.profile()["kept"] and fake_cpu == []


@pytest.mark.parametrize("garbage", ["{not json", '{"per_core": {"fp32": "fast"}}', "[]"])
def test_an_unreadable_kept_file_is_measured_again_not_a_crash(fake_cpu, isolated_home, garbage):
    fake_cpu += [(140 * G, 80 * G), (141 * G, 79 * G)]
    path = cpu._cache_path(cpu.cpu_kind())
    path.parent.mkdir(parents=True)
    path.write_text(garbage)
    assert cpu.fastest_precision()[0] == "fp32" and fake_cpu == []
    assert json.loads(path.read_text())["per_core"]["fp32"] == 141 * G  # replaced by a good one


def _spin():
    while True:
        pass


def test_a_real_measurement_on_a_loaded_machine_decides_and_records_why(isolated_home):
    hogs = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(2)]
    for h in hogs:
        h.start()
    try:
        p = plan.resolve(parse_train_args([]), "cpu", 1)
    finally:
        for h in hogs:
            h.kill()
    assert p.precision in ("fp32", "bf16")
    assert p.precision_why.startswith(f"auto -> {p.precision}: bf16 matmuls ")
    rec = cpu.profile()  # kept, or measured again: either way both rates and the verdict
    assert rec["per_core"]["fp32"] > 0 and rec["per_core"]["bf16"] > 0
    assert rec["kept"] == (rec["doubt"] is None)


def test_fp16_on_a_cpu_that_runs_it_far_slower_says_what_it_costs(fake_cpu, isolated_home, monkeypatch):
    """#49: fp16 on a CPU ran 10-25x slower than bf16 without a word, though gptrain measures both."""
    fake_cpu += [(141 * G, 79 * G), (141 * G, 79 * G)]  # (fp16: a tenth of fp32, as without fp16 units)
    precision, why = plan.resolve_precision("fp16", "cpu")
    assert precision == "fp16" and why == (
        "as set; warning: fp16 matmuls run 10x slower than fp32's on this CPU (14.1 vs 141 GFLOP/s per core, "
        "measured); --train.precision=auto takes the fastest"), why
    assert plan.resolve_precision("bf16", "cpu") == ("bf16", "as set")  # (what was asked, no measuring)
    monkeypatch.setattr(cpu, "profile", lambda precisions: {"per_core": {"fp32": 100 * G, "bf16": 120 * G,
                                                                         "fp16": 90 * G}})
    assert plan.resolve_precision("fp16", "cpu") == ("fp16", "as set")  # fp16 units: nothing to say
