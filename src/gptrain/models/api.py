"""What a user does with a model, for both faces (the CLI's `generate` and `export`, the
console's prompt box): from a source already resolved to a path or hub id (jobs/api.model_source
resolves job names and checkpoint IDs), never printing; the faces format what comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gptrain.errors import UserError
from gptrain.weights.checksums import allow_unverified  # noqa: F401  (--allow-unverified of the faces)

__all__ = [  # what the faces (cli/, ui/) may use: tests/unit/test_api_surface.py
    "allow_unverified", "DTYPES", "export", "Exported", "generate", "Sampling",
]

DTYPES = ("auto", "fp32", "bf16", "fp16")


@dataclass
class Sampling:
    """How to sample: the `generate` flags (models/generate.py checks them)."""
    prompt: str = ""
    max_new_tokens: int = 50
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    num_samples: int = 1
    tokenizer: str | None = None  # overrides the model's: gpt2, byte or a tokenizer directory
    fallback_tokenizer: dict | None = None  # a spec, for a model with none of its own (its job's data)
    device: str = "auto"
    dtype: str = "auto"  # auto: bf16 on CUDA, fp32 on CPU


def generate(source: str, s: Sampling, name: str | None = None) -> list[str]:
    """The texts sampled from the model at `source` (`name`: what the user called it, for
    errors): each the prompt and its continuation, cut at the end-of-text token."""
    import torch

    from gptrain.models.generate import check_sampling, generate as sample
    from gptrain.models.load import load_model, pick_device
    from gptrain.tokenizers import by_name

    if s.dtype not in DTYPES:
        raise UserError(f"dtype {s.dtype!r}: choose one of {', '.join(DTYPES)}")
    check_sampling(s.max_new_tokens, s.temperature, s.top_k, s.top_p, s.num_samples, s.seed)
    device = pick_device(s.device)
    model, tokenizer = load_model(source, device=device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(
        s.dtype, torch.bfloat16 if device == "cuda" else torch.float32)
    model = model.to(dtype)
    if s.tokenizer:
        tokenizer = by_name(s.tokenizer)
    if tokenizer is None and s.fallback_tokenizer:
        from gptrain.tokenizers import from_spec

        fallback = from_spec(s.fallback_tokenizer)
        tokenizer = fallback if fallback.vocab_size <= model.config.vocab_size else None
    if tokenizer is None:
        raise UserError(f"{name or source} has no tokenizer files; pass --tokenizer gpt2 (or a "
                        "tokenizer directory)")
    ids = tokenizer.encode(s.prompt) if s.prompt else []
    if not ids:
        if tokenizer.eos_id is None:
            raise UserError("give a prompt: this tokenizer has no end-of-text token to start from")
        ids = [tokenizer.eos_id]
    prompt = torch.tensor([ids] * s.num_samples, device=device)
    out = sample(model, prompt, s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                 top_p=s.top_p, eos_id=tokenizer.eos_id, seed=s.seed)
    texts = []
    for row in out.tolist():
        new = row[len(ids):]
        if tokenizer.eos_id is not None and tokenizer.eos_id in new:
            new = new[: new.index(tokenizer.eos_id)]
        texts.append(s.prompt + tokenizer.decode(new))
    return texts


@dataclass
class Exported:
    out: str
    arch: str  # "GPT-2" or "Llama"
    merged: bool = False  # a LoRA model's adapters merged into the weights (hf)
    base: str = ""  # peft: the base the adapters go on
    notes: list[str] = field(default_factory=list)


def export(source: str, out, fmt: str = "hf") -> Exported:
    """The model at `source` written as a new directory `out`: a Hugging Face model (`hf`; a
    LoRA model's adapters merged in) or a LoRA model's adapters as a PEFT adapter (`peft`)."""
    from pathlib import Path

    from gptrain.models.hf import export_hf
    from gptrain.models.load import load_model

    if fmt not in ("hf", "peft"):
        raise UserError(f"export format {fmt!r}: choose hf or peft")
    model, tokenizer = load_model(source, device="cpu")
    from gptrain.models.registry import spec_of

    arch = spec_of(model.config.arch).display
    if fmt == "peft":
        from gptrain.models.peft_export import export_peft
        from gptrain.weights.hf import is_hf_dir

        base = (getattr(model, "lora_base", None) or {}).get("init_from", "")
        written = export_peft(model, out, base)
        notes = []
        if Path(base).is_dir() and not is_hf_dir(base):
            notes.append(f"their base {base} is a gptrain checkpoint, which peft cannot load: export it "
                         f"(`gptrain export {base} --out BASE_DIR`) and set base_model_name_or_path in "
                         f"{written}/adapter_config.json to BASE_DIR")
        return Exported(str(written), arch, base=base, notes=notes)
    written = export_hf(model, tokenizer, out)
    return Exported(str(written), arch, merged=bool(model.config.lora_r))
