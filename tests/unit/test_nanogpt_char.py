"""A character-level nanoGPT run used as its users have it: ckpt.pt in out/, meta.pkl in
data/<dataset>/ (as nanoGPT's prepare.py writes it), `generate` finding the vocabulary as nanoGPT's
sample.py does; a meta.pkl that names a class is refused, never run (models/nanogpt.py)."""

import os
import pickle

import pytest

from gptrain.errors import UserError
from gptrain.models.nanogpt import load_nanogpt
from tests.conftest import run_cli
from tests.helpers import nanogpt_ckpt
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"


def char_run(root, dataset="shakespeare_char"):
    """nanoGPT's layout: data/<dataset>/meta.pkl (prepare.py) and out/ckpt.pt (train.py)."""
    chars = sorted(set(TEXT))
    meta = root / "data" / dataset / "meta.pkl"
    meta.parent.mkdir(parents=True)
    with open(meta, "wb") as f:  # what nanoGPT's data/shakespeare_char/prepare.py writes
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)
    ckpt = nanogpt_ckpt(root / "out" / "ckpt.pt", vocab=len(chars), n_layer=1, block=32)
    import torch

    state = torch.load(ckpt, weights_only=True)
    state["config"] = {"dataset": dataset}
    torch.save(state, ckpt)
    return ckpt, meta


def test_generate_reads_the_runs_character_vocabulary(tmp_path, isolated_home):
    ckpt, _ = char_run(tmp_path)
    model, tok = load_nanogpt(ckpt)
    assert tok is not None and tok.vocab_size == model.config.vocab_size == len(set(TEXT))
    assert tok.decode(tok.encode("hear me")) == "hear me"
    r = run_cli("generate", ckpt, "--prompt", "First", "--max-new-tokens", "5", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("First") and len(r.stdout.rstrip("\n")) >= 6, r.stdout


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/gptrain-meta-pkl-ran",))


def test_a_meta_pkl_naming_code_is_refused_not_run(tmp_path):
    ckpt, meta = char_run(tmp_path)
    with open(meta, "wb") as f:
        pickle.dump({"vocab_size": 3, "itos": Boom()}, f)
    if os.path.exists("/tmp/gptrain-meta-pkl-ran"):
        os.unlink("/tmp/gptrain-meta-pkl-ran")
    with pytest.raises(UserError, match="not nanoGPT's character vocabulary.*only plain data"):
        load_nanogpt(ckpt)
    assert not os.path.exists("/tmp/gptrain-meta-pkl-ran")


def test_a_dataset_name_with_a_path_is_not_followed(tmp_path):
    ckpt, _ = char_run(tmp_path / "run")
    import torch

    state = torch.load(ckpt, weights_only=True)
    state["config"] = {"dataset": "../../elsewhere"}
    torch.save(state, ckpt)
    model, tok = load_nanogpt(ckpt)
    assert tok is None  # no meta.pkl where it may look: generate asks for --tokenizer


def test_the_export_carries_its_tokenizer_and_gives_the_same_logits(tmp_path, isolated_home):
    """`export` of a char-level run: transformers loads the model with a tokenizer that round-trips
    (not a 1-token one) and the model's logits are gptrain's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt, _ = char_run(tmp_path)
    r = run_cli("export", ckpt, "--out", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours, our_tok = load_nanogpt(ckpt)
    ids = tok("hear me speak.\nFirst")["input_ids"]
    assert ids == our_tok.encode("hear me speak.\nFirst") and len(tok) == our_tok.vocab_size
    assert tok.decode(ids) == "hear me speak.\nFirst"
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(theirs(x).logits, ours.eval()(x), atol=1e-5, rtol=1e-5)


def test_a_byte_tokenizer_exports_as_one_autotokenizer_loads():
    from transformers import AutoTokenizer

    from gptrain.tokenizers import ByteTokenizer
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        ByteTokenizer().save_hf(Path(d))
        tok = AutoTokenizer.from_pretrained(d)
        text = "héllo\nwörld 😀"
        assert tok(text)["input_ids"] == ByteTokenizer().encode(text) and tok.decode(tok(text)["input_ids"]) == text
        assert (len(tok), tok.eos_token_id) == (257, 256)


def test_a_biasless_model_exports_as_gptrain_and_transformers_both_load(tmp_path, isolated_home):
    """nanoGPT's bias=False: the export has zero biases (HF's GPT-2 always has them), and both
    gptrain and transformers load it with the model's logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from gptrain.models.load import load_model

    ckpt, _ = char_run(tmp_path)
    state = torch.load(ckpt, weights_only=True)
    state["model"] = {k: v for k, v in state["model"].items() if not k.endswith(".bias")}
    state["model_args"]["bias"] = False
    torch.save(state, ckpt)
    ours, _ = load_nanogpt(ckpt)
    assert run_cli("export", ckpt, "--out", tmp_path / "hf").returncode == 0
    again, _ = load_model(str(tmp_path / "hf"))
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.tensor([[1, 5, 7, 2, 9]])
    with torch.no_grad():
        want = ours.eval()(x)
        torch.testing.assert_close(again.eval()(x), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(theirs(x).logits, want, atol=1e-5, rtol=1e-5)


def test_the_real_nanogpt_model_computes_what_gptrain_loads(tmp_path):
    """The vendored nanoGPT model.py (its nn.GELU() is the exact GELU, not GPT-2's tanh form):
    its checkpoint, loaded by gptrain and exported to transformers, gives nanoGPT's own logits.
    The MLP input is scaled so the two GELUs differ by far more than the tolerance."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    spec = importlib.util.spec_from_file_location(
        "nanogpt_model", __import__("pathlib").Path(__file__).parents[1] / "third_party" / "nanogpt" / "model.py")
    nano = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nano)
    torch.manual_seed(0)
    args = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, bias=True, vocab_size=40, dropout=0.0)
    theirs = nano.GPT(nano.GPTConfig(**args)).eval()
    with torch.no_grad():
        for block in theirs.transformer.h:
            block.mlp.c_fc.weight.mul_(40)
    ckpt = tmp_path / "out" / "ckpt.pt"
    ckpt.parent.mkdir()
    torch.save({"model": theirs.state_dict(), "model_args": args, "iter_num": 5, "best_val_loss": 2.0,
                "config": {"dataset": "none"}}, ckpt)
    ours, _ = load_nanogpt(ckpt)
    x = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = torch.cat([theirs(x[:, :t + 1])[0] for t in range(16)], dim=1)  # nanoGPT: last position only
        got = ours.eval()(x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        tanh = torch.nn.functional.gelu(torch.tensor([1.3]), approximate="tanh") - torch.nn.functional.gelu(torch.tensor([1.3]))
        assert abs(tanh.item()) > 1e-4  # the two forms do differ where the test looks
    assert run_cli("export", ckpt, "--out", tmp_path / "hf").returncode == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, want, atol=1e-5, rtol=1e-5)
