"""The shape of one model, per architecture: GPTConfig (GPT-2's, and the fields every
architecture shares) and its subclasses (Llama and its kin), each with its checks. No torch
here: a shape is vetted when a job is submitted, and a shape read from someone else's file
(check_loadable) before anything is built from it. models/registry.py ties each config class to
its architecture's spec.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import ClassVar

from gptrain.errors import UserError

GELUS = {"tanh": "gelu_new", "exact": "gelu"}  # ours -> Hugging Face's activation_function


ALLOW_LARGE = "GPTRAIN_ALLOW_LARGE_MODEL"  # "1": a model larger than this machine is the user's call (sharded)
WEIGHT_BYTES = 4  # a parameter's fp32 weight, as a model is built to load into
SHAPE_FIELDS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")
MAX_LORA_R = 1 << 16


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
    for name in (*SHAPE_FIELDS, "lora_r", *(("n_kv_head", "intermediate_size") if hasattr(cfg, "n_kv_head") else ())):
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
        # LoRA's adapters, at most one pair on each of a block's matrices: r x (in + out) each
        adapters = self.n_layer * self.lora_r * (4 * 2 * d + self.mlp_matrices * (d + self.ffn_size))
        return self.n_layer * (attention + self.mlp_matrices * d * self.ffn_size) + embeddings + positions + adapters

    def not_tensor_parallel(self) -> str:
        """Why this shape is not split by tensor parallel yet ("": it is)."""
        return ""

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
        if not 0 <= self.lora_r <= MAX_LORA_R or not 0.0 <= self.lora_dropout < 1.0 or \
                not isinstance(self.lora_targets, list):
            raise UserError(f"LoRA needs r from 0 to {MAX_LORA_R}, dropout in [0, 1) and a list of targets, got "
                            f"r={self.lora_r}, "
                            f"dropout={self.lora_dropout}, targets={self.lora_targets!r}")


@dataclass
class LlamaConfig(GPTConfig):
    """Llama's shape: GPT-2's fields plus grouped-query attention, the SwiGLU width and the
    rotary base; no biases and an output head of its own by default."""
    arch: ClassVar[str] = "llama"
    mlp_matrices: ClassVar[int] = 3
    learned_positions: ClassVar[bool] = False
    fused_projections: ClassVar[bool] = False  # qkv_proj and gate_up_proj, one Linear each (Phi-3's)
    post_norm: ClassVar[bool] = False  # each sub-layer's output normalized, none before it (OLMo 2's)
    qk_norm_per_head: ClassVar[bool] = True  # qk_norm over each head (Qwen3's), else over all of them (OLMo 2's)
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

    def not_tensor_parallel(self) -> str:
        return ("its query/key norms" if self.qk_norm else
                "its fused projections" if self.fused_projections else "")

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


@dataclass
class Phi3Config(LlamaConfig):
    """Phi-3: Llama's shape with the query, key and value projections in one Linear (qkv_proj)
    and the gate and up projections in another (gate_up_proj), as its checkpoints hold them."""
    arch: ClassVar[str] = "phi3"
    fused_projections: ClassVar[bool] = True


@dataclass
class Olmo2Config(LlamaConfig):
    """OLMo 2: Llama's shape with each sub-layer's output normalized before it joins the residual
    (no norm before it), and a norm over all the query heads (key heads) together."""
    arch: ClassVar[str] = "olmo2"
    post_norm: ClassVar[bool] = True
    qk_norm_per_head: ClassVar[bool] = False
    qk_norm: bool = True
    rope_theta: float = 500000.0
    layer_norm_eps: float = 1e-6


@dataclass
class Gemma2Config(LlamaConfig):
    """Gemma 2: Llama's attention and gated MLP (gelu, tanh approximation) with four norms a block
    (before and after each sub-layer), norms that scale by 1 + weight, embeddings scaled by
    sqrt(n_embd), queries scaled by query_scale^-1/2, scores and logits soft-capped, and every
    sliding_pattern-th layer attending to the whole context, the others within sliding_window."""
    arch: ClassVar[str] = "gemma2"
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-6
    sliding_window: int | None = 4096
    sliding_pattern: int = 2  # layer i attends to all where (i + 1) % sliding_pattern == 0
    local_rope_theta: float | None = None  # the windowed layers' rotary base (Gemma 3's); None: rope_theta
    query_scale: float | None = 256.0  # HF's query_pre_attn_scalar; None: head_dim
    attn_softcap: float | None = 50.0  # HF's attn_logit_softcapping
    final_softcap: float | None = 30.0  # HF's final_logit_softcapping

    def not_tensor_parallel(self) -> str:
        return "its norms after each sub-layer"

    def validate(self) -> None:
        super().validate()
        if self.sliding_pattern < 1:
            raise UserError(f"sliding_pattern must be >= 1, got {self.sliding_pattern}")
        for name in ("query_scale", "attn_softcap", "final_softcap", "local_rope_theta"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise UserError(f"{name} must be > 0 (or unset), got {value}")

    def attends_to_all(self, layer: int) -> bool:
        return (layer + 1) % self.sliding_pattern == 0


@dataclass
class Gemma3Config(Gemma2Config):
    """Gemma 3 (text): Gemma 2's shape without soft-capping, with a norm over each query and key
    head, five windowed layers to one global one, and a rotary base of their own for the windowed."""
    arch: ClassVar[str] = "gemma3"
    qk_norm: bool = True
    sliding_pattern: int = 6
    rope_theta: float = 1000000.0
    local_rope_theta: float | None = 10000.0
    attn_softcap: float | None = None
    final_softcap: float | None = None


# The generic path (models/generic.py): transformers' own module of a model type no spec covers
ARCH_GENERIC = "hf_generic"
WHY_GENERIC = "transformers' own module, trained through the generic path"


def causal_lm_types() -> dict:
    """model_type -> transformers' causal LM class name, for every type transformers maps."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@dataclass
class GenericConfig(GPTConfig):
    """The shape fields gptrain reads (layers, heads, width, context, vocabulary: FLOPs, memory,
    the context check), taken from `hf_config`, the model's own config.json, which builds it."""
    arch: ClassVar[str] = ARCH_GENERIC
    hf_config: dict = field(default_factory=dict)
    pad_vocab_multiple: int = 0  # the module's own vocabulary, as its embeddings have it
    tie_embeddings: bool = False  # (a tied module ties its own weights; its checkpoint keeps both names)

    def not_tensor_parallel(self) -> str:
        return WHY_GENERIC

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.hf_config, dict) or self.hf_config.get("model_type") not in causal_lm_types():
            raise UserError("hf_config must be a Hugging Face config.json of a causal LM transformers knows")
        if self.lora_r:
            raise UserError(f"LoRA on a {self.hf_config['model_type']} model ({WHY_GENERIC}) is not supported yet: "
                            "fine-tune all its weights (no --lora_r), sharded with parallel.dp_shard if it is large")


# Fields every model_config carried before the configs were split per architecture, with the
# value a GPT-2 checkpoint holds in them: read and dropped (older checkpoints still load).
_SHARED_ONCE = {"n_kv_head": None, "intermediate_size": None, "rope_theta": 10000.0}


