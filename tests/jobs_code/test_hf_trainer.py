"""A real transformers `Trainer` script as a job (tiny GPT-2, 2 CPU processes, gloo): a worker
is killed with SIGKILL right after checkpoint-4; the restart passes GPTRAIN_RESUME_FROM to
`trainer.train(resume_from_checkpoint=...)` and finishes at step 8 without writing
checkpoint-2 or checkpoint-4 again (issue 14: it restarted at step 0 and overwrote them)."""

import json

import pytest

from tests.conftest import run_cli
from tests.jobs_code.programs import write
from tests.job_helpers import job_dir, rank_log, succeeded
pytestmark = pytest.mark.slow

TRAIN = '''
import os, signal, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

class Crash(TrainerCallback):
    def on_save(self, args, state, control, **kw):
        if state.global_step == 4 and os.environ["GPTRAIN_ATTEMPT"] == "0" and os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=64))
data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(64)]
out = sys.argv[1].split("=", 1)[1]
args = TrainingArguments(output_dir=out, max_steps=8, save_steps=2, per_device_train_batch_size=2,
                         logging_steps=1, report_to=[], use_cpu=True,
                         dataloader_num_workers=0, disable_tqdm=True)
resume = os.environ.get("GPTRAIN_RESUME_FROM")
print("attempt", os.environ["GPTRAIN_ATTEMPT"], "resume", resume, flush=True)
Trainer(model=model, args=args, train_dataset=data, callbacks=[Crash()]).train(resume_from_checkpoint=resume)
print("finished", flush=True)
if torch.distributed.is_initialized():  # else gloo's threads may abort the exit ("terminate called")
    torch.distributed.destroy_process_group()
'''


def test_hf_trainer_job_resumes_after_kill_9(slots, tmp_path):
    code = write(tmp_path / "hf", {"train.py": TRAIN})
    r = run_cli("run", "hft", "--accels", "2", "--max-restarts", "1", "--", "train.py",
                "--output_dir=$GPTRAIN_OUTPUT_DIR/run", cwd=code)
    assert r.returncode == 0, r.stderr
    j = succeeded("hft")
    run = job_dir("hft") / "output" / "run"
    text = rank_log("hft")
    assert j["restarts"] == 1 and "attempt 0 resume None" in text, text
    assert f"attempt 1 resume {run}/checkpoint-4" in text and "finished" in text, text
    steps = {p.name: json.loads((p / "trainer_state.json").read_text())["global_step"]
             for p in run.glob("checkpoint-*")}
    assert steps == {f"checkpoint-{n}": n for n in (2, 4, 6, 8)}, steps
    before, after = text.split("--- gptrain: attempt 1")
    first = [line for line in before.splitlines() if "'loss'" in line]
    again = [line for line in after.splitlines() if "'loss'" in line]
    assert len(first) >= 4 and len(again) == 4, text  # steps 5..8 only: no step trained twice
