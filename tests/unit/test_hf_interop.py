"""gptrain's GPT-2 against transformers' GPT2LMHeadModel: logits, generation (GPT-2 and Llama), export."""

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from gptrain.models.generate import generate
from gptrain.models.hf import export_hf, load_hf
from gptrain.tokenizers import GPT2Tokenizer


def _ids(n=2, t=24, seed=1):
    return torch.randint(0, 50257, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("pad", [0, 64])
def test_logits_match_transformers(tiny_hf_gpt2, impl, pad):
    ref = GPT2LMHeadModel.from_pretrained(tiny_hf_gpt2).eval()
    model, _ = load_hf(str(tiny_hf_gpt2), attn_implementation=impl, pad_vocab_multiple=pad)
    model.eval()
    ids = _ids()
    with torch.no_grad():
        expected = ref(ids).logits
        got = model(ids)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_loss_matches_transformers(tiny_hf_gpt2):
    ref = GPT2LMHeadModel.from_pretrained(tiny_hf_gpt2).eval()
    model, _ = load_hf(str(tiny_hf_gpt2))
    ids = _ids(t=33)
    with torch.no_grad():
        expected = ref(ids, labels=ids).loss
        _, loss = model.eval()(ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


MODELS = ["tiny_hf_gpt2", "tiny_hf_llama"]  # GPT-2, and Llama with grouped-query attention


@pytest.mark.parametrize("which", MODELS)
@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_generation_matches_transformers(request, which, batch):
    model_dir = request.getfixturevalue(which)
    ref = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model, _ = load_hf(str(model_dir))
    prompt = _ids(n=batch, t=7, seed=3)
    expected = ref.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None,
                            pad_token_id=0, attention_mask=torch.ones_like(prompt))
    got = generate(model, prompt, max_new_tokens=20, temperature=0.0)
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("which", MODELS)
def test_kv_cache_matches_full_recompute(request, which):
    model, _ = load_hf(str(request.getfixturevalue(which)), attn_implementation="eager")
    prompt = _ids(n=3, t=5, seed=4)
    out = generate(model, prompt, max_new_tokens=12)
    # recompute each step without a cache: the greedy choice must agree
    ids = prompt
    for _ in range(12):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.tolist() == ids.tolist()


def test_sampling_is_seeded_and_respects_top_k(tiny_hf_gpt2):
    model, _ = load_hf(str(tiny_hf_gpt2))
    prompt = _ids(n=2, t=4, seed=5)
    a = generate(model, prompt, 10, temperature=1.0, top_k=5, top_p=0.9, seed=7)
    b = generate(model, prompt, 10, temperature=1.0, top_k=5, top_p=0.9, seed=7)
    assert a.tolist() == b.tolist()
    # top_k=1 is greedy
    greedy = generate(model, prompt, 10)
    assert generate(model, prompt, 10, temperature=1.0, top_k=1, seed=1).tolist() == greedy.tolist()


def test_generation_stops_at_eos(tiny_hf_gpt2):
    model, _ = load_hf(str(tiny_hf_gpt2))
    prompt = _ids(n=1, t=4)
    first = generate(model, prompt, 1)[0, -1].item()
    out = generate(model, prompt, 20, eos_id=first)
    assert out.shape[1] == prompt.shape[1] + 1


def test_padded_vocab_never_sampled(tiny_hf_gpt2):
    model, _ = load_hf(str(tiny_hf_gpt2), pad_vocab_multiple=64)
    assert model.transformer.wte.weight.shape[0] == 50304
    with torch.no_grad():
        model.transformer.wte.weight[50257:] = 100.0  # make padded rows maximally attractive
    out = generate(model, _ids(n=2, t=4), 10, temperature=1.0, seed=0)
    assert out.max().item() < 50257


def test_export_roundtrip_loads_in_transformers_without_warnings(tiny_hf_gpt2, tmp_path, caplog):
    model, _ = load_hf(str(tiny_hf_gpt2), pad_vocab_multiple=64)
    out = export_hf(model, GPT2Tokenizer(), tmp_path / "export")
    import logging

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    hf_logging.enable_propagation()
    with caplog.at_level(logging.WARNING):
        loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
        tok = AutoTokenizer.from_pretrained(out)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not [r for r in caplog.records if "weight" in r.getMessage().lower()], caplog.text
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids).logits, model.eval()(ids), atol=1e-5, rtol=1e-5)
    assert tok("Hello world")["input_ids"] == [15496, 995]


def test_flash_attention_2_without_package_is_a_clear_error(tiny_hf_gpt2):
    from gptrain.errors import UserError

    model, _ = load_hf(str(tiny_hf_gpt2), attn_implementation="flash_attention_2")
    with pytest.raises(UserError, match="flash"):
        model(_ids())


def test_generation_past_the_context_slides_the_window(tiny_hf_gpt2):
    model, _ = load_hf(str(tiny_hf_gpt2))  # context 64
    prompt = _ids(n=1, t=60, seed=9)
    out = generate(model, prompt, 10)
    ids = prompt
    for _ in range(10):  # nanoGPT's loop: crop to the context, recompute
        ids = torch.cat([ids, model(ids[:, -64:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.tolist() == ids.tolist()


def test_pytorch_model_bin_is_read_weights_only(tiny_hf_gpt2, tmp_path):
    ref = GPT2LMHeadModel.from_pretrained(tiny_hf_gpt2).eval()
    ref.config.save_pretrained(tmp_path / "bin")  # the legacy layout older transformers wrote
    torch.save(ref.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    model, _ = load_hf(str(tmp_path / "bin"))
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids), ref(ids).logits, atol=1e-5, rtol=1e-5)


def test_sharded_safetensors_load_tensor_by_tensor(tiny_hf_llama, tmp_path):
    """A model saved in several safetensors shards (what save_pretrained writes for big models)
    loads with the same logits; each tensor is read from its shard when it is copied."""
    from gptrain.files import SafetensorsFile
    from gptrain.models.hf import read_state_dict

    ref = AutoModelForCausalLM.from_pretrained(tiny_hf_llama).eval()
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    by_name = read_state_dict(tmp_path / "sharded")
    assert all(isinstance(f, SafetensorsFile) for f in by_name.values())  # names only: nothing read yet
    model, _ = load_hf(str(tmp_path / "sharded"))
    ids = torch.randint(0, ref.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids), ref(ids).logits, atol=1e-5, rtol=1e-5)


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    from gptrain.errors import UserError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="cannot get 'openai-community/gpt2' from the Hugging Face Hub"):
        load_hf("openai-community/gpt2")
