"""The five seed workflows as their tutorials type them, through `gptrain run` with 2 processes
on the local scheduler (one node x 2, or two nodes x 1 joined by c10d rendezvous), each starting
from the weights the tutorial starts from (tiny HF GPT-2 / Llama directories the tests make).
Each ends with the same checks (conftest.assert_workflow_outcome)."""

import json

import pytest

from tests.conftest import run_cli
from tests.helpers import http_server, make_dataset, save_as_hf_blocks, write_corpus
from tests.job_helpers import ok
from tests.workflows.conftest import assert_workflow_outcome, metrics

pytestmark = pytest.mark.slow  # real jobs: detached supervisors, torchrun, 2 processes each

SHORT = ["--max_steps", "8", "--max_eval_samples", "8", "--report_to", "none"]
# Each seed under both layouts would be ten jobs; each runs under one, alternating, so both layouts
# (two agents meeting through c10d, and one agent with two workers) run the seeds' flags.
TWO_NODES = pytest.mark.parametrize("nodes, accels", [(2, 1)], ids=["2x1"])
TWO_ACCELS = pytest.mark.parametrize("nodes, accels", [(1, 2)], ids=["1x2"])


@pytest.fixture
def wikitext(jobs_home, tmp_path):
    """The hosted tutorial's dataset: GPT-2 token blocks saved by datasets.save_to_disk, pushed
    under the tutorial's name (imported into token files first)."""
    saved = save_as_hf_blocks(make_dataset(tmp_path, tokenizer="gpt2"), tmp_path / "gpt2-tokenized-wikitext")
    ok("data", "import", saved, "--out", tmp_path / "imported")
    ok("data", "push", "gpt2-tokenized-wikitext", tmp_path / "imported")
    return "gpt2-tokenized-wikitext"


def _tutorial_flags(model_dir, *extra):
    return ["--do_eval", "--do_train", "--dataset_name", "wikitext", "--model_name_or_path", model_dir,
            "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
            "--logging_steps", "1", "--save_steps", "4", "--eval_steps", "4", "--eval_strategy", "steps",
            "--learning_rate", "1e-3", "--block_size", "32", *SHORT, *extra]


@TWO_NODES
def test_seed0_hosted_ddp_tutorial(wikitext, tiny_hf_gpt2, tmp_path, nodes, accels):
    """Seed 0: fine-tune HF GPT-2 on the pushed wikitext blocks, HF Trainer flags, 2 processes."""
    ok("run", "fcs-experiments-simple-ddp", "--dataset", wikitext, "--nodes", nodes, "--accels", accels,
       "--", *_tutorial_flags(tiny_hf_gpt2))
    assert_workflow_outcome("fcs-experiments-simple-ddp", tmp_path, dataset=wikitext)
    events = json.loads(ok("inspect", "fcs-experiments-simple-ddp", "--json"))["events"]
    assert [e["kind"] for e in events][:4] == ["submitted", "queued", "starting", "running"]


@TWO_ACCELS
def test_seed1_attention_and_dtype_flags(wikitext, tiny_hf_gpt2, tmp_path, nodes, accels):
    """Seed 1: the same job with --attn_implementation and --torch_dtype (flash_attention_2 needs
    a GPU; on CPU the sdpa kernel in bf16 is the same command shape)."""
    ok("run", "flash", "--dataset", wikitext, "--nodes", nodes, "--accels", accels, "--",
       *_tutorial_flags(tiny_hf_gpt2, "--attn_implementation", "sdpa", "--torch_dtype", "bfloat16"))
    assert_workflow_outcome("flash", tmp_path)
    assert 'precision = "bf16"' in json.loads(ok("inspect", "flash", "--json"))["config"]


@TWO_NODES
def test_seed2_mingpt_yaml_with_http_data_and_bucket_snapshots(jobs_home, tmp_path, nodes, accels):
    """Seed 2: minGPT's DDP job from a YAML file: data read over http, snapshots to a bucket
    path, on two processes."""
    (tmp_path / "www").mkdir()
    write_corpus(tmp_path / "www" / "input.txt", 60000)
    bucket = tmp_path / "bucket"
    with http_server(tmp_path / "www") as url:
        (tmp_path / "mingpt.yaml").write_text(f"""
name: mingpt
nodes: {nodes}
accels: {accels}
config:
  data: {{path: "{url}/input.txt", tokenizer: char}}
  model: {{n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}}
  train: {{max_steps: 8, batch_size: 4, lr: 0.001, eval_every: 4}}
  checkpoint: {{every: 4, remote: "file://{bucket}/mingpt/snapshots"}}
  metrics: {{log_every: 1, report_to: none}}
""")
        ok("run", "-f", tmp_path / "mingpt.yaml")
        assert_workflow_outcome("mingpt", tmp_path)
    assert (bucket / "mingpt" / "snapshots" / "latest").is_file()


@TWO_ACCELS
def test_seed3_fmengine_llama_pipeline(jobs_home, tiny_hf_llama, tmp_path, nodes, accels):
    """Seed 3: FMEngine's command: Llama from a checkpoint, JSONL data, DeepSpeed JSON, two
    pipeline stages."""
    text = write_corpus(tmp_path / "corpus.txt", n_chars=40000).read_text()
    data = tmp_path / "dataset.train.jsonl"
    data.write_text("".join(json.dumps({"text": line}) + "\n" for line in text.splitlines()))
    ds = tmp_path / "deepspeed.json"
    ds.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "train_batch_size": 4, "gradient_clipping": 1.0,
        "bf16": {"enabled": False}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}}))
    (tmp_path / "pretrained").symlink_to(tiny_hf_llama)
    # as typed in the project's folder: every path relative to where `gptrain run` is called
    r = run_cli("run", "fmengine", "--nodes", nodes, "--accels", accels, "--", "--init_ckpt", "pretrained",
                "--data_path", data.name, "--max_seq_len", "32", "--train_steps", "8", "--eval_steps", "4",
                "--save_steps", "4", "--log_steps", "1", "--pipe_parallel_size", "2",
                "--model_parallel_size", "1", "--use_flash_attn", "false", "--deepspeed_config", ds.name,
                "--report_to", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert_workflow_outcome("fmengine", tmp_path)
    config = json.loads(ok("inspect", "fmengine", "--json"))["config"]
    assert f'init_from = "{tiny_hf_llama}"' in config and f'path = "{data}"' in config


@TWO_NODES
def test_seed4_fsdp_gpt2_from_hf_weights(jobs_home, tiny_hf_gpt2, tmp_path, nodes, accels):
    """Seed 4: GPT-2 from HF weights (--hf_model), FSDP with activation checkpointing per block,
    TensorBoard metrics, data in a flat uint16 token file."""
    data = make_dataset(tmp_path, tokenizer="gpt2")
    ok("run", "gpt2-fsdp", "--nodes", nodes, "--accels", accels, "--", f"--hf_model={tiny_hf_gpt2}",
       f"--data.path={data}",
       "--parallel.dp_shard=2", "--train.activation_checkpointing=full", "--train.max_steps=8",
       "--train.batch_size=2", "--train.lr=1e-3", "--model.block_size=32", "--train.eval_every=4",
       "--checkpoint.every=4", "--data.max_eval_samples=8", "--metrics.log_every=1",
       "--metrics.report_to=tensorboard")
    assert_workflow_outcome("gpt2-fsdp", tmp_path)
    from gptrain.jobs.folder import job_dir

    assert list(job_dir("gpt2-fsdp").rglob("events.out.tfevents.*")), "no TensorBoard events"
    assert len(metrics("gpt2-fsdp")) >= 8
