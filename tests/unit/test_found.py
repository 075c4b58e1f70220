"""Checkpoint discovery (jobs/found.py over weights/scan.py): one row per checkpoint of each kind, nothing else."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from gptrain import run_layout
from tests.conftest import run_cli
from tests.helpers import nanogpt_ckpt, step_dir


def hf_trainer_checkpoint(tiny_hf_gpt2, path, step, losses=((10, 3.0), (20, 2.5)), eval_loss=2.7):
    shutil.copytree(tiny_hf_gpt2, path)
    history = [{"step": s, "loss": l, "epoch": 0.1} for s, l in losses] + \
        [{"step": step, "eval_loss": eval_loss, "epoch": 0.2}]
    (path / "trainer_state.json").write_text(json.dumps(
        {"global_step": step, "epoch": 0.2, "log_history": history, "best_metric": None}))
    for extra in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        (path / extra).write_bytes(b"x" * 10)
    return path


def test_each_kind_one_row_right_steps_no_bogus_rows(tmp_path, tiny_hf_gpt2):
    from gptrain.jobs import found

    job = tmp_path / "job"
    out, ck = job / "output", run_layout.checkpoints_dir(job)
    hf_trainer_checkpoint(tiny_hf_gpt2, out / "checkpoint-20", 20)
    hf_trainer_checkpoint(tiny_hf_gpt2, out / "checkpoint-40", 40, losses=((30, 2.0), (40, 1.75)), eval_loss=1.9)
    hf_trainer_checkpoint(tiny_hf_gpt2, out / "checkpoint-60", 60)
    (out / "checkpoint-60" / "trainer_state.json").unlink()  # being written: not a checkpoint yet
    for f in tiny_hf_gpt2.iterdir():  # save_model(output_dir): the output dir is the final model
        shutil.copy2(f, out / f.name)
    for junk in ("tokenizer.json", "vocab.json", "merges.txt", "training_args.json", "train.log", "notes.txt",
                 "training_args.bin", "optimizer.pt", "rng_state_1.pth", "train.bin", "val.bin"):
        (out / junk).write_text("{}")
    (out / "epoch_2.pt").write_bytes(b"weights beside the final model")
    nanogpt_ckpt(ck / "out-shakespeare" / "ckpt.pt", iter_num=250, val=1.25)
    (ck / "epoch_7.pth").write_bytes(b"not a pickle")
    (ck / "weights.safetensors").write_bytes(b"x")
    (ck / "run.log").write_text("loss 1.0\n")
    rows = {r["name"]: r for r in found.scan(job)}
    assert set(rows) == {"output", "output/checkpoint-20", "output/checkpoint-40", "output/epoch_2.pt",
                         "out-shakespeare/ckpt.pt", "epoch_7.pth", "weights.safetensors"}, sorted(rows)
    assert rows["output"]["kind"] == "hf-model" and rows["output"]["step"] is None
    assert rows["output"]["size"] < 2 * rows["output/checkpoint-20"]["size"]  # not its checkpoints too
    c40 = rows["output/checkpoint-40"]
    assert (c40["kind"], c40["step"], c40["train_loss"], c40["eval_loss"]) == ("hf-trainer", 40, 1.75, 1.9)
    assert rows["output/checkpoint-20"]["train_loss"] == 2.5
    nano = rows["out-shakespeare/ckpt.pt"]
    assert (nano["kind"], nano["step"], nano["eval_loss"]) == ("nanogpt", 250, 1.25)
    assert (rows["epoch_7.pth"]["kind"], rows["epoch_7.pth"]["step"]) == ("file", 7)
    assert rows["weights.safetensors"]["step"] is None
    assert found.latest(job) == ck / "out-shakespeare" / "ckpt.pt"


def test_crafted_pickle_is_refused_and_never_run(tmp_path):
    """A ckpt.pt whose pickle runs a command on load: listed as a plain file, never executed,
    and using it as a model fails in one line."""
    marker = tmp_path / "pwned"
    evil = run_layout.checkpoints_dir(tmp_path / "home" / "jobs" / "evil") / "ckpt.pt"
    evil.parent.mkdir(parents=True)
    code = ("import os, torch\n"
            "class Evil:\n"
            f"    def __reduce__(self): return (os.system, ('touch {marker}',))\n"
            f"torch.save({{'iter_num': Evil(), 'model': Evil()}}, {str(evil)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    from gptrain.jobs import found

    rows = found.scan(evil.parent.parent)
    assert [(r["name"], r["kind"]) for r in rows] == [("ckpt.pt", "file")]
    r = run_cli("generate", evil, "--max-new-tokens", "2")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "ckpt.pt" in r.stderr
    assert not marker.exists()


def test_rewritten_checkpoint_refreshes_its_row(tmp_path, isolated_home):
    """A script that saves ckpt.pt again at a later step: the row follows (not only new names)."""
    from gptrain.jobs import folder, found, store

    store.create_job("nano", {"name": "nano"}, 1, 1, "local")
    path = nanogpt_ckpt(folder.job_dir("nano") / "output" / "ckpt.pt", iter_num=100, val=2.0)
    store.sync_checkpoints("nano", found.scan_job("nano"))
    assert [(c["step"], c["eval_loss"]) for c in store.checkpoints("nano")] == [(100, 2.0)]
    time.sleep(0.01)
    nanogpt_ckpt(path, iter_num=300, val=1.5)
    os.utime(path, (time.time() + 5, time.time() + 5))
    store.sync_checkpoints("nano", found.scan_job("nano"))
    rows = store.checkpoints("nano")
    assert [(c["name"], c["step"], c["eval_loss"]) for c in rows] == [("output/ckpt.pt", 300, 1.5)]
    assert "rewritten at step 300" in store.events("nano")[-1]["message"]


@pytest.mark.parametrize("vocab", [50304, 65])
def test_nanogpt_checkpoint_matches_its_own_forward(tmp_path, vocab):
    """The converted model computes what nanoGPT's GPT computes with the same weights (its
    forward written out here: Linear layers, causal attention, exact GELU as its nn.GELU(), tied head)."""
    from gptrain.models.load import load_model

    path = nanogpt_ckpt(tmp_path / "ckpt.pt", vocab=vocab)
    model, tok = load_model(str(path))
    assert (tok is not None) == (vocab == 50304)
    sd = {k.removeprefix("_orig_mod."): v for k, v in torch.load(path, weights_only=True)["model"].items()}
    idx = torch.randint(0, 65, (2, 16))
    F = torch.nn.functional

    def lin(x, name):
        return F.linear(x, sd[name + ".weight"], sd[name + ".bias"])

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:16]
    for i in range(2):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (32,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"])
        q, k, v = lin(h, p + "attn.c_attn").split(32, dim=2)
        q, k, v = (t.view(2, 16, 4, 8).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, 32)
        x = x + lin(y, p + "attn.c_proj")
        h = F.layer_norm(x, (32,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])
        x = x + lin(F.gelu(lin(h, p + "mlp.c_fc")), p + "mlp.c_proj")
    want = F.linear(F.layer_norm(x, (32,), sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]),
                    sd["transformer.wte.weight"])
    with torch.no_grad():
        got = model(idx)
    got = got[0] if isinstance(got, tuple) else got
    assert got.shape[-1] == (50257 if vocab == 50304 else vocab)  # nanoGPT's padding rows dropped
    torch.testing.assert_close(got, want[..., :got.shape[-1]], atol=1e-4, rtol=1e-4)
    # `gptrain export` of it: transformers computes the same
    from transformers import GPT2LMHeadModel

    r = run_cli("export", path, "--out", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        theirs = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()(idx).logits
    torch.testing.assert_close(theirs, want[..., :theirs.shape[-1]], atol=1e-4, rtol=1e-4)


def test_training_starts_from_a_nanogpt_checkpoint_named_by_job(tmp_path, isolated_home):
    """--model.init_from JOB: the job's nanoGPT ckpt.pt, resolved at the CLI edge (jobs/api.model_source)
    and converted; the first loss is the converted model's own."""
    from gptrain.jobs import folder, store
    from tests.helpers import TINY, losses, make_dataset, train

    store.create_job("nano", {"name": "nano"}, 1, 1, "local")
    nanogpt_ckpt(folder.job_dir("nano") / "output" / "ckpt.pt", vocab=65)
    data = make_dataset(tmp_path)
    out = tmp_path / "run"
    train(f"--data.path={data}", f"--output_dir={out}", "--model.init_from=nano", "--train.max_steps=1",
          "--train.batch_size=2", *[f for f in TINY if not f.startswith(("--model.n_", "--model.block"))])
    first = losses(out)[1]
    assert 3.0 < first < 5.0  # ln(65) = 4.17 for the near-uniform random init; not a fresh model's shape
    from gptrain.models.load import load_model

    assert load_model(str(out))[0].config.n_embd == 32 and load_model(str(out))[0].config.vocab_size == 65


