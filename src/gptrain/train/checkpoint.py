"""Checkpoints: torch.distributed.checkpoint for tensors, JSON for everything else.

    OUTPUT/checkpoints/step-000100/   .metadata, __*_*.distcp   model + optimizer tensors (DCP)
                                      rank-00000.safetensors     per-rank RNG states
                                      trainer_state.json         step, losses, loader, config...
                                      checksums.json             size and CRC-32C of each file
    OUTPUT/checkpoints/latest         the name of the newest complete checkpoint
    OUTPUT/checkpoints/best           with keep_best: the one evaluated lowest at its step

A checkpoint is written into .tmp-step-N and renamed only when every rank has finished and
trainer_state.json is in place, so it is complete or absent; `latest` moves after the rename.
Every rank hashes the files it writes as it writes them (weights/checksums.py); rank 0 gathers
the lists, seals them into checksums.json, fsyncs the folder, renames it and fsyncs its parent:
a committed checkpoint survives a power loss, and every load verifies it.
Nothing is unpickled as code: DCP gets only tensors, its .metadata is read by weights/dcp.py
(an exact list of DCP's own metadata classes), and the rest is JSON or safetensors. A corrupt or
truncated checkpoint, or a full disk while writing one, is one UserError.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from gptrain import run_layout
from gptrain.errors import UserError
from gptrain.weights import checksums
from gptrain.weights.dcp import dcp_error, load_tensors
from gptrain.weights.layout import BEST, STATE_FILE, lowest_eval, resume_order, root_of, step_name


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class _HashingFileSystem(FileSystem):
    """DCP's local file system, with every file it writes hashed on its way to disk into
    `written` ({name: (size, crc)}); its rename of .metadata.tmp carries the entry along."""

    def __init__(self, written: dict):
        super().__init__()
        self.written = written

    def create_stream(self, path, mode):
        if "w" not in mode:
            return super().create_stream(path, mode)
        return checksums.Hashing(open(path, mode), path, self.written.__setitem__)

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        if Path(path).name in self.written:
            self.written[Path(new_path).name] = self.written.pop(Path(path).name)


class _Writer(FileSystemWriter):
    def __init__(self, path, written: dict):
        super().__init__(path)
        self.fs = _HashingFileSystem(written)


class PendingSave:
    """A checkpoint being written; `finish()` waits for it and commits it (all ranks call it).
    `written`: this rank's files so far, with their sizes and checksums."""

    def __init__(self, root: Path, name: str, trainer_state: dict, keep_last: int | None, written: dict,
                 future=None, remote: str = "", keep_best: bool = False):
        self.root, self.name, self.state, self.keep_last, self.future = root, name, trainer_state, keep_last, future
        self.keep_best = keep_best
        self.remote, self.written = remote, written
        self.path = root / name

    def finish(self) -> Path:
        tmp = self.root / f".tmp-{self.name}"
        try:
            if self.future is not None:
                future, self.future = self.future, None
                future.result()
            lists = _gather(self.written)
            if _rank() == 0:
                files = {k: v for written in lists for k, v in written.items()}
                state = json.dumps(dict(self.state, saved_at=time.time(), **{checksums.SEALED_KEY: checksums.ALGORITHM}),
                                   indent=2).encode()
                files[STATE_FILE] = checksums.write_synced(tmp / STATE_FILE, state)
                checksums.seal(tmp, files)
                if self.path.is_symlink():  # a link put where this step goes: removed, never followed
                    self.path.unlink()
                elif self.path.exists():  # a stale copy of this step from an interrupted run
                    shutil.rmtree(self.path)
                os.rename(tmp, self.path)
                checksums.fsync_dir(self.root)
                _write_pointer(self.root, run_layout.LATEST, self.name)
                _prune(self.root, self.keep_last, self.keep_best)
                if self.remote:
                    from gptrain.train import remote

                    remote.upload(self.path, self.remote, self.keep_last)
            _barrier()
        except BaseException as e:
            raise _save_failed(e, tmp) from None
        return self.path


def _gather(written: dict) -> list[dict]:
    """Every rank's list of written files, on rank 0 (after all ranks have written theirs)."""
    if not dist.is_initialized():
        return [written]
    lists = [None] * dist.get_world_size() if _rank() == 0 else None
    dist.gather_object(dict(written), lists, dst=0)
    return lists or []


def _save_failed(e: BaseException, tmp: Path) -> BaseException:
    """What to raise when writing a checkpoint failed: its partial directory is removed (it was
    never a checkpoint: only a renamed one is), and a full disk becomes one UserError."""
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # (a half-written `latest` removes itself)
    return dcp_error(e, tmp.parent / tmp.name.removeprefix(".tmp-")) or e


