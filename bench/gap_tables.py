"""Small text tables from one torch.profiler trace of a few training steps (bench/gap_probe.py).

Computed where the trace was taken (a lent GPU machine), so only these tables come back, never
the traces. On a GPU the "kernels" are the device's; on a CPU (the probe's dry run) the CPU ops'
self times stand in for them, so every table is written on both.
"""

from __future__ import annotations

import re
import statistics

# first match wins; kernel names from cuBLAS/CUTLASS, flash attention, Inductor's triton_* and aten
CATEGORIES = [
    ("copy H2D pageable", r"Memcpy HtoD \(Pageable"),
    ("copy H2D pinned", r"Memcpy HtoD"),
    ("copy other", r"Memcpy|Memset|aten::copy_|aten::to\b|aten::_to_copy"),
    ("attention", r"flash|fmha|attention|sdpa|_efficient_attention"),
    ("optimizer", r"adam|multi_tensor|foreach|fused_adamw"),
    ("loss", r"cross_entropy|log_softmax|nll_loss|softmax"),
    ("GEMM", r"gemm|cutlass|xmma|nvjet|cublas|aten::mm\b|aten::addmm|aten::bmm|aten::matmul|aten::linear"),
    ("LayerNorm", r"layer_norm|layernorm|var_mean|native_layer_norm"),
    ("embedding", r"embedding|index_select|indexing_backward|index_put"),
]
# each host wait once, at the runtime call that blocks: a copy to pageable memory (`.tolist()`) waits
# inside cudaMemcpyAsync; `.item()` copies to pinned memory, then waits in cudaStreamSynchronize
SYNCS = r"cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpyAsync|cudaMemcpy\b"


def category(name: str) -> str:
    low = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, low if label != "copy H2D pageable" else name, re.I):
            return label
    return "other"


def kernels(prof, device: str) -> list:
    """(name, start_us, end_us) of the device's kernels and copies; on a CPU, of the aten ops,
    each as long as its self time (what it does besides the ops it calls)."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.events():
        if getattr(e, "is_user_annotation", False):  # a record_function's span on the device: no kernel
            continue
        if device == "cuda":
            if e.device_type == DeviceType.CUDA:
                out.append((e.name, e.time_range.start, e.time_range.end))
        elif e.device_type == DeviceType.CPU and e.name.startswith("aten::") and e.self_cpu_time_total > 0:
            out.append((e.name, e.time_range.start, e.time_range.start + e.self_cpu_time_total))
    return sorted(out, key=lambda k: k[1])


def _merged(intervals):
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def timeline(ks, steps: int) -> tuple[str, dict]:
    """Per step: the window's wall (first kernel start to last kernel end), busy (the union of
    kernels), idle, and the gaps between kernels longer than 20 us (the device waiting on the
    host), with the 10 longest and the kernels around them."""
    if not ks:
        return "timeline: no kernels in the trace\n", {}
    merged = _merged([(s, e) for _, s, e in ks])
    wall = merged[-1][1] - merged[0][0]
    busy = sum(e - s for s, e in merged)
    gaps = []
    for (_, e0), (s1, _) in zip(merged, merged[1:]):
        if s1 - e0 > 20:
            gaps.append((s1 - e0, e0, s1))
    around = []
    for g, e0, s1 in sorted(gaps, reverse=True)[:10]:
        before = max((k for k in ks if k[2] <= e0 + 0.01), key=lambda k: k[2], default=("?",))[0]
        after = min((k for k in ks if k[1] >= s1 - 0.01), key=lambda k: k[1], default=("?",))[0]
        around.append(f"  {g / 1000:8.3f} ms  after {before[:60]}  before {after[:60]}")
    facts = {"wall_ms": wall / 1000 / steps, "busy_ms": busy / 1000 / steps,
             "idle_ms": (wall - busy) / 1000 / steps, "gaps": len(gaps) / steps,
             "gap_ms": sum(g for g, _, _ in gaps) / 1000 / steps}
    text = (f"per step (mean of {steps} traced): wall {facts['wall_ms']:.3f} ms | busy {facts['busy_ms']:.3f} ms "
            f"({100 * busy / wall:.1f}%) | idle {facts['idle_ms']:.3f} ms | {facts['gaps']:.1f} gaps > 20 us "
            f"totalling {facts['gap_ms']:.3f} ms\nlongest gaps (device idle, waiting on the host):\n"
            + ("\n".join(around) or "  none") + "\n")
    return text, facts


def by_category(ks, steps: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, s, e in ks:
        c = category(name)
        out[c] = out.get(c, 0.0) + (e - s) / 1000 / steps
    return out


def category_table(sides: dict[str, dict[str, float]]) -> str:
    """ms a step per kernel category, a row per side, and each side's difference from the first."""
    cats = [c for c, _ in CATEGORIES] + ["other"]
    short = {"copy H2D pageable": "H2D page", "copy H2D pinned": "H2D pin", "copy other": "copy",
             "attention": "attn", "optimizer": "optim", "LayerNorm": "norm", "embedding": "embed"}
    head = f"{'side':<28}" + "".join(f"{short.get(c, c):>9}" for c in cats) + f"{'total':>9}"
    lines, first = [head], None
    for name, s in sides.items():
        vals = [s.get(c, 0.0) for c in cats] + [sum(s.values())]
        lines.append(f"{name[:28]:<28}" + "".join(f"{v:9.3f}" for v in vals))
        if first is None:
            first = (name, vals)
        else:
            lines.append(f"{('  - ' + first[0])[:28]:<28}" + "".join(f"{v - f:+9.3f}" for v, f in zip(vals, first[1])))
    return "\n".join(lines) + "\n"