def test_listing_an_unchanged_nanogpt_checkpoint_does_not_load_torch(tmp_path, isolated_home):
    """The first listing reads ckpt.pt (torch); later ones reuse its row, so `checkpoints` and
    `inspect` stay light."""
    from gptrain.jobs import folder, store

    store.create_job("nano", {"name": "nano", "script": "x.py", "args": [], "datasets": []}, 1, 1, "local")
    nanogpt_ckpt(folder.checkpoints_dir(folder.job_dir("nano")) / "ckpt.pt", iter_num=42)
    code = ("import sys; from gptrain.cli import main\n"
            "assert main(['checkpoints', 'nano']) == 0\n"
            "print('torch' in sys.modules)\n")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True) for _ in range(2)]
    assert [r.stdout.strip().splitlines()[-1] for r in runs] == ["True", "False"], [r.stderr for r in runs]
    assert "nanogpt" in runs[1].stdout and " 42 " in runs[1].stdout
    # past the grace a new job's supervisor has to appear, a listing ends it (`failed`, with the line
    # of what a restart would be given): that line reuses the recorded row too (CI took > 10 s and
    # the second listing loaded torch)
    with store.transaction() as conn:
        conn.execute("UPDATE jobs SET created = created - 60, updated = updated - 60 WHERE name = 'nano'")
    late = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert late.stdout.strip().splitlines()[-1] == "False", (late.stdout, late.stderr)
    assert store.get_job("nano")["state"] == "failed"


