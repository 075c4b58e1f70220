"""Trainer features against the plain fp32 run: activation checkpointing, compile, precisions,
NaN skipping, Weights & Biases offline."""

import json
import math
import re
import signal
import subprocess
import sys
import time

import pytest

from gptrain import run_layout
from gptrain.weights.layout import step_name
from tests.helpers import (
    TINY, env, http_server, losses, model_tensors, step_dir, train, write_corpus)

STEPS = 4


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    train(*_args(data, out))
    return losses(out)


def _args(data, out, *extra):
    return [f"--data.path={data}", f"--train.output_dir={out}", "--train.batch_size=4",
            f"--train.max_steps={STEPS}", "--train.do_eval=false", *TINY, "--model.n_layer=3", *extra]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_gives_the_same_losses(data, reference, tmp_path, mode):
    train(*_args(data, tmp_path, f"--train.activation_checkpointing={mode}"))
    got = losses(tmp_path)
    for step, value in reference.items():
        assert abs(got[step] - value) < 1e-6, (mode, step)


@pytest.mark.slow
def test_compiled_blocks_match_eager(data, reference, tmp_path):
    train(*_args(data, tmp_path, "--train.compile=true"))
    got = losses(tmp_path)
    for step, value in reference.items():
        assert abs(got[step] - value) < 1e-4, step


@pytest.mark.parametrize("precision, tol", [("bf16", 0.05), ("fp16", 0.02)])
def test_mixed_precision_tracks_fp32(data, reference, tmp_path, precision, tol):
    r = train(*_args(data, tmp_path, f"--train.precision={precision}", "--metrics.peak_flops=none"))
    assert f" in {precision}: " in r.stdout
    got = losses(tmp_path)
    for step, value in reference.items():
        assert math.isfinite(got[step]) and abs(got[step] - value) < tol, (precision, step, got[step], value)
    rows = [json.loads(line) for line in run_layout.metrics_file(tmp_path).read_text().splitlines()]
    # MFU against the faster of this precision's and fp32's measured peak (a CPU without bf16
    # units runs these products in fp32): the basis names which. Its size (< 1) is a ratio of two
    # speeds, one timed while the machine may be busy, so it is not asserted here (bench/)
    said = json.loads(run_layout.run_info_file(tmp_path).read_text())["mfu_basis"]  # (`gptrain inspect` shows it)
    basis = re.search(r" GFLOP/s (\w+) per core, measured on one-thread matmuls", said)
    assert basis and basis[1] in (precision, "fp32"), said
    assert basis[1] == precision or f"(faster here than {precision}'s " in said, said
    assert all(r["train/mfu"] > 0 for r in rows if "train/mfu" in r)


@pytest.mark.slow
def test_fp16_with_pipeline_and_tensor_parallel_tracks_fp32(data, reference, tmp_path):
    """fp16 loss scaling whose skip decision is global: 2 pipeline stages x 2 TP ranks."""
    r = train(*_args(data, tmp_path, "--train.precision=fp16", "--parallel.pp=2", "--parallel.tp=2",
                     "--parallel.dp_shard=1", "--model.n_layer=4"), nproc=4)
    assert " in fp16: " in r.stdout
    single = tmp_path / "single"
    train(*_args(data, single, "--model.n_layer=4"))
    got, expected = losses(tmp_path), losses(single)
    for step, value in expected.items():
        assert math.isfinite(got[step]) and abs(got[step] - value) < 0.02, (step, got[step], value)