def save(output_dir, step: int, tensors: dict, trainer_state: dict, keep_last: int | None,
         asynchronous: bool = False, group=None, remote: str = "", keep_best: bool = False) -> PendingSave:
    """Write a checkpoint on every rank. A synchronous save is committed before this returns;
    an asynchronous one copies the tensors aside, writes them in the background (its
    collectives on `group`, a process group of its own) and is committed by `finish()`.
    With `remote`, the committed checkpoint is then copied there (train/remote.py). With
    `keep_best`, pruning keeps the one evaluated lowest and `best` names it."""
    from safetensors.torch import save

    root, name = root_of(output_dir), step_name(step)
    tmp = root / f".tmp-{name}"
    written: dict = {}
    try:
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        rng = f"rank-{_rank():05d}.safetensors"
        written[rng] = checksums.write_synced(tmp / rng, save({k: v.contiguous() for k, v in rng_state().items()}))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            if asynchronous:
                future = dcp.async_save(tensors, storage_writer=_Writer(tmp, written), process_group=group)
                return PendingSave(root, name, dict(trainer_state, step=step), keep_last, written, future, remote,
                                   keep_best)
            dcp.save(tensors, storage_writer=_Writer(tmp, written))
    except BaseException as e:
        raise _save_failed(e, tmp) from None
    pending = PendingSave(root, name, dict(trainer_state, step=step), keep_last, written, remote=remote,
                          keep_best=keep_best)
    pending.finish()
    return pending


def _write_pointer(root: Path, pointer: str, name: str) -> None:
    """Point `latest` (or `best`) at `name`: written beside, fsync'd, renamed over, the folder fsync'd."""
    tmp = root / f".{pointer}.tmp-{os.getpid()}"
    try:
        checksums.write_synced(tmp, (name + "\n").encode())
        os.replace(tmp, root / pointer)
    finally:
        tmp.unlink(missing_ok=True)
    checksums.fsync_dir(root)


def _prune(root: Path, keep_last: int | None, keep_best: bool = False) -> None:
    """Remove unfinished writes, and all but the `keep_last` newest checkpoints a resume would
    take (one marked damaged is kept for a look until a new save of its step replaces it; it
    never counts as one of the kept), and with `keep_best` the one evaluated lowest, which
    `best` then names."""
    for stale in root.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    order = resume_order(root.parent)
    best = lowest_eval(order) if keep_best else None
    if best is not None:
        _write_pointer(root, BEST, best.name)
    if keep_last:
        for old in order[keep_last:]:
            if old != best:
                shutil.rmtree(old, ignore_errors=True)


def load_rng(path) -> None:
    """Restore this rank's RNG states when the checkpoint has them (same world size)."""
    from gptrain.files import read_safetensors, reading

    f = Path(path) / f"rank-{_rank():05d}.safetensors"
    if f.is_file():
        with reading(f, "checkpoint RNG state"):
            set_rng_state(read_safetensors(f))


def _canonical_key(part, key: str) -> str | None:
    """Checkpoint keys are those of the whole model, with a tied lm_head stored as wte.

    A part that has wte drops lm_head.weight (it is wte); a last pipeline stage without wte
    stores its lm_head copy under wte's name.
    """
    gpt = getattr(part, "module", part)
    if key != "lm_head.weight" or not gpt.config.tie_embeddings:
        return key
    return None if gpt.transformer["wte"] is not None else "transformer.wte.weight"


def training_tensors(parts, optims, adapters_only: bool = False) -> dict:
    """This rank's model and optimizer tensors under their canonical names; `adapters_only`:
    the model's trained tensors only (a LoRA run over a base it references), not the frozen ones."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    model, optim = {}, {}
    only = StateDictOptions(ignore_frozen_params=adapters_only)
    for part, opt in zip(parts, optims):
        for src, dst in ((get_model_state_dict(part, options=only), model),
                         (get_optimizer_state_dict(part, opt)["state"], optim)):
            for key, value in src.items():
                name = _canonical_key(part, key)
                if name is not None:
                    dst[name] = value
    return {"model": model, "optim": optim}


def load_training_tensors(path, parts, optims, adapters_only: bool = False) -> None:
    """Load model and optimizer tensors into the parts (any layout DCP can reshard into)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    loaded = training_tensors(parts, optims, adapters_only)
    try:
        load_tensors(path, loaded)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"cannot load checkpoint {path} into this layout: "
                        f"{str(e).strip().splitlines()[-1][:300]}") from None
    for part, opt in zip(parts, optims):
        model_sd = {k: loaded["model"][n] for k in get_model_state_dict(part)
                    if (n := _canonical_key(part, k)) is not None and n in loaded["model"]}
        set_model_state_dict(part, model_sd, options=StateDictOptions(strict=False))
        full = get_optimizer_state_dict(part, opt)
        full["state"] = {k: loaded["optim"][_canonical_key(part, k)] for k in full["state"]}
        set_optimizer_state_dict(part, opt, full)
