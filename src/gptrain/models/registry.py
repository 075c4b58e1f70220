"""The architectures gptrain trains, one spec each: what "gpt2" or "llama" is, in one place
(each one's shape, its config class, is in models/shapes.py). No torch here: `check_shape` vets a
config when a job is submitted, before anything is built.

A spec names the model class, its presets (shapes, with a tiny one for tests), how its weights
are named in a Hugging Face checkpoint (a rename table read in both directions by models/hf.py,
plus the tensors HF stores in another layout) and its tensor-parallel plan (which projections
split their columns and which their rows; distributed/parallelize.py applies it).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path

from gptrain.errors import UserError, closest
from gptrain.models.shapes import (_SHARED_ONCE, ARCH_GENERIC, WHY_GENERIC, Gemma2Config, Gemma3Config, GenericConfig,
                                   GPTConfig, LlamaConfig, MistralConfig, Olmo2Config, Phi3Config, Qwen2Config,
                                   Qwen3Config, causal_lm_types)


def config_from_dict(d: dict, overrides: dict | None = None) -> GPTConfig:
    """The config a checkpoint recorded (to_dict), with `overrides`; a field the architecture
    does not have is one clear error, not a TypeError."""
    if not isinstance(d, dict):
        raise UserError("model_config must be a mapping of fields")
    fields = {**d, **(overrides or {})}
    cls = spec_of(str(fields.pop("arch", "gpt2"))).config_class
    known = {f.name for f in dataclasses.fields(cls)}
    for key, value in list(fields.items()):
        if key not in known and _SHARED_ONCE.get(key, object()) == value:
            del fields[key]
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UserError(f"model_config field {unknown[0]!r} is not one of a {cls.arch} model's "
                        f"({', '.join(sorted(known))})")
    return cls(**fields)  # (what a file says is checked by check_loadable before a model is built)


@dataclass(frozen=True)
class ArchSpec:
    arch: str                   # the config's `arch`
    model_class: str            # "module:Class", imported when a model is built
    config_class: type          # its GPTConfig (sub)class
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
    display: str = ""           # the name users know it by ("GPT-2", "Qwen2")
    lora_targets: tuple = ()    # LoRA's targets where none is given (peft's defaults for the type)

    def rename(self, key: str, to_ours: bool) -> str | None:
        """`key` under the other side's name (hf_renames' first row that fits), or None."""
        for hf_prefix, ours in self.hf_renames:
            src, dst = (hf_prefix, ours) if to_ours else (ours, hf_prefix)
            if key.startswith(src):
                return dst + key.removeprefix(src)
        return None

    @property
    def block_linears(self) -> set[str]:
        """The names of a block's Linears, as LoRA targets name them (`c_attn`, `attn.c_attn`)."""
        return {f for _, sub, cols, row in self.tp_sublayers for name in (*cols, row)
                for f in (name, f"{sub}.{name}")}

    def build(self, cfg):
        module, name = self.model_class.split(":")
        return getattr(importlib.import_module(module), name)(cfg)


GPT2 = ArchSpec(
    arch="gpt2", model_class="gptrain.models.gpt2:GPT", config_class=GPTConfig, hf_model_type="gpt2",
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
    display="GPT-2", lora_targets=("c_attn",),
)

LLAMA_SHAPE = dict(layer_norm_eps=1e-5)
LLAMA = ArchSpec(
    arch="llama", model_class="gptrain.models.llama:Llama", config_class=LlamaConfig, hf_model_type="llama",
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
    display="Llama", lora_targets=("q_proj", "v_proj"),
)
# Llama's kin: the same modules and names (models/llama.py), their own config.json model_type
QWEN2 = dataclasses.replace(
    LLAMA, arch="qwen2", config_class=Qwen2Config, hf_model_type="qwen2", hf_architecture="Qwen2ForCausalLM",
    display="Qwen2", presets={
        "qwen2.5-0.5b": dict(n_layer=24, n_head=14, n_kv_head=2, n_embd=896, intermediate_size=4864,
                             block_size=32768, tie_embeddings=True),
        "qwen2-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=176, block_size=64),
    })
QWEN3 = dataclasses.replace(
    LLAMA, arch="qwen3", config_class=Qwen3Config, hf_model_type="qwen3", hf_architecture="Qwen3ForCausalLM",
    display="Qwen3", presets={
        "qwen3-0.6b": dict(n_layer=28, n_head=16, n_kv_head=8, n_embd=1024, head_size=128,
                           intermediate_size=3072, block_size=40960, tie_embeddings=True),
        "qwen3-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, head_size=32, intermediate_size=176,
                           block_size=64),
    })
