"""Checkpoints: torch.distributed.checkpoint for tensors, JSON for everything else.

    OUTPUT/checkpoints/step-000100/   .metadata, __*_*.distcp   model + optimizer tensors (DCP)
                                      rank-00000.safetensors     per-rank RNG states
                                      trainer_state.json         step, losses, loader, config...
    OUTPUT/checkpoints/latest         the name of the newest complete checkpoint

A checkpoint is written into .tmp-step-N and renamed only when every rank has finished and
trainer_state.json is in place, so it is complete or absent; `latest` moves after the rename.
Nothing is unpickled as code: DCP gets only tensors, its .metadata is read by an unpickler that
accepts an exact list of DCP's own metadata classes (METADATA_GLOBALS), and the rest is JSON or
safetensors. A corrupt or truncated checkpoint, or a full disk while writing one, is one UserError.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from gptrain.errors import UserError
from gptrain.train.checkpoint_files import STATE_FILE, find_latest, is_checkpoint_dir, read_state, resolve  # noqa: F401

# The only globals a .metadata may name: exactly those torch 2.13's DCP writes for gptrain's
# checkpoints (single process, DDP, FSDP2, tensor and pipeline parallel, llama, fp16, async save;
# found by saving each and listing the pickle's globals), plus the dtypes a tensor may have.
# Not BytesStorageMetadata: DCP would torch.load its bytes with weights_only=False.
METADATA_GLOBALS = frozenset({
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a layout from its name, e.g. "torch.strided"
    ("torch", "Size"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    *(("torch", dtype) for dtype in ("float32", "float16", "bfloat16", "float64", "int64", "int32",
                                     "int16", "int8", "uint8", "bool")),
})


class _MetadataUnpickler(pickle._Unpickler):  # the Python unpickler: its BUILD can be checked
    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module, name):
        # exact pairs only: protocol 4 would resolve a dotted name ("os.system") through a module
        if (module, name) not in METADATA_GLOBALS:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which is not a checkpoint "
                                         "metadata class (refused: a checkpoint is never code)")
        return super().find_class(module, name)

    def load_build(self):
        # BUILD fills in an instance; on a class itself it would rewrite that class's attributes
        if isinstance(self.stack[-2], type) or not type(self.stack[-2]).__module__.startswith(
                "torch.distributed.checkpoint"):
            raise pickle.UnpicklingError(f"it sets the state of {type(self.stack[-2]).__name__} "
                                         "objects, which DCP metadata never does")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def read_metadata(path):
    """DCP's Metadata of a checkpoint, read without running code and checked against its files:
    every tensor file it names is a plain name in the checkpoint directory and long enough."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    from gptrain.files import check_plain_name, reading

    path = Path(path)
    meta_file = path / ".metadata"
    with reading(meta_file, "checkpoint metadata"):
        metadata = _MetadataUnpickler(io.BytesIO(meta_file.read_bytes())).load()
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise ValueError(f"it holds a {type(metadata).__name__}, not DCP metadata")
        sizes = {}
        for info in metadata.storage_data.values():
            if not isinstance(info, _StorageInfo):
                raise ValueError(f"storage entry {type(info).__name__}")
            name = check_plain_name(info.relative_path, meta_file)
            if name not in sizes:
                sizes[name] = (path / name).stat().st_size if (path / name).is_file() else -1
            if sizes[name] < info.offset + info.length:
                raise UserError(f"checkpoint file {path / name} is missing or truncated "
                                f"({max(sizes[name], 0)} bytes, its metadata needs "
                                f"{info.offset + info.length}); use another checkpoint")
    return metadata


class SafeReader(FileSystemReader):
    """FileSystemReader whose .metadata is read (once, before DCP starts) by read_metadata."""

    def __init__(self, path):
        super().__init__(path)
        self._metadata = read_metadata(path)

    def read_metadata(self, *args, **kwargs):
        metadata = self._metadata
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def dcp_error(e: BaseException, path) -> UserError | None:
    """A UserError for what a DCP CheckpointException wraps, when a user can fix it: a full disk,
    or a UserError from our own reader; None otherwise."""
    from gptrain.errors import disk_full

    causes = [exc for exc, _ in getattr(e, "failures", {}).values()] or [e]
    for cause in causes:
        if isinstance(cause, UserError):
            return cause
        full = disk_full(cause, path)
        if full is not None:
            return full
    return None


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


class PendingSave:
    """A checkpoint being written; `finish()` waits for it and commits it (all ranks call it)."""

    def __init__(self, root: Path, name: str, trainer_state: dict, keep_last: int | None, future=None,
                 remote: str = ""):
        self.root, self.name, self.state, self.keep_last, self.future = root, name, trainer_state, keep_last, future
        self.remote = remote
        self.path = root / name

    def finish(self) -> Path:
        tmp = self.root / f".tmp-{self.name}"
        try:
            if self.future is not None:
                future, self.future = self.future, None
                future.result()
            _barrier()
            if _rank() == 0:
                (tmp / STATE_FILE).write_text(json.dumps(dict(self.state, saved_at=time.time()), indent=2))
                if self.path.exists():  # a stale copy of this step from an interrupted run
                    shutil.rmtree(self.path)
                os.rename(tmp, self.path)
                _write_latest(self.root, self.name)
                _prune(self.root, self.keep_last)
                if self.remote:
                    from gptrain.train import remote

                    remote.upload(self.path, self.remote, self.keep_last)
            _barrier()
        except BaseException as e:
            raise _save_failed(e, tmp) from None
        return self.path


