"""LoRA in gptrain's own blocks (models/lora.py): the math against a by-hand reference, what is
frozen, how targets are named (peft's way), the [lora] settings, and bad input refused in one
line before anything runs."""

import pytest
import torch

from gptrain.config_options import parse_train_args
from gptrain.errors import UserError
from gptrain.models.lora import LoRALinear, add_lora, attach, merged
from gptrain.models.registry import build, build_model_config, config_from_dict
from tests.conftest import run_cli


def tiny(preset="gpt2-tiny"):
    torch.manual_seed(0)
    return build(build_model_config(parse_train_args([f"--model.preset={preset}"]).model, 65))


def test_the_adapted_linear_is_base_plus_scaled_b_a_and_starts_as_the_base():
    m = tiny()
    x = torch.randint(0, 65, (2, 16))
    before = m(x)
    add_lora(m, 4, 8.0, 0.0, ["c_attn"])
    assert torch.equal(m(x), before)  # B = 0: the adapted model starts as the base
    layer = m.transformer.h["0"].attn.c_attn
    assert isinstance(layer, LoRALinear) and layer.lora_A.shape == (4, 64) and layer.lora_B.shape == (192, 4)
    torch.nn.init.normal_(layer.lora_B)
    h = torch.randn(3, 64)
    by_hand = h @ layer.weight.T + layer.bias + (h @ layer.lora_A.T @ layer.lora_B.T) * (8.0 / 4)
    assert torch.allclose(layer(h), by_hand, atol=1e-6)
    plain = merged(m)  # W + (B A) alpha / r: the same function without adapters
    assert not any(".lora_" in n for n, _ in plain.named_parameters()) and plain.config.lora_r == 0
    assert torch.allclose(plain(x), m(x), atol=1e-5)
    assert plain.lm_head.weight is plain.transformer.wte.weight  # still tied


def test_only_the_adapters_train():
    m = tiny("llama-tiny")
    add_lora(m, 2, 16.0, 0.1, [])  # peft's default for llama: q_proj, v_proj
    trained = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained)
    assert {n.split(".")[-2] for n in trained} == {"q_proj", "v_proj"}
    from gptrain.train.optim import build_optimizer

    opt = build_optimizer(m, parse_train_args([]).train, "cpu")
    assert sum(len(g["params"]) for g in opt.param_groups) == len(trained)
    m(torch.randint(0, 65, (2, 8)), targets=torch.randint(0, 65, (2, 8)))[1].backward()
    assert all(p.grad is None for n, p in m.named_parameters() if ".lora_" not in n)
    assert all(p.grad is not None for n, p in m.named_parameters() if ".lora_" in n)


@pytest.mark.parametrize("preset, targets, count", [
    ("gpt2-tiny", ["all-linear"], 8), ("gpt2-tiny", ["c_proj"], 4), ("gpt2-tiny", ["mlp.c_proj"], 2),
    ("gpt2-tiny", [], 2), ("llama-tiny", ["all-linear"], 14), ("llama-tiny", ["down_proj", "q_proj"], 4),
    # a path of the HF module, as peft matches it (model.layers.N... / transformer.h.N...), or of ours
    ("llama-tiny", ["layers.0.self_attn.q_proj"], 1), ("llama-tiny", ["model.layers.1.mlp.down_proj"], 1),
    ("gpt2-tiny", ["h.0.attn.c_attn"], 1), ("llama-tiny", ["transformer.h.1.self_attn.v_proj"], 1)])
def test_targets_are_named_as_peft_names_them(preset, targets, count):
    m = tiny(preset)
    add_lora(m, 2, 8.0, 0.0, targets)
    assert sum(isinstance(x, LoRALinear) for x in m.modules()) == count
    assert not isinstance(m.lm_head, LoRALinear)


def test_a_checkpoints_config_rebuilds_its_adapters():
    m = tiny("llama-tiny")
    add_lora(m, 3, 6.0, 0.0, ["o_proj"])
    again = build(config_from_dict(m.config.to_dict()))
    attach(again)  # as a checkpoint's loader does (models/load.py): build() makes the plain model
    assert again.state_dict().keys() == m.state_dict().keys()
    assert again.transformer.h["1"].self_attn.o_proj.lora_scaling == 2.0


def test_settings_and_the_flags_peft_and_trl_scripts_use():
    cfg = parse_train_args(["--lora_r", "8", "--lora_alpha", "16", "--lora_dropout=0.05",
                            "--lora_target_modules", "c_attn", "c_fc", "--train.max_steps=3"])
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules) == (8, 16.0, 0.05, ["c_attn", "c_fc"])
    assert parse_train_args(["--lora.target_modules=q_proj,v_proj", "--model.preset=llama-tiny",
                             "--lora.r=2"]).lora.target_modules == ["q_proj", "v_proj"]
    assert parse_train_args([]).lora.r is None  # full fine-tuning unless asked


