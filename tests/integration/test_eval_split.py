"""Eval is never skipped silently: a file trained on directly gets a validation split with blocks
to evaluate on, and a split too short for the layout is named in one line."""

import json

from gptrain import run_layout
from tests.helpers import TINY, make_dataset, train


def _jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": f"document {i}: the king rode out at dawn with "
                                                 "his men while the river ran high."}) + "\n"
                            for i in range(docs)))
    return path


def test_a_single_jsonl_file_gets_eval_blocks(tmp_path):
    data = _jsonl(tmp_path / "train.jsonl", 600)  # one file: no validation split of its own
    r = train(f"--data.path={data}", "--data.tokenizer=char", f"--train.output_dir={tmp_path / 'out'}",
              "--train.max_steps=2", "--train.batch_size=2", "--train.eval_every=2", *TINY)
    rows = [json.loads(line) for line in run_layout.metrics_file(tmp_path / "out").read_text().splitlines()]
    assert any("eval/loss" in row for row in rows), r.stdout
    assert "no evaluation" not in r.stdout


def test_a_validation_split_too_short_is_named_in_one_line(tmp_path):
    data = make_dataset(tmp_path)
    r = train(f"--data.path={data}", f"--train.output_dir={tmp_path / 'out'}", "--train.max_steps=1",
              "--train.batch_size=4", "--data.max_eval_samples=1", "--train.eval_batch_size=4",
              "--parallel.pp=2", "--parallel.dp_shard=1", "--model.n_layer=2", *TINY[1:], nproc=2)
    lines = [line for line in r.stdout.splitlines() if "no evaluation" in line]
    assert len(lines) == 1 and "1 block(s) of 32" in lines[0] and "needs 4" in lines[0], r.stdout


def _eval_tokens(r):
    line = next(ln for ln in r.stdout.splitlines() if "eval step" in ln)
    return int(line.rsplit("|", 1)[1].split()[0].replace(",", ""))


def test_evaluation_is_bounded_by_default_and_the_whole_split_is_one_setting_away(tmp_path):
    data = make_dataset(tmp_path)  # 187 validation blocks of 32 tokens
    common = [f"--data.path={data}", "--train.max_steps=1", "--train.batch_size=2", "--train.eval_batch_size=2",
              *TINY]
    r = train(*common, f"--train.output_dir={tmp_path / 'a'}")
    assert _eval_tokens(r) == 50 * 2 * 32, r.stdout  # 50 batches of 2 blocks: nanoGPT's eval_iters
    assert "reads the first 100 of the 187 validation blocks" in r.stdout and "eval_iters=0" in r.stdout
    r = train(*common, "--train.eval_iters=0", f"--train.output_dir={tmp_path / 'b'}")
    assert _eval_tokens(r) == 187 * 32 and "reads the first" not in r.stdout, r.stdout
    r = train(*common, "--max_eval_samples", "10", f"--train.output_dir={tmp_path / 'c'}")
    assert _eval_tokens(r) == 10 * 32, r.stdout  # HF's bound alone where the user gave it
    r = train(*common, "--max_eval_samples", "10", "--train.eval_iters=3", f"--train.output_dir={tmp_path / 'd'}")
    assert _eval_tokens(r) == 6 * 32, r.stdout
