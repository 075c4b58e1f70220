"""A model named by the user as a local Hugging Face directory or a hub id ("owner/name"): the
directory to read, downloading a hub id into the HF cache (when online); at submit, whether a hub
id can be had at all."""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import UserError
from gptrain.weights.hf import is_hf_dir


def resolve(name_or_path: str) -> Path:
    """A local HF model directory, downloading a hub id (when online) into the HF cache."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        if not is_hf_dir(p):
            raise UserError(f"{p} is not a Hugging Face model directory (needs config.json and "
                            "model.safetensors or pytorch_model.bin)")
        return p
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise UserError(f"model path {name_or_path} does not exist")
    return _from_hub(name_or_path, ["config.json", "generation_config.json", "model.safetensors*", "*.json",
                                    "merges.txt", "vocab.json", "tokenizer.model"])


def check_fetchable(hub_id: str) -> None:
    """At submit, a hub id ("owner/name") the job's workers would fetch: in this machine's HF
    cache, or else its config.json fetched now (the hub's own answer: no such repository, no
    network, offline), so a name that cannot be had is one line before anything is recorded."""
    try:
        _from_hub(hub_id, ["config.json"], local_files_only=True)
    except UserError:
        _from_hub(hub_id, ["config.json"])


def _from_hub(name: str, patterns: list[str], **kw) -> Path:
    """snapshot_download of `patterns` of a hub model, its failures one line."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"{name!r} is not a local directory, and downloading from the "
                        "Hugging Face Hub needs: pip install 'gptrain[hf]'") from None
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, **kw))
    except Exception as e:  # the hub client raises many types: offline, 404, auth
        raise UserError(f"cannot get {name!r} from the Hugging Face Hub ({type(e).__name__}); check "
                        "the name and the network, or pass a local model directory") from None
