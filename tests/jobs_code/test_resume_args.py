"""Restarts that really resume, with the programs users bring (issue 22): the real nanoGPT run as
typed (`-- train.py config/...`, one process, on CPU) and a real transformers Trainer script
shaped like the hosted tutorial, each told how to resume by `--resume-args`; and the honest
events when a job has no resume arguments and its program starts over."""

import json
import re

import pytest

from tests.conftest import run_cli
from tests.job_helpers import job_dir, ok, rank_log, rank_log_path, succeeded, wait_for
from tests.jobs_code.programs import nanogpt_project, write
def events(name, kind=None):
    from gptrain.jobs import store

    return [e["message"] for e in store.events(name) if kind is None or e["kind"] == kind]


def wait_for_line(name, text):
    import time

    while text not in (rank_log(name) if rank_log_path(name).exists() else ""):
        assert wait_for(name, states=("succeeded", "failed", "stopped", "running"))["state"] == "running", \
            rank_log(name)[-3000:]
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_nanogpt_as_typed_resumes_from_its_ckpt(slots, tmp_path, how):
    """`gptrain stop` + `gptrain resume`, or kill -9 with --max-restarts 1, after ckpt.pt of iter
    20: the restarted nanoGPT gets --init_from=resume, says "Resuming training", and goes on from
    iter 20 to 30 (it used to start at iter 0 and write ckpt.pt of iter 10 over iter 20's)."""
    code = nanogpt_project(tmp_path / "nanoGPT")
    r = run_cli("run", "nano", "--resume-args", "nanogpt", "--max-restarts", "1" if how == "kill" else "0",
                "--env", "HALT_AT=20", "--env", f"HALT_HOW={how}", "--",
                "train.py", "config/train_tiny.py", "--out_dir=$GPTRAIN_OUTPUT_DIR", cwd=code)
    assert r.returncode == 0, r.stderr
    if how == "stop":
        wait_for_line("nano", "halting at iter 20")
        ok("stop", "nano")
        assert wait_for("nano")["state"] == "stopped"
        ok("resume", "nano")
    j = succeeded("nano")
    text = rank_log("nano")
    first, again = text.split("halting at iter 20")
    assert "Initializing a new model from scratch" in first and "RANK" not in first, first[-2000:]
    ckpt = job_dir("nano") / "output" / "ckpt.pt"
    assert ", resumes with --init_from=resume" in again and f"Resuming training from {ckpt.parent}" in again
    iters = [int(n) for n in re.findall(r"^iter (\d+):", again, re.M)]
    assert iters == list(range(20, 31)), again[-3000:]  # no iteration trained twice, none skipped
    import torch

    assert torch.load(ckpt, weights_only=True)["iter_num"] == 30
    restart = [m for m in events("nano") if "resumes with" in m]
    assert restart and restart[0].endswith("resumes with --init_from=resume"), events("nano")
    steps = [int(m.rsplit(" ", 1)[1]) for m in events("nano", "checkpoint") if "rewritten at step" in m]
    assert steps == sorted(steps) and not events("nano", "warning"), events("nano")
    assert j["restarts"] == (1 if how == "kill" else 0)


# The hosted tutorial's shape: argparse flags, a Trainer, train(resume_from_checkpoint=...).
# The first attempt dies by SIGKILL right after saving checkpoint-4.
HF_TUTORIAL = '''
import argparse, os, signal, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", required=True)
parser.add_argument("--max_steps", type=int, default=8)
parser.add_argument("--resume_from_checkpoint", default=None)
args = parser.parse_args()

class Crash(TrainerCallback):
    def on_save(self, a, state, control, **kw):
        if state.global_step == 4 and os.environ["GPTRAIN_ATTEMPT"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=64))
data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(64)]
targs = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, save_steps=2,
                          per_device_train_batch_size=2, logging_steps=1, report_to=[], use_cpu=True,
                          dataloader_num_workers=0, disable_tqdm=True)
print("resume_from_checkpoint", args.resume_from_checkpoint, flush=True)
Trainer(model=model, args=targs, train_dataset=data, callbacks=[Crash()]).train(
    resume_from_checkpoint=args.resume_from_checkpoint)
print("finished", flush=True)
'''


def hf_job(tmp_path, name, *resume_args):
    code = write(tmp_path / "hf", {"train.py": HF_TUTORIAL})
    r = run_cli("run", name, *resume_args, "--max-restarts", "1", "--env", "TRANSFORMERS_VERBOSITY=info",
                "--", "train.py", "--output_dir=$GPTRAIN_OUTPUT_DIR", cwd=code)
    assert r.returncode == 0, r.stderr
    j = succeeded(name)
    assert j["restarts"] == 1
    out = job_dir(name) / "output"
    steps = {p.name: json.loads((p / "trainer_state.json").read_text())["global_step"]
             for p in out.glob("checkpoint-*")}
    assert steps == {f"checkpoint-{n}": n for n in (2, 4, 6, 8)}, steps
    return out, rank_log(name).split("--- gptrain: attempt 1")


def test_hf_trainer_resumes_with_resume_args_hf(slots, tmp_path):
    """--resume-args hf: the restart passes --resume_from_checkpoint .../checkpoint-4; the
    Trainer continues from global step 4 and writes no checkpoint below it again."""
    out, (first, again) = hf_job(tmp_path, "hfr", "--resume-args", "hf")
    assert "resume_from_checkpoint None" in first
    assert f"resume_from_checkpoint {out}/checkpoint-4" in again and "finished" in again, again[-3000:]
    assert re.search(r"(Continuing training from global step|Resuming training from checkpoint with "
                     r"epoch \d+ and global step) 4", again), again[-3000:]
    restart = [m for m in events("hfr", "restarting")]
    assert restart and restart[0].endswith(f"resumes with --resume_from_checkpoint {out}/checkpoint-4"), restart
    assert not events("hfr", "warning"), events("hfr")
    for n in (2, 4):  # written once, by the first attempt
        assert (out / f"checkpoint-{n}" / "trainer_state.json").stat().st_mtime < \
            (out / "checkpoint-6" / "trainer_state.json").stat().st_mtime
    assert len(re.findall(r"'loss'", again)) == 4, again[-3000:]  # steps 5..8 only


def test_without_resume_args_the_events_say_it_started_over(slots, tmp_path):
    """No --resume-args and a program that does not read GPTRAIN_RESUME_FROM: the restart
    event says it restarted from scratch, and rewriting checkpoint-2 (and -4) at a lower step
    than the job had reached is a warning event (it used to say nothing)."""
    out, (first, again) = hf_job(tmp_path, "hfs")
    assert "resume_from_checkpoint None" in again and len(re.findall(r"'loss'", again)) == 8
    restart = events("hfs", "restarting")
    assert restart and ("restart 1 of 1: restarted from scratch: the program was given no resume "
                        "arguments (see --resume-args)") in restart[0], restart
    warnings = events("hfs", "warning")
    assert any(w.startswith("output/checkpoint-2 rewritten at step 2 after the restart") for w in warnings), \
        events("hfs")
    assert not any("checkpoint-6" in w or "checkpoint-8" in w for w in warnings), warnings
