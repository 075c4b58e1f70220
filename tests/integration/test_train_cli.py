"""`gptrain train` as users run it: the hosted-service tutorial's command, metrics, errors."""

import json
import re
from pathlib import Path

import pytest

from gptrain import run_layout
from tests.helpers import TINY, make_dataset, save_as_hf_blocks, shakespeare_char, step_dir, train, write_corpus

NANOGPT = Path(__file__).resolve().parents[1] / "third_party" / "nanogpt"


@pytest.fixture(scope="module")
def gpt2_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("gpt2data"), tokenizer="gpt2")


@pytest.fixture(scope="module")
def hf_saved(gpt2_data, tmp_path_factory):
    """The same tokens as a HF DatasetDict.save_to_disk with grouped input_ids blocks."""
    return save_as_hf_blocks(gpt2_data, tmp_path_factory.mktemp("hfsaved") / "gpt2-tokenized-wikitext")


def tutorial_cmd(data_dir, model_dir, out, *extra):
    return ["--do_train", "--do_eval", "--dataset_name", "wikitext", "--tokenized_dataset_load_dir",
            data_dir, "--model_name_or_path", model_dir, "--output_dir", out,
            "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
            "--logging_steps", "50", "--save_steps", "500", "--eval_steps", "500",
            "--eval_strategy", "steps", "--max_steps", "3", "--max_eval_samples", "16", *extra]


@pytest.mark.parametrize("source", ["gptrain", "hf_save_to_disk"])
def test_hosted_service_tutorial_command_runs_as_written(source, gpt2_data, hf_saved, tiny_hf_gpt2, tmp_path):
    data_dir = gpt2_data if source == "gptrain" else hf_saved
    r = train(*tutorial_cmd(data_dir, tiny_hf_gpt2, tmp_path / "out"))
    assert "completed at step 3" in r.stdout and "eval step 3" in r.stdout
    # one header line a user reads (issue 39), and the line saying whose defaults filled the gaps
    # (#49: the HF Trainer's); the choices behind it in run.json (`gptrain inspect`): the precision
    # and its reason (the Trainer's fp32), what MFU is measured against
    out = tmp_path / "out"
    header = [line for line in r.stdout.splitlines() if line.startswith("training ")]
    info_file = re.escape(str(run_layout.run_info_file(out)))
    assert len(header) == 1 and re.fullmatch(r"training [\d.]+M parameters on 1 x cpu in fp32: 3 steps of "
                                             rf"512 tokens \(how and why: {info_file}\)",
                                             header[0]), r.stdout
    assert "mfu basis" not in r.stdout and "kernels:" not in r.stdout
    info = json.loads(run_layout.run_info_file(out).read_text())
    assert info["precision"].startswith("fp32 (the HF Trainer's default") and info["dialect"] == "hf", info
    assert "the HF Trainer's defaults fill what its flags leave out: lr 5e-5, linear decay to 0" in r.stdout
    assert info["mfu_basis"].startswith("1 x (") and " per core, measured on one-thread matmuls" in info["mfu_basis"]
    assert info["kernels"] in ("eager blocks, fused chunked loss", "eager blocks, eager plain loss"), info
    rows = [json.loads(l) for l in run_layout.metrics_file(tmp_path / "out").read_text().splitlines()]
    assert any("eval/loss" in row for row in rows) and any("train/loss" in row for row in rows)
    # --logging_steps 50: the first step is shown at once, not after 50 steps (issue 39), then the last
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 3]
    assert (step_dir(tmp_path / "out", 3) / "trainer_state.json").is_file()


def test_flash_attention_variant_is_a_clear_error_without_flash_attn(gpt2_data, tiny_hf_gpt2, tmp_path):
    out = tmp_path / "out"
    r = train(*tutorial_cmd(gpt2_data, tiny_hf_gpt2, out, "--attn_implementation", "flash_attention_2",
                            "--torch_dtype", "float16"), check=False)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "flash" in r.stderr, r.stderr
    assert not out.exists()


