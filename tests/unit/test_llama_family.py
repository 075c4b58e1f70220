"""Qwen2/2.5, Qwen3, Mistral, Phi-3, OLMo 2, Gemma 2 and Gemma 3, Llama's kin in models/registry.py
(Gemma's module is models/gemma.py), against transformers' own modules (Qwen2ForCausalLM, ...,
Gemma3ForCausalLM, saved by transformers with random weights): logits, loss and gradients, the export
loading back into the same class, a Mistral sliding window exact within and past its length (Gemma's
windowed layers and soft caps, set low enough to matter, in the logits), and a Qwen2, a Phi-3, an
OLMo 2 and a Gemma 2 fine-tuned with LoRA from their HF folders by `gptrain train`."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from gptrain.errors import UserError
from gptrain.models.hf import config_from_hf, export_hf, load_hf
from tests.conftest import run_cli
from tests.helpers import TINY, train

SHAPE = dict(vocab_size=300, hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0)
KINDS = {  # name -> (transformers config class, model class, its extra settings)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(rope_theta=1000000.0, head_dim=16, tie_word_embeddings=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(rope_theta=10000.0, sliding_window=16,
                                                            tie_word_embeddings=False)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(rope_theta=10000.0, pad_token_id=0, tie_word_embeddings=False)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(rope_theta=500000.0, pad_token_id=0, tie_word_embeddings=False)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(  # caps low enough to matter, a window of 8 of 12
        head_dim=16, query_pre_attn_scalar=12, sliding_window=8, attn_logit_softcapping=2.0,
        final_logit_softcapping=1.5, tie_word_embeddings=True)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, query_pre_attn_scalar=12, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=True)),
}
ATTENTION_INPUT = {"phi3": "qkv_proj"}  # the Linear whose gradients are compared (k_proj elsewhere)


def save_hf(kind, out):
    import transformers

    config_cls, model_cls, extra = KINDS[kind]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_cls)(**SHAPE, **extra)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # transformers zeroes biases and sets norms to 1 at init: random ones, tested
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(out)
    return out, model


def _ids(t=12, seed=1):
    return torch.randint(0, 300, (2, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_loss_gradients_and_export_match_transformers(kind, tmp_path):
    path, ref = save_hf(kind, tmp_path / kind)
    model, _ = load_hf(str(path))
    arch = kind.split("-")[0]
    assert model.config.arch == arch
    assert (model.lm_head.weight is model.transformer.wte.weight) == (kind.endswith("tied") or arch.startswith("gemma"))
    attn = model.transformer.h["0"].self_attn
    assert ((getattr(attn, "q_proj", None) or attn.qkv_proj).bias is not None) == (arch == "qwen2")
    assert hasattr(model.transformer.h["0"].self_attn, "q_norm") == (arch in ("qwen3", "olmo2", "gemma3"))
    assert hasattr(model.transformer.h["0"], "input_layernorm") == (arch != "olmo2")  # (OLMo 2: norms after)
    assert model.config.head_dim == (16 if arch in ("qwen3", "gemma2", "gemma3") else 8)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids), ref(ids).logits, atol=1e-5, rtol=1e-5)
    ref.train()
    expected = ref(ids, labels=ids).loss
    expected.backward()
    _, loss = model.train()(ids[:, :-1], ids[:, 1:])
    loss.backward()
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    which = ATTENTION_INPUT.get(arch, "k_proj")
    ours, theirs = (getattr(m.self_attn, which) for m in (model.transformer.h["1"], ref.model.layers[1]))
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, atol=1e-6, rtol=1e-4)
    if arch == "qwen2":
        torch.testing.assert_close(ours.bias.grad, theirs.bias.grad, atol=1e-6, rtol=1e-4)

    export_hf(model.eval(), None, tmp_path / "exported")
    back, info = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert type(back) is type(ref) and not any(info.values()), info
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(ids).logits, model(ids), atol=1e-5, rtol=1e-5)
    if arch == "mistral":
        assert json.loads((tmp_path / "exported" / "config.json").read_text())["sliding_window"] == 16


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_mistral_sliding_window_is_exact_within_it_and_past_it(tmp_path, impl):
    """A window of 16 over 40 tokens: each sees the 15 before it (HF's mask), in training's
    forward, packed rows, and generation's cache, prefill and one token at a time (the window
    was refused past its length before)."""
    from gptrain.models.generate import KVCache

    path, ref = save_hf("mistral", tmp_path / "mistral")
    model, _ = load_hf(str(path), attn_implementation=impl)
    ids = _ids(t=40)
    with torch.no_grad():
        expected = ref(ids).logits
        torch.testing.assert_close(model.eval()(ids), expected, atol=1e-5, rtol=1e-5)
        assert (ref(ids[:, 1:]).logits[:, -1] - expected[:, -1]).abs().max() < 1e-5  # (the window: 1st unseen)
        assert (ref(ids[:, 24:]).logits[:, -1] - expected[:, -1]).abs().max() > 1e-3  # (and the 16th seen)
        packed = model(ids, segments=torch.zeros_like(ids))  # one example a row: the same as unpacked
        torch.testing.assert_close(packed, expected, atol=1e-5, rtol=1e-5)
        cache = KVCache(2, 40, torch.float32, "cpu")
        steps = [model(ids[:, :30], cache=cache)]
        cache.pos = 30
        for t in range(30, 40):
            steps.append(model(ids[:, t:t + 1], cache=cache, start_pos=t))
            cache.pos = t + 1
        torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_what_the_family_does_not_compute_is_refused():
    base = dict(SHAPE, model_type="qwen2")
    config_from_hf(base).validate()
    with pytest.raises(UserError, match="Qwen2 models with attention_bias or mlp_bias"):
        config_from_hf({**base, "mlp_bias": True})
    assert config_from_hf({**base, "model_type": "mistral", "head_dim": 16}).head_dim == 16  # (Mistral-Nemo's kind)
    with pytest.raises(UserError, match="model_type 'no_such_type' is not supported"):
        config_from_hf({**base, "model_type": "no_such_type"})
    assert config_from_hf({**base, "model_type": "gpt_neox"}).arch == "hf_generic"  # (no spec: transformers' own)
    gemma = {**base, "model_type": "gemma3_text", "head_dim": 16}
    assert config_from_hf({**gemma, "layer_types": ["sliding_attention", "full_attention"]}).sliding_pattern == 2
    with pytest.raises(UserError, match="not a repeating pattern"):  # (a global layer first, then windowed)
        config_from_hf({**gemma, "layer_types": ["full_attention", "sliding_attention"]})
    with pytest.raises(UserError, match="rope scaling 'linear'"):  # (Gemma 3 4B's global layers)
        config_from_hf({**gemma, "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                                                     "sliding_attention": {"rope_type": "default"}}})
    with pytest.raises(UserError, match="partial_rotary_factor 0.75 is not supported"):  # (Phi-4-mini's)
        config_from_hf({**base, "model_type": "phi3", "partial_rotary_factor": 0.75})
    with pytest.raises(UserError, match="rope scaling 'longrope'"):  # (Phi-3's 128k context)
        config_from_hf({**base, "model_type": "phi3", "rope_scaling": {"type": "longrope"}})


@pytest.mark.parametrize("kind", ["qwen2", "phi3", "olmo2", "gemma2"])
def test_lora_on_it_trains_from_its_hugging_face_folder_generates_and_exports_what_peft_computes(kind, data, tmp_path):
    """Adapters on the spec's targets (qwen2: the biased q_proj and v_proj; phi3: the fused
    qkv_proj); the peft export, applied by peft on the HF base, computes the merged export."""
    from peft import PeftModel

    path, _ = save_hf(kind, tmp_path / kind)
    lora = tmp_path / "lora"
    shape = [a for a in TINY if not a.startswith("--model.")]
    r = train(f"--data.path={data}", f"--train.output_dir={lora}", f"--model_name_or_path={path}",
              "--train.max_steps=3", "--train.batch_size=2", "--train.do_eval=false", "--model.block_size=16",
              "--lora.r=4", *shape, "--train.lr=2e-2", "--train.warmup_steps=0", "--train.precision=fp32")
    assert "LoRA r=4" in r.stdout and "completed at step 3" in r.stdout, r.stdout[-2000:]
    g = run_cli("generate", str(lora), "--prompt", "th", "--max-new-tokens", "4", "--seed", "0")
    assert g.returncode == 0 and g.stdout.startswith("th"), g.stderr[-2000:]
    for fmt, where in (("hf", "merged"), ("peft", "adapter")):
        r = run_cli("export", str(lora), "--format", fmt, "--out", str(tmp_path / where))
        assert r.returncode == 0, r.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path).eval(), tmp_path / "adapter").eval()
    with torch.no_grad():
        ids = _ids()
        diff = (merged(ids).logits - adapted(ids).logits).abs().max().item()
        plain = (merged(ids).logits - AutoModelForCausalLM.from_pretrained(path).eval()(ids).logits).abs().max().item()
    assert diff < 1e-4 < plain, (diff, plain)  # the adapters matter, and peft applies them as gptrain does


def test_a_qwen3_from_its_preset_starts_with_unit_norms_and_refuses_tensor_parallel():
    from gptrain.distributed.parallelize import check_layout
    from gptrain.distributed.mesh import ParallelDims
    from gptrain.models.registry import PRESETS, build, spec_of

    shape = dict(PRESETS["qwen3-tiny"])
    cfg = spec_of(shape.pop("arch")).config_class(vocab_size=300, **shape)
    model = build(cfg)
    attn = model.transformer.h["0"].self_attn
    assert torch.equal(attn.q_norm.weight, torch.ones(32)) and attn.q_proj.out_features == 4 * 32
    with pytest.raises(UserError, match="tensor parallel of a qwen3 model"):
        check_layout(cfg, ParallelDims(dp_replicate=1, dp_shard=1, tp=2, pp=1, world=2))
    for preset, why in (("phi3-tiny", "its fused projections"), ("olmo2-tiny", "its query/key norms"),
                        ("gemma2-tiny", "its norms after each sub-layer")):
        shape = dict(PRESETS[preset])
        cfg = spec_of(shape.pop("arch")).config_class(vocab_size=300, **shape)
        with pytest.raises(UserError, match=f"tensor parallel of a {cfg.arch} model \\({why}\\)"):
            check_layout(cfg, ParallelDims(dp_replicate=1, dp_shard=1, tp=2, pp=1, world=2))

