"""The architectures gptrain trains, one spec each: what "gpt2" or "llama" is, in one place.

A spec names the model class, its presets (shapes, with a tiny one for tests), how its weights
are named in a Hugging Face checkpoint (a rename table read in both directions by models/hf.py,
plus the tensors HF stores in another layout) and its tensor-parallel plan (which projections
split their columns and which their rows; distributed/parallelize.py applies it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from gptrain.errors import UserError, closest


@dataclass(frozen=True)
class ArchSpec:
    arch: str                   # the config's `arch`
    model_class: str            # "module:Class", imported when a model is built
    hf_model_type: str          # config.json's model_type
    hf_architecture: str        # config.json's architectures[0]
    presets: dict = field(default_factory=dict)
    # (HF key prefix, our key prefix): a key takes the first row whose prefix it starts with,
    # HF -> ours on import and ours -> HF on export
    hf_renames: tuple = ()
    hf_transposed: tuple = ()   # our key suffixes HF stores transposed (GPT-2's Conv1D)
    hf_head_rows: tuple = ()    # suffixes whose rows HF orders (q|k|v, head) and we (head, q|k|v)
    hf_ignored: tuple = ()      # HF key suffixes that are not weights (old buffers)
    # per block: (norm, sub-module, its column-split input projections, its row-split output one)
    tp_sublayers: tuple = ()

    def build(self, cfg):
        module, name = self.model_class.split(":")
        return getattr(importlib.import_module(module), name)(cfg)


GPT2 = ArchSpec(
    arch="gpt2", model_class="gptrain.models.gpt2:GPT", hf_model_type="gpt2",
    hf_architecture="GPT2LMHeadModel",
    presets={
        "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),          # 124M
        "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024),  # 350M
        "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280, block_size=1024),   # 774M
        "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600, block_size=1024),      # 1558M
        "gpt2-mini": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),        # CPU benchmarks
        "gpt2-tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=64),          # tests, demos
    },
    hf_renames=(("transformer.", "transformer."), ("", "transformer.")),  # old files lack the prefix
    hf_transposed=("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
    hf_head_rows=("attn.c_attn.weight", "attn.c_attn.bias"),
    hf_ignored=(".attn.bias", ".attn.masked_bias"),
    tp_sublayers=(("ln_1", "attn", ("c_attn",), "c_proj"), ("ln_2", "mlp", ("c_fc",), "c_proj")),
)

LLAMA_SHAPE = dict(arch="llama", bias=False, tie_embeddings=False, layer_norm_eps=1e-5)
LLAMA = ArchSpec(
    arch="llama", model_class="gptrain.models.llama:Llama", hf_model_type="llama",
    hf_architecture="LlamaForCausalLM",
    presets={  # shapes of the Hugging Face checkpoints of the same names
        "llama2-7b": dict(LLAMA_SHAPE, n_layer=32, n_head=32, n_embd=4096, intermediate_size=11008,
                          block_size=4096),
        "tinyllama-1.1b": dict(LLAMA_SHAPE, n_layer=22, n_head=32, n_kv_head=4, n_embd=2048,
                               intermediate_size=5632, block_size=2048),
        "llama-tiny": dict(LLAMA_SHAPE, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                           intermediate_size=176, block_size=64),                  # tests, demos
    },
    hf_renames=(("model.embed_tokens.", "transformer.wte."), ("model.layers.", "transformer.h."),
                ("model.norm.", "transformer.ln_f."), ("lm_head.", "lm_head.")),
    hf_ignored=("rotary_emb.inv_freq",),
    tp_sublayers=(("input_layernorm", "self_attn", ("q_proj", "k_proj", "v_proj"), "o_proj"),
                  ("post_attention_layernorm", "mlp", ("gate_proj", "up_proj"), "down_proj")),
)

SPECS = {spec.arch: spec for spec in (GPT2, LLAMA)}
PRESETS: dict[str, dict] = {name: dict(shape, arch=spec.arch) for spec in SPECS.values()
                            for name, shape in spec.presets.items()}


def spec_of(arch: str) -> ArchSpec:
    if arch not in SPECS:
        raise UserError(f"unknown model arch {arch!r}: use one of {', '.join(SPECS)}")
    return SPECS[arch]


def spec_of_hf(model_type) -> ArchSpec:
    for spec in SPECS.values():
        if spec.hf_model_type == model_type:
            return spec
    raise UserError(f"model_type {model_type!r} is not supported: gptrain loads "
                    f"{' and '.join(f'{s.hf_model_type} ({s.hf_architecture})' for s in SPECS.values())} models")


def build_model_config(model_cfg, vocab_size: int | None = None):
    """GPTConfig from the [model] section: the preset, then any field set explicitly."""
    from gptrain.models.base import GPTConfig

    if model_cfg.preset not in PRESETS:
        raise UserError(f"unknown model preset {model_cfg.preset!r}{closest(model_cfg.preset, PRESETS)}; "
                        f"choose one of {', '.join(PRESETS)}")
    shape = dict(PRESETS[model_cfg.preset])
    for key in ("n_layer", "n_head", "n_kv_head", "n_embd", "block_size", "bias"):
        if getattr(model_cfg, key) is not None:
            shape[key] = getattr(model_cfg, key)
    vocab = model_cfg.vocab_size or vocab_size or 50257
    cfg = GPTConfig(vocab_size=vocab, dropout=model_cfg.dropout,
                    attn_implementation=model_cfg.attn_implementation,
                    pad_vocab_multiple=model_cfg.pad_vocab_multiple, **shape)
    cfg.validate()
    return cfg


def build(cfg):
    """The model of cfg.arch, randomly initialized on the current device."""
    return spec_of(cfg.arch).build(cfg)
