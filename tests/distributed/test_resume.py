"""Exact resume, atomic checkpoints, and loading checkpoints on another world size."""

import shutil
import subprocess
import sys

import pytest
import torch

from gptrain import run_layout
from gptrain.weights.layout import find_latest, step_name
from tests.helpers import TINY, env, losses, model_tensors, rewind_to, step_dir, train

pytestmark = pytest.mark.slow  # real multi-process runs: `pytest -m slow` runs them alone

N, K = 8, 4


@pytest.fixture(scope="module")
def straight_run(data, tmp_path_factory):
    """The uninterrupted run of each layout, made once for the tests that compare with it."""
    runs = {}

    def get(nproc, layout):
        key = (nproc, *layout)
        if key not in runs:
            runs[key] = tmp_path_factory.mktemp("straight")
            train(*_args(data, runs[key], *layout), nproc=nproc)
        return runs[key]
    return get


def _args(data, out, *extra):
    return [f"--data.path={data}", f"--train.output_dir={out}", "--train.batch_size=4",
            f"--train.max_steps={N}", "--train.do_eval=false", "--model.dropout=0.1", *TINY,
            f"--checkpoint.every={K}", *extra]


@pytest.mark.parametrize("nproc, layout", [(1, []), (2, ["--parallel.dp_shard=2"])],
                         ids=["single", "fsdp2"])
def test_resume_is_bitwise_exact(data, straight_run, tmp_path, nproc, layout):
    straight, resumed = straight_run(nproc, layout), tmp_path / "resumed"
    shutil.copytree(straight, resumed)  # the same run, then as if it stopped after step K
    rewind_to(resumed, K)
    r = train(*_args(data, resumed, *layout), nproc=nproc)
    assert f"resumed from {step_dir(resumed, K)} at step {K}" in r.stdout
    assert losses(resumed) == losses(straight)  # exact float equality, every step
    a = model_tensors(step_dir(straight, N))
    b = model_tensors(step_dir(resumed, N))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_two_rank_checkpoint_loads_in_one_process_and_hf(data, straight_run, tmp_path):
    out = shutil.copytree(straight_run(2, ["--parallel.dp_shard=2"]), tmp_path / "fsdp")  # a 2-rank FSDP run
    ckpt = find_latest(out)
    # 1 process: inference, export to HF, and resuming training on a different world size
    from transformers import AutoModelForCausalLM

    from gptrain.models.hf import export_hf
    from gptrain.models.load import load_for_inference

    model, tok = load_for_inference(ckpt)
    hf_dir = export_hf(model, tok, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = torch.randint(0, tok.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=1e-5)
    r = train(*_args(data, out, f"--train.max_steps={N + 2}"))
    assert f"at step {N}" in r.stdout and f"completed at step {N + 2}" in r.stdout


CRASH = """
import os, sys
from gptrain import config, config_options
from gptrain.train import checkpoint, trainer

real_rename = os.rename
def rename(src, dst):
    if str(dst).endswith("step-000004"):
        os._exit(9)  # the process dies after writing the tensors, before the commit
    real_rename(src, dst)
checkpoint.os.rename = rename
trainer.train(config_options.parse_train_args(sys.argv[1:]))
"""


def test_killed_during_save_resumes_from_previous_checkpoint(data, tmp_path):
    out = tmp_path / "run"
    args = _args(data, out, "--checkpoint.every=2")
    crashed = subprocess.run([sys.executable, "-c", CRASH, *args], capture_output=True, text=True, env=env())
    assert crashed.returncode == 9
    half = run_layout.checkpoints_dir(out) / f".tmp-{step_name(4)}"
    assert half.is_dir()  # half-written, never visible
    assert find_latest(out).name == step_name(2)
    r = train(*args)
    assert "resumed from" in r.stdout and "at step 2" in r.stdout
    assert not half.exists()
    straight = tmp_path / "straight"
    train(*_args(data, straight, "--checkpoint.every=2"))
    assert losses(out) == losses(straight)


@pytest.mark.parametrize("nproc, layout", [(1, []), (2, ["--parallel.dp_shard=2"])], ids=["single", "fsdp2"])
def test_async_checkpoints_resume_exactly(data, straight_run, tmp_path, nproc, layout):
    """Checkpoints written in the background while training goes on hold the state of their step."""
    straight, resumed = straight_run(nproc, layout), tmp_path / "resumed"
    r = train(*_args(data, resumed, *layout, "--checkpoint.async_save=true"), nproc=nproc)
    assert "in the background" in r.stdout
    rewind_to(resumed, K)
    train(*_args(data, resumed, *layout, "--checkpoint.async_save=true"), nproc=nproc)
    assert losses(resumed) == losses(straight)
    a = model_tensors(step_dir(straight, N))
    b = model_tensors(step_dir(resumed, N))
    for key in a:
        assert torch.equal(a[key], b[key]), key
