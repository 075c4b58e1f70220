"""Eval is never skipped silently: a file trained on directly gets a validation split with blocks
to evaluate on, and a split too short for the layout is named in one line."""

import json

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
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/loss" in row for row in rows), r.stdout
    assert "no evaluation" not in r.stdout


def test_a_validation_split_too_short_is_named_in_one_line(tmp_path):
    data = make_dataset(tmp_path)
    r = train(f"--data.path={data}", f"--train.output_dir={tmp_path / 'out'}", "--train.max_steps=1",
              "--train.batch_size=4", "--data.max_eval_samples=1", "--train.eval_batch_size=4",
              "--parallel.pp=2", "--parallel.dp_shard=1", "--model.n_layer=2", *TINY[1:], nproc=2)
    lines = [line for line in r.stdout.splitlines() if "no evaluation" in line]
    assert len(lines) == 1 and "1 block(s) of 32" in lines[0] and "needs 4" in lines[0], r.stdout
