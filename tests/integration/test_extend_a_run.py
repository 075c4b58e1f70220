"""A run extended with more steps (`gptrain resume NAME --max-steps N`, #51): a warmup-stable-decay
run that succeeded is branched from a checkpoint of its stable phase and trained to a longer
length; from the extension on it is the run that had the longer length from the start, step for
step (its schedule is computed for the new length: the decay moves to the new end)."""

import json

import pytest

from tests.helpers import metrics_rows, train
from tests.job_helpers import TRAIN, job, job_dir, ok, refused, wait_for
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

WSD = ["--lr_scheduler_type", "warmup_stable_decay", "--lr_scheduler_kwargs", json.dumps({"num_decay_steps": 4}),
       "--train.warmup_steps=2", "--train.precision=fp32", "--train.do_eval=false", "--checkpoint.every=4", *TRAIN]


def by_step(out) -> dict[int, dict]:
    """The last row logged for each step (a resumed run logs the steps past its checkpoint again)."""
    return {row["step"]: {"loss": row["train/loss"], "lr": row["train/lr"]}
            for row in metrics_rows(out) if "train/loss" in row}


def test_a_wsd_run_extended_from_its_stable_phase_is_the_longer_run(dataset, tmp_path):
    ok("run", "wsd", "--dataset", dataset, "--", "--train.max_steps=12", *WSD)
    assert wait_for("wsd")["state"] == "succeeded"
    short = by_step(job_dir("wsd"))
    assert short[10]["lr"] < 1e-3 * 0.9  # steps 8-11 of 12 decayed

    from gptrain.jobs import store

    ids = {c["step"]: c["id"] for c in store.checkpoints("wsd")}
    refused(run_cli("resume", "wsd"), "wsd is succeeded", "--max-steps N")
    refused(run_cli("resume", "wsd", "--max-steps", "0"), "--max-steps must be 1 to")
    assert job("wsd")["state"] == "succeeded"
    ok("resume", "wsd", "--from", ids[4], "--max-steps", "20")  # step 4: the stable phase (steps 2-7 of 12)
    assert wait_for("wsd")["state"] == "succeeded"
    assert any(e["kind"] == "extended" and "step 20" in e["message"] for e in store.events("wsd"))
    extended = by_step(job_dir("wsd"))

    longer = tmp_path / "longer"
    train(f"--data.path={dataset}", f"--train.output_dir={longer}", "--train.max_steps=20", *WSD)
    reference = by_step(longer)
    assert sorted(extended) == sorted(reference) == list(range(1, 21))
    for step in range(5, 21):  # every step after the extension
        assert extended[step]["lr"] == reference[step]["lr"], step
        assert extended[step]["loss"] == pytest.approx(reference[step]["loss"], abs=1e-5), step
    assert extended[10]["lr"] == 1e-3 and reference[19]["lr"] < 1e-3 * 0.9  # the decay moved to the new end


def test_only_gptrains_trainer_is_extended(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    ok("run", "own", "--", script)
    assert wait_for("own")["state"] == "succeeded"
    refused(run_cli("resume", "own", "--max-steps", "20"), "extends a run of gptrain's trainer")
    assert job("own")["state"] == "succeeded" and job("own")["spec"]["args"] == []
