"""Model presets: name -> shape. `build_model_config` turns the [model] section into a config,
`build` a config into the model of its architecture."""

from __future__ import annotations

from gptrain.errors import UserError, closest

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
    from gptrain.models.gpt2 import GPTConfig

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
