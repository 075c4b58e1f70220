"""The generic path on 2 FSDP2 ranks: a GPT-NeoX (no spec: transformers' own module) fine-tuned
with each decoder layer sharded and recomputed in backward (activation checkpointing) trains as
the single process does (the same blocks: B rows per rank vs 2B in one), and its export reloads
in transformers with the weights the ranks wrote."""

import pytest
import torch

from tests.helpers import TINY, losses, model_tensors, step_dir, train

pytestmark = pytest.mark.slow
STEPS = 4


def _args(data, model, out, rows):
    return [f"--data.path={data}", f"--model_name_or_path={model}", f"--train.output_dir={out}",
            f"--train.batch_size={rows}", f"--train.max_steps={STEPS}", "--model.block_size=32",
            "--train.do_eval=false", "--train.dialect=gptrain", *[f for f in TINY if not f.startswith("--model.")]]


def test_two_fsdp2_ranks_train_a_family_without_a_spec_as_one_process_does(data, tiny_hf_neox, tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.conftest import run_cli

    one, two = tmp_path / "one", tmp_path / "two"
    train(*_args(data, tiny_hf_neox, one, 4))
    train(*_args(data, tiny_hf_neox, two, 2), "--parallel.dp_shard=2", "--gradient_checkpointing", nproc=2)
    got, expected = losses(two), losses(one)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert abs(got[step] - expected[step]) < 1e-4, (step, got[step], expected[step])
    mine, theirs = model_tensors(step_dir(two, STEPS)), model_tensors(step_dir(one, STEPS))
    assert set(mine) == set(theirs) and all(k.startswith("model.") for k in mine)
    for key in theirs:
        torch.testing.assert_close(mine[key], theirs[key], atol=1e-4, rtol=0, msg=key)
    r = run_cli("export", str(two), "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-2000:]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    for key, value in exported.state_dict().items():
        torch.testing.assert_close(value, mine[f"model.{key}"], atol=0, rtol=0, msg=key)
