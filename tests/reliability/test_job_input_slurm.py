"""The sbatch script cannot be made to run anything but the job: hostile Slurm options are
refused, and the values that are allowed (env values, paths with spaces, script arguments,
secrets) reach the worker verbatim. The script is run by bash with stub `srun`/`scontrol`/`sbatch`
on PATH (real torchrun and worker behind them), so no Slurm cluster is needed."""

import json
import os
import socket
import stat
import subprocess

import pytest

from gptrain.jobs import folder
from tests.conftest import run_cli

STUBS = {
    # srun's own options (--kill-on-bad-exit, --output, ...) dropped; the command runs here, once
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    "scontrol": '#!/bin/bash\ncase "$1 $2" in\n  "show hostnames") echo localhost ;;\n'
                '  "show node") echo "NodeName=localhost NodeAddr=127.0.0.1 State=IDLE" ;;\n'
                '  *) exit 1 ;;\nesac\n',
    # sbatch --parsable SCRIPT: accepted as job 4242; the test runs the script itself
    "sbatch": "#!/bin/bash\necho 4242\n",
}
WORKER = """import json, os, sys
out = sys.argv[1]
with open(out, "w") as f:
    json.dump({"args": sys.argv[2:], "env": {k: os.environ.get(k) for k in ("V", "TOK", "WANDB_API_KEY")},
               "umask": os.umask(0o077)}, f)
"""


