"""Resolve what a user names as MODEL into a (model, tokenizer) pair.

MODEL may be a Hugging Face model directory or hub id, a gptrain checkpoint directory, a
checkpoint ID or a job name (the last two through the job store, when it has them).
"""

from __future__ import annotations

import json
from pathlib import Path

from gptrain.errors import UserError


def pick_device(name: str = "auto") -> str:
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def tokenizer_of_dir(model_dir: Path):
    """The tokenizer saved beside a model, or None."""
    from gptrain import tokenizers
    from gptrain.files import read_json, reading

    spec_file = model_dir / "gptrain_tokenizer.json"
    if spec_file.is_file():
        with reading(spec_file, "tokenizer spec"):
            return tokenizers.from_spec(read_json(spec_file, "tokenizer spec"))
    vocab = model_dir / "vocab.json"
    if vocab.is_file() and (model_dir / "merges.txt").is_file():
        ours = tokenizers.ASSETS
        if (model_dir / "merges.txt").read_bytes() == (ours / "gpt2_merges.txt").read_bytes() and \
                read_json(vocab, "tokenizer vocabulary") == json.loads((ours / "gpt2_vocab.json").read_text()):
            return tokenizers.GPT2Tokenizer()  # the GPT-2 vocabulary: use the fast tiktoken path
    if any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return tokenizers.HFTokenizer(str(model_dir))
    return None


def resolve_ref(ref: str) -> str:
    """A job name or checkpoint ID as the checkpoint directory it names; anything else as is."""
    from gptrain.home import NAME_RE, home

    if Path(ref).expanduser().exists() or not NAME_RE.fullmatch(ref) or not (home() / "gptrain.db").is_file():
        return ref
    from gptrain.jobs import local, store

    try:
        return store.checkpoint_by_id(ref)["path"]
    except UserError:
        pass
    try:
        store.get_job(ref)
    except UserError:
        return ref
    found = [c for c in local.scan_checkpoints(ref) if c["step"] is not None]
    if not found:
        raise UserError(f"job {ref} has no checkpoint yet; see `gptrain checkpoints {ref}`")
    return max(found, key=lambda c: c["step"])["path"]


def load_model(ref: str, device: str = "cpu", **overrides):
    """(model in eval mode on device, tokenizer or None) for a MODEL reference."""
    from gptrain.models import hf

    path = Path(resolve_ref(ref)).expanduser()
    ref = str(path) if path.exists() else ref
    if path.is_dir() and not hf.is_hf_dir(path):
        from gptrain.train.checkpoint import load_for_inference

        return load_for_inference(path, device, **overrides)
    model, model_dir = hf.load_hf(ref, **overrides)
    return model.to(device).eval(), tokenizer_of_dir(model_dir)
