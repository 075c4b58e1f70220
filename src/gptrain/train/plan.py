"""Settings resolved once, before the Trainer and `parallelize` run.

A config says what the user asked for ("auto" precision, a global batch size, a dataset name or a
raw file); a Plan says what this run does on this machine and world size: the precision (and so
FSDP's parameter dtype), the per-rank batch, accumulation steps or pipeline microbatches, and the
parallel degrees. Everything downstream reads the plan, never the raw setting, so two places can
never resolve "auto" differently. `resolve` needs no process group: it is unit-tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptrain.config import Config
from gptrain.distributed.mesh import ParallelDims, apply_global_batch
from gptrain.errors import UserError


@dataclass(frozen=True)
class Plan:
    precision: str          # fp32 | bf16 | fp16: what autocast and FSDP compute in
    dims: ParallelDims      # parallel degrees that multiply to the world size
    batch_size: int         # rows per data-parallel rank per micro-step (a pipeline's whole batch)
    grad_accum_steps: int   # micro-steps per optimizer step (1 under pipeline parallel)
    pp_microbatches: int    # microbatches the pipeline splits batch_size into (0 without pp)
    precision_why: str = "as set"  # what decided the precision (printed at start)
    compile: bool = False   # torch.compile the blocks and the loss
    fused_loss: bool = True  # the chunked lm_head + cross-entropy (models/fused_ce.py)

    @property
    def compute_dtype(self):
        """The dtype of autocast and of FSDP's gathered parameters (None: fp32, no autocast)."""
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

    @property
    def rows_per_step(self) -> int:
        """Sequences per optimizer step over all data-parallel ranks."""
        return self.batch_size * self.grad_accum_steps * self.dims.dp


def resolve_precision(setting: str, device_type: str) -> tuple[str, str]:
    """(precision, why). auto: bf16 on GPUs that support it; on a CPU the dtype its matmuls run
    fastest in, measured once per CPU kind (train/cpu.py); every rank takes rank 0's choice."""
    if setting == "fp16" and device_type == "cpu":  # (the one a CPU runs 10-25x slower: its cost said)
        from gptrain.train.cpu import slow_precision_note

        note = _decided_on_rank0(lambda: slow_precision_note(setting))
        return setting, f"as set; {note}" if note else "as set"
    if setting != "auto":
        return setting, "as set"
    if device_type == "cuda":
        import torch

        return ("bf16", "auto: the GPU supports bf16") if torch.cuda.is_bf16_supported() \
            else ("fp32", "auto: the GPU lacks bf16")
    from gptrain.train.cpu import fastest_precision

    choice, why = _decided_on_rank0(fastest_precision)
    return choice, f"auto -> {choice}: {why}"


def _decided_on_rank0(decide):
    """decide() on rank 0 alone, its answer on every rank: one measurement, one precision."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return decide()
    box = [decide() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def resolve(cfg: Config, device_type: str, world: int) -> Plan:
    """The plan for `world` processes on `device_type`; turns train.global_batch_size into
    accumulation steps or microbatches in cfg too, so the saved config.toml says what ran."""
    dims = ParallelDims.from_config(cfg.parallel, world)
    apply_global_batch(cfg, dims.dp, dims.pp)
    tc, pc = cfg.train, cfg.parallel
    microbatches = 0
    if dims.pp > 1:
        if tc.grad_accum_steps != 1:
            raise UserError("with pipeline parallel, accumulate through parallel.pp_microbatches "
                            "instead of train.grad_accum_steps")
        microbatches = pc.pp_microbatches or 2 * dims.pp
        if microbatches < dims.pp or tc.batch_size % microbatches:
            raise UserError(f"parallel.pp_microbatches={microbatches} must be >= pp ({dims.pp}) and "
                            f"divide train.batch_size ({tc.batch_size})")
        if pc.pp_schedule == "interleaved_1f1b" and microbatches % dims.pp:
            raise UserError(f"interleaved_1f1b needs pp_microbatches ({microbatches}) to be a "
                            f"multiple of pp ({dims.pp})")
    precision, why = resolve_precision(tc.precision, device_type)
    if tc.dialect == "hf" and precision == "fp32" and why == "as set":
        why = "the HF Trainer's default: fp32 unless --bf16 or --fp16 (train.dialect=hf)"
    compile_, fused = resolve_kernels(tc.compile, tc.fused_loss, device_type)
    return Plan(precision=precision, dims=dims, batch_size=tc.batch_size,
                grad_accum_steps=tc.grad_accum_steps, pp_microbatches=microbatches, precision_why=why,
                compile=compile_, fused_loss=fused)


def resolve_kernels(compile_: bool | None, fused_loss: bool | None, device_type: str) -> tuple[bool, bool]:
    """(compile, fused_loss); unset means what measured fastest (BENCHMARKS.md, GPT-2 124M): on
    a GPU compiled, with the compiled plain loss (an H200: 38 ms/step against 46 fused); on a
    CPU eager, with the fused loss."""
    gpu = device_type == "cuda"
    compile_ = gpu if compile_ is None else compile_
    fused = not (gpu and compile_) if fused_loss is None else fused_loss
    return compile_, fused
