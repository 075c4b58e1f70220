"""#47: one rule for "may these bytes be loaded" (weights/checksums.py `admit`). A gptrain
checkpoint without checksums.json and without the mark that it was sealed with one (written
before gptrain verified checkpoints, or with both removed) was loaded with a note, so a flipped
byte in it trained on or generated from; now every load refuses it in one line unless the user
says --allow-unverified, which loads it with a warning, once, recorded in the run's run.json. An
export gptrain sealed says so in its config.json: its list gone, it is refused as damaged."""

import json
import shutil

from gptrain import run_layout
from tests.conftest import run_cli
from tests.helpers import TINY, step_dir, train

RUN = [*TINY, "--train.batch_size=2", "--train.do_eval=false", "--train.precision=fp32", "--checkpoint.every=2"]


def as_before_checksums(ckpt):
    """What a checkpoint of a gptrain before verified checkpoints holds: no list, no mark."""
    (ckpt / "checksums.json").unlink()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state.pop("checksums")
    (ckpt / "trainer_state.json").write_text(json.dumps(state))


def refused(r):
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no checksums.json" in lines[0] and "--allow-unverified" in lines[0], r.stderr


def test_a_checkpoint_without_its_list_loads_only_when_the_user_allows_it(data, tiny_run, tmp_path):
    run = shutil.copytree(tiny_run, tmp_path / "run")
    newest = step_dir(run, 4)
    as_before_checksums(newest)
    before = sorted(p.name for p in run_layout.checkpoints_dir(run).iterdir())
    refused(run_cli("generate", str(newest), "--prompt", "a", "--max-new-tokens", "2"))
    refused(run_cli("eval", str(newest), "--dataset", str(data), "--max-blocks", "2"))
    refused(run_cli("export", str(newest), "--out", str(tmp_path / "hf")))
    refused(run_cli("train", f"--data.path={data}", f"--train.output_dir={tmp_path / 'new'}",
                    f"--model.init_from={newest}", "--train.max_steps=1", *RUN))
    r = train(f"--data.path={data}", f"--train.output_dir={run}", "--train.max_steps=6", *RUN, check=False)
    refused(r)  # no resume from it, no silent start over, nothing written
    assert sorted(p.name for p in run_layout.checkpoints_dir(run).iterdir()) == before
    assert not (tmp_path / "hf").exists() and not (tmp_path / "new").exists()

    r = run_cli("generate", str(newest), "--prompt", "a", "--max-new-tokens", "2", "--allow-unverified")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("loaded WITHOUT verifying its bytes") == 1, r.stderr
    r = train(f"--data.path={data}", f"--train.output_dir={run}", "--train.max_steps=6", *RUN, "--allow-unverified")
    assert f"resumed from {newest} at step 4" in r.stdout + r.stderr
    assert (r.stdout + r.stderr).count("loaded WITHOUT verifying its bytes") == 1
    info = json.loads(run_layout.run_info_file(run).read_text())
    assert info["loaded_unverified"] == [str(newest)]


def test_an_export_gptrain_sealed_is_refused_without_its_list_and_a_foreign_one_loads(tiny_run, tiny_hf_gpt2,
                                                                                        tmp_path):
    exported = tmp_path / "hf"
    assert run_cli("export", str(tiny_run), "--out", str(exported)).returncode == 0
    assert json.loads((exported / "config.json").read_text())["gptrain_checksums"] == "crc32c"
    (exported / "checksums.json").unlink()
    r = run_cli("generate", str(exported), "--prompt", "a", "--max-new-tokens", "2")
    assert r.returncode == 2 and "checksums.json is missing (the checkpoint was written with one)" in r.stderr, \
        r.stderr[-3000:]
    r = run_cli("generate", str(tiny_hf_gpt2), "--prompt", "a", "--max-new-tokens", "2", "--tokenizer", "byte")
    assert r.returncode == 0 and "WITHOUT" not in r.stderr, r.stderr[-3000:]  # a Hugging Face model from elsewhere


def test_a_job_refused_an_unverified_checkpoint_resumes_when_the_user_allows_it(slots, data, tiny_run, tmp_path):
    """The job's workers refuse the checkpoint; `gptrain resume J --allow-unverified` (the line's
    advice, for a job whose flags the user cannot retype) lets them load it, with the warning, an
    event and run.json saying so; a plain resume of it stays refused."""
    from tests.job_helpers import job, job_dir, ok, rank_log, wait_for

    old = shutil.copytree(step_dir(tiny_run, 4), tmp_path / "old")
    as_before_checksums(old)
    ok("run", "old", "--", f"--data.path={data}", f"--model.init_from={old}", "--train.max_steps=2", *RUN)
    assert wait_for("old")["state"] == "failed"
    assert "has no checksums.json" in job("old")["error"] and "--allow-unverified" in job("old")["error"]
    r = run_cli("resume", "old", "--allow-unverified")
    assert r.returncode == 0, r.stderr
    j = wait_for("old")
    assert j["state"] == "succeeded", j
    assert j["spec"]["env"] == {"GPTRAIN_ALLOW_UNVERIFIED": "1"}
    assert rank_log("old").count("loaded WITHOUT verifying its bytes") == 1
    info = json.loads(run_layout.run_info_file(job_dir("old")).read_text())
    assert info["loaded_unverified"] == [str(old)]
    events = json.loads(ok("inspect", "old", "--json"))["events"]
    assert [e["kind"] for e in events].count("allowed") == 1