def _save_failed(e: BaseException, tmp: Path) -> BaseException:
    """What to raise when writing a checkpoint failed: its partial directory is removed (it was
    never a checkpoint: only a renamed one is), and a full disk becomes one UserError."""
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # (a half-written `latest` removes itself)
    return dcp_error(e, tmp.parent / tmp.name.removeprefix(".tmp-")) or e


def save(output_dir, step: int, tensors: dict, trainer_state: dict, keep_last: int | None,
         asynchronous: bool = False, group=None, remote: str = "") -> PendingSave:
    """Write a checkpoint on every rank. A synchronous save is committed before this returns;
    an asynchronous one copies the tensors aside, writes them in the background (its
    collectives on `group`, a process group of its own) and is committed by `finish()`.
    With `remote`, the committed checkpoint is then copied there (train/remote.py)."""
    from safetensors.torch import save_file

    root = Path(output_dir) / "checkpoints"
    name = f"step-{step:06d}"
    tmp = root / f".tmp-{name}"
    try:
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        save_file({k: v.contiguous() for k, v in rng_state().items()}, tmp / f"rank-{_rank():05d}.safetensors")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            if asynchronous:
                future = dcp.async_save(tensors, storage_writer=FileSystemWriter(tmp), process_group=group)
                return PendingSave(root, name, dict(trainer_state, step=step), keep_last, future, remote)
            dcp.save(tensors, storage_writer=FileSystemWriter(tmp))
    except BaseException as e:
        raise _save_failed(e, tmp) from None
    pending = PendingSave(root, name, dict(trainer_state, step=step), keep_last, remote=remote)
    pending.finish()
    return pending


def _write_latest(root: Path, name: str) -> None:
    from gptrain.atomic import write_text_atomic

    write_text_atomic(root / "latest", name + "\n")


def _prune(root: Path, keep_last: int | None) -> None:
    for stale in root.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep_last:
        done = sorted(p for p in root.glob("step-*") if is_checkpoint_dir(p))
        for old in done[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def load_tensors(path, tensors: dict) -> None:
    """Fill `tensors` (this rank's shards, any layout DCP can reshard into) from a checkpoint."""
    from torch.distributed.checkpoint.api import CheckpointException

    reader = SafeReader(path)  # refuses a hostile, corrupt or truncated checkpoint up front
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        try:
            dcp.load(tensors, storage_reader=reader)
        except CheckpointException as e:  # DCP wraps every failure: garbage tensors, wrong shapes
            causes = [exc for exc, _ in e.failures.values()]
            detail = "; ".join(dict.fromkeys(f"{type(c).__name__}: {str(c).strip().splitlines()[0][:150]}"
                                             for c in causes if str(c).strip()))
            raise dcp_error(e, path) or UserError(
                f"cannot load checkpoint {path}: its tensor files are corrupt or do not match this "
                f"model ({detail})") from None


def load_rng(path) -> None:
    """Restore this rank's RNG states when the checkpoint has them (same world size)."""
    from gptrain.files import read_safetensors, reading

    f = Path(path) / f"rank-{_rank():05d}.safetensors"
    if f.is_file():
        with reading(f, "checkpoint RNG state"):
            set_rng_state(read_safetensors(f))


def load_for_inference(path, device="cpu", **overrides):
    """(GPT in eval mode, tokenizer) from a checkpoint directory or training output directory."""
    from gptrain import tokenizers
    from gptrain.files import reading
    from gptrain.models.registry import build, config_from_dict

    path = resolve(path)
    state = read_state(path)
    with reading(path / STATE_FILE, "checkpoint state"):
        cfg = config_from_dict(state["model_config"], overrides)
        model = build(cfg)
        tok = tokenizers.from_spec(state["tokenizer"]) if state.get("tokenizer") else None
    sd = {"model": model.state_dict()}
    if cfg.tie_embeddings:
        sd["model"].pop("lm_head.weight")  # it is wte
    load_tensors(path, sd)
    model.load_state_dict(sd["model"], strict=False)
    return model.to(device).eval(), tok


def _canonical_key(part, key: str) -> str | None:
    """Checkpoint keys are those of the whole model, with a tied lm_head stored as wte.

    A part that has wte drops lm_head.weight (it is wte); a last pipeline stage without wte
    stores its lm_head copy under wte's name.
    """
    gpt = getattr(part, "module", part)
    if key != "lm_head.weight" or not gpt.config.tie_embeddings:
        return key
    return None if gpt.transformer["wte"] is not None else "transformer.wte.weight"


def training_tensors(parts, optims) -> dict:
    """This rank's model and optimizer tensors under their canonical names."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model, optim = {}, {}
    for part, opt in zip(parts, optims):
        for src, dst in ((get_model_state_dict(part), model),
                         (get_optimizer_state_dict(part, opt)["state"], optim)):
            for key, value in src.items():
                name = _canonical_key(part, key)
                if name is not None:
                    dst[name] = value
    return {"model": model, "optim": optim}


def load_training_tensors(path, parts, optims) -> None:
    """Load model and optimizer tensors into the parts (any layout DCP can reshard into)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    loaded = training_tensors(parts, optims)
    try:
        load_tensors(path, loaded)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"cannot load checkpoint {path} into this layout: "
                        f"{str(e).strip().splitlines()[-1][:300]}") from None
    for part, opt in zip(parts, optims):
        model_sd = {k: loaded["model"][n] for k in get_model_state_dict(part)
                    if (n := _canonical_key(part, k)) is not None}
        set_model_state_dict(part, model_sd, options=StateDictOptions(strict=False))
        full = get_optimizer_state_dict(part, opt)
        full["state"] = {k: loaded["optim"][_canonical_key(part, k)] for k in full["state"]}
        set_optimizer_state_dict(part, opt, full)