@pytest.fixture
def stubs(tmp_path):
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def refused(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("gptrain: error: ") and r.stderr.count("\n") == 1, r.stderr
    for word in words:
        assert word in r.stderr, (word, r.stderr)


@pytest.mark.parametrize("flags, words", [
    (["--partition", "gpu\nhostname"], ["--partition", "is not partition names"]),
    (["--partition", "gpu;id"], ["--partition"]),
    (["--account", "a b"], ["--account", "is not an account name"]),
    (["--time", "1:00; id"], ["--time", "is not a Slurm time"]),
    (["--time", "01:00:00\ntouch /tmp/x"], ["--time"]),
    (["--sbatch-arg=--exclusive\nid"], ["--sbatch-arg", "one line"]),
    # the time limit's signal (120 s before it, at a check every 30 s) would come before any step
    (["--time", "2"], ["--time 2 leaves no time to train", "120 s before", "give --time 3 or more"]),
    (["--time", "0:02:30", "--sbatch-arg=--signal=B:USR1@100"], ["--time 0:02:30", "100 s before", "--time 3 "]),
    (["--sbatch-arg=id"], ["--sbatch-arg", "starting with --"]),
    (["--env", "X=1; touch f; Y=2", "--env", "A;B=1"], ["invalid --env name 'A;B'"]),
])
def test_hostile_slurm_options_are_refused(tmp_path, isolated_home, flags, words):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = run_cli("run", "inj", "--scheduler", "slurm", "--accel-type", "cpu", "--dry-run", *flags, "--",
                "--train.max_steps=1", cwd=cwd)
    refused(r, *words)
    assert list(cwd.iterdir()) == [] and not (isolated_home / "jobs").exists()


def test_a_time_limit_with_time_to_train_is_taken():
    from gptrain.jobs.engines.slurm import check_options, signal_lead_s, time_limit_s

    assert [time_limit_s(v) for v in ("2", "2:30", "1:00:00", "1-0", "1-2:3", "1-2:3:4", "UNLIMITED")] == \
        [120, 150, 3600, 86400, 93780, 93784, None]
    assert signal_lead_s(["--signal=USR1@10", "--exclusive", "--signal=B:USR1@40"]) == 40  # sbatch: the last
    check_options({"time": "2", "sbatch_args": ["--signal=B:USR1@40"]})  # 50 s before the signal
    check_options({"time": "3"})
    check_options({"time": "UNLIMITED"})


@pytest.mark.parametrize("yaml, words", [
    ('env: {"X=1; touch f; Y": v}', ["invalid env name 'X=1; touch f; Y'"]),
    ('slurm: {partition: "p\\nhostname"}', ["--partition"]),
    ("slurm: {time: 1:00:00}", ["--time 3600", "quoted in YAML"]),  # YAML reads it as 3600 (base 60)
    ("slurm: {partiton: gpu}", ["unknown slurm option", "did you mean 'partition'"]),
    ("slurm: {port: 99999}", ["--port must be a TCP port"]),
])
def test_hostile_job_yaml_is_refused(tmp_path, isolated_home, yaml, words):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "job.yaml").write_text(f"name: inj\nargs: ['--train.max_steps=1']\n{yaml}\n")
    r = run_cli("run", "-f", cwd / "job.yaml", "--scheduler", "slurm", "--accel-type", "cpu",
                "--dry-run", cwd=cwd)
    refused(r, *words)
    assert sorted(p.name for p in cwd.iterdir()) == ["job.yaml"] and not (isolated_home / "jobs").exists()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_script(script_path, stubs, cwd):
    """The sbatch script as Slurm's batch step would run it (one node), with the stubs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PATH=f"{stubs}:{env['PATH']}", SLURM_JOB_NODELIST="localhost", SLURM_NNODES="1",
               SLURM_NODEID="0", SLURM_JOB_ID="4242", OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(script_path)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def test_allowed_values_reach_the_worker_verbatim(tmp_path, monkeypatch, stubs):
    home = tmp_path / "gptrain home"  # a path with a space
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    marks = [tmp_path / f"mark{i}" for i in range(5)]
    value = f"a b;$(touch {marks[0]}) `touch {marks[1]}` \"q\" 'it''s' $HOME * \\"
    args = [f"$(touch {marks[2]})", f"it's; touch {marks[3]}", "--x=a b", "*", f"`touch {marks[4]}`", ""]
    script_dir = tmp_path / "my scripts"
    script_dir.mkdir()
    (script_dir / "worker.py").write_text(WORKER)
    seen = tmp_path / "seen.json"
    r = run_cli("run", "meta", "--scheduler", "slurm", "--accel-type", "cpu", "--port", _free_port(),
                "--time", "1-00:00", "--env", f"V={value}", "--dry-run", "--",
                script_dir / "worker.py", seen, *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '#SBATCH --output="' in r.stdout  # the path with a space, quoted for sbatch
    (tmp_path / "job.sbatch").write_text(r.stdout)
    done = _run_script(tmp_path / "job.sbatch", stubs, tmp_path)
    assert done.returncode == 0, (done.stdout, done.stderr, _logs(home, "meta"))
    got = json.loads(seen.read_text())
    assert got["env"]["V"] == value and got["args"] == args
    assert not [m for m in marks if m.exists()]
    assert got["umask"] == 0o077


def test_secrets_reach_the_worker_but_not_the_script(tmp_path, monkeypatch, stubs):
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    monkeypatch.setenv("WANDB_API_KEY", "shell-key-9876")  # a pass-through variable named like a secret
    home = tmp_path / "home"
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    (tmp_path / "worker.py").write_text(WORKER)
    seen = tmp_path / "seen.json"
    secret = "tok 'quoted' $(touch /nonexistent) s3cr3t"
    r = run_cli("run", "sec", "--scheduler", "slurm", "--accel-type", "cpu", "--port", _free_port(),
                "--secret", f"TOK={secret}", "--", tmp_path / "worker.py", seen, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    script = home / "jobs" / "sec" / "job.sbatch"
    text = script.read_text()
    assert secret not in text and "shell-key-9876" not in text and "s3cr3t" not in text
    assert "secrets/sec.env" in text
    secrets_file = home / "secrets" / "sec.env"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    done = _run_script(script, stubs, tmp_path)
    assert done.returncode == 0, (done.stdout, done.stderr, _logs(home, "sec"))
    got = json.loads(seen.read_text())
    assert got["env"]["TOK"] == secret and got["env"]["WANDB_API_KEY"] == "shell-key-9876"
    report = run_cli("inspect", "sec", "--json")
    assert report.returncode == 0 and json.loads(report.stdout)["job"]["state"] == "succeeded", report
    assert '"TOK": "***"' in report.stdout and "s3cr3t" not in report.stdout
    holders = sorted(str(p.relative_to(home)) for p in home.rglob("*")
                     if p.is_file() and b"s3cr3t" in p.read_bytes())
    assert holders == ["secrets/sec.env"], holders
    assert run_cli("rm", "sec").returncode == 0 and not secrets_file.exists()


def test_bare_secret_takes_the_value_from_the_shell(isolated_home, monkeypatch):
    monkeypatch.setenv("MY_TOKEN", "from-the-shell-1234")
    r = run_cli("run", "bare", "--scheduler", "slurm", "--accel-type", "cpu", "--dry-run",
                "--secret", "MY_TOKEN", "--", "--train.max_steps=1")
    assert r.returncode == 0, r.stderr
    assert "secrets/bare.env" in r.stdout and "from-the-shell-1234" not in r.stdout
    monkeypatch.delenv("MY_TOKEN")
    r = run_cli("run", "bare", "--scheduler", "slurm", "--dry-run", "--secret", "MY_TOKEN")
    refused(r, "--secret 'MY_TOKEN' is not KEY=VALUE (and MY_TOKEN is not set in this shell)")


def _logs(home, name):
    logs = folder.logs_dir(home / "jobs" / name)
    return {p.name: p.read_text()[-2000:] for p in logs.glob("*")} if logs.is_dir() else {}
