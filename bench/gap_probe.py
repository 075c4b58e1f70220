"""The one device call of issue #46: where gptrain's GPU step loses to nanoGPT's, measured in one go.

    python bench/gap_probe.py --out $OUT                       # on a lent GPU: <= 8 minutes
    python bench/gap_probe.py --device cpu --steps 2 --out DIR  # the dry run (tests/unit/test_gap_probe.py)

Each variant below trains GPT-2 124M (context 1024, batch 16, bf16; on a CPU a tiny shape) on the
same random GPT-2 tokens: --warmup steps, then --steps timed ones (each step's time from CUDA
events at its start, so the host never waits for them), then a window of --window steps traced by
torch.profiler. The tables are computed where the traces are (bench/gap_tables.py) and written to
--out as small text files; the traces are not kept. Variants run in priority order while the
budget lasts (each in its own process on a GPU, one process on a CPU):

  nanogpt, gptrain              each side as the throughput bench runs it (logging every step)
  gptrain-log50, nanogpt-log50  logging every 50 steps on both sides
  gptrain-fix1-off .. fix4-off  one of #46's fixes undone: the logits sliced in eager before the
                                loss (blocks and loss then compiled apart), three host reads a
                                logged step, the batch moved at the step's head from a
                                non-contiguous view, blocks and loss compiled apart
  gptrain-model-nanogpt-loop    gptrain's model, compiled whole, in nanoGPT's loop (loop cost
                                vs model cost)
  gptrain-whole-compile         gptrain with the whole model compiled as one graph
  gptrain-pre46                 all four undone: the step as it was before #46
  nanogpt#2, gptrain#2, ...     each side again, for the spread

Written: summary.txt (tokens/s, p10/p50/p90, MFU of 989 TFLOP/s, GPU busy share, SM clocks, and
the kernel categories of every variant side by side) and VARIANT.txt (its timeline and gaps, its
40 top kernels, GEMM TFLOP/s by shape, every host sync with its phase).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
NANOGPT = ROOT / "tests" / "third_party" / "nanogpt"

VARIANTS = ["nanogpt", "gptrain", "gptrain-log50", "nanogpt-log50", "gptrain-fix1-off", "gptrain-fix2-off",
            "gptrain-fix3-off", "gptrain-fix4-off", "gptrain-model-nanogpt-loop", "gptrain-whole-compile",
            "gptrain-pre46", "nanogpt#2", "gptrain#2", "nanogpt#3", "gptrain#3"]
# #46's fixes each variant undoes: 1 the masked loss (its slice must sit outside the compiled head,
# so 4 goes with it), 2 one host read a logged step, 3 contiguous batches queued ahead, 4 the head
# region compiled
FIXES_OFF = {"gptrain-fix1-off": {1, 4}, "gptrain-fix2-off": {2}, "gptrain-fix3-off": {3}, "gptrain-fix4-off": {4},
             "gptrain-pre46": {1, 2, 3, 4}}
COMPILED_ONLY = {"gptrain-fix4-off", "gptrain-whole-compile"}  # the same as `gptrain` when nothing compiles


def shape(device: str) -> dict:
    if device == "cuda":
        return dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch=16)
    return dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch=2)


class Done(Exception):
    """Raised from the step hook once the traced window is over: no final save to wait for."""


class Clock:
    """Called at the start of every step: times steps (CUDA events, or perf_counter on a CPU),
    then traces two windows and ends the run. Window A (--window steps, after one untraced
    profiler warm-up step that takes CUPTI's start): kernels, timeline, syncs, no shapes (recording
    them costs host time per op, more for an eager loop than a compiled one). Window B (2 steps)
    records shapes and FLOPs for the GEMM rates. The device is drained, labelled, before each
    window starts and ends; SM clocks are read outside the timed steps."""

    def __init__(self, device, warmup, steps, window):
        import torch

        self.torch, self.device = torch, device
        self.warmup, self.steps, self.window = warmup, steps, window
        self.marks, self.prof, self.shapes, self.clocks = [], None, None, []
        self._open = None

    def tick(self):
        torch, n = self.torch, len(self.marks)
        if self.device == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())
        a = self.warmup + self.steps  # window A's profiler starts here (its warm-up step, then --window)
        b = a + 1 + self.window  # A ends and B starts (its warm-up step, then 2)
        end = b + 3
        if n in (max(self.warmup - 1, 0), a):
            self._read_clock()
        if n > a:
            if n in (b, end):
                self._drain()  # what the window queued runs inside it
            self._open.step()
            if n in (b, end):
                self._open.__exit__(None, None, None)
            if n == b:
                self.prof = self._open
            if n == end:
                self.shapes = self._open
                raise Done()
        if n in (a, b):
            if n == a:
                self._drain()  # the timed steps' queue ends before the trace starts
            self._open = self._profile(self.window if n == a else 2, shapes=n == b)
            self._open.__enter__()

    def _profile(self, active: int, shapes: bool):
        from torch.profiler import ProfilerActivity, profile, schedule

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        return profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
                       record_shapes=shapes, with_flops=shapes)

    def _drain(self):
        if self.device == "cuda":
            with self.torch.profiler.record_function("probe.drain"):
                self.torch.cuda.synchronize()

    def _read_clock(self):
        if self.device != "cuda" or not shutil.which("nvidia-smi"):
            return
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i",
                                os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                               capture_output=True, text=True, timeout=10)
            self.clocks.append(float(r.stdout.split()[0]))
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass

    def step_times(self) -> list[float]:
        timed = self.marks[self.warmup: self.warmup + self.steps + 1]
        if self.device == "cuda":
            return [a.elapsed_time(b) / 1000 for a, b in zip(timed, timed[1:])]
        return [b - a for a, b in zip(timed, timed[1:])]


def phase(name, fn):
    """fn inside a record_function named `name` (the sync table's phases)."""
    import torch

    def wrapped(*a, **k):
        with torch.profiler.record_function(name):
            return fn(*a, **k)

    return wrapped


# ---- gptrain's trainer, with one fix undone where a variant says ------------------------------

def gptrain_patches(variant: str, clock: Clock, stack: contextlib.ExitStack) -> None:
    import torch

    from gptrain.distributed import parallelize
    from gptrain.models import base
    from gptrain.train import finite, metrics, trainer
    from gptrain.train.step_reader import StepReader

    T = trainer.Trainer
    patch = lambda obj, name, new: stack.enter_context(mock.patch.object(obj, name, new))  # noqa: E731
    step = T.train_step
    patch(T, "train_step", lambda self, b: (clock.tick(), step(self, b))[1])
    for owner, name in ((T, "_forward_backward"), (T, "read_back"), (T, "_prefetch"), (StepReader, "read"),
                        (StepReader, "stop_agreed"), (metrics.MetricsLogger, "log"), (finite.DeviceSkips, "step")):
        raw = inspect.getattr_static(owner, name)
        wrapped = phase(f"gptrain.{owner.__name__}.{name}", getattr(owner, name))
        patch(owner, name, staticmethod(wrapped) if isinstance(raw, staticmethod) else wrapped)
    patch(trainer, "clip_grads", phase("gptrain.clip_grads", trainer.clip_grads))
    off = FIXES_OFF.get(variant, set())
    if 1 in off:  # the logits sliced in eager before a loss compiled alone (with 4 off: as before #46)
        def head_loss(self, x, targets):
            logits = self.lm_head(self.transformer.ln_f(x))
            return logits, self.loss_fn(logits[..., :self.config.vocab_size], targets)
        patch(base.CausalLM, "head_loss", head_loss)
    if 2 in off:  # three host reads a logged step
        def read_back(self, loss):
            latest = False
            if self.skips is not None:
                count, first, latest = self.skips.take()
                if count:
                    self._non_finite(first, count)
            value = None if latest or loss is None else loss.detach().clone().item()
            norm = None if self.grad_norm is None else float(self.grad_norm)
            ok = lambda v: v if v is not None and math.isfinite(v) else None  # noqa: E731
            return ok(value), ok(norm)
        patch(T, "read_back", phase("gptrain.Trainer.read_back", read_back))
    if 3 in off:  # non-contiguous views, pinned and moved at the step's head
        view = lambda t: torch.cat([t, t[:, -1:]], 1)[:, :-1]  # noqa: E731
        patch(T, "_prefetch", lambda self, b: None if b is None else [tuple(view(t) for t in x) for x in b])
        fb = T._forward_backward

        def moved(self, t):
            return t.pin_memory().to(self.env.device, non_blocking=True) if self.env.device.type == "cuda" else t
        patch(T, "_forward_backward", phase("gptrain.Trainer._forward_backward",
                                              lambda self, b: fb(self, [tuple(moved(self, t) for t in x) for x in b])))
    if 4 in off:  # each block and the loss compiled apart, ln_f and lm_head eager
        def blocks_apart(model):
            for block in model.transformer.h.values():
                block.compile()
            model.loss_fn = torch.compile(base.cross_entropy)
        patch(parallelize, "apply_compile", blocks_apart)
    if variant == "gptrain-whole-compile":
        patch(parallelize, "apply_compile", lambda model: model.compile())


def run_gptrain(variant, w, args, clock, data) -> None:
    from gptrain.config_options import parse_train_args
    from gptrain.train.trainer import train

    log_every = 50 if "log50" in variant else 1
    out = Path(tempfile.mkdtemp(prefix="gap-probe-"))
    cfg = parse_train_args([
        f"--data.path={data}", "--model.preset=gpt2-mini", f"--model.n_layer={w['n_layer']}",
        f"--model.n_head={w['n_head']}", f"--model.n_embd={w['n_embd']}", f"--model.block_size={w['block_size']}",
        f"--train.batch_size={w['batch']}", f"--train.max_steps={clock.warmup + clock.steps + clock.window + 10}",
        f"--train.precision={'bf16' if args.device == 'cuda' else 'fp32'}", f"--train.device={args.device}",
        "--train.do_eval=false", "--checkpoint.every=0", f"--metrics.log_every={log_every}", "--report_to=none",
        f"--train.output_dir={out}", "--train.warmup_steps=2", "--checkpoint.resume_from=none",
        *(["--train.compile=true", "--train.fused_loss=false"] if args.compile else []),  # (a GPU's default)
    ])
    with contextlib.ExitStack() as stack, contextlib.redirect_stdout(open(os.devnull, "w")):
        gptrain_patches(variant, clock, stack)
        with contextlib.suppress(Done):
            train(cfg)
    shutil.rmtree(out, ignore_errors=True)


# ---- nanoGPT's loop (train.py's, with its model or gptrain's) -------------------------------

def run_nanogpt_loop(variant, w, args, clock, data) -> None:
    import numpy as np
    import torch

    device = args.device
    sys.path.insert(0, str(NANOGPT))
    if variant == "gptrain-model-nanogpt-loop":
        from gptrain.models.registry import build
        from gptrain.models.shapes import GPTConfig

        model = build(GPTConfig(vocab_size=50257, n_layer=w["n_layer"], n_head=w["n_head"], n_embd=w["n_embd"],
                                block_size=w["block_size"]))
        model.fused_loss = not args.compile
    else:
        from model import GPT, GPTConfig  # nanoGPT's

        with contextlib.redirect_stdout(open(os.devnull, "w")):  # (it prints its size)
            model = GPT(GPTConfig(n_layer=w["n_layer"], n_head=w["n_head"], n_embd=w["n_embd"],
                                  block_size=w["block_size"], bias=False, vocab_size=50304, dropout=0.0))
    model.to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95), **({"fused": True} if device == "cuda" else {}))
    if args.compile:
        model = torch.compile(model)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ctx = torch.autocast(device, dtype=dtype) if device == "cuda" else contextlib.nullcontext()
    scaler = torch.amp.GradScaler(device, enabled=False)
    B, T = w["batch"], w["block_size"]
    log_interval = 50 if "log50" in variant else 1

    def get_batch():  # train.py's
        arr = np.memmap(os.path.join(data, "train.bin"), dtype=np.uint16, mode="r")
        ix = torch.randint(len(arr) - T, (B,))
        x = torch.stack([torch.from_numpy(arr[i:i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(arr[i + 1:i + 1 + T].astype(np.int64)) for i in ix])
        if device == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    rf = torch.profiler.record_function
    X, Y = get_batch()
    with contextlib.suppress(Done):
        for it in range(10 ** 9):
            clock.tick()
            lr = 6e-4 * min(1.0, (it + 1) / 2)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with rf("nanogpt.forward"), ctx:
                _, loss = model(X, Y)
            with rf("nanogpt.get_batch"):
                X, Y = get_batch()
            with rf("nanogpt.backward"):
                scaler.scale(loss).backward()
            with rf("nanogpt.clip_grads"):
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with rf("nanogpt.optimizer"):
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
            if it % log_interval == 0:
                with rf("nanogpt.log"):
                    lossf = loss.item()
                    print(f"iter {it}: loss {lossf:.4f}", file=open(os.devnull, "w"))


# ---- one variant, and the whole probe ---------------------------------------------------------

def run_variant(variant: str, args) -> dict:
    import gap_tables as tables

    w = shape(args.device)
    clock = Clock(args.device, args.warmup, args.steps, args.window)
    base = variant.split("#")[0]
    runner = run_gptrain if base.startswith("gptrain") and base != "gptrain-model-nanogpt-loop" else run_nanogpt_loop
    runner(base, w, args, clock, args.data)
    ks = tables.kernels(clock.prof, args.device)
    timeline, facts = tables.timeline(ks, args.window)
    step_s = clock.step_times()
    p50 = statistics.median(step_s)
    text = (f"{variant} on {args.device}, {w}\n" + tables.percentiles(step_s) + timeline
            + "\nthe top kernels\n" + tables.top_kernels(ks, args.window)
            + "\nGEMM rates by shape (2 more steps, traced with shapes)\n" + tables.gemm_rates(clock.shapes, args.device, 2)
            + "\nhost syncs\n" + tables.syncs(clock.prof, args.window))
    (Path(args.out) / f"{variant.replace('#', '-run')}.txt").write_text(text)
    return {"variant": variant, "step_s": step_s, "p50_ms": p50 * 1000,
            "tokens_per_s": w["batch"] * w["block_size"] / p50, "timeline": facts,
            "categories": tables.by_category(ks, args.window), "sm_clock_mhz": clock.clocks}


def make_data(folder: Path, tokens: int) -> Path:
    """Random GPT-2 token ids as train.bin/val.bin (what nanoGPT's loop reads) with the meta.json
    of a prepared gptrain dataset beside them: no tokenizer is loaded on either side."""
    import numpy as np

    from gptrain.data.formats import sha256_file, write_meta

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    splits = {}
    for split, n in (("train", tokens), ("val", tokens // 10)):
        rng.integers(0, 50257, n, dtype=np.uint16).tofile(folder / f"{split}.bin")
        splits[split] = {"tokens": n, "documents": 1,
                         "files": [{"name": f"{split}.bin", "tokens": n, "sha256": sha256_file(folder / f"{split}.bin")}]}
    write_meta(folder, {"format": "gptrain-tokens", "version": 1, "tokenizer": {"name": "gpt2"},
                        "tokenizer_name": "gpt2", "vocab_size": 50257, "eos_id": 50256, "dtype": "uint16",
                        "splits": splits})
    return folder


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (10 on a GPU, 1 on a CPU)")
    ap.add_argument("--window", type=int, default=None, help="steps traced (6 on a GPU, 1 on a CPU)")
    ap.add_argument("--budget-s", type=float, default=480, help="start no variant that would end past this")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--compile", default="auto", choices=["auto", "true", "false"], help="auto: on a GPU")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    start = time.monotonic()
    import gap_tables as tables
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (10 if gpu else 1)
    args.window = args.window if args.window is not None else (6 if gpu else 1)
    args.compile = gpu if args.compile == "auto" else args.compile == "true"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.child:
        print("RESULT " + json.dumps(run_variant(args.child, args)), flush=True)
        return
    work = Path(tempfile.mkdtemp(prefix="gap-probe-"))
    os.environ["GPTRAIN_HOME"] = str(work / "home")  # gptrain's dataset cache stays in here
    w = shape(args.device)
    args.data = str(make_data(work / "data", (args.warmup + args.steps + args.window + 10) * w["batch"] * w["block_size"] * 2))
    results, longest = [], 0.0
    (Path(args.out) / "summary.txt").write_text("no variant finished\n")
    for variant in args.variants.split(","):
        if variant in COMPILED_ONLY and not args.compile:
            continue
        left = args.budget_s - (time.monotonic() - start)
        if left < longest * 1.2 + 5:
            print(f"skipped {variant}: {left:.0f}s of the budget left", flush=True)
            continue
        began = time.monotonic()
        if gpu:  # a process each: its own compile caches and memory
            cmd = [sys.executable, __file__, "--child", variant, "--data", args.data, "--out", args.out,
                   "--device", args.device, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--window", str(args.window), "--compile", str(args.compile).lower()]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
            except subprocess.TimeoutExpired:
                print(f"{variant}: out of time", flush=True)
                continue
            found = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
            if not found:
                print(f"{variant} failed ({r.returncode}):\n{r.stderr[-3000:]}", flush=True)
                continue
            result = json.loads(found[-1][7:])
        else:
            result = run_variant(variant, args)
        longest = max(longest, time.monotonic() - began)
        results.append(result)
        print(f"{variant}: {result['tokens_per_s']:,.0f} tokens/s, p50 {result['p50_ms']:.3f} ms "
              f"({time.monotonic() - began:.0f}s)", flush=True)
        (Path(args.out) / "summary.txt").write_text(tables.summary(results, args.device, w))
    shutil.rmtree(work, ignore_errors=True)
    print((Path(args.out) / "summary.txt").read_text())


if __name__ == "__main__":
    main()
