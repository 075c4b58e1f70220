"""Verified checkpoints: every file of a committed checkpoint has its size and CRC-32C in
checksums.json (weights/checksums.py), written and fsync'd as part of the commit; a flipped or
missing byte anywhere is refused by every load path with one line naming the checkpoint and the
file, and a run (or a job) whose newest checkpoint is damaged resumes from the newest good one
by itself, saying so."""

import json
import random
import shutil

import pytest

from gptrain import run_layout
from gptrain.weights.layout import step_name
from tests.conftest import run_cli
from tests.helpers import TINY, make_dataset, step_dir, train
from tests.job_helpers import TRAIN, checkpoints_dir, job, ok, wait_for

RUN = [*TINY, "--train.batch_size=2", "--train.do_eval=false", "--train.precision=fp32", "--checkpoint.every=2"]


def flip(path, seed: int) -> int:
    """Flip one bit at a seeded random offset of `path`; the offset."""
    rng = random.Random(seed)
    data = bytearray(path.read_bytes())
    at = rng.randrange(len(data))
    data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return at


def one_line_refusal(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gptrain: error:"), r.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_commit_lists_every_file_with_its_size_and_checksum(tiny_run):
    from gptrain.weights import checksums

    out = tiny_run
    ckpt = step_dir(out, 4)
    listed = checksums.read(ckpt)
    on_disk = {p.name for p in ckpt.iterdir() if p.name != checksums.FILE}
    assert set(listed) == on_disk and {".metadata", "__0_0.distcp", "trainer_state.json"} <= on_disk
    for name, (size, crc) in listed.items():  # hashed while written == hashed from disk
        assert checksums.hash_file(ckpt / name) == (size, crc), name
    assert checksums.verify(ckpt) == checksums.VERIFIED


@pytest.mark.parametrize("seed", range(10))
def test_a_bit_flipped_anywhere_is_refused_by_every_reader(tiny_run, tmp_path, seed):
    """10 seeds over every file of the checkpoint (checksums.json itself included): the verifier
    names the file, and the loaders used by generate/eval/export/init_from and by resume refuse."""
    from gptrain.errors import UserError
    from gptrain.models.load import load_for_inference
    from gptrain.weights import checksums

    out = tiny_run
    ckpt = shutil.copytree(step_dir(out, 4), tmp_path / step_name(4))
    files = sorted(p.name for p in ckpt.iterdir())
    victim = files[seed % len(files)]
    flip(ckpt / victim, seed)
    with pytest.raises(checksums.VerificationError) as e:
        checksums.verify(ckpt)
    assert victim in str(e.value) and str(ckpt) in str(e.value)
    with pytest.raises(UserError, match="fails verification"):
        load_for_inference(ckpt)


LOAD_PATHS = {
    "generate": lambda data, ck, tmp: ["generate", ck, "--prompt", "the", "--max-new-tokens", "2"],
    "eval": lambda data, ck, tmp: ["eval", ck, "--dataset", data],
    "export": lambda data, ck, tmp: ["export", ck, "--out", tmp / "exported"],
    "resume_from_checkpoint": lambda data, ck, tmp: ["train", f"--data.path={data}", "--train.max_steps=6",
                                                     f"--train.output_dir={tmp / 'new'}",
                                                     f"--resume_from_checkpoint={ck}", *RUN],
    "init_from": lambda data, ck, tmp: ["train", f"--data.path={data}", "--train.max_steps=2",
                                        f"--train.output_dir={tmp / 'new'}", f"--model.init_from={ck}", *RUN],
}


@pytest.mark.parametrize("path", list(LOAD_PATHS))
def test_each_command_refuses_a_damaged_checkpoint_in_one_line(data, tiny_run, tmp_path, path):
    out = tiny_run
    ckpt = shutil.copytree(step_dir(out, 4), step_dir(tmp_path / "run", 4))
    flip(ckpt / "__0_0.distcp", 7)
    one_line_refusal(run_cli(*LOAD_PATHS[path](data, ckpt, tmp_path)), str(ckpt), "__0_0.distcp",
                     "fails verification")
    assert not (tmp_path / "exported").exists() and not run_layout.checkpoints_dir(tmp_path / "new").exists()


def test_a_damaged_remote_copy_is_refused_and_not_kept(data, tiny_run, tmp_path):
    out = tiny_run
    bucket = tmp_path / "bucket"
    shutil.copytree(step_dir(out, 4), bucket / step_name(4))
    (bucket / "latest").write_text(step_name(4))
    flip(bucket / step_name(4) / "__0_0.distcp", 3)
    new = tmp_path / "elsewhere"
    r = run_cli("train", f"--data.path={data}", f"--train.output_dir={new}", "--train.max_steps=6",
                f"--checkpoint.remote=file://{bucket}", *RUN)
    one_line_refusal(r, "was refused and not kept", "__0_0.distcp", "fails verification")
    assert not list(run_layout.checkpoints_dir(new).glob("*step-*"))


def test_a_damaged_remote_copy_falls_back_to_the_good_remote_step_before_it(data, tiny_run, tmp_path):
    """#47 row 3: REMOTE/latest names a damaged step-000004 and step-000002 there is good: the run
    exited 2 ("refused and not kept") with no fallback. It passes the damaged copy by, fetches
    step 2, resumes from it and finishes."""
    out = tiny_run
    bucket = tmp_path / "bucket"
    for step in (2, 4):
        shutil.copytree(step_dir(out, step), bucket / step_name(step))
    (bucket / "latest").write_text(step_name(4))
    flip(bucket / step_name(4) / "__0_0.distcp", 3)
    new = tmp_path / "elsewhere"
    r = train(f"--data.path={data}", f"--train.output_dir={new}", "--train.max_steps=6",
              f"--checkpoint.remote=file://{bucket}", *RUN)
    said = r.stdout + r.stderr
    assert "was refused and not kept" in said and "trying the remote checkpoint before it" in said, said[-3000:]
    assert f"resumed from {step_dir(new, 2)} at step 2" in said, said[-3000:]
    assert not step_dir(new, 4).exists() or (step_dir(new, 4) / "checksums.json").is_file()


def test_an_exported_hf_model_is_verified_when_loaded(data, tiny_run, tmp_path, seed=0):
    from gptrain.weights import checksums

    out = tiny_run
    hf = tmp_path / "hf"
    ok("export", step_dir(out, 4), "--out", hf)
    assert checksums.verify(hf, what="model") == checksums.VERIFIED and "model.safetensors" in checksums.read(hf)
    flip(hf / "model.safetensors", seed)
    for args in (["generate", hf, "--prompt", "the"],
                 ["train", f"--data.path={data}", f"--train.output_dir={tmp_path / 'n'}",
                  "--train.max_steps=2", f"--model.init_from={hf}", *RUN]):
        one_line_refusal(run_cli(*args), str(hf), "model.safetensors", "fails verification")


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_run_whose_newest_checkpoint_is_damaged_resumes_from_the_one_before(data, tiny_run, tmp_path, damage):
    """...and ends with the weights of a run of 6 steps never interrupted (fp32, same data: the
    damaged run was made with max_steps=4, so only a resume from step 2 retrains steps 3-4 on the
    6-step schedule)."""
    import torch

    from tests.helpers import model_tensors

    out = tiny_run
    run = shutil.copytree(out, tmp_path / "run")
    newest = step_dir(run, 4) / "__0_0.distcp"
    if damage == "flipped":
        flip(newest, 11)
    else:
        newest.write_bytes(newest.read_bytes()[:1000])
    r = train(f"--data.path={data}", f"--train.output_dir={run}", "--train.max_steps=6", *RUN)
    said = r.stdout + r.stderr
    assert "fails verification: __0_0.distcp" in said and \
        "checkpoint step-000004 failed verification: resumed from step-000002 instead" in said, said
    clean = tmp_path / "clean"
    train(f"--data.path={data}", f"--train.output_dir={clean}", "--train.max_steps=6", *RUN)
    got, want = (model_tensors(step_dir(d, 6)) for d in (run, clean))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_no_good_checkpoint_left_is_one_line(data, tiny_run, tmp_path):
    out = tiny_run
    run = shutil.copytree(out, tmp_path / "run")
    for step in (2, 4):
        flip(step_dir(run, step) / ".metadata", 5)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "damaged.txt"}
    for attempt in range(2):  # the second found both marked damaged: it trained from step 0 over them (#47 row 1)
        r = run_cli("train", f"--data.path={data}", f"--train.output_dir={run}", "--train.max_steps=6", *RUN)
        assert r.returncode == 2 and "no checkpoint of" in r.stderr and "passes verification" in r.stderr, \
            (attempt, r.stderr[-2000:])
        assert "step-000002" in r.stderr and "step-000004" in r.stderr and "resumed from" not in r.stdout, \
            (attempt, r.stdout[-2000:])
        assert (step_dir(run, 4) / "damaged.txt").is_file()
    assert not (step_dir(run, 6)).exists()
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "damaged.txt"}
    # every checkpoint byte as it was (the refusals add to damaged.jsonl; config.toml is the last one asked for)
    kept = {run_layout.checkpoints_dir(run) / "damaged.jsonl", run_layout.config_file(run)}
    assert {p: b for p, b in after.items() if p not in kept} == {p: b for p, b in before.items() if p not in kept}


