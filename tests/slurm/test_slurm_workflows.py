"""The FMEngine and FSDP GPT-2 seed workflows on the real test Slurm cluster (two nodes x one
process, srun + torchrun with c10d rendezvous), ending with the same checks as on the local
scheduler (tests/workflows/conftest.py: loss falls, eval ran, checkpoints listed with losses, HF
export with gptrain's logits in transformers, generation by job name)."""

import json

import pytest

from tests.conftest import run_cli
from tests.helpers import make_dataset, write_corpus
from tests.job_helpers import ok, states_until_done
from tests.workflows.conftest import assert_workflow_outcome

pytestmark = pytest.mark.slow

SLURM = ["--scheduler", "slurm", "--nodes", "2", "--accels", "1", "--accel-type", "cpu"]


def test_fmengine_llama_pipeline_on_slurm(slurm, tiny_hf_llama, tmp_path):
    text = write_corpus(tmp_path / "corpus.txt", n_chars=40000).read_text()
    (tmp_path / "dataset.train.jsonl").write_text(
        "".join(json.dumps({"text": line}) + "\n" for line in text.splitlines()))
    (tmp_path / "deepspeed.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "train_batch_size": 4, "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}}))
    (tmp_path / "pretrained").symlink_to(tiny_hf_llama)
    r = run_cli("run", "fmengine-slurm", *SLURM, "--", "--init_ckpt", "pretrained",
                "--data_path", "dataset.train.jsonl", "--max_seq_len", "32", "--train_steps", "8",
                "--eval_steps", "4", "--save_steps", "4", "--log_steps", "1", "--pipe_parallel_size", "2",
                "--model_parallel_size", "1", "--deepspeed_config", "deepspeed.json",
                "--report_to", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert states_until_done("fmengine-slurm", timeout=600)[-1] == "succeeded", ok("logs", "fmengine-slurm")
    assert_workflow_outcome("fmengine-slurm", tmp_path)


def test_fsdp_gpt2_from_hf_weights_on_slurm(slurm, tiny_hf_gpt2, tmp_path):
    data = make_dataset(tmp_path, tokenizer="gpt2")
    ok("run", "gpt2-fsdp-slurm", *SLURM, "--", f"--hf_model={tiny_hf_gpt2}", f"--data.path={data}",
       "--parallel.dp_shard=2", "--train.activation_checkpointing=full", "--train.max_steps=8",
       "--train.batch_size=2", "--train.lr=1e-3", "--model.block_size=32", "--train.eval_every=4",
       "--checkpoint.every=4", "--data.max_eval_samples=8", "--metrics.log_every=1",
       "--metrics.report_to=tensorboard")
    assert states_until_done("gpt2-fsdp-slurm", timeout=600)[-1] == "succeeded", ok("logs", "gpt2-fsdp-slurm")
    assert_workflow_outcome("gpt2-fsdp-slurm", tmp_path)
