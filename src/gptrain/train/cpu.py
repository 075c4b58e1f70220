"""The CPU a run trains on: its process settings, what it is, what it multiplies fastest, its peak.

Precision. A CPU's flags do not say which dtype trains faster: with torch 2.13 an AMD EPYC with
AVX512-BF16 multiplies bf16 about twice as fast as fp32, while an Intel Xeon with the same flag but
no AMX multiplies bf16 at half the fp32 rate (158 vs 282 GFLOP/s), so a flag rule trained 2x
slower there. `auto` therefore rests on a measurement of both dtypes on a transformer block's
matmul shapes, made once per CPU kind (model, vector units, torch version) and kept with its
numbers in $GPTRAIN_HOME/cache/cpu-KEY.json; bf16 is chosen only when its matmuls are at least
BF16_MARGIN times faster (autocast also pays casts that a matmul timing does not see).

Load. Each sample is one short matmul on ONE thread, the dtypes interleaved, and each dtype keeps
its best of many samples: a busy machine slows most samples, but one free slice of a core is
enough for a sample to run at full speed. Two such rounds must agree and the fp32 rate must be
plausible against what the CPU can do at most (cores x frequency x FLOP/cycle of its vector
units) before a result is kept; an unsteady one decides this run only and is measured anew next
time. The peak behind MFU is that kept per-core rate times the cores the run computes on, so a
job's MFU no longer depends on how busy the machine was when its peak was first timed.

Memory. glibc serves every allocation above its mmap threshold with a fresh mmap and gives it
back on free, so a training step that allocates and frees hundreds of MB of activations
page-faults all of it in again every step. Keeping freed memory in the heap (what jemalloc or
tcmalloc do, and what PyTorch's CPU performance guide recommends them for) removed a third of the
step time of bench/train_throughput.py on a 2-core machine. The price: the process keeps its peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

BF16_MARGIN = 1.3     # bf16 matmuls must beat fp32 by this much for `auto` to pick bf16
STEADY = 0.85         # two measurement rounds within 15% of each other, or nothing is kept
SHAPES = ((128, 384, 1536), (128, 1536, 384))  # (tokens, in, out) of a 384-wide block's MLP
UNITS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "fma")  # the flags that decide, best first
DTYPES = ("fp32", "bf16", "fp16")


def keep_freed_memory() -> bool:
    """Tell glibc malloc to never mmap and never trim; False where this is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1)))


@dataclass(frozen=True)
class CpuKind:
    """What a CPU is, read from /proc/cpuinfo (one core's entry) and cpufreq."""

    model: str
    vendor: str
    family: int
    units: tuple[str, ...]      # those of UNITS it has
    mhz: float | None           # the highest frequency the OS reports, None when unknown

    @classmethod
    def from_cpuinfo(cls, text: str, max_khz: str | None = None) -> "CpuKind":
        fields: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                break  # the first processor's block says it all
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        flags = set(fields.get("flags", fields.get("Features", "")).split())
        mhz = float(max_khz) / 1000 if max_khz else None
        try:
            mhz = mhz or float(fields["cpu MHz"]) or None
        except (KeyError, ValueError):
            pass
        try:
            family = int(fields.get("cpu family", "0"))
        except ValueError:
            family = 0
        import platform

        return cls(model=fields.get("model name") or platform.machine() or "unknown",
                   vendor=fields.get("vendor_id", ""), family=family,
                   units=tuple(u for u in UNITS if u in flags), mhz=mhz)

    @property
    def key(self) -> str:
        """One CPU kind under one torch: the name of its kept measurement."""
        import torch

        text = "|".join([self.model, ",".join(self.units), torch.__version__])
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def fp32_flops_per_cycle(self) -> int | None:
        """Per core: FMA units x fp32 lanes x 2. AMD before Zen 5 (family 26) runs AVX-512 on
        256-bit units; Intel server cores have two 512-bit FMA units (some have one: the bound
        is an upper one)."""
        if "avx512f" in self.units:
            return 32 if self.vendor == "AuthenticAMD" and self.family < 26 else 64
        if "avx2" in self.units and "fma" in self.units:
            return 32
        return None

    def bound_per_core(self, precision: str) -> float | None:
        """The most FLOP/s one core can do in `precision`, or None where its units are unknown."""
        per_cycle = self.fp32_flops_per_cycle()
        if per_cycle is None or not self.mhz:
            return None
        if precision == "bf16" and "amx_bf16" in self.units:
            per_cycle = 1024  # one AMX tile multiply: 16x32 by 32x16 bf16 per 16 cycles, x2
        elif precision == "bf16" and "avx512_bf16" in self.units:
            per_cycle *= 2  # vdpbf16ps: two bf16 products per fp32 lane
        return per_cycle * self.mhz * 1e6

    def describe(self) -> str:
        have = ", ".join(self.units) or "no vector flags read"
        return f"{self.model} ({have}{'' if 'amx_bf16' in self.units else ', no amx'})"


