"""gptrain's Llama against transformers' LlamaForCausalLM: logits, loss, export (generation:
tests/unit/test_hf_interop.py runs the same checks on both architectures)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from gptrain.errors import UserError
from gptrain.models.shapes import LlamaConfig
from gptrain.models.hf import config_from_hf, export_hf, load_hf
from gptrain.models.llama import Llama


def _ids(n=2, t=24, seed=1):
    return torch.randint(0, 50257, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("pad", [0, 64])
def test_logits_match_transformers(tiny_hf_llama, impl, pad):
    ref = LlamaForCausalLM.from_pretrained(tiny_hf_llama).eval()
    model, _ = load_hf(str(tiny_hf_llama), attn_implementation=impl, pad_vocab_multiple=pad)
    assert isinstance(model, Llama) and model.config.kv_heads == 2
    assert model.lm_head.weight is not model.transformer.wte.weight  # untied, as in the file
    ids = _ids()
    with torch.no_grad():
        expected = ref(ids).logits
        got = model.eval()(ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_loss_and_gradients_match_transformers(tiny_hf_llama):
    ref = LlamaForCausalLM.from_pretrained(tiny_hf_llama)
    model, _ = load_hf(str(tiny_hf_llama))
    ids = _ids(t=33)
    expected = ref(ids, labels=ids).loss
    expected.backward()
    _, loss = model(ids[:, :-1], ids[:, 1:])  # the fused linear + cross-entropy path
    loss.backward()
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    ours = model.transformer.h["1"].self_attn.k_proj.weight.grad
    theirs = ref.model.layers[1].self_attn.k_proj.weight.grad
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(model.lm_head.weight.grad[:50257], ref.lm_head.weight.grad,
                               atol=1e-6, rtol=1e-4)


def test_export_loads_in_transformers(tiny_hf_llama, tmp_path):
    model, _ = load_hf(str(tiny_hf_llama))
    export_hf(model.eval(), None, tmp_path / "exported")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", output_loading_info=True)
    reloaded, info = back
    assert isinstance(reloaded, LlamaForCausalLM)
    assert not any(info.values()), info
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(ids).logits, model(ids), atol=1e-5, rtol=1e-5)


def test_tied_llama_round_trips(tmp_path):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, n_layer=2, n_head=4, n_kv_head=1, n_embd=32,
                      block_size=32, tie_embeddings=True, intermediate_size=64)
    model = Llama(cfg).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    export_hf(model, None, tmp_path / "tied")
    hf = json.loads((tmp_path / "tied" / "config.json").read_text())
    assert hf["tie_word_embeddings"] and hf["num_key_value_heads"] == 1
    ref = LlamaForCausalLM.from_pretrained(tmp_path / "tied").eval()
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ref(ids).logits, model(ids), atol=1e-5, rtol=1e-5)


def test_unsupported_llama_variants_are_refused():
    base = dict(model_type="llama", vocab_size=100, hidden_size=32, intermediate_size=64,
                num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=32)
    config_from_hf(base).validate()
    with pytest.raises(UserError, match="rope scaling 'llama3'"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(UserError, match="attention_bias"):
        config_from_hf({**base, "attention_bias": True})
    with pytest.raises(UserError, match="multiple of n_kv_head"):
        config_from_hf({**base, "num_key_value_heads": 3})
    with pytest.raises(UserError, match="model_type 'llama9'"):  # one transformers does not know either
        config_from_hf({**base, "model_type": "llama9"})
    assert config_from_hf({**base, "model_type": "gemma"}).arch == "hf_generic"  # Gemma 1: transformers' own


def test_each_architecture_has_its_own_config():
    """Llama's fields live in LlamaConfig only; a checkpoint's model_config names its class."""
    from dataclasses import fields

    from gptrain.config import ModelConfig
    from gptrain.models.registry import build_model_config, config_from_dict
    from gptrain.models.shapes import GPTConfig

    assert not {"n_kv_head", "intermediate_size", "rope_theta"} & {f.name for f in fields(GPTConfig)}
    llama = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64)
    assert config_from_dict(llama.to_dict()) == llama
    assert config_from_dict(llama.to_dict(), {"block_size": 16}).block_size == 16
    gpt2 = GPTConfig(n_layer=2, n_head=2, n_embd=32)
    assert type(config_from_dict(gpt2.to_dict())) is GPTConfig
    # a GPT-2 checkpoint written before the split carried the Llama fields at their defaults
    old = {k: v for k, v in gpt2.to_dict().items()} | dict(n_kv_head=None, intermediate_size=None,
                                                            rope_theta=10000.0)
    assert config_from_dict(old) == gpt2
    with pytest.raises(UserError, match="'n_kv_head' is not one of a gpt2 model's"):
        config_from_dict({**gpt2.to_dict(), "n_kv_head": 4})
    with pytest.raises(UserError, match="unknown model arch 'mamba'"):
        config_from_dict({**gpt2.to_dict(), "arch": "mamba"})
    with pytest.raises(UserError, match="--model.n_kv_head applies to Llama presets"):
        build_model_config(ModelConfig(preset="gpt2-tiny", n_kv_head=1))
    assert build_model_config(ModelConfig(preset="llama-tiny", n_kv_head=1)).kv_heads == 1