MISTRAL = dataclasses.replace(
    LLAMA, arch="mistral", config_class=MistralConfig, hf_model_type="mistral",
    hf_architecture="MistralForCausalLM", display="Mistral", presets={
        "mistral-7b": dict(n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, intermediate_size=14336,
                           block_size=32768, rope_theta=1000000.0),
        "mistral-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=176, block_size=64),
    })

PHI3 = dataclasses.replace(
    LLAMA, arch="phi3", config_class=Phi3Config, hf_model_type="phi3", hf_architecture="Phi3ForCausalLM",
    display="Phi-3", lora_targets=("qkv_proj",),
    tp_sublayers=(("input_layernorm", "self_attn", ("qkv_proj",), "o_proj"),  # (LoRA's names; no TP yet)
                  ("post_attention_layernorm", "mlp", ("gate_up_proj",), "down_proj")),
    presets={
        "phi3-mini": dict(n_layer=32, n_head=32, n_embd=3072, intermediate_size=8192, block_size=4096,
                          sliding_window=2047),  # Phi-3-mini-4k-instruct
        "phi3-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=176, block_size=64),
    })
OLMO2 = dataclasses.replace(
    LLAMA, arch="olmo2", config_class=Olmo2Config, hf_model_type="olmo2", hf_architecture="Olmo2ForCausalLM",
    display="OLMo 2",
    tp_sublayers=(("post_attention_layernorm", "self_attn", ("q_proj", "k_proj", "v_proj"), "o_proj"),
                  ("post_feedforward_layernorm", "mlp", ("gate_proj", "up_proj"), "down_proj")),
    presets={
        "olmo2-1b": dict(n_layer=16, n_head=16, n_embd=2048, intermediate_size=8192, block_size=4096),  # OLMo-2-0425-1B
        "olmo2-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=176, block_size=64),
    })

GEMMA_SUBLAYERS = (("input_layernorm", "self_attn", ("q_proj", "k_proj", "v_proj"), "o_proj"),  # (LoRA's names;
                   ("pre_feedforward_layernorm", "mlp", ("gate_proj", "up_proj"), "down_proj"))  # no TP yet)
GEMMA2 = dataclasses.replace(
    LLAMA, arch="gemma2", model_class="gptrain.models.gemma:Gemma", config_class=Gemma2Config,
    hf_model_type="gemma2", hf_architecture="Gemma2ForCausalLM", display="Gemma 2", tp_sublayers=GEMMA_SUBLAYERS,
    presets={
        "gemma2-2b": dict(n_layer=26, n_head=8, n_kv_head=4, n_embd=2304, head_size=256, intermediate_size=9216,
                          block_size=8192),
        "gemma2-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, head_size=32, intermediate_size=176,
                            block_size=64, sliding_window=32, query_scale=32.0),
    })
GEMMA3 = dataclasses.replace(
    GEMMA2, arch="gemma3", config_class=Gemma3Config, hf_model_type="gemma3_text",
    hf_architecture="Gemma3ForCausalLM", display="Gemma 3", presets={
        "gemma3-1b": dict(n_layer=26, n_head=4, n_kv_head=1, n_embd=1152, head_size=256, intermediate_size=6912,
                          block_size=32768, sliding_window=512),
        "gemma3-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, head_size=32, intermediate_size=176,
                            block_size=64, sliding_window=32, sliding_pattern=2, query_scale=32.0),
    })

SPECS = {spec.arch: spec for spec in (GPT2, LLAMA, QWEN2, QWEN3, MISTRAL, PHI3, OLMO2, GEMMA2, GEMMA3)}
PRESETS: dict[str, dict] = {name: dict(shape, arch=spec.arch) for spec in SPECS.values()
                            for name, shape in spec.presets.items()}


# Any other decoder-only model transformers implements: its own module (models/generic.py)
GENERIC = ArchSpec(arch=ARCH_GENERIC, model_class="gptrain.models.generic:GenericCausalLM", config_class=GenericConfig,
                   hf_model_type="", hf_architecture="", display="transformers' own module")


def spec_of(arch: str) -> ArchSpec:
    if arch == ARCH_GENERIC:
        return GENERIC
    if arch not in SPECS:
        raise UserError(f"unknown model arch {arch!r}: use one of {', '.join(SPECS)}")
    return SPECS[arch]


def spec_of_hf(model_type) -> ArchSpec:
    """The spec of a config.json's model_type: gptrain's own, else the generic path for any
    causal LM transformers implements."""
    for spec in SPECS.values():
        if spec.hf_model_type == model_type:
            return spec
    if isinstance(model_type, str) and model_type in causal_lm_types():
        return GENERIC
    raise UserError(f"model_type {model_type!r} is not supported: gptrain loads "
                    f"{', '.join(f'{s.hf_model_type} ({s.hf_architecture})' for s in SPECS.values())} models with "
                    "its own modules, and any other causal LM the installed transformers implements as "
                    "transformers' own module")