def cpu_kind() -> CpuKind:
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None

    return CpuKind.from_cpuinfo(read("/proc/cpuinfo") or "",
                                read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"))


def cores_in_use() -> int:
    """The cores this process computes on: torch's threads, at most the CPUs it may run on."""
    import torch

    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), allowed))


def measure_per_core(precisions, samples: int = 40, budget_s: float = 0.5) -> dict[str, float]:
    """Matmul FLOP/s of one core in each precision: one thread, SHAPES, the precisions
    interleaved, the best of `samples` rounds each (see the module docstring for why); a
    precision that has spent `budget_s` stops after 3 rounds (bf16 without bf16 units runs at
    2 GFLOP/s here: 40 rounds of it cost every training process 8 s of CPU)."""
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    gen = torch.Generator().manual_seed(0)  # leave the global RNG (dropout, init) untouched
    mats = {p: [(torch.randn(m, k, generator=gen).to(dtypes[p]), torch.randn(k, n, generator=gen).to(dtypes[p]))
                for m, k, n in SHAPES] for p in precisions}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best, spent = dict.fromkeys(precisions, 0.0), dict.fromkeys(precisions, 0.0)
    try:
        for sample in range(samples + 1):
            for p in precisions:
                if sample > 3 and spent[p] > budget_s:
                    continue
                for a, b in mats[p]:
                    start = time.perf_counter()
                    a @ b
                    took = time.perf_counter() - start
                    spent[p] += took
                    if sample:  # the first round warms caches and kernels up
                        best[p] = max(best[p], 2 * a.shape[0] * a.shape[1] * b.shape[1] / took)
    finally:
        torch.set_num_threads(threads)
    return best


def _doubts(kind: CpuKind, rounds: list[dict[str, float]]) -> str | None:
    """Why a measurement is not to be kept, or None when it is steady and plausible."""
    for p in rounds[0]:
        low, high = min(r[p] for r in rounds), max(r[p] for r in rounds)
        if low < STEADY * high:
            return f"{p} rounds disagree ({low / 1e9:.0f} vs {high / 1e9:.0f} GFLOP/s: a busy machine)"
    bound = kind.bound_per_core("fp32")
    fp32 = max(r["fp32"] for r in rounds) if "fp32" in rounds[0] else None
    if bound and fp32 and not 0.3 * bound <= fp32 <= 1.6 * bound:  # 1.6: turbo above the reported MHz
        return f"fp32 {fp32 / 1e9:.0f} GFLOP/s per core is implausible against {bound / 1e9:.0f} at most"
    return None


def _cache_path(kind: CpuKind) -> Path:
    from gptrain.home import home

    return home() / "cache" / f"cpu-{kind.key}.json"


def _read_kept(path: Path) -> dict:
    """A kept record, or an empty one when there is none or it cannot be read (measured again)."""
    try:
        kept = json.loads(path.read_text())
        if kept["kept"] is True and isinstance(kept["bound_per_core"], dict) and \
                all(isinstance(v, (int, float)) and v > 0 for v in kept["per_core"].values()):
            return kept
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return {"per_core": {}}


_THIS_PROCESS: dict = {}  # an unsteady measurement, used again by this process, never kept


