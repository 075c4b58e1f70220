"""Resolve what a user names as MODEL into a (model, tokenizer) pair.

Names (job names, checkpoint IDs) are resolved before, at the CLI edge, by gptrain/refs.py:
this module sees only paths and hub ids, and never the job store.
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


def load_model(source: str, device: str = "cpu", **overrides):
    """(model in eval mode on device, tokenizer or None) from a source that gptrain/refs.py
    resolved: a gptrain checkpoint or training output directory, a Hugging Face model directory
    (a Trainer's checkpoint-N included) or hub id, or a nanoGPT ckpt.pt file."""
    from gptrain.models import hf
    from gptrain.weights.kinds import source_kind

    path = Path(source).expanduser()
    kind = source_kind(path)
    if kind == "nanogpt":
        from gptrain.models.nanogpt import load_nanogpt

        model, tok = load_nanogpt(path, **overrides)
        return model.to(device).eval(), tok
    if kind == "gptrain" or (kind is None and path.is_dir()):  # the latter: says what it lacks
        return load_for_inference(path, device, **overrides)
    model, model_dir = hf.load_hf(str(path) if path.exists() else source, **overrides)
    tok = tokenizer_of_dir(model_dir)
    if tok is None and (model_dir / "trainer_state.json").is_file():
        try:  # a Trainer's checkpoint-N: the run's tokenizer, saved in its output_dir (a guess)
            tok = tokenizer_of_dir(model_dir.parent)
        except Exception:  # not loadable there: as if absent (--tokenizer names one)
            tok = None
    return model.to(device).eval(), tok


def load_for_inference(path, device="cpu", **overrides):
    """(GPT in eval mode, tokenizer) from a checkpoint directory or training output directory."""
    from gptrain import tokenizers
    from gptrain.files import reading
    from gptrain.models.registry import build, config_from_dict
    from gptrain.weights.dcp import load_tensors
    from gptrain.weights.layout import STATE_FILE, read_state, resolve

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