def test_tensorboard_events_are_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = make_dataset(tmp_path)
    out = tmp_path / "out"
    r = train(f"--data.path={data}", f"--train.output_dir={out}", "--train.max_steps=4", "--logging_steps=1",
              "--train.eval_every=2", "--eval_strategy=steps", *TINY, "--report_to=tensorboard", "--max_grad_norm=0.001")
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/loss", "eval/perplexity"} <= set(tags)
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    # each logged step's gradient norm before clipping, as torchtitan and the HF Trainer log it:
    # in metrics.jsonl, TensorBoard and the console line
    rows = [json.loads(line) for line in run_layout.metrics_file(out).read_text().splitlines()]
    norms = [r["train/grad_norm"] for r in rows if "train/grad_norm" in r]
    assert [e.value for e in acc.Scalars("train/grad_norm")] == pytest.approx(norms) and len(norms) == 4
    assert all(n > 0.001 for n in norms)  # (so each step was clipped)
    assert f"| grad {norms[0]:.3g} |" in r.stdout, r.stdout
    unclipped = tmp_path / "unclipped"  # the same first step, measured without clipping: the same norm
    train(f"--data.path={data}", f"--train.output_dir={unclipped}", "--train.max_steps=1", *TINY,
          "--train.do_eval=false", "--train.grad_clip=0")
    first = [json.loads(line) for line in run_layout.metrics_file(unclipped).read_text().splitlines()][0]
    assert first["train/grad_norm"] == pytest.approx(norms[0], rel=1e-6)


def test_nan_loss_stops_without_a_poisoned_checkpoint(tmp_path):
    data = make_dataset(tmp_path)
    out = tmp_path / "out"
    r = train(f"--data.path={data}", f"--train.output_dir={out}", "--train.max_steps=20",
              *TINY, "--train.lr=1e30", "--train.warmup_steps=0", "--train.grad_clip=0",
              "--checkpoint.every=1", "--train.do_eval=false", check=False)
    assert r.returncode == 2 and "NaN/inf" in r.stderr, r.stderr
    from gptrain.weights.layout import find_latest, read_state, step_name

    latest = find_latest(out)
    import math

    assert latest is not None and math.isfinite(read_state(latest)["train_loss"])
    # step 1 (lr 1e30) makes the weights overflow: step 2 is the first NaN, skipped on the
    # device (train/finite.py) and reported before step 2's checkpoint would be written
    assert "the loss became NaN/inf at step 2;" in r.stderr and latest.name == step_name(1), (r.stderr, latest)


