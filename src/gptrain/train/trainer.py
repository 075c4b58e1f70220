"""The training loop: one code path from a single CPU process to DDP, FSDP2, tensor and
pipeline parallel.

    gptrain train configs/tiny-debug.toml                       # one process
    torchrun --nproc-per-node 2 -m gptrain train ... --parallel.dp_shard=2

Order of work: resolve the plan (precision, batch, degrees: train/plan.py) -> build the plain
model -> check the layout -> cut it into pipeline stages (if pp > 1) -> parallelize each part ->
optimizers -> resume (model, optimizer, loader position, RNG) -> loop (accumulate, clip, step,
log, eval, checkpoint). A SIGTERM makes every rank stop at the same step and save a checkpoint
first.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gptrain.config import Config, dump_toml
from gptrain.config_check import packing_possible
from gptrain.data.formats import read_meta
from gptrain.data import mixture
from gptrain.data.loader import notes, open_train_loader
from gptrain.data.remote_shards import is_remote
from gptrain.distributed import pipeline
from gptrain.distributed.mesh import end_distributed, init_distributed
from gptrain.distributed.parallelize import check_layout, parallelize
from gptrain.errors import UserError, disk_full
from gptrain.models.base import cross_entropy
from gptrain.train.checkpointing import Checkpointing, make_output_dir
from gptrain.train.evaluating import Evaluating
from gptrain.train import plan as run_plan
from gptrain import run_layout, stop
from gptrain.atomic import write_text_atomic
from gptrain.train import finite
from gptrain.train.evaluate import reshard
from gptrain.train.loss_scale import LossScaler
from gptrain.train.metrics import MetricsLogger, console_line, flops_per_token, peak_flops, progress_bar, step_health
from gptrain.train.model_init import build_model, resolve_sources
from gptrain.train.optim import build_optimizer, clip_grads, lr_at
from gptrain.train.data_check import DataCheck
from gptrain.train.samples import Sampler
from gptrain.train.step_reader import StepReader
from gptrain.weights import checksums
from gptrain.config_aliases import DIALECT_NOTES



def train(cfg: Config) -> dict:
    """Run training as configured; returns a summary (status, final step, losses)."""
    env = init_distributed(cfg.train.device)
    try:
        return Trainer(cfg, env).run()
    except OSError as e:  # metrics, config.toml...: a full disk names the output directory
        full = disk_full(e, Path(cfg.train.output_dir).expanduser())
        if full is None:
            raise
        raise full from None
    finally:
        end_distributed()


class Trainer(Checkpointing, Evaluating):
    def __init__(self, cfg: Config, env):
        self.cfg, self.env = cfg, env
        tc = cfg.train
        if env.device.type == "cpu":
            from gptrain.train.cpu import keep_freed_memory

            keep_freed_memory()
        self.out = Path(tc.output_dir).expanduser()
        if cfg.checkpoint.allow_unverified:  # before any load (init_from, resume): weights/checksums.py
            checksums.allow_unverified()
        self.bar = None  # the progress bar while the loop runs (log_main writes above it)
        self.sources = resolve_sources(cfg)  # [(name, weight, dir)]: data.path's, or data.mix's
        self.data_dir = self.sources[0][2]
        meta = read_meta(self.data_dir)
        self.tokenizer_spec = meta["tokenizer"]
        self.sampler = Sampler(cfg.metrics, self.tokenizer_spec, tc.seed) if cfg.metrics.sample_every else None
        self.plan = run_plan.resolve(cfg, env.device.type, env.world)
        if env.device.type == "cuda" and self.plan.precision != "fp32":
            # what autocast leaves in fp32 may use TF32 (as nanoGPT); fp32 runs stay exact
            torch.backends.cuda.matmul.allow_tf32 = True
        self.dims = self.plan.dims
        plain = build_model(cfg, meta["vocab_size"], self.plan.compute_dtype)
        plain.fused_loss = self.plan.fused_loss
        self.model_cfg = plain.config
        check_layout(self.model_cfg, self.dims)
        if cfg.checkpoint.remote:
            from gptrain.train import remote

            remote.check(cfg.checkpoint.remote, self.out)
        self.n_params = plain.num_params()
        self.n_trained = sum(p.numel() for p in plain.parameters() if p.requires_grad)
        self.lora_base = getattr(plain, "lora_base", None)  # adapter-only checkpoints refer to it
        self.mesh = self.dims.build_mesh(env.device.type)
        self.dp_rank = self.dims.dp_rank(self.mesh)
        self._build_parts(plain)
        self.optims = [build_optimizer(p, tc, env.device) for p in self.parts]
        self.scaler = LossScaler.from_config(cfg.train) if self.plan.precision == "fp16" else None
        self.skips = finite.DeviceSkips(env.device) if finite.on_device(self.optims, self.scaler) else None
        T = self.model_cfg.block_size
        self.vocab_size = meta["vocab_size"]
        stream = (T, self.plan.batch_size, self.dp_rank, self.dims.dp, tc.seed, cfg.data.max_train_samples,
                  self.vocab_size)
        self.loader = mixture.MixtureLoader.open(self.sources, *stream) if cfg.data.mix else \
            open_train_loader(self.data_dir, *stream, packing=False if packing_possible(cfg) or (  # (auto: what the model takes)
                cfg.data.packing is None and not getattr(plain, "packs_rows", True)) else cfg.data.packing,
                              hosts=self._hosts())
        for line in notes(self.loader, T):
            self.log_main(line)
        self.val_sets = [(name, w, path, *split) for name, w, path in self.sources
                         if (split := self._val_split(path, T)) is not None]
        batches_per_epoch = self.loader.batches_per_epoch() / self.plan.grad_accum_steps
        self.steps_per_epoch = max(1, math.ceil(batches_per_epoch))
        self.total_steps = tc.max_steps if tc.max_steps > 0 else max(1, math.ceil(tc.epochs * batches_per_epoch))
        if hasattr(self.loader, "ends_at"):  # (a URL's loader reads nothing ahead past the run's end)
            per_step = 1 if self.schedule is not None else self.plan.grad_accum_steps
            self.loader.ends_at = self.total_steps * per_step * self.loader.global_batch
        self.step, self.skipped = 0, 0
        self.last = {"train_loss": None, "eval_loss": None, "eval_step": None}
        self._step_loss = None
        self.grad_norm = None
        self.data_check = DataCheck([path for _, _, path in self.sources], env.rank, env.world)
        self.reader = StepReader(self.loader, 1 if self.schedule is not None else self.plan.grad_accum_steps,
                                 remote=any(is_remote(path) for _, _, path in self.sources))
        self.pending_save = None
        self._async_pg = None
        make_output_dir(self.out, dump_toml(cfg), env.is_main)  # after every check: none wrote anything
        self.metrics = MetricsLogger(self.out, cfg.metrics, env.is_main, self.out.name, cfg.to_dict())

    def _build_parts(self, plain) -> None:
        """self.parts: the parallelized model, or this rank's pipeline stages."""
        cfg, dims, device = self.cfg, self.dims, self.env.device
        self.schedule = None
        dtype = self.plan.compute_dtype
        if dims.pp == 1:
            self.parts = [parallelize(plain.to(device), dims, self.mesh, cfg, device, dtype,
                                     self.plan.compile)]
            return
        pc = cfg.parallel
        microbatches = self.plan.pp_microbatches
        pp_mesh = self.mesh["pp"]
        parts, ids, n_stages = pipeline.split(plain, pp_mesh.get_local_rank(), dims.pp, pc.pp_schedule)
        self.parts = [parallelize(p.to(device), dims, self.mesh, cfg, device, dtype, self.plan.compile)
                      for p in parts]
        self.pp_group = pp_mesh.get_group()
        self.embedding_group = pipeline.embedding_group(self.mesh) if plain.config.tie_embeddings else None
        self.has_first = any(pipeline.is_first(p) for p in parts)
        self.has_last = any(pipeline.is_last(p) for p in parts)

        def loss_fn(logits, targets):  # the schedule runs backward from what this returns
            with self.autocast():
                loss = cross_entropy(logits, targets)
            return self.scaler.scale_loss(loss) if self.scaler else loss

        self.schedule = pipeline.build_schedule(self.parts, ids, n_stages, device, self.pp_group,
                                                pc.pp_schedule, microbatches, loss_fn)

    def autocast(self):
        if self.plan.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.plan.compute_dtype)

    def log_main(self, msg: str) -> None:
        if self.bar is not None:  # above the progress bar, which stays at the bottom
            self.bar.write(msg)
        elif self.env.is_main:
            print(msg, flush=True)

    # ---- one step ----------------------------------------------------------------------------

    def _hosts(self) -> int:
        """The hosts among the data-parallel ranks (torchrun numbers each host's ranks one after
        another), each reading its own share of a dataset at a URL (data/host_shares.py); 1 when
        tensor or pipeline parallel make the data-parallel ranks other than the world's."""
        local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        if self.dims.tp > 1 or self.dims.pp > 1 or self.env.world % local:
            return 1
        return self.env.world // local

    def _grad_sync(self, enabled: bool):
        model = self.parts[0]
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
            model.set_requires_gradient_sync(enabled)
            return contextlib.nullcontext()
        if hasattr(model, "no_sync") and not enabled:  # DDP
            return model.no_sync()
        return contextlib.nullcontext()

    def _forward_backward(self, batches: list) -> torch.Tensor:
        """Gradients of one optimizer step on its `batches`; returns the mean loss (on every rank)."""
        device = self.env.device
        if self.schedule is not None:
            x, y = batches[0]
            losses: list = []
            inputs = (x,) if self.has_first else ()
            self.schedule.step(*inputs, target=y if self.has_last else None, losses=losses)
            loss = torch.stack(losses).mean().detach() if self.has_last else torch.zeros((), device=device)
            if self.scaler and self.has_last:
                loss = loss / self.scaler.scale
            pipeline.sync_tied_grads(self.parts, self.embedding_group)
            return pipeline.share_from_last(loss, self.parts, self.pp_group)
        loss_sum = torch.zeros((), device=device)
        accum = self.plan.grad_accum_steps
        for micro, batch in enumerate(batches):
            x, y, *packed = batch  # packed: the rows' segments
            with self._grad_sync(micro == accum - 1), self.autocast():
                _, loss = self.parts[0](x, y, segments=packed[0] if packed else None)
            scaled = loss / accum
            (self.scaler.scale_loss(scaled) if self.scaler else scaled).backward()
            loss_sum += loss.detach()
        return loss_sum / accum

    def _prefetch(self, batches: list | None) -> list | None:
        """The batches of the next step, contiguous, on the device: to a GPU from pinned memory,
        copies queued right behind the step just queued that the host never waits for (read
        while the device still runs that step, as nanoGPT's get_batch during the forward)."""
        if batches is None:
            return None
        gpu = self.env.device.type == "cuda"

        def move(t):
            t = t.contiguous()  # (a view's pinned copy would go through a pageable temporary)
            return t.pin_memory().to(self.env.device, non_blocking=True) if gpu else t

        return [tuple(move(t) for t in batch) for batch in batches]

    def train_step(self, batches: list):
        """One optimizer step on `batches` (train/step_reader.py); returns (mean loss or None when
        skipped, lr)."""
        tc = self.cfg.train
        lr = lr_at(self.step, tc, self.total_steps)
        for opt in self.optims:
            for group in opt.param_groups:
                group["lr"] = lr
        self.reader.consume()
        mean_loss = self._forward_backward(batches)
        if self.scaler:
            self.scaler.unscale_(self.parts)
        norm = clip_grads(self.parts, tc.grad_clip, self.pp_group if self.schedule else None)
        self.grad_norm = norm  # the global norm before clipping; read (a sync) only on logged steps
        # fp16: an overflow shows in the (global) gradient norm; else a NaN/inf loss or norm
        finite = torch.isfinite(norm) if self.scaler else torch.isfinite(mean_loss) & torch.isfinite(norm)
        if dist.is_initialized():
            flag = finite.float()
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            finite = flag.bool()
        if self.skips is not None:  # the optimizers skip a non-finite step themselves
            self.skips.step(self.optims, finite, self.step + 1)
            self.step += 1
            return mean_loss, lr
        finite = bool(finite)
        if self.scaler:
            self.scaler.update(finite)
            if not finite:  # the scaled gradients overflowed: skip, with a smaller scale
                for opt in self.optims:
                    opt.zero_grad(set_to_none=True)
                self.log_main(f"fp16 gradients overflowed at step {self.step + 1}; step skipped, "
                              f"loss scale now {self.scaler.scale:g}")
                self.step += 1
                return None, lr
        elif not finite:
            for opt in self.optims:
                opt.zero_grad(set_to_none=True)
            self._non_finite(self.step + 1, 1)
            self.step += 1
            return None, lr
        for opt in self.optims:
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.step += 1
        return mean_loss, lr

    def read_back(self, loss) -> tuple[float | None, float | None]:
        """(the step's loss averaged over ranks, the gradient norm before clipping) in one
        device-to-host read, where a logged step or a save reads values anyway; what the device
        skipped since the last read (train/finite.py) comes in it and is reported here. Each is
        None when not finite, and the loss when the step just taken was skipped."""
        device = self.env.device
        values = [torch.full((), math.nan, device=device) if loss is None else loss.detach().clone(),
                  torch.full((), math.nan, device=device) if self.grad_norm is None else self.grad_norm]
        if loss is not None and dist.is_initialized():
            dist.all_reduce(values[0], op=dist.ReduceOp.AVG)
        if self.skips is not None:
            values += self.skips.counters()
        value, norm, *skipped = torch.stack([v.to(device=device, dtype=torch.float64).reshape(())
                                             for v in values]).tolist()  # (a norm of no gradients is made on the CPU)
        if skipped:
            count, first, latest = self.skips.settle(*skipped)
            if count:
                self._non_finite(first, count)
            if latest:
                value = math.nan
        return (value if math.isfinite(value) else None), (norm if math.isfinite(norm) else None)

    def _non_finite(self, first: int, count: int) -> None:
        if self.cfg.train.nan_policy == "stop":
            raise UserError(f"the loss became NaN/inf at step {first}; no checkpoint was written "
                            "for it. Lower train.lr, or set train.nan_policy=skip")
        self.skipped += count
        later = f" and {count - 1} later step(s)" if count > 1 else ""
        self.log_main(f"warning: non-finite loss or gradient at step {first}{later}; skipped")

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> dict:
        tc, env = self.cfg.train, self.env
        # dropout draws: seeded per rank here, restored from the checkpoint when resuming
        torch.manual_seed(tc.seed + env.rank)
        self.maybe_resume()
        if self.step:  # resumed: steps logged past the checkpoint run again
            self.metrics.rewind(self.step)
        stop.install()
        tokens_per_step = self.plan.rows_per_step * self.model_cfg.block_size
        flops_tok = flops_per_token(self.model_cfg, self.n_params)
        lora = (f" (LoRA r={self.model_cfg.lora_r}: {self.n_trained:,} trained, the rest frozen"
                f"{' in NF4' if self.model_cfg.lora_quant else ''})" if self.model_cfg.lora_r else "")
        mode = "compiled" if self.plan.compile else "eager"
        loss = "fused chunked" if self.plan.fused_loss else f"{mode} plain"
        peak, basis = 0.0, None
        if env.is_main:  # only rank 0 reports MFU; peers on one host would time each other
            peak, basis = peak_flops(env.device, self.cfg.metrics.peak_flops, self.plan.precision)
            peak *= env.world
        info = run_layout.run_info_file(self.out)
        self.log_main(f"training {self.n_params / 1e6:.2f}M parameters{lora} on {env.world} x {env.device.type} "
                      f"in {self.plan.precision}: {self.total_steps:,} steps of {tokens_per_step:,} tokens "
                      f"(how and why: {info})" + DIALECT_NOTES.get(self.cfg.train.dialect, ""))
        if "warning: " in self.plan.precision_why:  # (a precision this CPU runs far slower: its cost)
            self.log_main(self.plan.precision_why.split("; ", 1)[1])
        if env.is_main:  # the details a user looks up (`gptrain inspect`), not a header to read
            write_text_atomic(info, json.dumps({
                "parameters": self.n_params, "trained_parameters": self.n_trained, "processes": env.world,
                "device": env.device.type, "precision": f"{self.plan.precision} ({self.plan.precision_why})",
                "kernels": f"{mode} blocks, {loss} loss", "mfu_basis": f"{env.world} x ({basis})",
                "steps": self.total_steps, "tokens_per_step": tokens_per_step, "dialect": self.cfg.train.dialect,
                **({"loaded_unverified": unverified} if (unverified := checksums.admitted()) else {})},
                indent=2) + "\n")
        window_start, window_steps, run_start = time.perf_counter(), 0, time.perf_counter()
        self.bar = progress_bar(self.total_steps, self.step, env.is_main)  # a terminal's only
        status = "completed"
        training = tc.do_train and self.step < self.total_steps
        stop.training()  # from here a stop saves at the end of the step (before: it ends the run at once)
        batches = self._prefetch(self.reader.read()) if training else []
        try:
            if training and self.reader.stop_agreed(self.env.device, batches is None):  # before the first step
                self.reader.unread()
                status, training = "stopped", False
            while training and self.step < self.total_steps:
                loss, lr = self.train_step(batches)
                if self.bar is not None:
                    self.bar.update(1)
                self._step_loss = loss
                window_steps += 1
                more = self.step < self.total_steps
                batches = self._prefetch(self.reader.read()) if more else []  # before anything collective of the next step
                # the step a stop ends on is logged: it is the checkpoint's
                stopping = self.reader.stop_agreed(self.env.device, batches is None)
                if stopping:
                    self.reader.unread()
                logging = self.step % self.cfg.metrics.log_every == 0 or self.step in (1, self.total_steps) or stopping
                value, norm = self.read_back(loss) if logging else (None, None)
                if value is not None:
                    elapsed = time.perf_counter() - window_start
                    tok_s = tokens_per_step * window_steps / elapsed
                    mfu = flops_tok * tok_s / peak if peak else 0.0
                    if mfu > 1.0:  # a basis this run beats says nothing: never show MFU above 100%
                        peak, mfu = flops_tok * tok_s, 1.0
                        self.log_main("note: this run beats the measured peak; mfu is against its best rate now")
                    self.last["train_loss"] = value
                    health = step_health(norm, self.env.device)
                    eta = (self.total_steps - self.step) * elapsed / window_steps
                    self.metrics.log(self.step, {"loss": value, "lr": lr, **health, "tokens_per_s": tok_s,
                                                 "step_s": round(elapsed / window_steps, 6),
                                                 "mfu": mfu, "tokens": self.step * tokens_per_step},
                                     progress={"total_steps": self.total_steps, "eta_s": round(eta, 1)})
                    self.log_main(console_line(self.step, self.total_steps, value, lr, tok_s, mfu, eta, **health))
                    window_start, window_steps = time.perf_counter(), 0
                if self._should_eval() and self.step < self.total_steps and not stopping:
                    self._eval()
                if self.sampler and self.sampler.due(self.step) and not stopping:  # every rank: FSDP
                    self.log_main(self.sampler.line(self.parts[0], self.step, self.env.device, self.autocast))
                    reshard(self.parts)
                every = self.cfg.checkpoint.every
                if every > 0 and self.step % every == 0 and self.step < self.total_steps:
                    self.save()
                if stopping:
                    status = "stopped"
                    break
            if tc.do_eval and status != "stopped":  # (a stop's grace is short)
                self._eval()
            if tc.do_train and self.step > 0:
                self.save(final=True)
        finally:
            self.metrics.close()
            if self.bar is not None:
                self.bar.close()
                self.bar = None
        skipped = f" ({self.skipped} step(s) skipped: non-finite)" if self.skipped else ""
        self.log_main(f"{status} at step {self.step} in {time.perf_counter() - run_start:.1f}s{skipped}")
        return {"status": status, "step": self.step, **self.last}