@pytest.mark.parametrize("args, words", [
    (["--lora_r", "0"], "--lora.r must be >= 1"),
    (["--lora_r", "4", "--lora_target_modules", "q_proj"], "'q_proj' is not a Linear of a gpt2 model"),
    (["--lora_r", "4", "--model.preset=llama-tiny", "--lora_target_modules", "qproj"], "did you mean 'q_proj'"),
    (["--lora_r", "4", "--parallel.tp=2"], "not with tensor or pipeline parallel"),
    (["--lora_r", "4", "--parallel.pp=2"], "not with tensor or pipeline parallel"),
    (["--lora_dropout", "1"], "--lora.dropout must be >= 0 and < 1"),
    (["--lora_r", "4", "--lora_target_modules", "all-linear", "c_attn"], "all-linear stands alone"),
])
def test_bad_lora_settings_are_one_line(args, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_train_args(args)


def test_a_target_the_weights_lack_is_refused_before_anything_is_written(isolated_home, tmp_path, tiny_hf_llama):
    out = tmp_path / "out"
    r = run_cli("train", f"--model.init_from={tiny_hf_llama}", "--data.path=nowhere", f"--train.output_dir={out}",
                "--lora_r", "4", "--lora_target_modules", "c_attn")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "'c_attn' is not a Linear of a llama model" in r.stderr and not out.exists()
    r = run_cli("run", "j", "--", f"--model.init_from={tiny_hf_llama}", "--data.path=x", "--lora_r", "4",
                "--lora_target_modules", "c_attn")
    assert r.returncode == 2 and "'c_attn' is not a Linear" in r.stderr, r.stderr
    assert not (isolated_home / "jobs" / "j").exists()


def test_qlora_holds_every_block_linear_in_nf4_and_computes_close_to_the_base():
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor

    m = tiny("llama-tiny")
    x = torch.randint(0, 65, (2, 16))
    before = m(x)
    fp32_bytes = sum(w.weight.numel() * 4 for w in m.transformer.h.modules() if isinstance(w, torch.nn.Linear))
    add_lora(m, 4, 8.0, 0.0, ["q_proj", "v_proj"], quant="nf4")
    linears = [w for w in m.transformer.h.modules() if isinstance(w, torch.nn.Linear)]
    assert len(linears) == 14 and all(isinstance(w.weight, NF4Tensor) and not w.weight.requires_grad for w in linears)
    nf4_bytes = sum(w.weight.quantized_data.numel() + w.weight.quantized_scalers.numel() for w in linears)
    assert nf4_bytes < fp32_bytes / 7  # 4 bits a weight and one-byte scales: about 1/8 of fp32
    after = m(x)
    rel = ((after - before).norm() / before.norm()).item()
    assert 0 < rel < 0.15, rel  # the base, to 4-bit precision
    m(x, targets=x)[1].backward()
    assert all(p.grad is not None for n, p in m.named_parameters() if ".lora_" in n)
    plain = merged(m)  # the NF4 weights dequantized, the adapters added
    assert not any(isinstance(p, NF4Tensor) for p in plain.parameters())
    assert torch.allclose(plain(x), m(x), atol=1e-5)


def test_qlora_settings(monkeypatch):
    cfg = parse_train_args(["--model.init_from=x", "--lora_r", "4", "--load_in_4bit"])
    assert cfg.lora.quantize_base == "nf4"
    for args in (["--load_in_4bit"], ["--lora_r", "4", "--lora.quantize_base=nf4"]):
        with pytest.raises(UserError, match="QLoRA.*set --lora_r and --model.init_from"):
            parse_train_args(args)
    import sys

    from gptrain.models import lora

    monkeypatch.setitem(sys.modules, "torchao.quantization.quantize_.workflows.nf4.nf4_tensor", None)
    with pytest.raises(UserError, match=r"pip install 'gptrain\[qlora\]'"):
        lora.nf4()


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_a_base_held_in_bf16_computes_what_autocast_computes_from_fp32(preset):
    """hold_base_in: the frozen block Linears in the compute dtype give the same logits and
    the same adapter gradients under autocast as the fp32 base, at half the memory."""
    import copy

    from gptrain.models.lora import hold_base_in

    ref = tiny(preset)
    add_lora(ref, 4, 8.0, 0.0, ["all-linear"])
    for name, p in ref.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)  # adapters that do something
    held = copy.deepcopy(ref)
    hold_base_in(held, torch.bfloat16)
    kinds = {(n.rsplit(".", 1)[-1], p.dtype) for n, p in held.named_parameters() if ".h." in n}
    assert ("weight", torch.bfloat16) in kinds and ("lora_A", torch.float32) in kinds
    assert held.transformer.wte.weight.dtype == torch.float32  # only the blocks' Linears
    x = torch.randint(0, 65, (2, 16))
    outs = []
    for m in (ref, held):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(x)
        logits.float().square().mean().backward()
        outs.append((logits, {n: p.grad for n, p in m.named_parameters() if p.requires_grad}))
    assert torch.equal(outs[0][0], outs[1][0])
    assert outs[0][1].keys() == outs[1][1].keys() and all(
        torch.equal(outs[0][1][n], outs[1][1][n]) for n in outs[0][1])