@pytest.mark.parametrize("where", ["a-file", "a-file/out"])
def test_an_output_dir_that_cannot_be_made_is_one_line(tmp_path, where):
    data = make_dataset(tmp_path)
    (tmp_path / "a-file").write_text("not a directory\n")
    r = train(f"--data.path={data}", f"--train.output_dir={tmp_path / where}", "--train.max_steps=1",
              *TINY, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"gptrain: error: cannot write the output directory {tmp_path / where} ("), r.stderr
    assert len(r.stderr.splitlines()) == 1 and "choose another train.output_dir" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--parallel.tp=2", "--parallel.dp_shard=1"], "multiply to the world size"),
    (["--parallel.tp=2"], "cannot infer parallel.dp_shard"),
    (["--parallel.pp=0"], "--parallel.pp must be >= 1, got 0"),
    (["--model.n_head=3"], "divisible by n_head"),
    (["--data.path=no-such-dataset"], "no dataset named"),
    (["--model.preset=gpt5"], "unknown model preset"),
    (["--train.precision=fp8"], "choose one of"),
])
def test_configuration_errors_one_line_exit_2_nothing_written(tmp_path, args, message):
    data = make_dataset(tmp_path)
    out = tmp_path / "out"
    r = train(f"--data.path={data}", f"--train.output_dir={out}", *TINY, *args, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr, r.stderr
    assert not out.exists()


def test_layout_checks():
    from gptrain.config import ParallelConfig
    from gptrain.distributed.mesh import ParallelDims
    from gptrain.distributed.parallelize import check_layout
    from gptrain.errors import UserError
    from gptrain.models.shapes import GPTConfig

    dims = ParallelDims.from_config(ParallelConfig(tp=2, dp_shard=-1), world=4)
    assert (dims.dp_shard, dims.tp) == (2, 2)
    with pytest.raises(UserError, match="not divisible by parallel.tp"):
        check_layout(GPTConfig(n_head=3, n_embd=48), dims)
    with pytest.raises(UserError, match="more|at most one stage per layer"):
        check_layout(GPTConfig(n_layer=2), ParallelDims.from_config(ParallelConfig(pp=4, dp_shard=1), 4))
    with pytest.raises(UserError, match="cannot infer"):
        ParallelDims.from_config(ParallelConfig(tp=3), world=4)


def test_a_terminal_gets_a_progress_bar_and_a_pipe_does_not(tmp_path):
    """HF's tqdm bar where the output is a terminal (a pty here): percent, steps done of total,
    elapsed and left, with the step lines printed above it; a job's log or a pipe gets the lines only."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from tests.helpers import env

    data = make_dataset(tmp_path)
    args = [sys.executable, "-m", "gptrain", "train", f"--data.path={data}", "--train.max_steps=4",
            "--train.do_eval=false", *TINY]
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 columns wide
    proc = subprocess.Popen([*args, f"--train.output_dir={tmp_path / 'tty'}"], stdout=child, stderr=child,
                            env=env(), close_fds=True)
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=300) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "100%|" in text and "4/4 [" in text and "step/s]" in text, text
    assert "step      4/4 | loss" in text and "completed at step 4" in text, text
    piped = train(*args[4:], f"--train.output_dir={tmp_path / 'pipe'}")
    assert "%|" not in piped.stdout and "%|" not in piped.stderr and "step      4/4 | loss" in piped.stdout


def test_hf_flags_evaluate_when_the_trainer_would(gpt2_data, tiny_hf_gpt2, tmp_path):
    """#49 row 2: the HF Trainer's cadence. run_clm.py's --do_eval without an --eval_strategy
    evaluates once, at the end; without --do_eval nothing is evaluated (gptrain evaluated every
    500 steps and at the end either way)."""
    def evals(*flags):
        out = tmp_path / f"out{len(flags)}"
        cmd = tutorial_cmd(gpt2_data, tiny_hf_gpt2, out)
        cut = cmd.index("--eval_steps")
        cmd = [f for f in cmd[:cut] + cmd[cut + 4:] if f != "--do_eval"]  # no --eval_steps/--eval_strategy
        train(*cmd, *flags)
        rows = [json.loads(line) for line in run_layout.metrics_file(out).read_text().splitlines()]
        return [row["step"] for row in rows if "eval/loss" in row]

    assert evals("--do_eval") == [3]
    assert evals() == []

def test_nanogpts_readme_line_trains_as_typed(tmp_path):
    """nanoGPT's README ("I only have a macbook") typed in a nanoGPT checkout: its config file first
    (config/train_shakespeare_char.py, read, never run), data/shakespeare_char as its prepare.py
    writes it, the flags as typed but for fewer iterations; nanoGPT's defaults fill the rest."""
    import shutil

    shutil.copytree(NANOGPT / "config", tmp_path / "config")
    shakespeare_char(tmp_path / "data" / "shakespeare_char", write_corpus(tmp_path / "in.txt", 20000).read_text())
    r = train("config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=2",
              "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
              "--max_iters=3", "--lr_decay_iters=3", "--dropout=0.0", cwd=tmp_path)
    assert "training 0.8" in r.stdout and "3 steps of 768 tokens" in r.stdout, r.stdout  # (the file's accumulation: 1)
    assert "nanoGPT train.py's defaults fill what its keys leave out" in r.stdout, r.stdout
    out = tmp_path / "out-shakespeare-char"  # the file's out_dir, in the checkout
    rows = [json.loads(line) for line in run_layout.metrics_file(out).read_text().splitlines()]
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 2, 3]
    lr = [row["train/lr"] for row in rows if "train/lr" in row]
    assert lr == pytest.approx([1e-3 * i / 100 for i in (1, 2, 3)]), lr  # the file's warmup_iters=100
    assert any("eval/loss" in row for row in rows) and step_dir(out, 3).is_dir()
