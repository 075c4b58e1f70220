"""The generic path (models/generic.py): a family gptrain has no spec for, GPT-NeoX here, built
offline from its transformers config, trains as transformers' own module: its logits are
transformers' at import, its export reloads in transformers with the same logits, generation
with transformers' KV cache equals generation without one, and what it cannot do (tensor and
pipeline parallel, LoRA, packed rows, a model's own code) is one line each."""

import json

import pytest
import torch

from gptrain.errors import UserError
from tests.conftest import run_cli
from tests.helpers import TINY, train


def _ids(n=16, vocab=60, seed=0):
    return torch.randint(0, vocab, (2, n), generator=torch.Generator().manual_seed(seed))


def test_a_family_without_a_spec_is_transformers_own_module(tiny_hf_neox):
    from transformers import AutoModelForCausalLM

    from gptrain.models.hf import load_hf

    theirs = AutoModelForCausalLM.from_pretrained(tiny_hf_neox).eval()
    ours, _ = load_hf(str(tiny_hf_neox))
    assert ours.config.arch == "hf_generic" and (ours.config.n_layer, ours.config.block_size) == (2, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(_ids()), theirs(_ids()).logits, atol=1e-5, rtol=0)
        logits, loss = ours(_ids(), targets=_ids(seed=1))
        expected = torch.nn.functional.cross_entropy(theirs(_ids()).logits.flatten(0, 1), _ids(seed=1).flatten())
    assert abs(loss.item() - expected.item()) < 1e-5


def test_it_fine_tunes_exports_and_generates(tiny_hf_neox, data, tmp_path):
    from transformers import AutoModelForCausalLM

    from gptrain.models.generate import generate
    from gptrain.models.load import load_model

    out = tmp_path / "run"
    r = train(f"--data.path={data}", f"--model_name_or_path={tiny_hf_neox}", f"--train.output_dir={out}",
              "--train.max_steps=3", "--train.batch_size=2", "--model.block_size=32", "--train.dialect=gptrain",
              *[f for f in TINY if not f.startswith("--model.")], "--train.do_eval=true")
    assert "completed at step 3" in r.stdout and "eval step 3" in r.stdout, r.stdout[-2000:]
    e = run_cli("export", str(out), "--out", str(tmp_path / "hf"))
    assert e.returncode == 0, e.stderr[-2000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt_neox"
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ours, _ = load_model(str(out))
    base = AutoModelForCausalLM.from_pretrained(tiny_hf_neox).eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(_ids()).logits, ours(_ids()), atol=1e-5, rtol=0)
        assert (exported(_ids()).logits - base(_ids()).logits).abs().max() > 1e-4  # it trained
        # greedy generation through transformers' KV cache equals a loop that recomputes everything
        prompt = _ids(n=5)[:1]
        cached = generate(ours, prompt, max_new_tokens=8)
        seq = prompt
        for _ in range(8):
            seq = torch.cat([seq, exported(seq).logits[:, -1:].argmax(-1)], dim=1)
    assert cached.tolist() == seq.tolist()
    g = run_cli("generate", str(out), "--prompt", "th", "--max-new-tokens", "4", "--seed", "0")
    assert g.returncode == 0 and g.stdout.startswith("th"), g.stderr[-2000:]
    ev = run_cli("eval", str(out), "--dataset", str(data))
    assert ev.returncode == 0 and "perplexity" in ev.stdout, ev.stderr[-2000:]


def test_what_it_cannot_do_is_one_line(tiny_hf_neox, tmp_path):
    from gptrain.config_options import parse_train_args
    from gptrain.distributed.parallelize import check_layout
    from gptrain.models.hf import load_hf
    from gptrain.distributed.mesh import ParallelDims

    with pytest.raises(UserError, match="LoRA on transformers' own module.* is not supported yet"):
        parse_train_args([f"--model_name_or_path={tiny_hf_neox}", "--lora_r=4"])
    model, _ = load_hf(str(tiny_hf_neox))
    for dims, says in ((ParallelDims(1, 1, 2, 1, 2), "tensor parallel of a hf_generic model"),
                       (ParallelDims(1, 1, 1, 2, 2), "pipeline parallel of")):
        with pytest.raises(UserError, match=says):
            check_layout(model.config, dims)
    with pytest.raises(UserError, match="packed rows need gptrain's own attention"):
        model(_ids(), targets=_ids(), segments=torch.zeros(2, 16, dtype=torch.long))
    # a model that needs its own code is never run; a type transformers does not know is one line
    import shutil

    for change, says in (({"auto_map": {"AutoModelForCausalLM": "evil.Model"}}, "needs its own Python code"),
                         ({"model_type": "no_such_type"}, "model_type 'no_such_type' is not supported"),
                         ({"num_hidden_layers": "x"}, "is not one transformers reads")):
        folder = tmp_path / f"m{len(change)}-{list(change)[0]}"
        shutil.copytree(tiny_hf_neox, folder)
        hf = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**hf, **change}))
        with pytest.raises(UserError, match=says):
            load_hf(str(folder))
    # weights missing from the folder are refused, not started at random
    from safetensors.torch import load_file, save_file

    short = tmp_path / "short"
    shutil.copytree(tiny_hf_neox, short)
    tensors = load_file(short / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "layers.1.mlp" not in k}, short / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(UserError, match="does not hold a complete gpt_neox model: missing keys"):
        load_hf(str(short))


