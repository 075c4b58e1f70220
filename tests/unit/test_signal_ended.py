"""How a Slurm batch script (and the local supervisor) tells a preemption from a failure
(jobs/logs.signal_ended): a SIGTERM that ends an attempt is a preemption, unless a rank of that
attempt failed with an error of its own first; then the SIGTERMs are srun's and torchrun's
teardown of the other ranks. Rank logs as the trainer writes them, one attempt after another."""

from pathlib import Path

from gptrain.jobs.folder import logs_dir
from gptrain.jobs.logs import failed_on_its_own, rank_log, signal_ended
from tests.helpers import step_dir

HEAD = "--- gptrain: attempt {a}, rank {r}, 2026-11-26 10:04:34, host vm, world 2\n"
FEWER = ("gptrain: error: the training split has fewer blocks of 100000 tokens than data-parallel ranks (2); "
         "use more data or another model.block_size\n")
SAVED = ("step      7/3000 | loss 3.1 | lr 1.00e-03 | 5,000 tok/s | mfu 0.6% | eta 00:00:40\n"
         "gptrain: SIGTERM received; saving a checkpoint at the end of this step\n"
         f"saved checkpoint {step_dir(Path('/x'), 7)}\nstopped at step 7\n")


def logs_of(tmp_path, *attempts):
    """rank-R.log for each rank: attempts[a][r] is what rank r wrote in attempt a."""
    logs = logs_dir(tmp_path)
    logs.mkdir()
    for r in range(len(attempts[0])):
        rank_log(logs, r).write_text("".join(HEAD.format(a=a, r=r) + att[r] for a, att in enumerate(attempts)))
    return logs


def test_srun_ending_the_others_after_a_ranks_own_error_is_no_preemption(tmp_path):
    """srun: 'node2: task 1: Exited with exit code 1', 'node1: task 0: Terminated': exit 143."""
    logs = logs_of(tmp_path, ["", FEWER])
    assert failed_on_its_own(logs) == "rank 1: " + FEWER.strip()
    assert signal_ended(logs, 143) is None  # (it was "its process got SIGTERM": requeued 13 times)


def test_a_sigterm_every_rank_saved_after_is_a_preemption(tmp_path):
    logs = logs_of(tmp_path, [FEWER, FEWER], [SAVED, SAVED])  # an earlier attempt's error does not count
    assert failed_on_its_own(logs) is None
    assert signal_ended(logs, 143) == "its process got SIGTERM"


def test_a_rank_that_lost_its_peer_is_not_the_cause(tmp_path):
    lost = ("gptrain: error: rank 0 lost another rank of the job (Read error [10.0.0.2]:4242: Connection reset "
            "by peer): a worker, its host or the network between them failed; ...\n")
    logs = logs_of(tmp_path, [lost, SAVED])
    assert failed_on_its_own(logs) is None
    assert signal_ended(logs, 143) == "its process got SIGTERM"
