"""Model shapes: GPTConfig, the presets (name -> shape). `build_model_config` turns the [model]
section into a GPTConfig, `build` a GPTConfig into the model of its architecture. No torch here:
`check_shape` vets a config when a job is submitted, before anything is built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gptrain.errors import UserError, closest

ARCHS = ("gpt2", "llama")


@dataclass
class GPTConfig:
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
    # Llama family (models/llama.py); GPT-2 ignores these
    arch: str = "gpt2"
    n_kv_head: int | None = None  # grouped-query attention: key/value heads (default n_head)
    intermediate_size: int | None = None  # MLP width (default 4 * n_embd)
    rope_theta: float = 10000.0
    tie_embeddings: bool = True  # lm_head shares wte's weight (GPT-2); Llama-2 keeps its own

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_multiple
        return self.vocab_size if m <= 0 else (self.vocab_size + m - 1) // m * m

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.n_embd

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise UserError(f"unknown model arch {self.arch!r}: use one of {', '.join(ARCHS)}")
        if self.n_embd % self.n_head:
            raise UserError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_head % self.kv_heads:
            raise UserError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.kv_heads}")
        if self.arch == "llama" and self.head_dim % 2:
            raise UserError(f"rotary embeddings need an even head size, got {self.head_dim}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise UserError(f"model {name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout}")



LLAMA = dict(arch="llama", bias=False, tie_embeddings=False, layer_norm_eps=1e-5)
PRESETS: dict[str, dict] = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),          # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280, block_size=1024),   # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600, block_size=1024),      # 1558M
    "gpt2-mini": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),        # CPU benchmarks
    "gpt2-tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=64),          # tests, demos
    # Llama family: shapes of the Hugging Face checkpoints of the same names
    "llama2-7b": dict(LLAMA, n_layer=32, n_head=32, n_embd=4096, intermediate_size=11008,
                      block_size=4096),
    "tinyllama-1.1b": dict(LLAMA, n_layer=22, n_head=32, n_kv_head=4, n_embd=2048,
                           intermediate_size=5632, block_size=2048),
    "llama-tiny": dict(LLAMA, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=176,
                       block_size=64),                                           # tests, demos
}


def build_model_config(model_cfg, vocab_size: int | None = None):
    """GPTConfig from the [model] section: the preset, then any field set explicitly."""
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
    """The model of cfg.arch (GPT-2 or Llama), randomly initialized on the current device."""
    if cfg.arch == "llama":
        from gptrain.models.llama import Llama

        return Llama(cfg)
    from gptrain.models.gpt2 import GPT

    return GPT(cfg)


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


def weights_positions(init_from: str) -> int | None:
    """The context length of the weights in a local directory, read from a gptrain checkpoint's
    trainer_state.json or a HF config.json without loading them; None when unknown (hub ids)."""
    import json

    from gptrain.train.checkpoint_files import find_latest, is_checkpoint_dir, read_state

    path = Path(init_from).expanduser()
    if not path.is_dir():
        return None
    try:
        ckpt = path if is_checkpoint_dir(path) else find_latest(path)
        if ckpt is not None:
            return read_state(ckpt).get("model_config", {}).get("block_size")
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, AttributeError):
        return None
    positions = hf.get("n_positions") or hf.get("max_position_embeddings")
    return positions if isinstance(positions, int) else None