def test_a_stopped_run_logs_the_step_it_stopped_at(data, tmp_path):
    """A stop between two logged steps: the last train record is the stop's step, the one its
    final checkpoint holds (`gptrain jobs` shows how far a job got from it)."""
    args = _args(data, tmp_path, "--train.max_steps=100000", "--metrics.log_every=1000", "--checkpoint.every=3")
    proc = subprocess.Popen([sys.executable, "-m", "gptrain", "train", *args], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not list(run_layout.checkpoints_dir(tmp_path).glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, out  # saved, and not a success: it stopped before its last step
    stopped = int(out.split("stopped at step ")[1].split()[0])
    assert stopped % 1000 and max(losses(tmp_path)) == stopped, out
    assert step_dir(tmp_path, stopped).is_dir()


def test_a_resumed_run_drops_the_records_of_the_steps_it_runs_again(data, tmp_path):
    """Killed after step 6 with its last checkpoint at 3: metrics.jsonl holds steps 4-6 twice
    unless the resume drops the first ones (each step once, the run's own numbers)."""
    import shutil

    args = _args(data, tmp_path, "--train.max_steps=6", "--checkpoint.every=3")
    train(*args)
    first = [json.loads(line) for line in run_layout.metrics_file(tmp_path).read_text().splitlines()]
    shutil.rmtree(step_dir(tmp_path, 6))
    (run_layout.checkpoints_dir(tmp_path) / "latest").write_text(step_name(3) + "\n")
    with open(run_layout.metrics_file(tmp_path), "a") as f:
        f.write('{"step": 5, "train/loss": 1.0, "torn')  # a line cut by the kill stays as it was
    train(*args)
    lines = run_layout.metrics_file(tmp_path).read_text().splitlines()
    rows = [json.loads(line) for line in lines if not line.endswith("torn")]
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6], steps
    assert [r["train/loss"] for r in rows] == [r["train/loss"] for r in first]  # (exact: resume is bitwise)


def test_nan_policy_skip_keeps_going(data, tmp_path):
    r = train(*_args(data, tmp_path, "--train.lr=1e30", "--train.warmup_steps=0", "--train.grad_clip=0",
                     "--train.nan_policy=skip"))
    assert "non-finite loss or gradient at step" in r.stdout and f"completed at step {STEPS}" in r.stdout
    assert "step(s) skipped: non-finite)" in r.stdout.splitlines()[-1], r.stdout


def test_wandb_offline_run(data, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(*_args(data, tmp_path, "--report_to=wandb", "--metrics.wandb_mode=offline"))
    runs = list((tmp_path / "wandb").glob("offline-run-*/*.wandb"))
    assert runs, list((tmp_path / "wandb").iterdir())
    # history values are stored as JSON text inside the run's protobuf records
    raw = runs[0].read_bytes()
    assert b"train/loss" in raw and b"train/tokens_per_s" in raw
    for value in losses(tmp_path).values():
        assert json.dumps(value).encode() in raw, value


def test_checkpoints_mirrored_to_object_storage_resume_on_a_fresh_machine(data, tmp_path):
    """checkpoint.remote (fsspec; file:// here, s3:// or oci:// in production): the run is cut at
    step 2 and its output directory lost; a new run fetches step 2 from the remote and goes on
    to losses equal to an uninterrupted run's."""
    bucket = f"file://{tmp_path}/bucket/run"
    full = tmp_path / "full"
    train(*_args(data, full, "--checkpoint.every=2"))
    first = tmp_path / "machine-a"
    train(*_args(data, first, "--checkpoint.every=2", f"--checkpoint.remote={bucket}",
                 "--checkpoint.keep_last=1"), "--train.max_steps=2")
    assert (tmp_path / "bucket" / "run" / "latest").read_text() == step_name(2)
    import shutil

    shutil.rmtree(first)
    second = tmp_path / "machine-b"
    r = train(*_args(data, second, "--checkpoint.every=2", f"--checkpoint.remote={bucket}",
                     "--checkpoint.keep_last=1"))
    assert f"fetching checkpoint {step_name(2)}" in r.stdout and "resumed from" in r.stdout
    got, expected = losses(second), losses(full)
    assert sorted(got) == [3, 4]
    for step in got:
        assert got[step] == expected[step], (step, got[step], expected[step])
    remote_steps = sorted(p.name for p in (tmp_path / "bucket" / "run").glob("step-*"))
    assert remote_steps == [step_name(4)]  # keep_last=1 applies to the remote too


def test_unusable_remote_is_refused_before_training(data, tmp_path):
    r = train(*_args(data, tmp_path / "out", "--checkpoint.remote=nosuchproto://bucket/x"), check=False)
    assert r.returncode == 2
    assert "checkpoint.remote=nosuchproto://bucket/x" in r.stderr.strip().splitlines()[-1]


def test_training_reads_a_url_through_fsspec_once(tmp_path):
    """minGPT's workflow: the text comes from a URL (http here; s3/oci through fsspec), char
    tokenizer; it is tokenized once into the cache and reused by the next run."""
    corpus = tmp_path / "web"
    corpus.mkdir()
    write_corpus(corpus / "input.txt", n_chars=20000)
    with http_server(corpus) as base:
        args = [f"--data.path={base}/input.txt", "--data.tokenizer=char", *TINY, "--train.batch_size=4",
                "--train.max_steps=2", "--train.do_eval=false"]
        first = train(*args, f"--train.output_dir={tmp_path / 'a'}")
        second = train(*args, f"--train.output_dir={tmp_path / 'b'}")
    assert "tokenizing http://" in first.stderr and "tokenizing" not in second.stderr
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_load_best_model_at_end_keeps_the_checkpoint_evaluated_lowest_and_the_run_stands_for_it(data, tmp_path):
    """HF's --load_best_model_at_end with --save_total_limit 1: the checkpoint with the lowest eval
    loss at its own step survives pruning, `best` names it, loading the run's folder as a model
    gives its weights; a resume would still continue from the newest. At this learning rate the
    eval loss goes 3.28, 3.07, 3.27, 3.08 (AMD EPYC, fp32): the best is not the last."""
    import torch

    from gptrain.weights.layout import find_latest

    out = tmp_path / "best"
    train(*_args(data, out, "--train.do_eval=true", "--eval_steps=1", "--save_steps=1", "--save_total_limit=1",
                 "--load_best_model_at_end", "--metric_for_best_model", "eval_loss", "--greater_is_better", "false",
                 "--train.lr=0.05", "--train.warmup_steps=0", "--train.eval_iters=2",
                 "--train.dialect=gptrain"))  # (gptrain's schedule and betas, which the losses above are of)
    rows = [json.loads(line) for line in run_layout.metrics_file(out).read_text().splitlines()]
    evals = {r["step"]: r["eval/loss"] for r in rows if "eval/loss" in r}
    assert sorted(evals) == list(range(1, STEPS + 1)), evals
    best = min(evals, key=lambda s: (evals[s], -s))
    ckpts = run_layout.checkpoints_dir(out)
    assert (ckpts / "best").read_text().strip() == step_name(best), evals
    assert sorted(p.name for p in ckpts.glob("step-*")) == sorted({step_name(best), step_name(STEPS)})
    assert find_latest(out).name == step_name(STEPS)
    got, want = model_tensors(out), model_tensors(ckpts / step_name(best))
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert best < STEPS, evals  # and the newest's weights differ: the run's folder gave the best's
    newest = model_tensors(ckpts / step_name(STEPS))
    assert not all(torch.equal(newest[k], want[k]) for k in want)
    # the same run as a job: its name stands for the best (generate, eval, export), but a run told to
    # resume from it continues from the newest
    import shutil

    from gptrain.jobs import folder, store
    from gptrain.jobs.api import model_source

    store.create_job("kept", {"name": "kept"}, 1, 1, "local")
    shutil.copytree(out, folder.job_dir("kept"), dirs_exist_ok=True)
    jckpts = folder.checkpoints_dir(folder.job_dir("kept"))
    assert model_source("kept") == str(jckpts / step_name(best))
    assert model_source("kept", resume=True) == str(jckpts / step_name(STEPS))


def test_samples_during_training_are_logged_and_leave_the_losses_unchanged(data, reference, tmp_path):
    """--metrics.sample_every (minGPT's chargpt, nanoGPT's sample.py): a sample every N steps, on
    one line; the training's losses are those of the run without samples, exactly."""
    out = tmp_path / "sampled"
    r = train(*_args(data, out, "--metrics.sample_every=2", "--metrics.sample_tokens=20"))
    lines = [line for line in r.stdout.splitlines() if line.startswith("sample step ")]
    assert [line.split(":")[0] for line in lines] == ["sample step 2", f"sample step {STEPS}"], r.stdout
    text = json.loads(lines[0].split(": ", 1)[1])
    assert text.startswith("\n") and len(text) == 21, text  # the prompt, then 20 characters (char tokenizer)
    assert losses(out) == reference


@pytest.mark.parametrize("flags, says", [
    (["--metrics.sample_every=2", "--metrics.sample_prompt=€"], "--metrics.sample_prompt '€' cannot be written"),
    (["--metrics.sample_every=2", "--parallel.tp=2"], "does not work with tensor or pipeline parallel"),
])
def test_samples_that_cannot_be_written_are_refused_before_anything(data, tmp_path, flags, says):
    out = tmp_path / "refused"
    r = train(*_args(data, out, *flags), check=False)
    assert r.returncode == 2 and says in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not out.exists()


def test_samples_under_fsdp_every_rank_generates_and_the_losses_stay(data, tmp_path):
    """FSDP's sharded model needs every rank in the forward: each runs the same generation."""
    flags = ["--parallel.dp_shard=2", "--parallel.dp_replicate=1"]
    sampled = train(*_args(data, tmp_path / "s", *flags, "--metrics.sample_every=2", "--metrics.sample_tokens=10"),
                    nproc=2)
    train(*_args(data, tmp_path / "plain", *flags), nproc=2)
    assert [line.split(":")[0] for line in sampled.stdout.splitlines() if line.startswith("sample step ")] == \
        ["sample step 2", f"sample step {STEPS}"], sampled.stdout
    assert losses(tmp_path / "s") == losses(tmp_path / "plain")
