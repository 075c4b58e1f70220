"""Bad job input is refused at `gptrain run` (and `gptrain train`): one line, exit 2, nothing
recorded (no job row, no job directory). Real CLI processes; no job ever starts here."""


import pytest

from tests.conftest import run_cli
from tests.job_helpers import nothing_recorded, refused


@pytest.mark.parametrize("line, words", [
    ("env: [A, B]", ["env in", "mapping of NAME: value", "got list"]),
    ("name: 123", ["name in", "string", "got int 123"]),
    ("config: 42", ["config in", "TOML file path or a mapping", "got int"]),
    ("datasets: [42]", ["datasets in", "dataset names", "got int 42"]),
    ('slurm: "x"', ["slurm in", "mapping", "got str 'x'"]),
    ('nodes: "two"', ["nodes in", "whole number", "got str 'two'"]),
    ("nodes: true", ["nodes in", "whole number", "got bool"]),
    ("accels: 1.5", ["accels in", "whole number", "got float"]),
    ("max_restarts: -1", ["--max-restarts", ">= 0", "got -1"]),
    ('args: "x"', ["args in", "list of arguments", "got str"]),
    ("args: [[1]]", ["args in", "got list"]),
    ("env: {A: {b: 1}}", ["env in", "strings or numbers", "got dict"]),
    ("secrets: {A: [s3cr3t]}", ["secrets in", "got list"]),
    ('secrets: {K: "s3cr3t\\0"}', ["secret K must be a string without NUL"]),
    ('env: {"A=B": x}', ["invalid env name 'A=B'"]),       # used to crash the supervisor
    ('env: {"1X": x}', ["invalid env name '1X'"]),
    ('secrets: {"A B": x}', ["invalid secret name 'A B'"]),
])
def test_job_yaml_with_wrong_types(tmp_path, isolated_home, line, words):
    job = tmp_path / "job.yaml"
    job.write_text(f"name: bad\nargs: ['--train.max_steps=1']\n{line}\n")
    r = run_cli("run", "-f", job, "--scheduler", "local")
    refused(r, *words)
    assert "Traceback" not in r.stderr and "s3cr3t" not in r.stderr
    nothing_recorded(isolated_home)


@pytest.mark.parametrize("flags, words", [
    (["--env", "1A=b"], ["invalid --env name '1A'"]),
    (["--env", "A"], ["--env 'A' is not KEY=VALUE"]),
    (["--secret", "A=b", "--env", "A=c"], ["A is given both"]),
    (["--nodes", "0"], ["--nodes must be a whole number >= 1"]),
])
def test_bad_run_flags(isolated_home, flags, words):
    r = run_cli("run", "bad", *flags, "--", "--train.max_steps=1")
    refused(r, *words)
    assert "s3cr3t" not in r.stderr
    nothing_recorded(isolated_home)


BAD_CONFIGS = [
    (["--train.batch_size=0"], "--train.batch_size must be >= 1 and <= 1048576, got 0"),
    (["--per_device_train_batch_size", "0"], "--train.batch_size must be >= 1 and <= 1048576, got 0"),
    (["--train.grad_accum_steps=0"], "--train.grad_accum_steps must be >= 1 and <= 1048576, got 0"),
    (["--gradient_accumulation_steps", "0"], "--train.grad_accum_steps must be >= 1"),
    (["--train.lr=-0.001"], "--train.lr must be >= 0, got -0.001"),
    (["--learning_rate", "nan"], "--train.lr must be >= 0, got nan"),
    (["--train.lr=inf"], "--train.lr must be >= 0, got inf"),
    (["--model.dropout=1.0"], "--model.dropout must be >= 0 and < 1, got 1.0"),
    (["--model.dropout=-0.1"], "--model.dropout must be >= 0 and < 1"),
    (["--model.n_embd=32", "--model.n_head=3"], "n_embd=32 must be divisible by n_head=3"),
    (["--model.preset=llama-tiny", "--model.n_kv_head=3"], "must be a multiple of n_kv_head=3"),
    (["--train.max_steps=-5"], "--train.max_steps must be >= 1 (or -1), got -5"),
    (["--parallel.tp=0"], "--parallel.tp must be >= 1, got 0"),
    (["--checkpoint.keep_last=0"], "--checkpoint.keep_last must be >= 1"),
    (["--train.epochs=0"], "--train.epochs must be > 0"),
]


