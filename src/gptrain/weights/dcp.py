"""Reading a gptrain checkpoint's tensors (torch.distributed.checkpoint) without running code.

DCP's .metadata is a pickle: it is read by an unpickler that accepts an exact list of DCP's own
metadata classes (METADATA_GLOBALS) and checked against the tensor files it names, before DCP
reads anything. A corrupt, truncated or hostile checkpoint is one UserError naming it. The
layout (step-N/, trainer_state.json, latest) is weights/layout.py; writing is train/checkpoint.py.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from gptrain.errors import UserError
from gptrain.weights import checksums
from gptrain.weights.checksums import Check, VerificationError

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
        sizes, short = {}, None
        for info in metadata.storage_data.values():
            if not isinstance(info, _StorageInfo):
                raise ValueError(f"storage entry {type(info).__name__}")
            name = check_plain_name(info.relative_path, meta_file)
            if name not in sizes:
                sizes[name] = (path / name).stat().st_size if (path / name).is_file() else -1
            if sizes[name] < info.offset + info.length and short is None:
                short = f"{name} is missing or truncated ({max(sizes[name], 0)} bytes, its metadata needs " \
                        f"{info.offset + info.length})"
    if short:  # damage, not a metadata problem: a resume passes it by for the one before
        raise VerificationError(path, short)
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


def load_tensors(path, tensors: dict) -> None:
    """Fill `tensors` (this rank's shards, any layout DCP can reshard into) from a checkpoint,
    verified against its checksums.json (weights/checksums.py) while DCP reads it: a damaged
    file is a VerificationError naming it, whatever DCP made of its bytes. The ranks of a job
    (all calling this, as DCP's load is collective) each hash a share of the files. A checkpoint
    without a list loads only as the user allowed (checksums.admit)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.api import CheckpointException

    share = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    check = Check(path, share=share)  # sizes and .metadata's bytes now; the large files meanwhile
    if check.files is None:  # no list: loaded only as the user allowed (every rank says the same)
        checksums.admit(path, say=(lambda line: None) if share[0] else None)
    failure = None
    try:
        reader = SafeReader(path)  # refuses a hostile, corrupt or truncated checkpoint up front
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            dcp.load(tensors, storage_reader=reader)
    except CheckpointException as e:  # DCP wraps every failure: garbage tensors, wrong shapes
        causes = [exc for exc, _ in e.failures.values()]
        detail = "; ".join(dict.fromkeys(f"{type(c).__name__}: {str(c).strip().splitlines()[0][:150]}"
                                         for c in causes if str(c).strip()))
        failure = dcp_error(e, path) or UserError(
            f"cannot load checkpoint {path}: its tensor files are corrupt or do not match this "
            f"model ({detail})")
    except UserError as e:
        failure = e
    problems = check.problems()
    if dist.is_initialized() and share[1] > 1:
        everyone = [None] * share[1]
        dist.all_gather_object(everyone, problems)
        problems = sorted(p for theirs in everyone for p in theirs)
    check.result(problems)  # damage first: it is why anything else failed
    if failure is not None:
        raise failure from None
