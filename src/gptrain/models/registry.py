"""The architectures gptrain trains, one spec each: what "gpt2" or "llama" is, in one place,
and GPTConfig, the shape of one model. No torch here: `check_shape` vets a config when a job is
submitted, before anything is built.

A spec names the model class, its presets (shapes, with a tiny one for tests), how its weights
are named in a Hugging Face checkpoint (a rename table read in both directions by models/hf.py,
plus the tensors HF stores in another layout) and its tensor-parallel plan (which projections
split their columns and which their rows; distributed/parallelize.py applies it).
"""

from __future__ import annotations

import dataclasses
import os
import importlib
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

from gptrain.errors import UserError, closest


GELUS = {"tanh": "gelu_new", "exact": "gelu"}  # ours -> Hugging Face's activation_function


ALLOW_LARGE = "GPTRAIN_ALLOW_LARGE_MODEL"  # "1": a model larger than this machine is the user's call (sharded)
WEIGHT_BYTES = 4  # a parameter's fp32 weight, as a model is built to load into
SHAPE_FIELDS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")


def machine_memory() -> int:
    """This machine's physical memory in bytes (0 when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def check_loadable(cfg, where: str) -> None:
    """A shape read from someone else's file (a checkpoint's trainer_state.json, a config.json)
    before anything is built from it: whole numbers where the shape has them, valid, and weights
    that fit this machine's memory (a forged n_layer=4000, n_embd=65536 tried to allocate 51 GB,
    a vocab_size 'x' was a TypeError): one line naming the file."""
    for name in (*SHAPE_FIELDS, *(("n_kv_head", "intermediate_size") if hasattr(cfg, "n_kv_head") else ())):
        value = getattr(cfg, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise UserError(f"{where}: model {name} must be a whole number, got {value!r}")
    try:
        cfg.validate()
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    need, have = cfg.param_estimate() * WEIGHT_BYTES, machine_memory()
    if have and need > have and os.environ.get(ALLOW_LARGE, "") in ("", "0"):
        raise UserError(f"{where}: a model of about {cfg.param_estimate():.3g} parameters needs about "
                        f"{need / 2 ** 30:,.0f} GiB for its weights, more than this machine's "
                        f"{have / 2 ** 30:,.0f} GiB; set {ALLOW_LARGE}=1 if that is what you mean")


@dataclass
class GPTConfig:
    """The shape of one GPT-2 model, and the fields every architecture shares (a subclass per
    architecture adds its own: LlamaConfig). `arch` names the class; to_dict/config_from_dict
    carry it through a checkpoint's trainer_state.json."""
    arch: ClassVar[str] = "gpt2"
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    layer_norm_eps: float = 1e-5
    attn_implementation: str = "sdpa"
    pad_vocab_multiple: int = 64
    tie_embeddings: bool = True  # lm_head shares wte's weight (GPT-2); Llama-2 keeps its own
    gelu: str = "tanh"  # GPT-2's gelu_new (tanh approximation); "exact": nanoGPT's nn.GELU()
    # LoRA adapters (models/lora.py) on the Linears lora_targets names (HF module names); 0: none
    lora_r: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: list = field(default_factory=list)
    lora_quant: str = ""  # "nf4": the frozen block Linears held in 4-bit NF4 (QLoRA)
    mlp_matrices: ClassVar[int] = 2  # c_fc, c_proj (Llama's SwiGLU: 3)
    learned_positions: ClassVar[bool] = True  # wpe (Llama: rotary, none)

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_multiple
        return self.vocab_size if m <= 0 else (self.vocab_size + m - 1) // m * m

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads (as many as query heads, unless grouped-query attention)."""
        return self.n_head

    @property
    def ffn_size(self) -> int:
        """The MLP's hidden width."""
        return 4 * self.n_embd

    def to_dict(self) -> dict:
        return {"arch": self.arch, **dataclasses.asdict(self)}

    def param_estimate(self) -> int:
        """The parameters this shape builds, its matrices counted (norms and biases, under 1%,
        left out); plain integer arithmetic, so any shape is counted without building it."""
        d, hd = self.n_embd, self.head_dim
        attention = d * (self.n_head * hd + 2 * self.kv_heads * hd) + self.n_head * hd * d
        embeddings = self.padded_vocab_size * d * (1 if self.tie_embeddings else 2)
        positions = self.block_size * d if self.learned_positions else 0
        return self.n_layer * (attention + self.mlp_matrices * d * self.ffn_size) + embeddings + positions

    def validate(self) -> None:
        if self.n_embd % self.n_head:
            raise UserError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise UserError(f"model {name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.gelu not in GELUS:
            raise UserError(f"gelu must be one of {', '.join(GELUS)}, got {self.gelu!r}")
        if self.lora_r < 0 or not 0.0 <= self.lora_dropout < 1.0 or not isinstance(self.lora_targets, list):
            raise UserError(f"LoRA needs r >= 0, dropout in [0, 1) and a list of targets, got r={self.lora_r}, "
                            f"dropout={self.lora_dropout}, targets={self.lora_targets!r}")


@dataclass
class LlamaConfig(GPTConfig):
    """Llama's shape: GPT-2's fields plus grouped-query attention, the SwiGLU width and the
    rotary base; no biases and an output head of its own by default."""
    arch: ClassVar[str] = "llama"
    mlp_matrices: ClassVar[int] = 3
    learned_positions: ClassVar[bool] = False
    bias: bool = False
    tie_embeddings: bool = False
    n_kv_head: int | None = None  # grouped-query attention: key/value heads (default n_head)
    intermediate_size: int | None = None  # MLP width (default 4 * n_embd)
    rope_theta: float = 10000.0
    qkv_bias: bool = False  # biases on q_proj, k_proj, v_proj only (Qwen2's)
    sliding_window: int | None = None  # each token sees this many before it at most (Mistral's); None: all
    head_size: int | None = None  # each head's width where it is not n_embd / n_head (HF's head_dim)
    qk_norm: bool = False  # an RMSNorm over each query and key head before the rotation (Qwen3's)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.n_embd

    def validate(self) -> None:
        super().validate()
        if self.n_head % self.kv_heads:
            raise UserError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.kv_heads}")
        if self.head_dim % 2:
            raise UserError(f"rotary embeddings need an even head size, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise UserError(f"sliding_window must be >= 1, got {self.sliding_window}")


@dataclass
class Qwen2Config(LlamaConfig):
    """Qwen2 / Qwen2.5: Llama's shape with biases on the query, key and value projections."""
    arch: ClassVar[str] = "qwen2"
    qkv_bias: bool = True
    rope_theta: float = 1000000.0
    layer_norm_eps: float = 1e-6


@dataclass
class Qwen3Config(Qwen2Config):
    """Qwen3: Qwen2's shape without the biases, with a norm over each query and key head (and
    heads of their own width)."""
    arch: ClassVar[str] = "qwen3"
    qkv_bias: bool = False
    qk_norm: bool = True


@dataclass
class MistralConfig(LlamaConfig):
    """Mistral: Llama's shape (grouped-query attention), with a sliding window in some versions."""
    arch: ClassVar[str] = "mistral"


# Fields every model_config carried before the configs were split per architecture, with the
# value a GPT-2 checkpoint holds in them: read and dropped (older checkpoints still load).
_SHARED_ONCE = {"n_kv_head": None, "intermediate_size": None, "rope_theta": 10000.0}


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

SPECS = {spec.arch: spec for spec in (GPT2, LLAMA, QWEN2, QWEN3, MISTRAL)}
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
    cfg = cls(vocab_size=vocab, dropout=model_cfg.dropout, attn_implementation=model_cfg.attn_implementation,
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
    import json

    from gptrain.weights.layout import model_checkpoint, read_state

    path = Path(init_from).expanduser()
    try:
        if path.is_dir():
            ckpt = model_checkpoint(path)
            if ckpt is not None:
                return read_state(ckpt).get("model_config", {}).get("arch", "gpt2")
            return spec_of_hf(json.loads((path / "config.json").read_text()).get("model_type")).arch
    except (OSError, ValueError, AttributeError, UserError):
        pass
    return None


def weights_positions(init_from: str) -> int | None:
    """The context length of the weights in a local directory, read from a gptrain checkpoint's
    trainer_state.json or a HF config.json without loading them; None when unknown (hub ids)."""
    import json

    from gptrain.weights.layout import model_checkpoint, read_state

    path = Path(init_from).expanduser()
    if not path.is_dir():
        return None
    try:
        ckpt = model_checkpoint(path)
        if ckpt is not None:
            return read_state(ckpt).get("model_config", {}).get("block_size")
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, AttributeError):
        return None
    positions = hf.get("n_positions") or hf.get("max_position_embeddings")
    return positions if isinstance(positions, int) else None