@pytest.mark.parametrize("how", ["removed", "a link", "a folder", "an extra file"])
def test_a_checkpoint_whose_list_is_gone_or_swapped_is_refused_not_trusted_less(data, tiny_run, tmp_path, how):
    """#47 row 4: remove checksums.json (or put a folder there) and flip a data byte: the step
    was `unverified`, loaded with only a note, and a resume preferred it to a verified older one;
    a checksums.json link was followed; a file added to a step passed `--verify`. A checkpoint
    gptrain sealed (its trainer_state.json says so) is refused in each case; a resume goes back to
    the verified step before it."""
    from gptrain.weights import checksums

    out = tiny_run
    run = shutil.copytree(out, tmp_path / "run")
    newest = step_dir(run, 4)
    listed = newest / "checksums.json"
    if how == "removed":
        listed.unlink()
    elif how == "a link":
        kept = shutil.copy(listed, tmp_path / "elsewhere.json")
        listed.unlink()
        listed.symlink_to(kept)
    elif how == "a folder":
        listed.unlink()
        listed.mkdir()
    else:
        (newest / "notes.bin").write_bytes(b"added after the seal")
    if how != "an extra file":
        flip(newest / "__0_0.distcp", 3)
    why = {"removed": "checksums.json is missing", "a link": "not a plain file", "a folder": "not a plain file",
           "an extra file": "notes.bin is not in its checksums.json"}[how]
    with pytest.raises(checksums.VerificationError, match=why):
        checksums.verify(newest)
    one_line_refusal(run_cli("generate", str(newest), "--prompt", "the", "--max-new-tokens", "2"), why)
    r = train(f"--data.path={data}", f"--train.output_dir={run}", "--train.max_steps=6", *RUN)
    said = r.stdout + r.stderr
    assert "checkpoint step-000004 failed verification: resumed from step-000002 instead" in said, said[-3000:]


