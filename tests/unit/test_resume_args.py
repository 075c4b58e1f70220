"""`--resume-args` (jobs/resume.py): the words a restart appends, the launch that appends them
(a real job folder), a single-process script with no torchrun, the Slurm script carrying only
the quoted template, the warning rule, and the one-line refusals with nothing recorded."""

import json
from pathlib import Path

import pytest

from gptrain import run_layout
from gptrain.errors import UserError
from gptrain.jobs import folder, launch, resume
from gptrain.jobs.spec import JobSpec
from tests.conftest import run_cli
from tests.helpers import trainer_checkpoint
def test_presets_and_placeholder_one_word_whatever_the_path():
    ckpt = Path("/jobs/a b/output/it's $HOME; rm -rf ~/checkpoint-20")
    assert resume.words("hf", ckpt) == (["--resume_from_checkpoint", str(ckpt)], None)
    assert resume.words("--resume={checkpoint} --x 'a b'", ckpt) == ([f"--resume={ckpt}", "--x", "a b"], None)
    assert resume.words("nanogpt", Path("/o/ckpt.pt")) == (["--init_from=resume"], None)
    args, why = resume.words("nanogpt", Path("/o/checkpoint-3"))
    assert args == [] and "resumes from its out_dir's ckpt.pt" in why
    assert resume.words("hf", None) == ([], "no checkpoint yet")
    assert resume.words(None, ckpt) == ([], resume.NO_ARGS)


@pytest.mark.parametrize("value, words", [
    ("", "needs the program's resume arguments"), ("  ", "needs the program's resume arguments"),
    ("--from {step}", "unknown placeholder {step}"), ("--from {}", "unknown placeholder {}"),
    ("--from '{checkpoint}", "No closing quotation"),
])
def test_bad_resume_args_refused(value, words):
    with pytest.raises(UserError, match=words.replace("{", r"\{").replace("}", r"\}")):
        resume.check(value)


def test_the_launch_appends_them_only_when_a_checkpoint_is_found(isolated_home, tmp_path):
    jdir = tmp_path / "jobs" / "j j"
    env = {resume.ENV: "hf", "GPTRAIN_OUTPUT_DIR": str(jdir / "output")}
    argv, said = launch.finish(env, jdir, ["python", "t.py", "--out=$GPTRAIN_OUTPUT_DIR"])
    assert argv == ["python", "t.py", f"--out={jdir}/output"] and said == "" and "GPTRAIN_RESUME_FROM" not in env
    trainer_checkpoint(jdir / "output" / "checkpoint-4", 4)
    argv, said = launch.finish(env, jdir, ["python", "t.py"])
    assert argv == ["python", "t.py", "--resume_from_checkpoint", f"{jdir}/output/checkpoint-4"]
    assert said == f", resumes with --resume_from_checkpoint '{jdir}/output/checkpoint-4'"
    del env[resume.ENV]
    assert launch.finish(env, jdir, ["python", "t.py"])[0] == ["python", "t.py"]
    assert env["GPTRAIN_RESUME_FROM"] == f"{jdir}/output/checkpoint-4"


def test_restart_line_says_what_the_program_is_given(isolated_home, tmp_path):
    jdir = tmp_path / "j"
    script = JobSpec(name="j", script="t.py", code="/c")
    assert resume.restart_line(script, jdir) == "starts again (no checkpoint yet)"
    trainer_checkpoint(jdir / "output" / "checkpoint-4", 4)
    assert resume.restart_line(script, jdir).startswith(
        "restarted from scratch: the program was given no resume arguments (see --resume-args)")
    script.resume_args = "hf"
    assert resume.restart_line(script, jdir) == f"resumes with --resume_from_checkpoint {jdir}/output/checkpoint-4"
    run_layout.checkpoints_dir(jdir).mkdir()
    (run_layout.checkpoints_dir(jdir) / "step-12.pt").write_bytes(b"x")  # named as `gptrain checkpoints` names it
    assert resume.restart_line(JobSpec(name="j", entry="trainer"), jdir) == \
        "continues from step-12.pt (or the newest one before it that passes verification)"