def profile(precisions=("fp32", "bf16")) -> dict:
    """This CPU kind's per-core matmul rates: kept ones, or measured now (under a lock, so the
    ranks of one host measure once) and kept when steady and plausible. The record says which."""
    from gptrain.atomic import exclusive, write_text_atomic

    kind = cpu_kind()
    path = _cache_path(kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(path.with_suffix(".lock")):
        kept = _read_kept(path)
        if all(p in kept["per_core"] for p in precisions):
            return kept  # a steady measurement kept since wins over this process's unsteady one
        if all(p in _THIS_PROCESS.get("per_core", {}) for p in precisions):
            return _THIS_PROCESS  # measured unsteady a moment ago: this process goes on with it
        wanted = sorted(set(precisions) | set(kept["per_core"]) | {"fp32"}, key=DTYPES.index)
        rounds = [measure_per_core(wanted) for _ in range(2)]
        doubt = _doubts(kind, rounds)
        record = {"cpu": kind.model, "units": list(kind.units), "mhz": kind.mhz, "torch_key": kind.key,
                  "per_core": {p: max(r[p] for r in rounds) for p in wanted},
                  "bound_per_core": {p: kind.bound_per_core(p) for p in wanted},
                  "measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "kept": doubt is None, "doubt": doubt}
        if doubt is None:
            try:
                write_text_atomic(path, json.dumps(record, indent=1))
            except OSError:  # a full or read-only disk: keep nothing, train on (measured next time)
                record["kept"], record["doubt"] = False, f"could not be kept in {path}"
        if not record["kept"]:
            _THIS_PROCESS.clear()
            _THIS_PROCESS.update(record)
        return record


def fastest_precision() -> tuple[str, str]:
    """`auto` on this CPU: (precision, why), from this kind's kept or fresh measurement."""
    rec, kind = profile(("fp32", "bf16")), cpu_kind()
    fp32, bf16 = rec["per_core"]["fp32"], rec["per_core"]["bf16"]
    choice = "bf16" if bf16 >= BF16_MARGIN * fp32 else "fp32"
    where = f"kept in {_cache_path(kind)}" if rec["kept"] else f"not kept: {rec['doubt']}"
    return choice, (f"bf16 matmuls {bf16 / 1e9:.0f} vs fp32 {fp32 / 1e9:.0f} GFLOP/s per core on "
                    f"{kind.describe()}; bf16 needs {BF16_MARGIN}x ({where})")


SLOW_RATIO = 3.0  # a precision whose matmuls run this many times slower than the fastest's is said so


def slow_precision_note(precision: str) -> str | None:
    """The cost of `precision` on this CPU where its matmuls measured SLOW_RATIO times slower than
    the fastest precision's (fp16 without fp16 units: 57x slower than fp32 on an AVX2 EPYC), in
    one line with the measured rates and what `auto` would take; None where it is not slow."""
    rec = profile(tuple(dict.fromkeys((precision, "fp32", "bf16"))))
    rates = rec["per_core"]
    best = max(rates, key=rates.get)
    if rates[precision] * SLOW_RATIO > rates[best]:
        return None
    return (f"warning: {precision} matmuls run {rates[best] / rates[precision]:.0f}x slower than {best}'s on "
            f"this CPU ({rates[precision] / 1e9:.1f} vs {rates[best] / 1e9:.0f} GFLOP/s per core, measured); "
            f"--train.precision=auto takes the fastest")


def peak(precision: str) -> tuple[float, str]:
    """This process's peak FLOP/s for a run in `precision` and the basis it rests on: the faster
    of its dtype's and fp32's measured matmuls (a CPU without bf16 units runs a bf16 run's large
    products in fp32 inside oneDNN, far above its own one-thread bf16 rate: MFU against that read
    829%), so an MFU is against the best this CPU does."""
    rec = profile(tuple(dict.fromkeys((precision, "fp32"))))
    best = max(dict.fromkeys((precision, "fp32")), key=lambda p: rec["per_core"][p])
    per_core, cores = rec["per_core"][best], cores_in_use()
    bound = rec["bound_per_core"].get(best)
    kind = cpu_kind()
    basis = (f"{cores} core(s) x {per_core / 1e9:.0f} GFLOP/s {best} per core, measured on "
             f"one-thread matmuls{'' if rec['kept'] else ' (unsteady: ' + str(rec['doubt']) + ')'}")
    if best != precision:
        basis += f" (faster here than {precision}'s {rec['per_core'][precision] / 1e9:.0f})"
    if bound:
        basis += (f"; the reported clock gives {bound / 1e9:.0f} = {kind.mhz / 1000:.2f} GHz x "
                  f"{bound / kind.mhz / 1e6:.0f} FLOP/cycle (turbo may exceed it)")
    return per_core * cores, basis
