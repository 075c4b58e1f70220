"""Resolve what a user names as MODEL into a (model, tokenizer) pair.

Names (job names, checkpoint IDs) are resolved before, at the CLI edge, by jobs/api.model_source:
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
    """(model in eval mode on device, tokenizer or None) from a source that jobs/api.model_source
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


def load_base(init_from: str, block_size: int | None = None, pad_vocab_multiple: int = 64, **overrides):
    """The plain model (train mode, CPU) whose weights `init_from` names, as a run starts from
    them: a gptrain checkpoint (a LoRA one merged into its base), a nanoGPT ckpt.pt, or a HF
    directory or hub id; its context cut to `block_size` when that is shorter."""
    import torch

    from gptrain.weights.kinds import source_kind

    src = Path(init_from).expanduser()
    kind = source_kind(src)
    if kind == "gptrain":
        model, _ = load_for_inference(src, "cpu", **overrides)
        if model.config.lora_r:  # weights of a LoRA run: what they compute, as plain weights
            from gptrain.models.lora import merged

            model = merged(model)
    elif kind == "nanogpt":
        from gptrain.models.nanogpt import load_nanogpt

        model, _ = load_nanogpt(src, **overrides)
    else:
        from gptrain.models.hf import load_hf

        model, _ = load_hf(init_from, pad_vocab_multiple=pad_vocab_multiple, **overrides)
    model.train()
    if block_size and block_size != model.config.block_size:
        if block_size > model.config.block_size:
            raise UserError(f"model.block_size={block_size} exceeds the {model.config.block_size} "
                            f"positions of {init_from}")
        if "wpe" in getattr(model, "transformer", {}):  # learned positions beyond the context are dropped
            wpe = model.transformer.wpe
            wpe.weight = torch.nn.Parameter(wpe.weight[: block_size].clone())
        model.config.block_size = block_size
    return model


def load_for_inference(path, device="cpu", **overrides):
    """(GPT in eval mode, tokenizer) from a checkpoint directory or training output directory."""
    from gptrain import tokenizers
    from gptrain.files import reading
    from gptrain.models.registry import build, config_from_dict
    from gptrain.models.shapes import check_loadable
    from gptrain.weights.dcp import load_tensors
    from gptrain.weights.layout import STATE_FILE, read_state, resolve

    path = resolve(path, as_model=True)
    state = read_state(path)
    with reading(path / STATE_FILE, "checkpoint state"):
        cfg = config_from_dict(state["model_config"], overrides)
        check_loadable(cfg, str(path / STATE_FILE))
        tok = tokenizers.from_spec(state["tokenizer"]) if state.get("tokenizer") else None
        base = state.get("lora_base")
    if base is not None:  # adapters only: the base they go on, from where it was (models/lora.py)
        model = adapted_base(base, cfg, **overrides)
        model.lora_base = base  # (what `export --format peft` names as the base)
    else:
        model = build(cfg)
        if cfg.lora_r:  # a LoRA run from scratch: the adapters its checkpoint holds, on a new model
            from gptrain.models.lora import attach

            attach(model)
    sd = {"model": {k: v for k, v in model.state_dict().items() if base is None or ".lora_" in k}}
    if cfg.tie_embeddings:
        sd["model"].pop("lm_head.weight", None)  # it is wte
    load_tensors(path, sd)
    model.load_state_dict(sd["model"], strict=False)
    return model.to(device).eval(), tok


MAX_BASE_CHAIN = 8  # LoRA checkpoints whose base is a LoRA checkpoint ... (each merged in turn)
_BASES_LOADING: list[str] = []  # the bases being loaded now, outermost first


def adapted_base(ref: dict, cfg, **overrides):
    """The base an adapter-only checkpoint names (`ref`), loaded and checked against its digest,
    with empty adapters of the checkpoint's shape (`cfg`) attached, ready for its tensors."""
    from gptrain.models.lora import add_lora, base_digest

    where = ref.get("init_from") if isinstance(ref, dict) else None
    if not isinstance(where, str) or not where:
        raise UserError("the checkpoint's lora_base names no base model")
    key = str(Path(where).expanduser().resolve()) if Path(where).expanduser().exists() else where
    if key in _BASES_LOADING or len(_BASES_LOADING) >= MAX_BASE_CHAIN:  # a hostile or edited state
        raise UserError(f"this LoRA checkpoint's base model {where} leads back to itself or through "
                        f"more than {MAX_BASE_CHAIN} LoRA checkpoints; give a plain base")
    _BASES_LOADING.append(key)
    try:
        model = load_base(where, cfg.block_size, cfg.pad_vocab_multiple, **overrides)
    except UserError as e:
        raise UserError(f"this LoRA checkpoint holds only adapters; its base model {where} cannot be "
                        f"loaded: {e}") from None
    finally:
        _BASES_LOADING.pop()
    if base_digest(model) != ref.get("sha256"):
        raise UserError(f"this LoRA checkpoint's base model {where} is not the one it was trained on "
                        f"(its weights changed); put the original back there")
    add_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets, cfg.lora_quant)
    return model
