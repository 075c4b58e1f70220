"""Hostile input on the way to a job or a model (issue #22): repository URLs holding credentials,
model sizes no machine holds, sampling settings out of range. Each is one line, exit 2, no
secret echoed, nothing recorded. Real CLI processes; no job ever starts here."""

import sqlite3

import pytest

from tests.conftest import run_cli
from tests.job_helpers import nothing_recorded, refused
SECRET = "hunter2xyz"
CREDENTIAL_URLS = [
    f"HTTPS://u:{SECRET}@127.0.0.1:9/r.git",
    f"Https://{SECRET}@127.0.0.1:9/r.git",
    f"https://127.0.0.1:9/r.git?access_token={SECRET}",
    f"https://127.0.0.1:9/r.git?token={SECRET}",
    f"u:{SECRET}@127.0.0.1:x.git",
    f"git+ssh://u:{SECRET}@127.0.0.1:9/x",
    f"ssh://git:{SECRET}@127.0.0.1/x.git",
    f"file://u:{SECRET}@localhost/tmp/x.git",
]


def no_secret(r):
    assert SECRET not in r.stdout + r.stderr, r.stdout + r.stderr


def sources(home):
    if not (home / "gptrain.db").exists():
        return []
    with sqlite3.connect(home / "gptrain.db") as conn:
        return conn.execute("SELECT name, url FROM sources").fetchall()


@pytest.mark.parametrize("url", CREDENTIAL_URLS)
def test_a_repository_url_with_credentials_is_refused_unechoed_and_unstored(url, isolated_home, tmp_path):
    for r in (run_cli("source", "add", "s", url, timeout=60),
              run_cli("run", "job", "--repository-url", url, "--", "train.py", timeout=60)):
        refused(r, "must not hold credentials", "credential helper")
        no_secret(r)
    (tmp_path / "job.yaml").write_text(f"name: yjob\nrepository_url: '{url}'\nscript: train.py\n")
    r = run_cli("run", "-f", tmp_path / "job.yaml", timeout=60)
    refused(r, "must not hold credentials")
    no_secret(r)
    assert sources(isolated_home) == []
    nothing_recorded(isolated_home)


def test_plain_repository_urls_still_pass_the_check():
    from gptrain.errors import redact
    from gptrain.jobs.programs.code import check_url

    for url in ("https://github.com/o/r.git", "ssh://git@host/r.git", "git@github.com:o/r.git",
                "git+ssh://git@host/r", "file:///srv/r.git", "/srv/r", "./r"):
        assert check_url(url) == url and redact(url) == url


def test_source_list_masks_a_url_stored_before_the_check(isolated_home):
    from gptrain.jobs import store

    store.add_source("old", f"https://me:{SECRET}@example.com/r.git?token={SECRET}", None)
    r = run_cli("source", "list")
    assert r.returncode == 0 and "old" in r.stdout and "example.com/r.git" in r.stdout, r.stdout
    no_secret(r)
    r = run_cli("run", "job", "--source", "old", "--", "train.py")
    refused(r, "must not hold credentials")
    no_secret(r)


# ---- model size: bounded at submit and in `gptrain train` -----------------------------------

HUGE = [(["--model.n_layer=99999999999999999999999"], "--model.n_layer must be >= 1 and <= 4096"),
        (["--model.n_layer=100000"], "--model.n_layer must be >= 1 and <= 4096"),
        (["--model.n_embd=10000000"], "--model.n_embd must be >= 1 and <= 131072"),
        (["--train.batch_size=99999999999999999999"], "--train.batch_size must be >= 1 and <= 1048576"),
        (["--train.seed=99999999999999999999999"], "--train.seed must be >= 0 and <= 4294967295"),
        (["--train.seed=-1"], "--train.seed must be >= 0 and <= 4294967295"),  # (numpy's traceback, after a record)
        (["--model.preset=gpt2", "--model.n_layer=4096", "--model.n_embd=65532"], "GPTRAIN_ALLOW_LARGE_MODEL=1")]


@pytest.mark.parametrize("flags, message", HUGE, ids=[" ".join(f) for f, _ in HUGE])
def test_a_model_no_machine_holds_is_refused_at_submit_and_in_train(flags, message, isolated_home, tmp_path):
    r = run_cli("run", "big", "--", *flags, timeout=60)
    refused(r, message)
    nothing_recorded(isolated_home)
    r = run_cli("train", "--data.path=nowhere", f"--train.output_dir={tmp_path / 'out'}", *flags, timeout=60)
    refused(r, message)
    assert not (tmp_path / "out").exists()


def test_a_restart_count_past_any_job_is_one_line(isolated_home):
    refused(run_cli("run", "j", "--max-restarts", "99999999999999999999999", "--", "--train.max_steps=1"),
            "--max-restarts 99999999999999999999999 is more than a job is ever restarted")
    nothing_recorded(isolated_home)


def test_the_memory_estimate_names_itself_and_its_override(isolated_home):
    flags = ["--model.preset=llama2-7b", "--model.n_layer=4000"]  # ~840G parameters
    r = run_cli("run", "big", "--", *flags, timeout=60)
    refused(r, "about 8.", "parameters", "GiB", "GPTRAIN_ALLOW_LARGE_MODEL=1")
    r = run_cli("run", "big", "--scheduler", "slurm", "--dry-run", "--", *flags,
                env={"GPTRAIN_ALLOW_LARGE_MODEL": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr  # sharded over several nodes: the user's call, which
    assert "GPTRAIN_ALLOW_LARGE_MODEL=1" in r.stdout  # its workers' own check is told too


# ---- sampling settings -----------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--temperature", "-1", "--top-p", "7"], "--temperature must be >= 0"),
    (["--top-p", "7"], "--top-p must be > 0 and <= 1, got 7.0"),
    (["--top-p", "0"], "--top-p must be > 0 and <= 1"),
    (["--top-k", "-3"], "--top-k must be >= 0"),
    (["--temperature", "nan"], "--temperature must be >= 0"),
    (["--max-new-tokens", "100000000"], "--max-new-tokens must be 1..65536"),
    (["--num-samples", "100000000"], "--num-samples must be 1..1024"),
])
def test_sampling_settings_out_of_range_are_one_line(flags, message, tiny_hf_gpt2):
    r = run_cli("generate", tiny_hf_gpt2, "--tokenizer", "gpt2", "--prompt", "hi", *flags, timeout=120)
    refused(r, message)
    assert r.stdout == ""


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf", "1e99"])
def test_a_stop_grace_out_of_range_is_one_line(isolated_home, timeout):
    """`stop --timeout -1` (or nan) was taken (#47 round 3, low): 0 to a week, one line."""
    refused(run_cli("stop", "j", "--timeout", timeout), "--timeout must be 0 to 604800 seconds")