def top_kernels(ks, steps: int, n: int = 40) -> str:
    total: dict[str, list] = {}
    for name, s, e in ks:
        t = total.setdefault(name, [0.0, 0])
        t[0] += (e - s) / 1000 / steps
        t[1] += 1
    lines = [f"{'ms/step':>9} {'calls/step':>10}  category    kernel"]
    for name, (ms, calls) in sorted(total.items(), key=lambda kv: -kv[1][0])[:n]:
        lines.append(f"{ms:9.3f} {calls / steps:10.1f}  {category(name):<11} {name[:110]}")
    return "\n".join(lines) + "\n"


def gemm_rates(prof, device: str, steps: int) -> str:
    """TFLOP/s of each matrix-product shape (the profiler's FLOP count over its device time, or
    CPU time on a CPU)."""
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if not e.flops or not re.search(r"aten::(mm|addmm|bmm|baddbmm|matmul|linear)$", e.key):
            continue
        t_us = (getattr(e, "device_time_total", 0) or 0) if device == "cuda" else e.self_cpu_time_total
        if t_us:
            rows.append((e.flops / (t_us * 1e-6) / 1e12, e.key, str(e.input_shapes)[:90], e.count / steps,
                         t_us / 1000 / steps))
    lines = [f"{'TFLOP/s':>8} {'calls/step':>10} {'ms/step':>8}  op  shapes"]
    for rate, key, shapes, calls, ms in sorted(rows, key=lambda r: -r[4])[:25]:
        lines.append(f"{rate:8.1f} {calls:10.1f} {ms:8.3f}  {key} {shapes}")
    return "\n".join(lines) + "\n"


def syncs(prof, steps: int) -> str:
    """Every host wait on the device in the traced steps: its op, the time it blocked, and the
    phase it came from (the innermost record_function name that the probe put around the step's
    parts)."""
    rows = {}
    for e in prof.events():
        if not re.search(SYNCS, e.name):
            continue
        phase, p = "?", e.cpu_parent
        while p is not None:
            if p.name.startswith(("gptrain.", "nanogpt.", "probe.")):
                phase = p.name
                break
            p = p.cpu_parent
        r = rows.setdefault((phase, e.name), [0, 0.0])
        r[0] += 1
        r[1] += (e.time_range.end - e.time_range.start) / 1000
    lines = [f"{'per step':>8} {'blocked ms/step':>15}  phase / op"]
    for (phase, name), (n, ms) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{n / steps:8.1f} {ms / steps:15.3f}  {phase} / {name}")
    return "\n".join(lines) + ("\n" if rows else "\n  none\n")


def percentiles(step_s: list[float]) -> str:
    if not step_s:
        return "no timed steps\n"
    q = statistics.quantiles(step_s, n=10) if len(step_s) > 1 else [step_s[0]] * 9
    p50 = statistics.median(step_s)
    return (f"step ms over {len(step_s)} timed steps: p10 {q[0] * 1000:.3f} | p50 {p50 * 1000:.3f} | "
            f"p90 {q[8] * 1000:.3f} | p90/p50 {q[8] / p50:.3f}\n")


def summary(results: list[dict], device: str, w: dict) -> str:
    """summary.txt: a row per variant (tokens/s, step percentiles, MFU of 989 TFLOP/s, busy share,
    SM clocks), then the kernel categories of all of them."""
    from gptrain.models.shapes import GPTConfig
    from gptrain.train.metrics import flops_per_token

    cfg = GPTConfig(vocab_size=50257, n_layer=w["n_layer"], n_head=w["n_head"], n_embd=w["n_embd"],
                    block_size=w["block_size"])
    L, C, V = cfg.n_layer, cfg.n_embd, cfg.padded_vocab_size
    n_params = L * (12 * C * C + 13 * C) + 2 * C + V * C  # tied head, biases (non-embedding, as nanoGPT)
    fpt = flops_per_token(cfg, n_params)
    lines = [f"{'variant':<28} {'tokens/s':>10} {'p10 ms':>8} {'p50 ms':>8} {'p90 ms':>8} {'p90/p50':>7} "
             f"{'MFU(989)':>8} {'busy %':>6} {'SM MHz':>12}"]
    for r in results:
        s = sorted(r["step_s"])
        q = statistics.quantiles(s, n=10) if len(s) > 1 else [s[0]] * 9
        busy = r["timeline"].get("busy_ms", 0) / max(r["timeline"].get("wall_ms", 0), 1e-9) * 100
        mfu = fpt * r["tokens_per_s"] / 989e12 * 100 if device == "cuda" else float("nan")
        clk = r["sm_clock_mhz"]
        clock = f"{min(clk):.0f}-{max(clk):.0f}" if clk else "n/a"
        lines.append(f"{r['variant']:<28} {r['tokens_per_s']:10,.0f} {q[0] * 1000:8.3f} {r['p50_ms']:8.3f} "
                     f"{q[8] * 1000:8.3f} {q[8] / statistics.median(s):7.3f} {mfu:7.1f}% {busy:6.1f} {clock:>12}")
    ratio = {r["variant"]: r["tokens_per_s"] for r in results}
    if "gptrain" in ratio and "nanogpt" in ratio:
        lines.append(f"gptrain / nanogpt: {ratio['gptrain'] / ratio['nanogpt']:.3f}x")
    lines.append("the sides' models: gptrain's GPT-2 (biases, tanh GELU, vocabulary 50257 padded to 50304) "
                 "and nanoGPT's (no biases, exact GELU, vocabulary 50304): the same matmul shapes but the biases")
    return ("\n".join(lines) + "\n\nkernel time by category (ms a step, traced window)\n"
            + category_table({r["variant"]: r["categories"] for r in results}))
