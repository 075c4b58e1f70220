"""weights/: "the newest checkpoint" decided once, for every kind, by the step as a number;
hostile names never listed; the capped tail of metrics.jsonl read by the library's one reader."""

import json
import os

import torch

from gptrain import run_layout
from gptrain.weights import layout, scan
from gptrain.weights.names import is_listable, step_of


def _gptrain_ckpt(d, step):
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"step": step}))
    (d / ".metadata").write_bytes(b"")
    return d


def test_gptrain_checkpoints_are_ordered_by_step_not_by_text(tmp_path):
    """Before: sorted as text, step-9 came after step-10 (find_latest and keep_last's prune, and
    the remote prune, each had their own sort), so a run past the zero padding resumed from an
    older checkpoint and pruned the newest."""
    root = run_layout.checkpoints_dir(tmp_path)
    for step in (9, 10, 100):
        _gptrain_ckpt(root / f"step-{step}", step)
    assert layout.find_latest(tmp_path) == root / "step-100"
    assert [p.name for p in layout.by_step(root.glob("step-*"))] == ["step-9", "step-10", "step-100"]
    (root / "latest").write_text("step-10\n")  # the pointer the trainer commits wins
    assert layout.find_latest(tmp_path) == root / "step-10"


def test_newest_across_kinds_is_the_highest_step_then_a_checkpoint_proper_then_time(tmp_path):
    out = tmp_path / "output"
    _gptrain_ckpt(out / layout.step_name(4), 4)
    hf = out / "checkpoint-12"
    hf.mkdir(parents=True)
    (hf / "model.safetensors").write_bytes(b"w")
    (hf / "config.json").write_text("{}")
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": 12, "log_history": []}))
    torch.save({"iter_num": 8, "best_val_loss": 1.5}, out / "ckpt.pt")
    (out / "weights_10.safetensors").write_bytes(b"w")
    (out / "final.bin").write_bytes(b"w")  # no step in its name: never the newest by step
    rows = scan.scan_folder(out, "output")
    kinds = {r["name"]: (r["kind"], r["step"]) for r in rows}
    assert kinds == {f"output/{layout.step_name(4)}": ("gptrain", 4), "output/checkpoint-12": ("hf-trainer", 12),
                     "output/ckpt.pt": ("nanogpt", 8), "output/weights_10.safetensors": ("file", 10),
                     "output/final.bin": ("file", None)}
    assert scan.newest(rows)["name"] == "output/checkpoint-12"
    # the folder itself a model at the same step (a Trainer's final save_model): the checkpoint wins
    top = {**next(r for r in rows if r["name"] == "output/checkpoint-12"), "name": "output", "time": 2e9}
    assert scan.newest([top, *rows], tops=("output",))["name"] == "output/checkpoint-12"
    assert scan.newest([top, *rows])["name"] == "output"  # without tops: the newer in time
    assert scan.newest([]) is None


def test_step_of_a_name():
    assert step_of("step-000100") == 100 and step_of("out/checkpoint-8") == 8
    assert step_of("run3/ckpt_12.pt", is_file=True) == 12 and step_of("model.v2.pt", is_file=True) == 2
    assert step_of("final") is None


def test_hostile_names_are_not_listed(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    for name in (b"bad-\xff-3.pt", b"new\nline-3.pt", b"esc-\x1b[31m-3.pt", b"ok-\xc3\xa9-3.pt"):
        os.close(os.open(os.fsencode(out) + b"/" + name, os.O_CREAT | os.O_WRONLY))
    assert [r["name"] for r in scan.scan_folder(out, "output")] == ["output/ok-é-3.pt"]
    assert is_listable("x" * 255) and not is_listable("x" * 256) and not is_listable("")


def test_the_jobs_row_reads_only_the_tail_of_metrics_jsonl(tmp_path):
    """jobs/progress reads the last records through the same incremental reader as the console,
    from the file's last TAIL_BYTES: a torn first line is dropped, not misread."""
    from gptrain.jobs import progress
    from gptrain.jobs.metrics_file import MetricsFile

    path = run_layout.metrics_file(tmp_path)
    rows = [{"step": s, "train/loss": 10 - s / 1000, "train/grad_norm": 0.5} for s in range(1, 3001)]
    rows.insert(1500, {"step": 1500, "eval/loss": 2.5})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert progress.from_jsonl(path) == {"train": {"step": 3000, "loss": 7.0, "grad_norm": 0.5}}
    mf = MetricsFile(path, tail_bytes=progress.TAIL_BYTES)
    mf.refresh()
    assert 0 < mf.count() < 3000 and mf.cols["train"]["step"][-1] == 3000  # only the tail was parsed
    with open(path, "a") as f:
        f.write(json.dumps({"step": 3001, "eval/loss": 2.0}) + "\n")
    mf.refresh()  # incremental: the appended line only
    assert mf.last_record("eval") == {"step": 3001, "loss": 2.0}


def test_what_a_model_is_loaded_from_is_decided_once(tmp_path):
    """models/load.py and train/model_init.py both ask weights/kinds.source_kind."""
    from gptrain.weights.kinds import source_kind

    ck = _gptrain_ckpt(layout.root_of(tmp_path / "run") / "step-2", 2)
    (tmp_path / "ckpt.pt").write_bytes(b"x")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"w")
    (tmp_path / "empty").mkdir()
    assert [source_kind(p) for p in (ck, tmp_path / "run", tmp_path / "ckpt.pt", hf, tmp_path / "empty",
                                      "gpt2")] == ["gptrain", "gptrain", "nanogpt", "hf", None, None]
