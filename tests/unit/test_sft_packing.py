"""SFT packing (data.packing): rows of several whole examples, each seeing only its own tokens
(models/base.Packed), give every example the logits and loss it has alone in a padded row of its
own, for GPT-2's learned positions and Llama's rotary ones, with every attention kernel; a run
says it packed, and the user's choice is kept or refused in one line."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptrain.data.formats import open_examples
from gptrain.data.loader import BlockLoader, packs_well
from gptrain.data.prepare import prepare
from gptrain.data.remote_shards import open_tokens
from gptrain.models.gpt2 import GPT
from gptrain.models.llama import Llama
from gptrain.models.shapes import GPTConfig, LlamaConfig
from tests.conftest import run_cli
from tests.helpers import TINY, train

T = 128
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    rng = np.random.default_rng(0)
    rows = [{"prompt": f"Q{i}: say " + " ".join(rng.choice(WORDS, rng.integers(1, 4))) + "\n",
             "completion": "A: " + " ".join(rng.choice(WORDS, rng.integers(1, 5)))} for i in range(60)]
    (tmp / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare([str(tmp / "sft.jsonl")], str(tmp / "data"), tokenizer="byte", val_fraction=0.1, quiet=True)
    return tmp / "data"


def loaders(path):
    tokens = open_tokens(path, "train")
    examples = open_examples(path, "train", len(tokens))
    return (BlockLoader(tokens, T, 4, examples=examples),
            BlockLoader(tokens, T, 4, examples=examples, pack=True))


def token_losses(model, batch):
    """Each target's loss, in row order (then column), and how many targets."""
    x, y, *seg = batch
    logits = model(x, segments=seg[0] if seg else None)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
    return loss[y.reshape(-1) != -100]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_each_example_packed_has_the_loss_it_has_padded(sft_data, arch, impl):
    padded, packed = loaders(sft_data)
    assert packed.n_blocks < padded.n_blocks / 2  # several examples a row
    torch.manual_seed(0)
    shape = dict(block_size=T, vocab_size=300, n_layer=2, n_head=4, n_embd=32, attn_implementation=impl)
    model = (GPT(GPTConfig(**shape)) if arch == "gpt2" else Llama(LlamaConfig(**shape, n_kv_head=2))).eval()
    with torch.no_grad():
        alone = token_losses(model, padded.batch(np.arange(padded.n_blocks)))
        together = token_losses(model, packed.batch(np.arange(packed.n_blocks)))
        unmasked = model(packed.batch([0])[0])  # the same row without its example boundaries
    assert len(alone) == len(together) > 100
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    # (and the mask matters: without it the second example of a row sees the first)
    x, y, seg = packed.batch([0])
    assert not torch.allclose(unmasked[seg == 1], model(x, segments=seg)[seg == 1], atol=1e-4)


def test_the_fused_loss_of_a_packed_batch_is_the_mean_of_its_examples_token_losses(sft_data):
    padded, packed = loaders(sft_data)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=T, vocab_size=300, n_layer=2, n_head=4, n_embd=32))
    x, y, seg = packed.batch(np.arange(2))
    with torch.no_grad():
        _, loss = model(x, y, segments=seg)
        model.fused_loss = False
        _, plain = model(x, y, segments=seg)
        each = token_losses(model, (x, y, seg))
    torch.testing.assert_close(loss, each.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain, each.mean(), rtol=1e-5, atol=1e-6)


def test_rows_hold_whole_examples_in_order_and_auto_packs_only_short_ones(sft_data):
    padded, packed = loaders(sft_data)
    x, y, seg = packed.batch(np.arange(packed.n_blocks))
    per_row = [len(set(s.tolist()) - {-1}) for s in seg]
    assert sum(per_row) == padded.n_blocks and min(per_row) >= 1
    for s in seg:  # segments 0, 1, 2, ... then the padding (-1) at the row's end
        real = s[s >= 0].tolist()
        assert real == sorted(real) and (s[len(real):] == -1).all()
    assert packs_well(padded.examples, T)  # ~35-token examples in 128
    assert not packs_well(padded.examples, 48)


def test_a_run_packs_by_default_says_so_and_a_resume_that_packs_otherwise_warns(sft_data, tmp_path):
    out = tmp_path / "run"
    args = [f"--data.path={sft_data}", f"--train.output_dir={out}", *TINY, f"--model.block_size={T}",
            "--train.batch_size=2", "--train.do_eval=false", "--checkpoint.every=2"]
    r = train(*args, "--train.max_steps=2")
    assert "instruction data packed: 54 examples in" in r.stdout, r.stdout
    r = train(*args, "--train.max_steps=4")
    assert "resumed" in r.stdout and "instruction data packed" in r.stdout and "warning" not in r.stdout
    # told not to pack, it cannot continue the packed stream: it says so and reads from the start
    r = train(*args, "--train.max_steps=6", "--data.packing=false")
    assert "data.packing changed; the data order restarts" in r.stdout, r.stdout


def test_packing_asked_where_it_cannot_run_is_one_line(sft_data, tmp_path):
    for extra, words in ((["--parallel.pp=2"], "pipeline parallel"),
                         (["--model.attn_implementation=flash_attention_2"], "flash_attention_2")):
        r = run_cli("train", f"--data.path={sft_data}", f"--train.output_dir={tmp_path / 'x'}", *TINY,
                    "--data.packing=true", *extra)
        assert r.returncode == 2 and words in r.stderr and "data.packing=false" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


@pytest.mark.parametrize("layout", ["--parallel.dp_shard=2", "--parallel.dp_replicate=2"])
def test_two_processes_packed_take_the_steps_of_one(sft_data, tmp_path, layout):
    """Packed rows under FSDP2 and DDP (two CPU ranks, each half the rows): the losses of one
    process with the whole batch (each rank's mean over its own targets, then averaged: as padded)."""
    from tests.helpers import losses

    base = [f"--data.path={sft_data}", *TINY, f"--model.block_size={T}", "--train.do_eval=false",
            "--train.max_steps=3", "--checkpoint.every=0"]
    one = train(*base, f"--train.output_dir={tmp_path / 'one'}", "--train.batch_size=4")
    two = train(*base, f"--train.output_dir={tmp_path / 'two'}", "--train.batch_size=2", layout, nproc=2)
    assert "instruction data packed" in one.stdout and "instruction data packed" in two.stdout
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for step in a:
        assert abs(a[step] - b[step]) < 1e-3 * a[step], (layout, step, a[step], b[step])
