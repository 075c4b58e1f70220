"""nanoGPT checkpoints (its train.py's `ckpt.pt`) as gptrain GPT-2 models.

nanoGPT saves {'model': state_dict, 'model_args': {n_layer, n_head, n_embd, block_size, bias,
vocab_size, dropout}, 'iter_num', 'best_val_loss', 'optimizer', 'config'} with torch.save. Its
parameter names are HF GPT-2's (after `_orig_mod.`, which torch.compile adds, is stripped), but
its projections are nn.Linear where HF's are Conv1D: nanoGPT's own from_pretrained transposes
those four weights on import, so here they are transposed to HF's layout and handed to the one
HF import path (models/hf.py). The file is read with weights_only=True: a crafted pickle is
refused, never run.
"""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import UserError

GPT2_VOCAB = 50257
NANOGPT_GPT2_VOCAB = 50304  # nanoGPT rounds GPT-2's vocabulary up to a multiple of 64


def read_checkpoint(path) -> dict:
    """The checkpoint's dict (tensors and plain data only); one-line UserError otherwise."""
    from gptrain.files import read_torch_weights

    ckpt = read_torch_weights(path, "nanoGPT checkpoint")
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict) or \
            not isinstance(ckpt.get("model_args"), dict):
        raise UserError(f"{path} is not a nanoGPT checkpoint (no 'model' and 'model_args'); "
                        "gptrain loads gptrain, Hugging Face and nanoGPT checkpoints")
    return ckpt


def config_of(model_args: dict, source, **overrides):
    """Our GPT-2 config from nanoGPT's model_args."""
    from gptrain.models.shapes import GPTConfig, check_loadable

    try:
        vocab = int(model_args["vocab_size"])
        cfg = GPTConfig(block_size=int(model_args["block_size"]),
                        vocab_size=GPT2_VOCAB if vocab == NANOGPT_GPT2_VOCAB else vocab,
                        n_layer=int(model_args["n_layer"]), n_head=int(model_args["n_head"]),
                        n_embd=int(model_args["n_embd"]), bias=bool(model_args.get("bias", True)),
                        pad_vocab_multiple=64 if vocab == NANOGPT_GPT2_VOCAB else 0,
                        gelu="exact")  # nanoGPT's MLP: nn.GELU()
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{source}: model_args is incomplete or mistyped ({type(e).__name__}: {e})") from None
    for key, value in overrides.items():
        setattr(cfg, key, value)
    check_loadable(cfg, str(source))
    return cfg


def to_hf_layout(sd: dict, transposed) -> dict:
    """nanoGPT's tensors under HF GPT-2's names and layouts."""
    out = {}
    for key, t in sd.items():
        key = key.removeprefix("_orig_mod.")
        out[key] = t.t() if key.endswith(transposed) else t
    return out


def load_nanogpt(path, **overrides):
    """(model, tokenizer or None) from a nanoGPT ckpt.pt: GPT-2's tokenizer when the vocabulary
    is GPT-2's; a character-level run's from its meta.pkl (meta_tokenizer), else None."""
    import torch

    from gptrain import tokenizers
    from gptrain.models.hf import copy_into, from_hf_state_dict
    from gptrain.models.registry import build, spec_of

    path = Path(path)
    ckpt = read_checkpoint(path)
    cfg = config_of(ckpt["model_args"], path, **overrides)
    with torch.device("meta"):
        model = build(cfg)
    model.to_empty(device="cpu")
    model.lm_head.weight = model.transformer.wte.weight  # nanoGPT ties them (weight tying)
    sd = to_hf_layout(ckpt["model"], spec_of("gpt2").hf_transposed)
    copy_into(model, from_hf_state_dict(sd, cfg), str(path))
    tok = tokenizers.GPT2Tokenizer() if cfg.vocab_size == GPT2_VOCAB else meta_tokenizer(path, ckpt, cfg.vocab_size)
    return model, tok


def meta_paths(path: Path, ckpt: dict) -> list[Path]:
    """Where nanoGPT keeps a character-level run's meta.pkl, for checkpoint `path`: beside it, or
    data/<its config's dataset>/meta.pkl in the folders above it (nanoGPT's sample.py reads it from
    the directory it runs in), nearest first. A dataset name with a path in it is not followed."""
    dataset = (ckpt.get("config") or {}).get("dataset") if isinstance(ckpt.get("config"), dict) else None
    out = [path.parent / "meta.pkl"]
    if isinstance(dataset, str) and dataset and "/" not in dataset and dataset not in (".", ".."):
        for folder in list(path.resolve().parents)[:4]:
            out += [folder / "data" / dataset / "meta.pkl", folder / "code" / "data" / dataset / "meta.pkl"]
    return out


def meta_tokenizer(path: Path, ckpt: dict, vocab_size: int):
    """The character tokenizer of a nanoGPT run from its meta.pkl (read as plain data, never run),
    or None when there is none: `generate` then asks for --tokenizer."""
    from gptrain.data.nanogpt_dir import read_char_vocab
    from gptrain.tokenizers import CharTokenizer

    meta = next((p for p in meta_paths(path, ckpt) if p.is_file()), None)
    if meta is None:
        return None
    chars = read_char_vocab(meta)  # the one reader of meta.pkl (data/nanogpt_dir.py): plain data only
    if len(chars) != vocab_size:
        raise UserError(f"{meta}: its {len(chars)} characters are not the model's {vocab_size}; give --tokenizer")
    return CharTokenizer(chars)
