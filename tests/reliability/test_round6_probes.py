"""Low rows of #47's sixth attacker round, each as it was tried, each failing before its fix:
generate's seed past what torch takes, `session stop` of a plain job, and instruction data on the
generic path (its default packing was chosen, then refused for a flag the user never gave)."""

import json

from gptrain import run_layout

from tests.conftest import run_cli
from tests.helpers import train


def one_line(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_generate_takes_only_a_seed_torch_takes(tiny_run):
    """4.25/R.10: --seed 2^64 was an 'Overflow when unpacking long long' traceback."""
    for seed in (str(2 ** 64), str(2 ** 63), "-1"):
        one_line(run_cli("generate", str(tiny_run), "--prompt", "th", "--seed", seed), "--seed must be 0 to 2^63-1")
    assert run_cli("generate", str(tiny_run), "--prompt", "th", "--seed", str(2 ** 63 - 1),
                   "--max-new-tokens", "2").returncode == 0


def test_session_stop_of_a_plain_job_is_refused_as_attach_is(isolated_home):
    """R.21: `session stop J` of a finished plain job said 'session J: succeeded', exit 0."""
    from gptrain.jobs import store

    store.create_job("plain", {"name": "plain", "args": ["--train.max_steps=1"]}, 1, 1, "local")
    store.set_state("plain", "succeeded", "done")
    for action in ("stop", "attach", "exec"):
        one_line(run_cli("session", action, "plain", *(["--", "true"] if action == "exec" else [])),
                 "plain is a job, not a session")


def test_instruction_data_on_the_generic_path_trains_unpacked_by_default(tmp_path):
    """G.pack2: the default (auto) packing was chosen for a model whose attention takes no
    block-diagonal mask, then refused with 'train without --packing', a flag never given."""
    from tests.conftest import save_tiny_hf_neox

    neox = save_tiny_hf_neox(tmp_path / "neox", n_layer=1, vocab=260)  # (the byte tokenizer's ids)
    rows = [{"prompt": f"Q{i % 10}\n", "completion": "hi"} for i in range(64)]  # (short: auto would pack them)
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = train(f"--data.path={sft}", f"--model_name_or_path={neox}", f"--train.output_dir={tmp_path / 'o'}",
              "--train.max_steps=2", "--train.batch_size=2", "--model.block_size=32", "--train.dialect=gptrain",
              "--train.do_eval=false", "--train.precision=fp32", "--data.tokenizer=byte", check=False)
    assert r.returncode == 0 and "completed at step 2" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


def test_a_floor_above_the_rate_and_one_token_shards_are_one_line(tmp_path):
    """3.94/R.13: --train.min_lr=5 with lr 1e-3 was accepted: the rate climbed to 4.5, loss 5.5 to
    107. 4.98/R.17: --shard-tokens 1 wrote a file per token (35,680 in 20 s) until killed."""
    from gptrain.config_options import parse_train_args
    from gptrain.errors import UserError

    import pytest

    with pytest.raises(UserError, match=r"--train.min_lr \(5\) is more than the learning rate \(0.001\)"):
        parse_train_args(["--train.lr=1e-3", "--train.min_lr=5"])
    assert parse_train_args(["--train.lr=1e-3", "--train.min_lr=1e-3"]).train.min_lr == 1e-3
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n" * 100)
    one_line(run_cli("data", "prepare", str(corpus), "--out", str(tmp_path / "o"), "--tokenizer", "byte",
                     "--shard-tokens", "1"), "--shard-tokens must be at least 256")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_a_pipe_or_a_mistyped_path_is_not_taken_for_a_hub_name(tmp_path):
    """9.8, 9.30/R.15, R.16: `data prepare` of a FIFO, or of a path with a typo under a folder
    that exists, asked the Hugging Face Hub for it (25 s of retries offline)."""
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "data").mkdir()
    one_line(run_cli("data", "prepare", str(fifo), "--out", str(tmp_path / "o")), "is not a file or a folder")
    one_line(run_cli("data", "prepare", "data/corpsu", "--out", str(tmp_path / "o"), cwd=tmp_path),
             "source data/corpsu does not exist")
    assert not (tmp_path / "o").exists()


def test_a_run_whose_checkpoints_were_removed_does_not_start_over_silently(tiny_run, data, tmp_path):
    """C.K13/C.K14 (medium): every step folder removed (checkpoints/latest still naming the
    newest), a rerun started over from step 0 without a word, and a job's resume event said
    "starts again (no checkpoint yet)" though it had recorded them."""
    import shutil

    from gptrain.jobs.resume import restart_line
    from gptrain.jobs.spec import JobSpec
    from tests.helpers import TINY

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    for step in run_layout.checkpoints_dir(run).glob("step-*"):
        shutil.rmtree(step)
    r = train(f"--data.path={data}", f"--train.output_dir={run}", "--train.max_steps=6", *TINY, "--train.batch_size=2",
              "--train.do_eval=false", "--train.precision=fp32", "--checkpoint.every=2", check=False)
    assert r.returncode == 2 and "names step-000004, which is gone" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert not list(run_layout.checkpoints_dir(run).glob("step-*"))  # nothing trained, nothing written over
    said = restart_line(JobSpec(name="j", entry="trainer"), run)
    assert "latest names step-000004, which is gone" in said and "no checkpoint yet" not in said