def build_model_config(model_cfg, vocab_size: int | None = None):
    """GPTConfig from the [model] section: the preset, then any field set explicitly."""
    if model_cfg.preset not in PRESETS:
        raise UserError(f"unknown model preset {model_cfg.preset!r}{closest(model_cfg.preset, PRESETS)}; "
                        f"choose one of {', '.join(PRESETS)}")
    shape = dict(PRESETS[model_cfg.preset])
    cls = spec_of(shape.pop("arch")).config_class
    for key in ("n_layer", "n_head", "n_kv_head", "n_embd", "block_size", "bias"):
        if getattr(model_cfg, key) is not None:
            if not hasattr(cls, key):
                raise UserError(f"--model.{key} applies to Llama presets; {model_cfg.preset} is a "
                                f"{cls.arch} model")
            shape[key] = getattr(model_cfg, key)
    vocab = model_cfg.vocab_size or vocab_size or 50257
    cfg = cls(vocab_size=vocab, dropout=model_cfg.dropout or 0.0, attn_implementation=model_cfg.attn_implementation,
              pad_vocab_multiple=model_cfg.pad_vocab_multiple, **shape)
    cfg.validate()
    return cfg


def build(cfg):
    """The model of cfg.arch, randomly initialized on the current device."""
    return spec_of(cfg.arch).build(cfg)


def check_shape(model_cfg) -> None:
    """The [model] section as the trainer will build it: from scratch, the preset's shape with the
    overrides must be valid; from weights (init_from), block_size must fit their positions."""
    if not model_cfg.init_from:
        try:
            build_model_config(model_cfg)
        except UserError as e:
            raise UserError(f"model preset {model_cfg.preset} with the --model.* overrides: {e}") from None
        return
    positions = weights_positions(model_cfg.init_from)
    if model_cfg.block_size and positions and model_cfg.block_size > positions:
        raise UserError(f"--model.block_size={model_cfg.block_size} exceeds the {positions} positions "
                        f"of {model_cfg.init_from}")


def check_lora_targets(model_cfg, targets: list[str]) -> None:
    """LoRA targets that name no Linear of the model's architecture, refused before anything
    runs (the architecture from the preset, or from the weights' own config when they are local)."""
    arch = weights_arch(model_cfg.init_from) if model_cfg.init_from else PRESETS.get(model_cfg.preset, {}).get("arch")
    if arch == ARCH_GENERIC:
        raise UserError(f"LoRA on {WHY_GENERIC} is not supported yet: fine-tune all its weights (no --lora_r), "
                        "sharded with parallel.dp_shard if it is large")
    if arch not in SPECS:
        return  # (hub ids: checked when the model is built)
    names = SPECS[arch].block_linears
    if "all-linear" in targets and len(targets) > 1:
        raise UserError("LoRA target all-linear stands alone (it is every Linear in the blocks): give it or a "
                        "list of module names, not both")
    for t in targets:
        if t != "all-linear" and not any(t == n or t.endswith("." + n) for n in names):
            kinds = sorted(n for n in names if "." not in n)
            raise UserError(f"LoRA target module {t!r} is not a Linear of a {arch} model{closest(t, kinds)}; "
                            f"its modules: {', '.join(kinds)}, or all-linear")


def weights_arch(init_from: str) -> str | None:
    """The architecture of local weights (a gptrain checkpoint's or a HF config.json's), or None."""
    from gptrain.files import read_json
    from gptrain.weights.layout import model_checkpoint, read_state

    path = Path(init_from).expanduser()
    try:
        if path.is_dir():
            ckpt = model_checkpoint(path)
            if ckpt is not None:
                return read_state(ckpt).get("model_config", {}).get("arch", "gpt2")
            return spec_of_hf(read_json(path / "config.json", "config.json").get("model_type")).arch
    except (OSError, ValueError, AttributeError, UserError):
        pass
    return None


def weights_positions(init_from: str) -> int | None:
    """The context length of the weights in a local directory, read from a gptrain checkpoint's
    trainer_state.json or a HF config.json without loading them; None when unknown (hub ids, or a
    config.json that is not a JSON object: its loader says so)."""
    from gptrain.files import read_json
    from gptrain.weights.layout import model_checkpoint, read_state

    path = Path(init_from).expanduser()
    if not path.is_dir():
        return None
    try:
        ckpt = model_checkpoint(path)
        if ckpt is not None:
            return read_state(ckpt).get("model_config", {}).get("block_size")
        hf = read_json(path / "config.json", "config.json")
    except (OSError, ValueError, AttributeError, UserError):
        return None
    positions = hf.get("n_positions") or hf.get("max_position_embeddings")
    return positions if isinstance(positions, int) else None
