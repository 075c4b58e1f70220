"""What a Slurm job's batch script does after an attempt (jobs/engines/slurm_attempt.py): a time limit's
signal or a preemption requeues the job; a time limit that ends attempt after attempt before a new
checkpoint stops being requeued after STALLED_LIMIT of them (a --time 2 job with the signal 100 s
before its end was requeued every 30 s for the whole of a CI run: Slurm sends the signal at its
first check after the start, before the program's first step). Checkpoints as a HF Trainer
script writes them, in the job's output folder."""

import os

from gptrain.jobs import folder
from gptrain.jobs.engines.slurm_attempt import ENDED, GAVE_UP, REQUEUE, STALLED_LIMIT, decide
from gptrain.jobs.logs import rank_log
from tests.helpers import trainer_checkpoint

SAVED = "step 7/3000 | loss 3.1\ngptrain: SIGTERM received; saving a checkpoint\nstopped at step 7\n"


def job(tmp_path):
    jdir = tmp_path / "job"
    folder.logs_dir(jdir).mkdir(parents=True)
    rank_log(folder.logs_dir(jdir), 0).write_text("--- gptrain: attempt 0, rank 0, x, host vm, world 1\n" + SAVED)
    return jdir


def test_a_time_limit_with_a_new_checkpoint_each_attempt_is_requeued_every_time(tmp_path):
    jdir = job(tmp_path)
    for step in range(1, 2 * STALLED_LIMIT):
        trainer_checkpoint(folder.program_output_dir(jdir) / f"checkpoint-{step}", step)
        verdict, line = decide(jdir, 143, near_limit=True)
        assert verdict == REQUEUE and f"checkpoint output/checkpoint-{step} saved, job requeued" in line, line
    assert "its time limit was near" in folder.slurm_preempted(jdir).read_text()


def test_a_time_limit_that_leaves_no_time_for_a_checkpoint_gives_up(tmp_path):
    jdir = job(tmp_path)
    for attempt in range(STALLED_LIMIT - 1):
        verdict, line = decide(jdir, 143, near_limit=True)
        assert verdict == REQUEUE and "no new checkpoint (there is none yet), job requeued" in line, line
    verdict, line = decide(jdir, 143, near_limit=True)
    assert verdict == GAVE_UP, line
    reason = folder.slurm_gave_up(jdir).read_text()
    assert f"in {STALLED_LIMIT} attempts in a row before a new checkpoint" in reason and "--time" in reason, reason


def test_the_stalls_must_come_in_a_row_and_a_rewritten_file_is_progress(tmp_path):
    """nanoGPT rewrites out/ckpt.pt in place: a newer file of the same name is a new checkpoint."""
    jdir = job(tmp_path)
    ckpt = folder.program_output_dir(jdir) / "checkpoint-5"
    trainer_checkpoint(ckpt, 5)
    assert decide(jdir, 143, near_limit=True)[0] == REQUEUE  # progress: the first one
    for _ in range(STALLED_LIMIT - 1):
        assert decide(jdir, 143, near_limit=True)[0] == REQUEUE  # stalled 1, 2
    later = os.stat(ckpt / "trainer_state.json").st_mtime + 10
    for path in (ckpt, *ckpt.iterdir()):
        os.utime(path, (later, later))
    verdict, line = decide(jdir, 143, near_limit=True)
    assert verdict == REQUEUE and "checkpoint output/checkpoint-5 saved" in line, line
    assert decide(jdir, 143, near_limit=True)[0] == REQUEUE  # the count starts again


def test_preemptions_are_requeued_however_often_and_other_ends_are_not(tmp_path):
    jdir = job(tmp_path)
    for _ in range(2 * STALLED_LIMIT):  # somebody else's job each time, not the same time limit
        verdict, line = decide(jdir, 143, near_limit=False)
        assert verdict == REQUEUE and line.startswith("--- gptrain: its process got SIGTERM: no new checkpoint"), line
    assert decide(jdir, 0, near_limit=False) == (ENDED, "")  # it finished
    assert decide(jdir, 1, near_limit=False) == (ENDED, "")  # it crashed (no SIGTERM in its logs)
    assert not folder.slurm_gave_up(jdir).exists()