@pytest.mark.parametrize("where", ["../outside/shard.safetensors", "/etc/passwd", "ABSOLUTE"])
def test_a_weights_index_naming_a_file_elsewhere_is_refused(tiny_hf_neox, tmp_path, where):
    """#47 round 6 (high): the generic path handed a model.safetensors.index.json naming
    '../outside/shard.safetensors', '/etc/passwd' or an absolute path to transformers, which read
    the weights from there (and trained on them); the own families' reader refused it."""
    import shutil

    from safetensors.torch import load_file, save_file

    from gptrain.models.hf import load_hf

    folder, outside = tmp_path / "m", tmp_path / "outside"
    shutil.copytree(tiny_hf_neox, folder)
    outside.mkdir()
    tensors = load_file(folder / "model.safetensors")
    save_file(tensors, outside / "shard.safetensors", metadata={"format": "pt"})
    (folder / "model.safetensors").unlink()
    target = str(outside / "shard.safetensors") if where == "ABSOLUTE" else where
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: target for k in tensors}}))
    with pytest.raises(UserError, match="is not a plain file name in its own directory"):
        load_hf(str(folder))


def test_quantized_pickled_and_malformed_folders_are_one_line(tiny_hf_neox, tmp_path):
    """#47 round 6: a bitsandbytes-quantized config (ImportError traceback), a pickled
    pytorch_model.bin (UnpicklingError traceback; never unpickled), a config.json that is a JSON
    list (AttributeError traceback) or nests 100,000 deep (RecursionError)."""
    import pickle
    import shutil

    from gptrain.models.hf import load_hf

    def copy(name):
        folder = tmp_path / name
        shutil.copytree(tiny_hf_neox, folder)
        return folder

    q = copy("q")
    hf = json.loads((q / "config.json").read_text())
    (q / "config.json").write_text(json.dumps({**hf, "quantization_config": {"quant_method": "bitsandbytes",
                                                                             "load_in_4bit": True}}))
    with pytest.raises(UserError, match=r"weights are quantized \(bitsandbytes\)"):
        load_hf(str(q))

    class Evil:
        def __reduce__(self):
            return (print, ("PICKLE RAN",))

    p = copy("p")
    (p / "model.safetensors").unlink()
    (p / "pytorch_model.bin").write_bytes(pickle.dumps({"x": Evil()}))
    with pytest.raises(UserError, match="transformers cannot load its gpt_neox weights"):
        load_hf(str(p))
    for text in ("[1, 2]", "[" * 100_000 + "]" * 100_000):
        bad = copy(f"c{len(text)}")
        (bad / "config.json").write_text(text)
        r = run_cli("train", f"--model_name_or_path={bad}", "--data.path=x", "--train.max_steps=1")
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_encoder_and_a_folder_holding_an_adapter_are_one_line(tiny_hf_neox, tmp_path):
    """#47 round 6 G.bert (medium): a BERT folder (BertLMHeadModel: bidirectional) trained with
    next-token loss, seeing the tokens it predicts; G.A3 (medium): a PEFT adapter saved beside the
    weights was loaded frozen in by transformers, then a RuntimeError traceback."""
    import shutil

    from transformers import BertConfig, BertLMHeadModel

    from gptrain.models.hf import load_hf

    bert = tmp_path / "bert"
    BertLMHeadModel(BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(bert)
    with pytest.raises(UserError, match="a bert model is an encoder"):
        load_hf(str(bert))
    adapted = tmp_path / "adapted"
    shutil.copytree(tiny_hf_neox, adapted)
    (adapted / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["query_key_value"]}))
    with pytest.raises(UserError, match="holds a PEFT adapter"):
        load_hf(str(adapted))


def test_a_weights_file_that_is_a_pipe_is_one_line(tiny_hf_neox, tmp_path):
    """#47 round 7 G.v6 (medium): an index naming a FIFO in the folder had transformers block on
    it for ever, deaf to SIGTERM."""
    import os
    import shutil

    from gptrain.models.hf import load_hf

    folder = tmp_path / "v6"
    shutil.copytree(tiny_hf_neox, folder)
    keys = list(json.loads((folder / "config.json").read_text()))[:1] or ["x"]
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "fifo.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {keys[0]: "fifo.safetensors"}}))
    with pytest.raises(UserError, match="is not a plain file|is not a Hugging Face model directory"):
        load_hf(str(folder))
    (folder / "model.safetensors.index.json").unlink()
    os.mkfifo(folder / "model.safetensors")
    with pytest.raises(UserError, match="is not a plain file|is not a Hugging Face model directory"):
        load_hf(str(folder))
