"""Qwen2/2.5, Qwen3 and Mistral, Llama's kin in models/registry.py, against transformers' own modules
(Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, saved by transformers with random weights): logits, loss and
gradients, the export loading back into the same class, a Mistral sliding window refused past its
length and exact within it, and a Qwen2 trained from its HF folder by `gptrain train`."""

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
}


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
    assert (model.lm_head.weight is model.transformer.wte.weight) == kind.endswith("tied")
    assert (model.transformer.h["0"].self_attn.q_proj.bias is not None) == (arch == "qwen2")
    assert hasattr(model.transformer.h["0"].self_attn, "q_norm") == (arch == "qwen3")
    assert model.config.head_dim == (16 if arch == "qwen3" else 8)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids), ref(ids).logits, atol=1e-5, rtol=1e-5)
    ref.train()
    expected = ref(ids, labels=ids).loss
    expected.backward()
    _, loss = model.train()(ids[:, :-1], ids[:, 1:])
    loss.backward()
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    ours, theirs = model.transformer.h["1"].self_attn.k_proj, ref.model.layers[1].self_attn.k_proj
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


def test_a_mistral_sliding_window_is_exact_within_it_and_refused_past_it(tmp_path):
    path, ref = save_hf("mistral", tmp_path / "mistral")
    model, _ = load_hf(str(path))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(_ids(t=16)), ref(_ids(t=16)).logits, atol=1e-5, rtol=1e-5)
        with pytest.raises(UserError, match="sliding window"):
            model(_ids(t=17))


def test_what_the_family_does_not_compute_is_refused():
    base = dict(SHAPE, model_type="qwen2")
    config_from_hf(base).validate()
    with pytest.raises(UserError, match="Qwen2 models with attention_bias or mlp_bias"):
        config_from_hf({**base, "mlp_bias": True})
    assert config_from_hf({**base, "model_type": "mistral", "head_dim": 16}).head_dim == 16  # (Mistral-Nemo's kind)
    with pytest.raises(UserError, match="model_type 'gemma2' is not supported"):
        config_from_hf({**base, "model_type": "gemma2"})


def test_a_qwen2_trains_from_its_hugging_face_folder_with_and_without_lora_and_generates(data, tmp_path):
    path, _ = save_hf("qwen2", tmp_path / "qwen2")
    out = tmp_path / "run"
    shape = [a for a in TINY if not a.startswith("--model.")]
    r = train(f"--data.path={data}", f"--train.output_dir={out}", f"--model_name_or_path={path}",
              "--train.max_steps=2", "--train.batch_size=2", "--train.do_eval=false", "--model.block_size=16",
              *shape)
    assert "completed at step 2" in r.stdout, r.stdout[-2000:]
    g = run_cli("generate", str(out), "--prompt", "th", "--max-new-tokens", "4", "--seed", "0")
    assert g.returncode == 0 and g.stdout.startswith("th"), g.stderr[-2000:]
    lora = tmp_path / "lora"  # adapters on the biased q_proj and v_proj (peft's defaults for qwen2)
    r = train(f"--data.path={data}", f"--train.output_dir={lora}", f"--model_name_or_path={path}",
              "--train.max_steps=2", "--train.batch_size=2", "--train.do_eval=false", "--model.block_size=16",
              "--lora.r=4", *shape)
    assert "LoRA r=4" in r.stdout and "completed at step 2" in r.stdout, r.stdout[-2000:]


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

