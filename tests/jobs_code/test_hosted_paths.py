"""The hosted tutorials' fixed paths (/input, /input/<dataset>, /output, /output-checkpoint) in a
program's arguments under the hosted words (`gptrain training run`): the job's dataset and output
folders, never the machine's own /output (jobs/programs/hosted_paths.py)."""

import json
import time
from pathlib import Path

import pytest

from gptrain.errors import UserError
from gptrain.jobs.programs.hosted_paths import rewrite
from tests.conftest import run_cli

PROGRAM = """
import os, sys
args = dict(a.split("=", 1) for a in sys.argv[1:])
print("files", sorted(os.listdir(args["--tokenized_dataset_load_dir"])), flush=True)
print("same", open(args["--first"]).read().strip(), flush=True)
os.makedirs(args["--output_dir"], exist_ok=True)
open(os.path.join(args["--output_dir"], "result.txt"), "w").write("done")
os.makedirs(args["--ckpt"], exist_ok=True)
print("output", args["--output_dir"], "ckpt", args["--ckpt"], flush=True)
"""


def test_each_hosted_path_is_the_jobs_own():
    args, notes = rewrite(["--a", "/input", "--b=/input/wiki/train", "/input/notes.txt", "--o=/output",
                           "/output-checkpoint/x", "/inputs", "/output2", "--c=/elsewhere/input"], ["wiki", "more"])
    assert args == ["--a", "${GPTRAIN_DATASET_DIR}", "--b=${GPTRAIN_DATASET_WIKI_DIR}/train",
                    "${GPTRAIN_DATASET_DIR}/notes.txt", "--o=${GPTRAIN_OUTPUT_DIR}",
                    "${GPTRAIN_CHECKPOINT_DIR}/x", "/inputs", "/output2", "--c=/elsewhere/input"]
    assert len(notes) == 5 and notes[0] == "/input -> ${GPTRAIN_DATASET_DIR}"
    with pytest.raises(UserError, match="--dataset NAME"):
        rewrite(["/input"], [])


def test_the_tutorials_paths_run_as_typed(tmp_path, isolated_home, monkeypatch):
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "1")
    data = tmp_path / "gpt2-tokenized-wikitext"
    data.mkdir()
    (data / "dataset_info.json").write_text("{}")
    (data / "first.txt").write_text("from the dataset\n")
    assert run_cli("dataset", "push", "gpt2-tokenized-wikitext", "--file", data).returncode == 0
    (tmp_path / "train.py").write_text(PROGRAM)
    r = run_cli("training", "run", "hosted", "--dataset", "gpt2-tokenized-wikitext", "--", "train.py",
                "--tokenized_dataset_load_dir=/input/gpt2-tokenized-wikitext", "--first=/input/first.txt",
                "--output_dir=/output", "--ckpt=/output-checkpoint", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "note: /output -> ${GPTRAIN_OUTPUT_DIR}" not in r.stderr  # (the note names the whole argument)
    assert "note: --output_dir=/output -> --output_dir=${GPTRAIN_OUTPUT_DIR}" in r.stderr, r.stderr
    deadline = time.time() + 120
    while (job := json.loads(run_cli("inspect", "hosted", "--json").stdout)["job"])["state"] not in (
            "succeeded", "failed") and time.time() < deadline:
        time.sleep(0.5)
    log = run_cli("logs", "hosted").stdout
    assert job["state"] == "succeeded", (job, log)
    assert "'dataset_info.json', 'first.txt']" in log and "same from the dataset" in log, log
    jdir = isolated_home / "jobs" / "hosted"
    assert (jdir / "output" / "result.txt").read_text() == "done"
    assert f"output {jdir}/output ckpt {jdir}/checkpoints" in log, log
    assert not Path("/output/result.txt").exists() and not Path("/output-checkpoint").exists()
