"""#49 row 4: what a job would trip on in every worker is answered at submit, in one line, exit 2,
nothing recorded (a .csv data file; parallel degrees the job's processes cannot make); and the
answer to a JSONL without a `text` field names a flag that exists, which then trains on it."""

import json

import pytest

from tests.conftest import run_cli
from tests.helpers import TINY, train
from tests.job_helpers import nothing_recorded

RUN = [*TINY, "--train.max_steps=2", "--train.batch_size=2", "--train.do_eval=false", "--checkpoint.every=0"]


def one_line(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words), (r.returncode, r.stderr)


@pytest.mark.parametrize("accels, layout, words", [
    (2, "--parallel.tp=3", ("--accels 2 (2 processes)", "cannot infer parallel.dp_shard")),
    (1, "--parallel.dp_shard=2", ("--accels 1", "= 2 but 1 processes run")),
])
def test_parallel_degrees_the_processes_cannot_make_are_refused_at_submit(isolated_home, tmp_path, accels,
                                                                           layout, words):
    (tmp_path / "d.txt").write_text("some text\n" * 50)
    one_line(run_cli("run", "j", "--accels", str(accels), "--", f"--data.path={tmp_path / 'd.txt'}", layout, *RUN),
             *words)
    nothing_recorded(isolated_home)


def test_a_data_file_gptrain_cannot_read_is_refused_at_submit(isolated_home, tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n1,2\n")
    one_line(run_cli("run", "j", "--", f"--data.path={tmp_path / 'd.csv'}", *RUN),
             "cannot read", "d.csv", "supported files are")
    nothing_recorded(isolated_home)


def test_records_without_a_text_field_name_the_trainer_flag_that_reads_them(isolated_home, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"content": f"line {i} of some text to learn"}) + "\n" for i in range(200)))
    r = train(f"--data.path={data}", f"--train.output_dir={tmp_path / 'a'}", "--data.tokenizer=char", *RUN, check=False)
    errors = [line for line in r.stderr.splitlines() if "error" in line]  # (after the "tokenizing ..." note)
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert all(w in errors[0] for w in ("has no string field 'text'", "(its fields: content)", "--data.text_field=NAME"))
    r = train(f"--data.path={data}", f"--train.output_dir={tmp_path / 'b'}", "--data.tokenizer=char", *RUN,
              "--dataset_text_field=content")
    assert "completed" in r.stdout + r.stderr