def test_a_checkpoint_folder_that_is_a_link_out_of_the_run_is_never_loaded_or_followed(data, tiny_run, tmp_path):
    """#47 row 6: step-000004 made a link to a checkpoint outside the run was loaded from there,
    and the save of step 4 then died with an rmtree OSError traceback, at every rerun. A link is
    not one of the run's checkpoints: the resume takes step 2, the save of step 4 replaces the
    link, and what it pointed at is untouched."""
    out = tiny_run
    run = shutil.copytree(out, tmp_path / "run")
    outside = shutil.copytree(step_dir(run, 4), tmp_path / "outside-step")
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    shutil.rmtree(step_dir(run, 4))
    step_dir(run, 4).symlink_to(outside, target_is_directory=True)
    r = train(f"--data.path={data}", f"--train.output_dir={run}", "--train.max_steps=6", *RUN)
    said = r.stdout + r.stderr
    assert f"resumed from {step_dir(run, 2)} at step 2" in said and "Traceback" not in said, said[-3000:]
    assert not step_dir(run, 4).is_symlink() and (step_dir(run, 4) / "checksums.json").is_file()
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_a_job_heals_itself_lists_the_damage_and_resumes_from_a_chosen_checkpoint(dataset):
    """A stopped job whose newest checkpoint was damaged: `checkpoints --verify` marks it,
    `resume` continues from the good one before it (events say why), `resume --from ID` takes
    the checkpoint named."""
    from gptrain.jobs import store
    from gptrain.jobs.folder import job_dir

    args = ["--train.max_steps=6", "--checkpoint.every=2", "--train.precision=fp32", "--train.do_eval=false", *TRAIN]
    ok("run", "heal", "--dataset", dataset, "--", *args)
    assert wait_for("heal")["state"] == "succeeded"
    ckpts = checkpoints_dir("heal")
    store.update("heal", state="stopped")  # (as if stopped after step 6, before max_steps=8 below)
    flip(ckpts / step_name(6) / "__0_0.distcp", 1)
    listing = ok("checkpoints", "heal", "--verify")
    row6 = next(line for line in listing.splitlines() if step_name(6) in line)
    row4 = next(line for line in listing.splitlines() if step_name(4) in line)
    assert "FAILED: __0_0.distcp does not match its checksum" in row6 and row4.rstrip().endswith("ok"), listing

    spec = json.loads((job_dir("heal") / "job.json").read_text())
    assert spec  # the job runs again with the same spec: 6 steps, so it ends once step 6 is rewritten
    ok("resume", "heal")
    assert wait_for("heal")["state"] == "succeeded"
    log = ok("logs", "heal")
    assert "resumed from" in log and f"{step_name(4)} at step 4" in log, log[-3000:]
    events = [e["message"] for e in store.events("heal") if e["kind"] == "warning"]
    assert any(step_name(6) in m and "failed verification" in m for m in events), events

    store.update("heal", state="stopped")
    ids = {c["name"]: c["id"] for c in store.checkpoints("heal")}
    r = run_cli("resume", "heal", "--from", "nope00000000")
    assert r.returncode == 2 and job("heal")["state"] == "stopped", r.stderr
    ok("resume", "heal", "--from", ids[step_name(2)])
    assert wait_for("heal")["state"] == "succeeded"
    assert f"{step_name(2)} at step 2" in ok("logs", "heal")


