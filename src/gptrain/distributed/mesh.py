"""Process group and DeviceMesh from the parallel degrees (torchtitan's ParallelDims, small).

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, tp. Degrees multiply to the
world size; one of dp_replicate/dp_shard may be -1 and is inferred.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gptrain.errors import UserError

if TYPE_CHECKING:  # torch is imported where a process group or a mesh is made: `gptrain run`
    import torch  # checks a job's layout (ParallelDims) before anything loads torch


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_pref: str = "auto") -> Dist:
    """Read torchrun's environment, pick the device, start the process group: nccl with a GPU
    per local rank, else gloo (CPU, or more ranks than GPUs on a host: ranks then share GPUs
    round-robin, which NCCL cannot do)."""
    import torch

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise UserError("train.device=cuda but no CUDA GPU is available")
    backend = "gloo"
    if use_cuda:
        gpus = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        if local_world <= gpus:
            backend = "nccl"
        elif rank == 0 and world > 1:  # NCCL refuses two ranks on one device ("Duplicate GPU")
            print(f"note: {local_world} ranks share {gpus} GPU(s) on this host; NCCL needs a GPU "
                  "per rank, so they communicate over gloo (slower)", flush=True)
    else:
        device = torch.device("cpu")
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, device_id=device if backend == "nccl" else None)
    return Dist(rank, world, local_rank, device)


def end_distributed() -> None:
    """Destroy the process groups and end their native threads now, while the interpreter is
    alive. `destroy_process_group` alone leaves each gloo group alive: every DeviceMesh keeps its
    groups in `_pg_registry`, and the meshes live on in DTensor's sharding caches, so the group's
    worker threads (pt_gloo_runloop, gloo_tcp_loop) outlive the interpreter. A worker thread that
    drops its last collective's tensor while the interpreter finalizes takes the GIL of a dying
    interpreter: the rank aborts ("terminate called without an active exception", SIGABRT)
    after its run completed, and torchrun reports the run failed (issue #47 row 0). Emptying
    the registries destroys the groups here: each joins its threads after its queued work."""
    import gc

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    dist.destroy_process_group()
    from torch.distributed.device_mesh import DeviceMesh

    gc.collect()  # the trainer's cycles (model, optimizer, FSDP state) hold groups too
    for obj in gc.get_objects():
        if isinstance(obj, DeviceMesh):
            registry = getattr(obj, "_pg_registry", None)
            if isinstance(registry, dict):
                registry.clear()
    gc.collect()


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    world: int

    @classmethod
    def from_config(cls, pc, world: int) -> "ParallelDims":
        dims = dict(dp_replicate=pc.dp_replicate, dp_shard=pc.dp_shard, tp=pc.tp, pp=pc.pp)
        for name, value in dims.items():
            if value == 0 or value < -1 or (value == -1 and name in ("tp", "pp")):
                raise UserError(f"parallel.{name}={value} is invalid: use a positive degree"
                                + (" or -1 to infer it" if name.startswith("dp") else ""))
        if dims["dp_replicate"] == -1 and dims["dp_shard"] == -1:
            raise UserError("only one of parallel.dp_replicate and parallel.dp_shard may be -1")
        known = 1
        for value in dims.values():
            known *= value if value > 0 else 1
        for name in ("dp_replicate", "dp_shard"):
            if dims[name] == -1:
                if world % known:
                    raise UserError(f"world size {world} is not divisible by the other parallel "
                                    f"degrees ({known}); cannot infer parallel.{name}")
                dims[name] = world // known
        product = dims["dp_replicate"] * dims["dp_shard"] * dims["tp"] * dims["pp"]
        if product != world:
            raise UserError(f"parallel degrees dp_replicate={dims['dp_replicate']} x dp_shard="
                            f"{dims['dp_shard']} x tp={dims['tp']} x pp={dims['pp']} = {product} "
                            f"but {world} processes run; make them multiply to the world size")
        return cls(world=world, **dims)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def build_mesh(self, device_type: str):
        """A DeviceMesh over the dimensions of degree > 1 (None for a single process)."""
        if self.world == 1:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        names = ("pp", "dp_replicate", "dp_shard", "tp")
        sizes = [getattr(self, n) for n in names]
        used = [(n, s) for n, s in zip(names, sizes) if s > 1]
        return init_device_mesh(device_type, [s for _, s in used], mesh_dim_names=[n for n, _ in used])

    def dp_rank(self, mesh) -> int:
        """This process's index among the data-parallel replicas (ranks sharing data differ)."""
        if mesh is None or self.dp == 1:
            return 0
        coord = dict(zip(mesh.mesh_dim_names, mesh.get_coordinate()))
        return coord.get("dp_replicate", 0) * self.dp_shard + coord.get("dp_shard", 0)


def apply_global_batch(cfg, dp: int, pp: int) -> None:
    """Turn train.global_batch_size into accumulation steps for `dp` data-parallel replicas;
    under pipeline parallel a step takes the replica's whole batch as microbatches of batch_size."""
    tc, pc = cfg.train, cfg.parallel
    if not tc.global_batch_size:
        return
    per_replica, rest = divmod(tc.global_batch_size, dp)
    if rest or per_replica % tc.batch_size or per_replica == 0:
        raise UserError(f"train.global_batch_size={tc.global_batch_size} is not train.batch_size "
                        f"({tc.batch_size}) x {dp} data-parallel ranks x a whole number of steps")
    accum = per_replica // tc.batch_size
    if pp > 1:
        if accum == 1 and pc.pp_microbatches:
            return  # batch_size is already the replica's whole batch (a resolved config.toml)
        if pc.pp_microbatches not in (None, accum):
            raise UserError(f"parallel.pp_microbatches={pc.pp_microbatches} contradicts "
                            f"train.global_batch_size (which makes {accum}); set only one")
        tc.batch_size, pc.pp_microbatches = per_replica, accum
    elif tc.grad_accum_steps not in (1, accum):
        raise UserError(f"train.grad_accum_steps={tc.grad_accum_steps} contradicts "
                        f"train.global_batch_size (which makes {accum}); set only one")
    else:
        tc.grad_accum_steps = accum