def test_trainer_checkpoint_of_a_plain_module_is_one_row(tmp_path):
    """HF Trainer with a model that is not a PreTrainedModel (or a script keeping the Trainer's
    layout) writes checkpoint-N/ with bare weights and no config.json: one row (what a restart
    resumes from), not a row per file inside."""
    from gptrain.jobs import found

    job = tmp_path / "job"
    for step in (2, 4):
        d = job / "output" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        torch.save({"w": torch.ones(1)}, d / "model.pt")
        (d / "optimizer.pt").write_bytes(b"x")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    rows = found.scan(job)
    assert [(r["name"], r["kind"], r["step"]) for r in rows] == \
        [("output/checkpoint-2", "hf-trainer", 2), ("output/checkpoint-4", "hf-trainer", 4)]
    assert found.latest(job) == job / "output" / "checkpoint-4"


def test_a_restart_resumes_from_the_numbered_folder_of_a_single_file(tmp_path):
    """docs/jobs-code.md's plain-PyTorch example keeps checkpoint-N/state.pt: GPTRAIN_RESUME_FROM
    is the folder (it was the file, and the example's restart read state.pt/state.pt)."""
    from gptrain.jobs import found

    job = tmp_path / "job"
    for step in (4, 8):
        d = job / "output" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        torch.save({"step": step}, d / "state.pt")
    assert found.latest(job) == job / "output" / "checkpoint-8"
    run_layout.checkpoints_dir(job).mkdir()
    torch.save({"step": 12}, run_layout.checkpoints_dir(job) / "step_12.pt")  # a file of its own stays the file
    assert found.latest(job) == run_layout.checkpoints_dir(job) / "step_12.pt"


