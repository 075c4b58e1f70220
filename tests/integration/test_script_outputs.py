"""What a user's script leaves behind, read back by gptrain: real script jobs (detached
supervisors, torchrun) writing HF Trainer checkpoints, nanoGPT ckpt.pt files, metrics.jsonl,
and failing on one rank."""

import json
import textwrap

import pytest

from tests.conftest import run_cli
from tests.job_helpers import ok, wait_for
pytestmark = pytest.mark.slow

# Where a script puts its outputs: $GPTRAIN_OUTPUT_DIR (jobs/NAME/output/)
OUT = ("import os, pathlib\n"
       "out = pathlib.Path(os.environ['GPTRAIN_OUTPUT_DIR'])\n")


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def jobs_row(name):
    for line in ok("jobs").splitlines()[1:]:
        cols = line.split()
        if cols[0] == name:
            return cols
    raise AssertionError(f"{name} not in `gptrain jobs`")


@pytest.mark.parametrize("with_dist", [False, True])
def test_failure_reason_is_the_root_cause_ranks_error(slots, tmp_path, with_dist):
    """Rank 0 fails to open its data; torchrun then tears rank 1 down with SIGTERM. The reason
    is rank 0's error line (with torch's `[rank0]:` prefix when the process group is up), not
    'rank 1 was killed by SIGTERM'."""
    s = script(tmp_path, "fail.py", f"""
        import os, time
        if {with_dist}:
            import torch.distributed as dist
            dist.init_process_group("gloo")
        if os.environ["RANK"] == "0":
            time.sleep(1)
            open("/nonexistent/data/train.bin")
        time.sleep(120)
        """)
    ok("run", "fails", "--accels", "2", "--", s)
    j = wait_for("fails")
    assert j["state"] == "failed"
    assert j["error"] == "rank 0: FileNotFoundError: [Errno 2] No such file or directory: " \
                         "'/nonexistent/data/train.bin'", j["error"]


def test_a_rank_killed_outright_is_the_reason_not_the_others_errors(slots, tmp_path):
    """Rank 0 is killed (SIGKILL, as the out-of-memory killer does); rank 1, blocked in a
    collective, may log a connection error before it is torn down: the reason is rank 0's kill."""
    s = script(tmp_path, "oom.py", """
        import os, signal, time
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if os.environ["RANK"] == "0":
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(1))
        time.sleep(120)
        """)
    ok("run", "oom", "--accels", "2", "--", s)
    j = wait_for("oom")
    assert j["state"] == "failed" and j["error"] == "rank 0 was killed by SIGKILL", j["error"]


def test_metrics_jsonl_of_a_script_shown_by_jobs_and_inspect(slots, tmp_path):
    s = script(tmp_path, "m.py", OUT + textwrap.dedent("""
        import json
        with open(out / "metrics.jsonl", "a") as f:
            for step in (10, 20, 30):
                f.write(json.dumps({"step": step, "train/loss": 4.0 - step / 10}) + "\\n")
            f.write(json.dumps({"step": 30, "eval/loss": 1.125}) + "\\n")
        """))
    ok("run", "metrics", "--", s)
    assert wait_for("metrics")["state"] == "succeeded"
    assert jobs_row("metrics")[4:6] == ["30", "1.0000"]
    report = json.loads(ok("inspect", "metrics", "--json"))["metrics"]
    assert report == {"train": {"step": 30, "loss": 1.0}, "eval": {"step": 30, "loss": 1.125}}
    assert "loss       █▅▁  3 -> 1 (30 steps)" in ok("inspect", "metrics")  # the sparkline


HF_TRAINER = OUT + """
import sys, torch
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments
model = GPT2LMHeadModel.from_pretrained(sys.argv[1])
torch.manual_seed(0)
data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 1000, (16, 16))]
args = TrainingArguments(output_dir=str(out), max_steps=4, save_steps=2, logging_steps=1,
                         eval_strategy="steps", eval_steps=2, per_device_train_batch_size=4,
                         report_to=[], use_cpu=True)
trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4])
trainer.train()
trainer.save_model()
"""