@pytest.mark.parametrize("flags, message", BAD_CONFIGS)
def test_bad_trainer_config_is_refused_at_submit(isolated_home, flags, message):
    refused(run_cli("run", "bad", "--", *flags), message)
    nothing_recorded(isolated_home)


@pytest.mark.parametrize("flags, message", BAD_CONFIGS[::3])
def test_gptrain_train_refuses_the_same(tmp_path, flags, message):
    r = run_cli("train", "--data.path=nowhere", f"--train.output_dir={tmp_path / 'out'}", *flags)
    refused(r, message)
    assert not (tmp_path / "out").exists()


def test_block_size_beyond_the_weights_positions(tiny_hf_gpt2, isolated_home, tmp_path):
    flags = [f"--model.init_from={tiny_hf_gpt2}", "--model.block_size=128"]  # n_positions is 64
    refused(run_cli("run", "bad", "--", *flags), "--model.block_size=128 exceeds the 64 positions")
    nothing_recorded(isolated_home)
    refused(run_cli("train", *flags, f"--train.output_dir={tmp_path / 'o'}"), "exceeds the 64 positions")
    r = run_cli("run", "good", "--scheduler", "slurm", "--dry-run", "--", f"--model.init_from={tiny_hf_gpt2}",
                "--model.block_size=64")
    assert r.returncode == 0, r.stderr


def test_config_errors_name_the_users_file(tmp_path, isolated_home):
    cfg = tmp_path / "my-config.toml"
    cfg.write_text('[train]\nlr = "fast"\n')
    r = run_cli("run", "bad", "--config", cfg)
    refused(r, str(cfg), "train.lr")
    (tmp_path / "job.yaml").write_text("name: bad\nconfig: my-config.toml\n")
    refused(run_cli("run", "-f", tmp_path / "job.yaml"), str(cfg), "train.lr")
    cfg.write_text("[train\n")
    refused(run_cli("run", "bad", "--config", cfg), str(cfg), "not valid TOML")
    (tmp_path / "inline.yaml").write_text("name: bad\nconfig: {train: {lr: fast}}\n")
    refused(run_cli("run", "-f", tmp_path / "inline.yaml"), str(tmp_path / "inline.yaml"), "train.lr")
    nothing_recorded(isolated_home)


def test_output_dir_given_to_a_job_is_refused_in_one_line(isolated_home, tmp_path):
    """The job's folder holds its checkpoints, metrics and logs; a flag that moves them elsewhere
    was silently overridden."""
    r = run_cli("run", "out", "--", "--output_dir", str(tmp_path / "elsewhere"), "--data.path=x")
    assert r.returncode == 2 and "--output_dir" in r.stderr and "own folder" in r.stderr
    assert r.stderr.count("\n") == 1 and not (isolated_home / "jobs" / "out").exists()


def test_output_dir_naming_the_jobs_own_folder_is_taken(isolated_home, tmp_path):
    """The hosted tutorial's --output_dir /output-checkpoint (made ${GPTRAIN_CHECKPOINT_DIR} one line
    earlier), or the job's folder written out, is where the job writes anyway: accepted (issue 38)."""
    from tests.helpers import make_dataset

    data = make_dataset(tmp_path)
    for name, where in (("hosted", "/output-checkpoint"), ("spelled", str(isolated_home / "jobs" / "spelled"))):
        r = run_cli("training", "run", name, "--scheduler", "slurm", "--dry-run", "--", "--output_dir", where,
                    f"--data.path={data}")
        assert r.returncode == 0, r.stderr
        assert "--data.path" in r.stdout and "--output_dir" not in r.stdout, r.stdout
