"""The generic path: a decoder-only Hugging Face model gptrain has no spec for (GPT-NeoX, Falcon,
StableLM, ...: any model type transformers itself maps to a causal LM), trained by gptrain's loop
as transformers' own module.

What it keeps of gptrain: the loop, its data, DDP and FSDP2 (each decoder layer, the classes the
model names in `_no_split_modules`, sharded on its own), activation checkpointing and compile per
layer, verified checkpoints and exact resume, eval, generate (transformers' own KV cache) and the
export, which is transformers' own `save_pretrained`. What it refuses, each in one line: tensor
and pipeline parallel, LoRA, packed rows (they need gptrain's own attention). Its code is always
transformers' modeling file for that model type, never the checkpoint's own: a config.json with
`auto_map` is refused (trust_remote_code stays off).

The checkpoint keys are transformers' own under `model.`; the config keeps the HF config.json
(`hf_config`), from which a checkpoint rebuilds the module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from gptrain.errors import UserError

from gptrain.models.shapes import WHY_GENERIC as WHY_NOT
from gptrain.models.shapes import GenericConfig, causal_lm_types

# families transformers maps to a causal LM class that are bidirectional encoders unless their
# config says is_decoder (BertLMHeadModel and its kin): trained on next tokens, they would see them
ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "electra", "ernie", "camembert",
                      "data2vec-text", "rembert", "roc_bert", "xmod", "megatron-bert", "bert-generation",
                      "big_bird", "qdqbert", "roberta-prelayernorm", "modernbert"})


def config_from_hf(hf: dict, **overrides) -> GenericConfig:
    """GenericConfig of a config.json whose model_type transformers maps to a causal LM."""
    from transformers import AutoConfig

    model_type = hf.get("model_type")
    if "auto_map" in hf:
        raise UserError(f"this {model_type} model needs its own Python code (config.json's auto_map), which "
                        "gptrain never runs; use a model transformers itself implements")
    if model_type not in causal_lm_types():
        raise UserError(f"model_type {model_type!r} is not a causal language model transformers knows")
    if model_type in ENCODERS and hf.get("is_decoder") is not True:
        raise UserError(f"a {model_type} model is an encoder (it sees the tokens after each one), not a decoder: "
                        "gptrain trains decoder-only language models")
    quantized = hf.get("quantization_config")
    if quantized is not None:
        how = quantized.get("quant_method", "?") if isinstance(quantized, dict) else "?"
        raise UserError(f"this {model_type} model's weights are quantized ({str(how)[:40]}): gptrain trains and "
                        "loads full-precision weights; give the model before quantization")
    dropout = overrides.pop("dropout", None)
    hf = dict(hf)
    if dropout is not None:  # every dropout rate of the model's config, as gptrain's --dropout
        hf.update({k: float(dropout) for k, v in hf.items() if _is_rate(k, v)})
    try:
        hc = AutoConfig.for_model(**hf)
    except Exception as e:  # transformers' config classes raise many types on a bad field
        raise UserError(f"config.json of a {model_type} model is not one transformers reads "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    block = next((getattr(text, k) for k in ("max_position_embeddings", "n_positions", "seq_length")
                  if isinstance(getattr(text, k, None), int)), None)
    shape = {k: getattr(text, name, None) for k, name in (("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads"),
                                                        ("n_embd", "hidden_size"), ("vocab_size", "vocab_size"))}
    if block is None or any(not isinstance(v, int) or isinstance(v, bool) for v in shape.values()):
        raise UserError(f"config.json of a {model_type} model does not give its layers, heads, width, "
                        "vocabulary and context as whole numbers")
    cfg = GenericConfig(block_size=block, dropout=0.0, hf_config=hf, **shape)
    for key, value in overrides.items():
        if key in {f.name for f in dataclasses.fields(GenericConfig)}:
            setattr(cfg, key, value)
    cfg.pad_vocab_multiple = 0
    cfg.validate()
    return cfg


def check_weight_files(folder) -> None:
    """What transformers would read in `folder`, before it reads it: each shard a weights index
    names is a plain file name in the folder (an index naming '../x' or '/etc/passwd' would have
    it read from elsewhere), as the own families' reader (models/hf.read_state_dict) checks."""
    from gptrain.files import check_plain_name, read_json

    def plain_file(path):  # (a pipe or a device opened by transformers blocks for ever, SIGTERM or not)
        if path.exists() and not path.is_file():
            raise UserError(f"{path} is not a plain file (a pipe, a device or a folder): a weights file is one")
    for name in ("model.safetensors", "pytorch_model.bin"):
        plain_file(Path(folder) / name)
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = Path(folder) / name
        if index.is_file():
            weight_map = read_json(index, "weights index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise UserError(f"weights index {index} has no weight_map; the model directory is corrupt")
            for shard in weight_map.values():
                plain_file(Path(folder) / check_plain_name(shard, index))


def _is_rate(key: str, value) -> bool:
    return ("dropout" in key or "pdrop" in key) and isinstance(value, float) and not isinstance(value, bool)


class GenericCausalLM(nn.Module):
    """transformers' own causal LM of `cfg.hf_config`, with the interface gptrain's loop calls:
    forward(idx, targets) -> (logits, loss); forward(idx, cache=...) for generation."""

    packs_rows = False  # transformers' attention takes no block-diagonal mask: data.packing's auto is off

    def __init__(self, cfg: GenericConfig, folder=None):
        """Random weights (transformers' own init), or those of the Hugging Face `folder`, read by
        transformers' own from_pretrained (its key renames, its safe readers) in fp32."""
        from transformers import AutoConfig, AutoModelForCausalLM

        super().__init__()
        cfg.validate()
        self.config = cfg
        hc = AutoConfig.for_model(**cfg.hf_config)
        how = dict(attn_implementation=cfg.attn_implementation, trust_remote_code=False)
        if folder is None:
            self.model = AutoModelForCausalLM.from_config(hc, **how)
        else:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            check_weight_files(folder)
            if (Path(folder) / "adapter_config.json").exists():  # (transformers would load it frozen in)
                raise UserError(f"{folder} holds a PEFT adapter (adapter_config.json): give its base model's folder; "
                                "LoRA on transformers' own module is not supported yet")
            try:
                self.model, info = AutoModelForCausalLM.from_pretrained(
                    folder, config=hc, local_files_only=True, dtype=torch.float32, output_loading_info=True, **how)
            except Exception as e:  # mis-shaped, unreadable or pickled weights: transformers' many types
                raise UserError(f"{folder}: transformers cannot load its {cfg.hf_config['model_type']} weights "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
            wrong = {k: sorted(v)[:3] for k, v in info.items() if k in ("missing_keys", "unexpected_keys",
                                                                         "mismatched_keys") and v}
            if wrong:  # (transformers would start those weights at random, with a warning)
                raise UserError(f"{folder} does not hold a complete {cfg.hf_config['model_type']} model: "
                                + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in wrong.items()))
        import inspect

        # the KV cache's argument: `cache` since transformers 5.x, `past_key_values` before
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.fused_loss = False  # (the trainer sets it; the module computes its own logits)
        from gptrain.models.base import cross_entropy

        self.loss_fn = cross_entropy

    def block_slots(self) -> list:
        """(container, key) of each decoder layer: the modules of the classes the model names in
        `_no_split_modules`, as accelerate and FSDP's auto-wrap find them."""
        names = set(getattr(self.model, "_no_split_modules", None) or ())
        for module in self.model.modules():
            first = getattr(module[0], "_checkpoint_wrapped_module", module[0]) if isinstance(module, nn.ModuleList) \
                and len(module) else None  # (activation checkpointing wraps each layer in place)
            if first is not None and type(first).__name__ in names:
                return [(module, i) for i in range(len(module))]
        raise UserError(f"cannot find the decoder layers of this {self.config.hf_config['model_type']} model "
                        "(its _no_split_modules name none in a list)")

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.model.get_input_embeddings().weight.numel()
        return n

    def forward(self, idx, targets=None, cache=None, start_pos: int = 0, last_only: bool = False, segments=None):
        if segments is not None:
            raise UserError(f"packed rows need gptrain's own attention, not {WHY_NOT}: train without --packing")
        if start_pos + idx.size(1) > self.config.block_size:
            raise UserError(f"sequence of {start_pos + idx.size(1)} tokens is longer than the model's "
                            f"context ({self.config.block_size})")
        if cache is not None:  # transformers' own KV cache, kept on gptrain's cache object
            past = {self._cache_arg: getattr(cache, "hf_past", None) if start_pos else None}
            out = self.model(input_ids=idx, use_cache=True, **past)
            cache.hf_past = getattr(out, "cache", None) or out.past_key_values
        else:
            out = self.model(input_ids=idx, use_cache=False)
        logits = out.logits
        if targets is not None:
            return logits, self.loss_fn(logits, targets, self.config.vocab_size)
        return (logits[:, -1:] if last_only else logits).contiguous()