def test_hf_trainer_script_checkpoints_listed_generated_and_fetched(slots, tmp_path, tiny_hf_gpt2):
    from transformers import GPT2LMHeadModel

    ok("run", "hft", "--", script(tmp_path, "hf_train.py", HF_TRAINER), tiny_hf_gpt2)
    j = wait_for("hft")
    assert j["state"] == "succeeded", j["error"]
    rows = json.loads(ok("checkpoints", "hft", "--json"))
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"output", "output/checkpoint-2", "output/checkpoint-4"}, sorted(by_name)
    c4 = by_name["output/checkpoint-4"]
    assert c4["kind"] == "hf-trainer" and c4["step"] == 4
    assert c4["train_loss"] > 0 and c4["eval_loss"] > 0
    assert by_name["output/checkpoint-2"]["step"] == 2
    assert jobs_row("hft")[4] == "4"  # STEP from trainer_state.json's log history
    # generate on the job (its newest: the final model or checkpoint-4) and on checkpoint-2
    for ref in ("hft", by_name["output/checkpoint-2"]["id"]):
        out = ok("generate", ref, "--prompt", "Hello", "--max-new-tokens", "4", "--tokenizer", "gpt2",
                 "--temperature", "0")
        assert out.startswith("Hello")
    from tests.helpers import make_dataset

    data = make_dataset(tmp_path, tokenizer="gpt2")
    result = json.loads(ok("eval", by_name["output/checkpoint-4"]["id"], "--dataset", data, "--json",
                           "--batch-size", "2", "--max-blocks", "4"))
    assert result["loss"] > 0
    # fetch --format hf of an HF Trainer checkpoint: the same weights, readable by transformers
    dest = tmp_path / "fetched" / "c2"
    ok("checkpoint", "fetch", by_name["output/checkpoint-2"]["id"], "--format", "hf", "--destination", dest)
    import torch

    final = tmp_path / "fetched" / "final"
    ok("checkpoint", "fetch", by_name["output"]["id"], "--destination", final)
    assert (final / "model.safetensors").is_file() and not (final / "checkpoint-2").exists()
    a = GPT2LMHeadModel.from_pretrained(dest).eval()
    b = GPT2LMHeadModel.from_pretrained(by_name["output/checkpoint-2"]["path"]).eval()
    ids = torch.randint(0, 1000, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(a(ids).logits, b(ids).logits, atol=1e-5, rtol=1e-5)


def test_nanogpt_style_script_checkpoint_listed_and_generated(slots, tmp_path):
    s = script(tmp_path, "nano.py", textwrap.dedent("""
        import os, pathlib, sys
        sys.path.insert(0, sys.argv[1])
        from tests.helpers import nanogpt_ckpt
        ck = pathlib.Path(os.environ["GPTRAIN_CHECKPOINT_DIR"])
        nanogpt_ckpt(ck / "ckpt.pt", iter_num=500, val=1.75)
        """))
    from tests.conftest import ROOT

    ok("run", "nano", "--", s, ROOT)
    assert wait_for("nano")["state"] == "succeeded"
    rows = json.loads(ok("checkpoints", "nano", "--json"))
    assert [(r["name"], r["kind"], r["step"], r["eval_loss"]) for r in rows] == [("ckpt.pt", "nanogpt", 500, 1.75)]
    out = ok("generate", "nano", "--prompt", "Hi", "--max-new-tokens", "3", "--seed", "1")
    assert out.startswith("Hi")
    dest = tmp_path / "no" / "such" / "parent"
    ok("checkpoint", "fetch", rows[0]["id"], "--destination", dest, "--format", "native")
    assert (dest / "ckpt.pt").is_file()


def test_a_nanogpt_job_on_a_pushed_char_dataset_generates_with_that_datasets_tokenizer(slots, tmp_path):
    """A nanoGPT-style program trained as a job on a pushed char dataset leaves a ckpt.pt with no
    meta.pkl beside it: `generate JOB` takes the job's dataset's tokenizer (it said 'has no
    tokenizer files'); the same checkpoint named by its path still asks for --tokenizer."""
    from tests.helpers import make_dataset

    data = make_dataset(tmp_path)
    vocab = json.loads((data / "meta.json").read_text())["vocab_size"]
    ok("data", "push", "chars", data)
    s = script(tmp_path, "nano.py", textwrap.dedent(f"""
        import os, pathlib, sys
        sys.path.insert(0, sys.argv[1])
        from tests.helpers import nanogpt_ckpt
        nanogpt_ckpt(pathlib.Path(os.environ["GPTRAIN_OUTPUT_DIR"]) / "ckpt.pt", iter_num=20, vocab={vocab})
        """))
    from tests.conftest import ROOT

    ok("run", "nanochar", "--dataset", "chars", "--", s, ROOT)
    assert wait_for("nanochar")["state"] == "succeeded"
    out = ok("generate", "nanochar", "--prompt", "the", "--max-new-tokens", "8", "--seed", "1")
    assert out.startswith("the") and len(out.rstrip("\n")) == len("the") + 8, out
    (row,) = json.loads(ok("checkpoints", "nanochar", "--json"))
    assert ok("generate", row["id"], "--prompt", "the", "--max-new-tokens", "2").startswith("the")
    r = run_cli("generate", row["path"], "--prompt", "the")
    assert r.returncode == 2 and "--tokenizer" in r.stderr, r.stderr


def test_generate_on_a_job_whose_checkpoints_gptrain_cannot_load_says_so(slots, tmp_path):
    s = script(tmp_path, "w.py", """
        import os, pathlib
        ck = pathlib.Path(os.environ["GPTRAIN_CHECKPOINT_DIR"])
        ck.mkdir(parents=True, exist_ok=True)
        (ck / "model_step_7.safetensors").write_bytes(b"x")
        """)
    ok("run", "opaque", "--", s)
    assert wait_for("opaque")["state"] == "succeeded"
    assert "model_step_7.safetensors" in ok("checkpoints", "opaque")
    r = run_cli("generate", "opaque")
    assert r.returncode == 2 and "no checkpoint yet" not in r.stderr and "cannot load" in r.stderr, r.stderr


def test_save_to_disk_dataset_pushed_as_is_is_read_by_a_script(slots, tmp_path):
    """The hosted tutorials' flow: a tokenized DatasetDict.save_to_disk folder, pushed as it is,
    loaded by the job's script with load_from_disk($GPTRAIN_DATASET_DIR) on every rank."""
    from tests.helpers import make_dataset, save_as_hf_blocks

    saved = save_as_hf_blocks(make_dataset(tmp_path), tmp_path / "tokenized")
    ok("data", "push", "tok", saved, "--tokenizer", "byte")  # (its ids are char ids: below byte's 257)
    s = script(tmp_path, "load.py", """
        import os
        from datasets import load_from_disk
        ds = load_from_disk(os.environ["GPTRAIN_DATASET_DIR"])
        print("rank", os.environ["RANK"], "train rows", len(ds["train"]), "first", ds["train"][0]["input_ids"][:3])
        """)
    ok("run", "reads", "--dataset", "tok", "--accels", "2", "--", s)
    assert wait_for("reads")["state"] == "succeeded"
    import datasets

    want = datasets.load_from_disk(str(saved))["train"]
    for rank in (0, 1):
        log = ok("logs", "reads", "--rank", str(rank))
        assert f"rank {rank} train rows {len(want)} first {want[0]['input_ids'][:3]}" in log, log
