"""The FMEngine workflow (seed 003) in gptrain: a Llama initialised from a checkpoint, JSONL
data, pipeline parallel, DeepSpeed-style flags and config, then generate and export."""

import json

import pytest
import torch

from gptrain import run_layout
from tests.conftest import run_cli
from tests.helpers import losses, step_dir, train, write_corpus

pytestmark = pytest.mark.slow  # multi-process training


def test_fmengine_pipeline_command_runs_on_jsonl(tiny_hf_llama, tmp_path):
    text = write_corpus(tmp_path / "corpus.txt", n_chars=40000).read_text()
    data = tmp_path / "dataset.train.jsonl"
    with data.open("w") as f:
        for para in text.split("\n\n"):
            f.write(json.dumps({"text": para}) + "\n")
    ds = tmp_path / "llama.json"
    ds.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "train_batch_size": 8, "steps_per_print": 100,
        "gradient_clipping": 1.0, "bf16": {"enabled": False}, "fp16": {"enabled": False},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8}},
        "wall_clock_breakdown": True}))
    out = tmp_path / "models"
    r = train("--output_dir", out, "--init_ckpt", tiny_hf_llama, "--data_path", data,
              "--max_seq_len", "32", "--train_steps", "4", "--eval_steps", "2", "--save_steps", "4",
              "--log_steps", "1", "--pipe_parallel_size", "2", "--model_parallel_size", "1",
              "--use_flash_attn", "false", "--use_fused_ops", "false", "--deepspeed_config", ds,
              "--report_to", "none", "--max_eval_samples", "4", nproc=2)
    assert "wall_clock_breakdown" in r.stderr  # the settings gptrain does not use are named
    assert sorted(losses(out)) == [1, 2, 3, 4]
    import tomllib

    resolved = tomllib.loads(run_layout.config_file(out).read_text())  # 8 = 4 microbatches of 2
    assert (resolved["train"]["batch_size"], resolved["parallel"]["pp_microbatches"]) == (8, 4)
    assert step_dir(out, 4).is_dir()

    g = run_cli("generate", out, "--prompt", "ROMEO:", "--max-new-tokens", "8")
    assert g.returncode == 0, g.stderr
    assert g.stdout.startswith("ROMEO:")

    e = run_cli("export", out, "--format", "hf", "--out", tmp_path / "hf")
    assert e.returncode == 0, e.stderr
    from transformers import LlamaForCausalLM

    from gptrain.models.load import load_model

    ours, tok = load_model(str(out))
    theirs = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([tok.encode("To be, or not to be")])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), atol=1e-5, rtol=1e-5)
