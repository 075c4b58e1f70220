"""The launcher's pure parts: `$GPTRAIN_*` expansion, the checkpoint a restart resumes from,
the .gitignore matcher of code snapshots outside git, and the Slurm script of each entry kind."""

import subprocess
from pathlib import Path

import pytest

from gptrain import run_layout
from gptrain.errors import UserError
from gptrain.jobs import folder, found, launch
from gptrain.jobs.programs import code
from gptrain.jobs.spec import JobSpec
from tests.helpers import trainer_checkpoint


def test_expand_only_gptrain_variables():
    env = {"GPTRAIN_OUTPUT_DIR": "/o", "GPTRAIN_JOB": "j", "HOME": "/root"}
    assert launch.expand(["--output_dir=$GPTRAIN_OUTPUT_DIR/x", "${GPTRAIN_JOB}-1", "$HOME",
                          "$GPTRAIN_NOPE", "$$GPTRAIN_JOB", "plain"], env) == \
        ["--output_dir=/o/x", "j-1", "$HOME", "$GPTRAIN_NOPE", "$j", "plain"]


def test_resume_from_the_newest_complete_checkpoint(tmp_path):
    assert found.latest(tmp_path) is None
    out = tmp_path / "output" / "run"
    for step in (2, 10, 9):
        trainer_checkpoint(out / f"checkpoint-{step}", step)
    trainer_checkpoint(out / "checkpoint-11", 11, state=False)  # killed while it was being written
    assert found.latest(tmp_path) == out / "checkpoint-10"
    run_layout.checkpoints_dir(tmp_path).mkdir()
    (run_layout.checkpoints_dir(tmp_path) / "step-12.pt").write_bytes(b"x")
    assert found.latest(tmp_path) == run_layout.checkpoints_dir(tmp_path) / "step-12.pt"


def test_resume_from_a_single_ckpt_pt(tmp_path):
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "ckpt.pt").write_bytes(b"x")
    assert found.latest(tmp_path) == tmp_path / "output" / "ckpt.pt"


def test_gitignore_outside_git(tmp_path):
    (tmp_path / ".gitignore").write_text("# c\n*.bin\ndata/\n/top.txt\n!keep.bin\nsub/skip.py\n")
    for name in ("a.py", "x.bin", "keep.bin", "data/d.txt", "top.txt", "sub/top.txt", "sub/skip.py",
                 "sub/data/e.txt", ".git/config", "sub/ok.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert sorted(code.list_files(tmp_path)) == [".gitignore", "a.py", "keep.bin", "sub/ok.py", "sub/top.txt"]


def test_git_work_tree_listing(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*.bin\n")
    for name in ("a.py", "x.bin", "sub/b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert sorted(code.list_files(tmp_path)) == [".gitignore", "a.py", "sub/b.py"]
    assert code.list_files(tmp_path / "sub") == ["b.py"]


def test_slurm_script_of_each_entry_kind(isolated_home, monkeypatch):
    from gptrain.jobs.engines.slurm import build_script

    monkeypatch.setattr("gptrain.jobs.engines.slurm.accel_type", lambda spec: "cpu")
    cmd = JobSpec(name="c", nodes=2, accels=4, command="bash", args=["run.sh", "$GPTRAIN_OUTPUT_DIR"],
                  code="/src").validate()
    text = build_script(cmd)
    jdir = folder.job_dir("c")
    assert f"cd {jdir}/code && exec" in text and "torch.distributed.run" not in text
    assert "export NNODES=$SLURM_NNODES; export NODE_RANK=$SLURM_NODEID; export NPROC_PER_NODE=4;" in text
    assert f"-m gptrain.jobs.rank_log --node {jdir}/logs -- bash run.sh '\"'\"'$GPTRAIN_OUTPUT_DIR" in text
    assert f"export GPTRAIN_OUTPUT_DIR={jdir}/output" in text
    mod = JobSpec(name="m", accels=2, module="pkg.train").validate()
    text = build_script(mod)
    assert "--nproc-per-node=2" in text and "-m pkg.train" in text
    assert f"cd {folder.job_dir('m')}/output && exec" in text


def test_entry_command_per_kind(isolated_home):
    jdir = Path("/j")
    assert launch.entry_command(JobSpec(name="a", module="p.m", args=["x"]).validate(), jdir)[1:] == ["-m", "p.m", "x"]
    assert launch.entry_command(JobSpec(name="a", command="bash", args=["r.sh"]).validate(), jdir) == ["bash", "r.sh"]
    t = JobSpec(name="a", args=["--train.max_steps=1"]).validate()
    assert launch.entry_command(t, jdir)[-1] == "--train.output_dir=/j" and folder.output_dir(t, jdir) == jdir


def test_job_yaml_code_fields(tmp_path):
    from gptrain.jobs.programs.job_file import from_yaml

    (tmp_path / "req.txt").write_text("tinypkg\n")
    (tmp_path / "job.yaml").write_text("name: y\ncode: src\nscript: train.py\nrequirements: req.txt\n"
                                       "args: ['--out=$GPTRAIN_OUTPUT_DIR']\n")
    fields = from_yaml(str(tmp_path / "job.yaml"))
    assert fields["code"] == str(tmp_path / "src") and fields["script"] == "train.py"
    assert fields["requirements"] == "tinypkg\n" and fields["args"] == ["--out=$GPTRAIN_OUTPUT_DIR"]
    (tmp_path / "bad.yaml").write_text("name: y\npython: /bin/sh\n")
    with pytest.raises(UserError, match="unknown field 'python'"):
        from_yaml(str(tmp_path / "bad.yaml"))