def test_a_snapshot_without_a_step_shows_none_made_up(tmp_path, isolated_home):
    """minGPT's snapshot.pt (model_state, optimizer_state, finished_epoch): listed with no step,
    and `inspect` says so instead of `step None`."""
    from gptrain.jobs import folder, store
    from gptrain.jobs.spec import JobSpec

    store.create_job("mingpt", JobSpec(name="mingpt", script="main.py").to_dict(), 1, 1, "local")
    out = folder.job_dir("mingpt") / "output"
    out.mkdir(parents=True)
    folder.logs_dir(folder.job_dir("mingpt")).mkdir()
    torch.save({"model_state": {"w": torch.zeros(2)}, "optimizer_state": {}, "finished_epoch": 3},
               out / "snapshot.pt")
    r = run_cli("inspect", "mingpt")
    assert r.returncode == 0, r.stderr
    assert "step None" not in r.stdout and "output/snapshot.pt  (no step recorded)" in r.stdout, r.stdout


def test_one_checkpoint_named_every_way_a_user_can_is_the_same_checkpoint(tmp_path, isolated_home):
    """A job whose `latest` names step 2 while a step-4 checkpoint is still on disk (what
    `resume --from` leaves until the run saves again): its name, the checkpoint's ID, the job's
    folder, its checkpoints folder and the checkpoint folder itself all mean step 2 (one rule for
    the newest: weights/scan.newest, as a gptrain resume takes it: weights/layout.resume_order)."""
    from gptrain.jobs import api, found, store
    from gptrain.jobs.folder import job_dir
    from gptrain.weights import layout
    from tests.helpers import TINY, make_dataset, train

    store.create_job("named", {"name": "named"}, 1, 1, "local")
    jdir = job_dir("named")
    train(f"--data.path={make_dataset(tmp_path)}", f"--train.output_dir={jdir}", "--train.max_steps=4",
          *TINY, "--checkpoint.every=2", "--train.do_eval=false")
    (run_layout.checkpoints_dir(jdir) / "latest").write_text(layout.step_name(2) + "\n")
    store.sync_checkpoints("named", found.scan_job("named"))
    ids = {c["name"]: c["id"] for c in store.checkpoints("named")}
    step2 = step_dir(jdir, 2)

    # the one chooser answers with the checkpoint itself: a run's folder is not handed on for a
    # loader to choose again (before: the folder, which generate then resolved a second time)
    for ref in ("named", ids[layout.step_name(2)], str(jdir), str(run_layout.checkpoints_dir(jdir)), str(step2)):
        assert api.model_source(ref) == str(step2), ref
    assert layout.find_latest(jdir) == step2 and found.latest(jdir) == step2
    assert api.model_source(ids[layout.step_name(4)]) == str(step_dir(jdir, 4))  # named: itself
    # to resume from, a run's folder stays the folder (its newest that passes verification is the
    # trainer's to take); kept best (checkpoint.keep_best) is what the run stands for as a model
    assert api.model_source(str(jdir), resume=True) == str(jdir)
    (run_layout.checkpoints_dir(jdir) / "best").write_text(layout.step_name(4) + "\n")
    for ref in ("named", str(jdir)):
        assert api.model_source(ref) == str(step_dir(jdir, 4)), ref


def test_a_mistyped_job_name_is_did_you_mean_before_any_network_request(tmp_path, isolated_home, monkeypatch):
    """`gptrain generate shakespear` asked the hub for 5 s and answered LocalEntryNotFoundError
    (issue 38); a cached hub model of that name and hf:NAME still reach the hub's loader."""
    from gptrain.errors import NotFound
    from gptrain.jobs import found, store

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    store.create_job("shakespeare", {"name": "shakespeare"}, 1, 1, "local")
    with pytest.raises(NotFound, match=r"no job, checkpoint or model named 'shakespear' here \(did you mean "
                                       r"'shakespeare'\?\); for the Hugging Face model of that name write hf:shakespear"):
        found.model_source("shakespear")
    assert found.model_source("hf:shakespear") == "shakespear"
    assert found.model_source("gpt2") == "gpt2"  # nothing close: a hub id, as before
    (tmp_path / "hub" / "models--shakespear").mkdir(parents=True)
    assert found.model_source("shakespear") == "shakespear"
    r = run_cli("generate", "shakespear", env={"HF_HUB_CACHE": str(tmp_path / "nohub")})
    assert r.returncode == 2 and "did you mean 'shakespeare'?" in r.stderr and r.stderr.count("\n") == 1, r.stderr
