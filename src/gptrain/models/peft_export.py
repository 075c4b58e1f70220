"""A LoRA model's adapters as a PEFT adapter directory (`gptrain export MODEL --format peft`):

    adapter_config.json          peft's LoraConfig (peft_type LORA, task_type CAUSAL_LM, r,
                                 lora_alpha, lora_dropout, target_modules, fan_in_fan_out ...)
    adapter_model.safetensors    base_model.model.<HF module>.lora_A.weight / .lora_B.weight

which `PeftModel.from_pretrained(base, DIR)` loads on the Hugging Face form of the base
(`gptrain export BASE`, or the HF directory the run started from). The module names are HF's
(models/hf.py renames them as it does the weights); GPT-2's c_attn rows, which gptrain keeps per
head, go back to HF's (q|k|v, head) order in lora_B. GPT-2's projections are Conv1D in HF: peft
says so with fan_in_fan_out = true and keeps lora_A/B in Linear's (out, in) form, as gptrain does.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptrain.errors import UserError


def adapter_tensors(model) -> dict:
    """peft's names and layouts of the model's adapters."""
    from gptrain.models.hf import _qkv_rows
    from gptrain.models.registry import spec_of

    cfg = model.config
    spec = spec_of(cfg.arch)
    out = {}
    for name, t in model.state_dict().items():
        if ".lora_" not in name:
            continue
        module, _, which = name.rpartition(".")  # transformer.h.0.attn.c_attn, lora_B
        if which == "lora_B" and f"{module}.weight".endswith(spec.hf_head_rows):
            t = _qkv_rows(t, cfg.n_head, to_hf=True)
        hf_module = spec.rename(f"{module}.weight", to_ours=False).removesuffix(".weight")
        out[f"base_model.model.{hf_module}.{which}.weight"] = t.detach().to("cpu").contiguous()
    return out


def adapter_config(model, base: str) -> dict:
    from gptrain.models.lora import ALL_LINEAR, default_targets

    cfg = model.config
    targets = list(cfg.lora_targets) or list(default_targets(cfg.arch))
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": cfg.lora_r, "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
        "target_modules": ALL_LINEAR if ALL_LINEAR in targets else targets,  # (peft: the string)
        "fan_in_fan_out": cfg.arch == "gpt2", "bias": "none", "modules_to_save": None,
        "init_lora_weights": True, "use_rslora": False, "use_dora": False, "inference_mode": True,
        "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
    }


def export_peft(model, out_dir, base: str = "") -> Path:
    """Write the adapter directory atomically; a model without adapters, or adapters without a
    base they can name (a LoRA run from scratch), is one line."""
    from safetensors.torch import save_file

    from gptrain.atomic import new_directory

    if not model.config.lora_r:
        raise UserError("--format peft writes LoRA adapters and this model has none (it was not trained "
                        "with --lora_r); use --format hf")
    if not base:  # adapter_config.json would name no base_model_name_or_path
        raise UserError("these LoRA adapters were trained on a base of their own (no --model.init_from), which "
                        "exists only in their checkpoint: `--format hf` writes the model with them merged")
    with new_directory(out_dir, "--out directory") as tmp:
        save_file(adapter_tensors(model), tmp / "adapter_model.safetensors", metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(adapter_config(model, base), indent=2))
    return Path(out_dir)