def test_rewinds_below_the_step_reached():
    row = lambda name, step, mtime: {"name": name, "step": step, "mtime": mtime, "size": 1}  # noqa: E731
    before = resume.baseline([row("output/checkpoint-2", 2, 1.0), row("output/checkpoint-4", 4, 2.0)])
    assert resume.rewinds(before, [row("output/checkpoint-2", 2, 1.0), row("output/checkpoint-6", 6, 3.0)]) == []
    assert [n for n, _ in resume.rewinds(before, [row("output/checkpoint-2", 2, 5.0),
                                                  row("output/checkpoint-4", 4, 6.0),
                                                  row("output/checkpoint-3", 3, 7.0)])] == \
        ["output/checkpoint-2", "output/checkpoint-3"]
    ckpt = resume.baseline([row("output/ckpt.pt", 400, 1.0)])
    assert resume.rewinds(ckpt, [row("output/ckpt.pt", 400, 2.0)]) == []  # a resumed nanoGPT saves 400 again
    (name, warning), = resume.rewinds(ckpt, [row("output/ckpt.pt", 100, 2.0)])
    assert warning == ("output/ckpt.pt rewritten at step 100 after the restart (it held step 400; the job "
                       "had reached step 400): the program started over")
    assert resume.rewinds({}, [row("output/ckpt.pt", 100, 2.0)]) == []  # a first attempt


def test_one_process_python_runs_without_torchrun(isolated_home, monkeypatch):
    from gptrain.jobs.engines.slurm import build_script

    monkeypatch.setattr("gptrain.jobs.engines.slurm.accel_type", lambda spec: "cpu")
    one = JobSpec(name="one", script="train.py", code="/src", resume_args="--r {checkpoint}").validate()
    assert not launch.under_torchrun(one) and not launch.meets_by_rendezvous(one)
    text = build_script(one)
    assert "torch.distributed.run" not in text and "NODE_RANK" not in text, text
    assert f"-m gptrain.jobs.rank_log --node {folder.job_dir('one')}/logs -- " in text
    assert "export GPTRAIN_RESUME_ARGS='--r {checkpoint}'" in text  # the template, quoted; no path
    two = JobSpec(name="two", accels=2, script="train.py", code="/src").validate()
    text = build_script(two)
    assert launch.under_torchrun(two) and "torch.distributed.run" in text
    assert "\nunset GPTRAIN_RESUME_ARGS\n" in text  # sbatch passes the submitter's environment on


def test_resume_args_of_another_job_are_not_inherited(isolated_home, monkeypatch):
    """`gptrain run` from inside a job that has resume arguments: the new job does not get them."""
    monkeypatch.setenv(resume.ENV, "--from {checkpoint}")
    plain = JobSpec(name="p", script="t.py", code="/c")
    assert resume.ENV not in launch.inherited_env(plain) and resume.ENV not in launch.job_env(plain, Path("/j"))
    mine = JobSpec(name="m", script="t.py", code="/c", resume_args="hf")
    assert {**launch.inherited_env(mine), **launch.job_env(mine, Path("/j"))}[resume.ENV] == "hf"


@pytest.mark.parametrize("flags, words", [
    (["--resume-args=--resume {step}", "--", "t.py"], "unknown placeholder {step}"),
    (["--resume-args=", "--", "t.py"], "--resume-args needs the program's resume arguments"),
    (["--resume-args", "hf", "--", "--train.max_steps=1"], "the built-in trainer resumes"),
])
def test_cli_refuses_in_one_line_and_records_nothing(isolated_home, tmp_path, flags, words):
    (tmp_path / "t.py").write_text("print(1)\n")
    r = run_cli("run", "bad", *flags, cwd=tmp_path)
    assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert json.loads(run_cli("jobs", "--json").stdout) == []


def test_job_yaml_resume_args(tmp_path):
    from gptrain.jobs.programs.job_file import from_yaml

    (tmp_path / "job.yaml").write_text("name: y\nscript: t.py\nresume_args: nanogpt\n")
    assert from_yaml(str(tmp_path / "job.yaml"))["resume_args"] == "nanogpt"
    (tmp_path / "bad.yaml").write_text("name: y\nscript: t.py\nresume_args: [1]\n")
    with pytest.raises(UserError, match="resume_args in .* must be a string"):
        from_yaml(str(tmp_path / "bad.yaml"))