def test_training_on_a_damaged_token_file_commits_no_checkpoint(tmp_path):
    """A byte flipped in a prepared dataset's train.bin (its size unchanged): the run's data check
    (train/data_check.py, beside training) fails it in one line naming the file before any
    checkpoint is committed; the intact dataset trains."""
    data = make_dataset(tmp_path)
    ok_run = run_cli("train", f"--data.path={data}", f"--train.output_dir={tmp_path / 'good'}",
                     "--train.max_steps=2", *RUN)
    assert ok_run.returncode == 0, ok_run.stderr[-2000:]
    token_file = data / "train.bin"
    flip(token_file, 4)
    r = run_cli("train", f"--data.path={data}", f"--train.output_dir={tmp_path / 'bad'}", "--train.max_steps=2", *RUN)
    one_line_refusal(r, str(token_file), "fails its sha256 check")
    assert not list(run_layout.checkpoints_dir(tmp_path / "bad").glob("step-*"))


@pytest.mark.parametrize("inside", ["", "/checkpoints", "/checkpoints/copies"])
def test_a_remote_inside_the_runs_own_folder_is_refused_before_anything_is_written(data, tmp_path, inside):
    """--checkpoint.remote=file://OUT/checkpoints copied each checkpoint onto itself: every step
    folder left empty, exit 0 (#47 round 3). Now one line, nothing written."""
    out = tmp_path / "run"
    r = train(f"--data.path={data}", f"--train.output_dir={out}", "--train.max_steps=2", *RUN,
              f"--checkpoint.remote=file://{out}{inside}", check=False)
    assert r.returncode == 2 and "is inside the run's own output folder" in r.stderr, r.stderr[-2000:]
    assert not out.exists()


def test_a_job_whose_checkpoints_all_fail_writes_no_false_event(dataset):
    """Every checkpoint of a stopped job damaged, `resume` twice: each attempt refuses in one line,
    and the events say only that. Before (#47 round 3): the damaged.txt marks moved the folders'
    mtimes, so the supervisor wrote 'step-N rewritten at step N after the restart ... the program
    started over' for each, and the second resume said 'starts again (no checkpoint yet)'."""
    from gptrain.jobs import store

    args = ["--train.max_steps=4", "--checkpoint.every=2", "--train.precision=fp32", "--train.do_eval=false", *TRAIN]
    ok("run", "gone", "--dataset", dataset, "--", *args)
    assert wait_for("gone")["state"] == "succeeded"
    store.update("gone", state="stopped")  # (as if stopped after step 4)
    for step in (2, 4):
        flip(checkpoints_dir("gone") / step_name(step) / "__0_0.distcp", step)
    for attempt in range(2):
        ok("resume", "gone")
        j = wait_for("gone")
        assert j["state"] == "failed" and "passes verification" in j["error"], (attempt, j)
        said = [e["message"] for e in store.events("gone")]
        assert not [m for m in said if "started over" in m or "no checkpoint yet" in m], (attempt, said)
        resumed = [e["message"] for e in store.events("gone") if e["kind"] == "resumed"][-1]
        assert ("has no checkpoint that passes verification" if attempt else "(or the newest one before it "
                "that passes verification)") in resumed, resumed  # (the first does not know yet)
