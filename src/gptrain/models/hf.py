"""Hugging Face interop (GPT-2 and the Llama family): load a HF model directory or hub id, export to one.

Each architecture's spec (models/registry.py) says how its HF names map onto ours, read in
both directions: GPT-2 keeps the projections in Conv1D modules, whose weights are the transpose
of a Linear's, and orders c_attn rows (q|k|v, head, d) where ours are (head, q|k|v, d) (see
models/gpt2.py); Llama's outer prefixes differ (model.embed_tokens / model.layers / model.norm
are our transformer.wte / transformer.h / transformer.ln_f) and its blocks use HF's own names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gptrain.errors import UserError
from gptrain.models.shapes import ARCH_GENERIC
from gptrain.weights import checksums
from gptrain.models.hub import resolve


def config_from_hf(hf: dict, **overrides):
    from gptrain.models.registry import spec_of_hf

    spec = spec_of_hf(hf.get("model_type"))
    if spec.arch == ARCH_GENERIC:
        from gptrain.models import generic

        return generic.config_from_hf(hf, **overrides)
    read = {"gpt2": gpt2_config_from_hf, "gemma2": gemma_config_from_hf, "gemma3": gemma_config_from_hf}
    cfg = read[spec.arch](hf, spec) if spec.arch in read else llama_config_from_hf(hf, spec)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    cfg.validate()
    return cfg


def llama_config_from_hf(hf: dict, spec):
    """The config of a Llama-family config.json (llama, qwen2, qwen3, mistral, phi3, olmo2:
    models/registry.py); what gptrain's module does not compute the same way is one clear line."""
    name = spec.display
    rope = hf.get("rope_parameters") or {}  # transformers 5 keeps rope_theta in here
    scaling = hf.get("rope_scaling") or ({} if rope.get("rope_type", "default") == "default" else rope)
    if scaling:
        raise UserError(f"rope scaling {scaling.get('rope_type') or scaling.get('type')!r} is not "
                        f"supported: gptrain's {name} uses plain rotary embeddings")
    partial = hf.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise UserError(f"partial_rotary_factor {partial} is not supported: gptrain's {name} rotates "
                        "each head's whole width")
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"activation {hf['hidden_act']!r} is not supported ({name} uses silu)")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise UserError(f"{name} models with attention_bias or mlp_bias are not supported")
    heads, width = hf["num_attention_heads"], hf["hidden_size"]
    head_size = hf.get("head_dim")
    # Qwen2 keeps a window only with use_sliding_window (and then only above max_window_layers)
    window = hf.get("sliding_window") if hf.get("use_sliding_window", spec.arch not in ("qwen2", "qwen3")) else None
    return spec.config_class(block_size=hf["max_position_embeddings"], vocab_size=hf["vocab_size"],
                             n_layer=hf["num_hidden_layers"], n_head=heads,
                             n_kv_head=hf.get("num_key_value_heads") or heads, n_embd=width,
                             intermediate_size=hf["intermediate_size"],
                             rope_theta=float(hf.get("rope_theta") or rope.get("rope_theta", 10000.0)),
                             layer_norm_eps=hf.get("rms_norm_eps", 1e-6), bias=False,
                             tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                             dropout=float(hf.get("attention_dropout") or 0.0),
                             sliding_window=window if window else None,
                             head_size=head_size if head_size not in (None, width // heads) else None)


def gemma_config_from_hf(hf: dict, spec):
    """The config of a Gemma 2 or Gemma 3 (text) config.json: the rotary bases of its global and
    windowed layers (HF 5's rope_parameters per layer type, or rope_theta and
    rope_local_base_freq), which layers attend to all (layer_types, or the pattern), its caps."""
    name, n_layer = spec.display, hf["num_hidden_layers"]
    rope = hf.get("rope_parameters") or {}
    per_type = rope if "full_attention" in rope else {"full_attention": rope, "sliding_attention": rope}
    for kind, params in per_type.items():
        if (params or {}).get("rope_type", "default") != "default" or hf.get("rope_scaling"):
            raise UserError(f"rope scaling {(params or {}).get('rope_type') or hf['rope_scaling']!r} is not "
                            f"supported: gptrain's {name} uses plain rotary embeddings")
    default_theta = 10000.0 if spec.arch == "gemma2" else 1000000.0
    theta = float((per_type["full_attention"] or {}).get("rope_theta") or hf.get("rope_theta") or default_theta)
    local = float((per_type["sliding_attention"] or {}).get("rope_theta") or hf.get("rope_local_base_freq")
                  or (theta if spec.arch == "gemma2" else 10000.0))
    pattern = int(hf.get("sliding_window_pattern") or (2 if spec.arch == "gemma2" else 6))
    types = hf.get("layer_types")
    if types:  # gptrain computes a pattern: every pattern-th layer global, the rest windowed
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        pattern = full[0] + 1 if full else n_layer + 1
        if len(types) != n_layer or any((t == "full_attention") != ((i + 1) % pattern == 0) for i, t in enumerate(types)):
            raise UserError(f"layer_types {types} is not a repeating pattern of windowed layers and one global "
                            f"layer, the only arrangement gptrain's {name} computes")
    if hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh")) not in ("gelu_pytorch_tanh", "gelu_new"):
        raise UserError(f"activation {hf.get('hidden_activation')!r} is not supported ({name} uses gelu_pytorch_tanh)")
    if hf.get("attention_bias") or hf.get("use_bidirectional_attention"):
        raise UserError(f"{name} models with attention_bias or bidirectional attention are not supported")
    heads, width = hf["num_attention_heads"], hf["hidden_size"]
    return spec.config_class(
        block_size=hf["max_position_embeddings"], vocab_size=hf["vocab_size"], n_layer=n_layer, n_head=heads,
        n_kv_head=hf.get("num_key_value_heads") or heads, n_embd=width, intermediate_size=hf["intermediate_size"],
        head_size=hf.get("head_dim") if hf.get("head_dim") not in (None, width // heads) else None,
        rope_theta=theta, local_rope_theta=local if local != theta else None, sliding_pattern=pattern,
        sliding_window=hf.get("sliding_window") or None, layer_norm_eps=hf.get("rms_norm_eps", 1e-6), bias=False,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), query_scale=hf.get("query_pre_attn_scalar"),
        attn_softcap=hf.get("attn_logit_softcapping"), final_softcap=hf.get("final_logit_softcapping"),
        dropout=float(hf.get("attention_dropout") or 0.0))


def gpt2_config_from_hf(hf: dict, spec=None):
    from gptrain.models.shapes import GPTConfig

    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        raise UserError(f"activation {act!r} is not supported (GPT-2 uses gelu_new; gelu, the exact one, too)")
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        raise UserError("n_inner other than 4 * n_embd is not supported")
    return GPTConfig(block_size=hf["n_positions"], vocab_size=hf["vocab_size"],
                     n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"],
                     dropout=float(hf.get("resid_pdrop", 0.1)),  # (GPT2Config's default; one rate for all three)
                     layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                     gelu="exact" if act == "gelu" else "tanh")


def config_to_hf(cfg) -> dict:
    from gptrain.models.registry import spec_of
    from gptrain.models.shapes import GELUS

    spec = spec_of(cfg.arch)
    kind = {"architectures": [spec.hf_architecture], "model_type": spec.hf_model_type}
    if cfg.arch in ("gemma2", "gemma3"):
        return {**kind, **_gemma_to_hf(cfg)}
    if cfg.arch != "gpt2":  # the Llama family
        own = {"llama": {"attention_bias": False, "mlp_bias": False},
               "qwen2": {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window},
               "qwen3": {"attention_bias": False, "use_sliding_window": cfg.sliding_window is not None,
                         "sliding_window": cfg.sliding_window},
               "mistral": {"sliding_window": cfg.sliding_window},
               "phi3": {"sliding_window": cfg.sliding_window, "pad_token_id": None},  # (HF's 32000 may be past the vocabulary)
               "olmo2": {"attention_bias": False}}[cfg.arch]
        return {
            **kind, **own,
            "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.block_size,
            "hidden_size": cfg.n_embd, "intermediate_size": cfg.ffn_size,
            "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
            "rms_norm_eps": cfg.layer_norm_eps, "rope_theta": cfg.rope_theta,
            "attention_dropout": cfg.dropout,
            "initializer_range": 0.02, "tie_word_embeddings": cfg.tie_embeddings,
            "torch_dtype": "float32",
        }
    return {
        **kind,
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": None,
        "activation_function": GELUS[cfg.gelu], "layer_norm_epsilon": cfg.layer_norm_eps,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
        "initializer_range": 0.02, "bos_token_id": 50256, "eos_token_id": 50256,
        "tie_word_embeddings": True, "torch_dtype": "float32",
    }


def _gemma_to_hf(cfg) -> dict:
    """A Gemma 2 / Gemma 3 config.json's fields (config_to_hf)."""
    local = cfg.local_rope_theta or cfg.rope_theta
    return {
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.block_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.ffn_size, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.layer_norm_eps,
        "hidden_activation": "gelu_pytorch_tanh" if cfg.gelu == "tanh" else "gelu", "attention_bias": False,
        "attention_dropout": cfg.dropout, "query_pre_attn_scalar": cfg.query_scale or cfg.head_dim,
        "sliding_window": cfg.sliding_window, "attn_logit_softcapping": cfg.attn_softcap,
        "final_logit_softcapping": cfg.final_softcap, "tie_word_embeddings": cfg.tie_embeddings,
        "layer_types": ["full_attention" if cfg.attends_to_all(i) else "sliding_attention" for i in range(cfg.n_layer)],
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta} if cfg.arch == "gemma2" else
        {"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
         "sliding_attention": {"rope_type": "default", "rope_theta": local}},
        "initializer_range": 0.02, "torch_dtype": "float32",
    }


def read_state_dict(model_dir: Path):
    """Tensors of a HF checkpoint by name: safetensors (single or sharded; each tensor read
    when it is used), else a weights-only .bin (a checkpoint is data, never code); UserError
    naming the file when one is corrupt."""
    from gptrain.files import SafetensorsFile, check_plain_name, read_json, read_torch_weights

    if (model_dir / "model.safetensors").is_file():
        return SafetensorsFile(model_dir / "model.safetensors", "model weights")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "weights index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"weights index {index} has no weight_map; the model directory is corrupt")
        shards = [SafetensorsFile(model_dir / check_plain_name(shard, index), "model weights")
                  for shard in sorted(set(weight_map.values()))]
        return {key: shard for shard in shards for key in shard}  # name -> the shard that holds it (_Ours reads it there)
    if not (model_dir / "pytorch_model.bin").is_file() and (model_dir / "pytorch_model.bin.index.json").is_file():
        raise UserError(f"{model_dir} holds sharded pytorch_model-*.bin weights, which gptrain does not "
                        "read; save the model with safetensors (save_pretrained's default)")
    return read_torch_weights(model_dir / "pytorch_model.bin", "model weights")


def _qkv_rows(t, n_head, to_hf: bool):
    """Reorder c_attn rows between HF (qkv, head, d) and gptrain (head, qkv, d)."""
    rest = t.shape[1:]
    if to_hf:
        return t.reshape(n_head, 3, -1, *rest).transpose(0, 1).reshape(t.shape)
    return t.reshape(3, n_head, -1, *rest).transpose(0, 1).reshape(t.shape)


def _pad_vocab(t, cfg):
    if cfg.padded_vocab_size > t.shape[0]:
        t = torch.cat([t, t.new_zeros(cfg.padded_vocab_size - t.shape[0], t.shape[1])])
    return t


class _Ours:
    """Our tensors by our names, each read and converted when it is asked for (fp32, our
    layout): copy_into takes them one at a time, so a model never sits twice in memory."""

    def __init__(self, sd, names: dict, cfg, spec):
        self.sd, self.names, self.cfg, self.spec = sd, names, cfg, spec

    def __contains__(self, name) -> bool:
        return name in self.names

    def __iter__(self):
        return iter(self.names)

    def __getitem__(self, name: str):
        key, spec = self.names[name], self.spec
        t = self.sd[key]
        if not isinstance(t, torch.Tensor):  # a sharded checkpoint: the shard that holds it
            t = t[key]
        if name.endswith(spec.hf_transposed):
            t = t.t()
        if name.endswith(spec.hf_head_rows):
            t = _qkv_rows(t, self.cfg.n_head, to_hf=False)
        if name in ("transformer.wte.weight", "lm_head.weight"):
            t = _pad_vocab(t, self.cfg)
        return t.float()

    def items(self):
        return ((name, self[name]) for name in self.names)


def from_hf_state_dict(sd, cfg) -> _Ours:
    """Our tensors (fp32, our names and layouts) from a HF state dict, by the arch's spec; the
    names checked now, each tensor converted when it is read."""
    from gptrain.models.registry import spec_of

    spec = spec_of(cfg.arch)
    names = {}
    for key in sd:
        if key.endswith(spec.hf_ignored) or (key == "lm_head.weight" and cfg.tie_embeddings):
            continue  # buffers of old HF versions; a tied lm_head is wte
        name = spec.rename(key, to_ours=True)
        if name is None:
            raise UserError(f"unexpected tensor {key!r} for a {cfg.arch} model")
        names[name] = key
    return _Ours(sd, names, cfg, spec)


def to_hf_state_dict(sd: dict, cfg) -> dict:
    """HF's tensors (its names and layouts, the real vocabulary) from ours, by the arch's spec."""
    from gptrain.models.registry import spec_of

    spec = spec_of(cfg.arch)
    out = {}
    for name, t in sd.items():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue  # tied: HF re-ties it from the embedding on load
        if name in ("transformer.wte.weight", "lm_head.weight"):
            t = t[: cfg.vocab_size]
        if name.endswith(spec.hf_head_rows):
            t = _qkv_rows(t, cfg.n_head, to_hf=True)
        if name.endswith(spec.hf_transposed):
            t = t.t()
        out[spec.rename(name, to_ours=False)] = t.detach().to("cpu").contiguous()
    if cfg.arch == "gpt2" and not cfg.bias:  # HF's GPT-2 always has biases: zeros compute the same
        out.update(_zero_biases(out))
    return out


def _zero_biases(hf: dict) -> dict:
    """The zero bias of every GPT-2 layer norm and projection that has a weight and no bias (a
    bias-less model, nanoGPT's bias=False): the bias is as wide as the weight's output side (the
    projections are Conv1D in HF, [in, out])."""
    import torch

    out = {}
    for name, w in hf.items():
        bias = name.removesuffix(".weight") + ".bias"
        if name.endswith(".weight") and bias not in hf and (".ln_" in name or ".c_" in name):
            out[bias] = torch.zeros(w.shape[-1], dtype=w.dtype)
    return out


def load_hf(name_or_path: str, **overrides):
    """(model, its HF directory) from a HF GPT-2 or Llama directory or hub id.

    The model is built without memory (meta), given empty CPU storage of its own layout, and each
    HF tensor is copied into its parameter under a shape check (nanoGPT's habit): the parameters
    stay the model's own contiguous tensors, never views of the file's (transposed) ones, which
    FSDP and tensor parallel need.
    """
    from gptrain.files import read_json, reading
    from gptrain.models.registry import build
    from gptrain.models.shapes import check_loadable

    model_dir = resolve(name_or_path)
    checksums.verify(model_dir, what="model")  # one gptrain exported: its bytes as written
    config_file = model_dir / "config.json"
    with reading(config_file, "model config"):  # a missing or mistyped field names the file
        cfg = config_from_hf(read_json(config_file, "model config"), **overrides)
    check_loadable(cfg, str(config_file))
    if cfg.arch == ARCH_GENERIC:  # transformers' own module, read by transformers
        from gptrain.models.generic import GenericCausalLM

        return GenericCausalLM(cfg, model_dir), model_dir
    with torch.device("meta"):
        model = build(cfg)
    model.to_empty(device="cpu")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    copy_into(model, from_hf_state_dict(read_state_dict(model_dir), cfg), str(model_dir))
    return model, model_dir


def copy_into(model, tensors: dict, source: str) -> None:
    """Copy every tensor into the model's parameter or buffer of the same name; all must be there."""
    own = dict(model.named_parameters())  # a tied weight appears once, under its first name
    own.update(model.named_buffers())
    missing = [k for k in own if k not in tensors]
    unexpected = [k for k in tensors if k not in own]
    if missing or unexpected:
        raise UserError(f"{source} does not hold a complete {model.config.arch} model: missing "
                        f"{missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for name, t in tensors.items():
            if tuple(t.shape) != tuple(own[name].shape):
                raise UserError(f"{source}: {name} has shape {tuple(t.shape)} where the model's "
                                f"config.json implies {tuple(own[name].shape)}")
            own[name].copy_(t)


def export_hf(model, tokenizer, out_dir) -> Path:
    """Write a HF model directory (config, safetensors, generation config, tokenizer) atomically."""
    from safetensors.torch import save_file

    from gptrain.atomic import new_directory

    if model.config.lora_r:  # the base with its adapters merged in: a plain HF model
        from gptrain.models.lora import merged

        model = merged(model)
    cfg = model.config
    with new_directory(out_dir, "--out directory") as tmp:
        if cfg.arch == ARCH_GENERIC:  # transformers' own module: its own save_pretrained
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            model.model.save_pretrained(tmp, safe_serialization=True)
            hf_cfg = json.loads((tmp / "config.json").read_text())
        else:
            save_file(to_hf_state_dict(model.state_dict(), cfg), tmp / "model.safetensors",
                      metadata={"format": "pt"})
            hf_cfg = config_to_hf(cfg)
        eos = getattr(tokenizer, "eos_id", None)
        hf_cfg["bos_token_id"] = hf_cfg["eos_token_id"] = eos
        hf_cfg[checksums.EXPORT_KEY] = checksums.ALGORITHM  # sealed with a list: a load refuses one without
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}, indent=2))
        if tokenizer is not None:
            tokenizer.save_hf(tmp)
            # gptrain reads its own tokenizer back from here (char/byte have no HF form).
            (tmp / "gptrain_tokenizer.json").write_text(json.dumps(tokenizer.spec()))
        checksums.seal_folder(tmp)  # every later load of it verifies its bytes
    return Path(out_dir)
