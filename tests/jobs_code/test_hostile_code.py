"""Hostile or mistaken code sources are refused in one line, exit 2, with nothing recorded or
left behind: option-like refs and URLs, git's command transports, passwords in URLs, names
that would be paths, a code directory past the size limit."""

import json

import pytest

from tests.conftest import run_cli
from tests.jobs_code.programs import git_repository, project


def refused(r, words):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert words in r.stderr and r.stderr.count("\n") == 1, r.stderr


def nothing_recorded():
    from gptrain.home import home

    assert json.loads(run_cli("jobs", "--json").stdout) == []
    jobs = home() / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []


@pytest.mark.parametrize("extra, words", [
    (["--repository-url", "REPO", "--ref=--upload-pack=touch /tmp/pwned"], "is not a branch, tag or commit"),
    (["--repository-url", "REPO", "--ref=-b"], "is not a branch, tag or commit"),
    (["--repository-url=--upload-pack=touch${IFS}/tmp/pwned"], "is not a URL or path"),
    (["--repository-url", "ext::sh -c touch% /tmp/pwned"], "is not a URL or path"),
    (["--repository-url", "ext::sh"], "git transport helper"),
    (["--repository-url", "https://me:hunter2@example.com/x.git"], "must not hold credentials"),
    (["--repository-url", "https://ghp_secret@example.com/x.git"], "must not hold credentials"),
    (["--source", "../../etc"], "invalid source name"),
    (["--source", "nope"], "no source named 'nope'"),
    (["--source-name", "nope"], "no source named 'nope'"),
    (["--repository-url", "REPO", "--ref", "no-such-branch"], "no such branch, tag or commit"),
    (["--repository-url", "REPO", "--code", "."], "not both"),
    (["--ref", "main"], "--ref needs --repository-url"),
    (["--repository-url", "REPO", "--", "missing.py"], None),
])
def test_hostile_code_sources_are_refused(tmp_path, extra, words):
    repo = git_repository(project(tmp_path / "repo"))
    extra = [str(repo) if a == "REPO" else a.replace("/tmp/pwned", str(tmp_path / "pwned")) for a in extra]
    tail = [] if "--" in extra else ["--", "hf_train.py"]
    r = run_cli("run", "bad", *extra, *tail, cwd=repo)
    refused(r, words or "missing.py is not in the job's code")
    nothing_recorded()
    assert not (tmp_path / "pwned").exists()


def test_source_add_list_rm_and_bad_sources(tmp_path):
    repo = git_repository(project(tmp_path / "repo"))
    assert run_cli("source", "add", "mine", repo, "--ref", "v1").returncode == 0
    assert str(repo) in run_cli("source", "list").stdout
    refused(run_cli("source", "add", "mine", repo), "already exists")
    refused(run_cli("source", "add", "Bad/Name", repo), "invalid source name")
    refused(run_cli("source", "add", "x", "ext::sh -c id"), "is not a URL or path")
    refused(run_cli("source", "add", "x", repo, "--ref=--force"), "is not a branch")
    refused(run_cli("source", "rm", "nope"), "no source named")
    assert run_cli("source", "rm", "mine").returncode == 0
    assert "mine" not in run_cli("source", "list").stdout


def test_code_past_the_size_limit_is_refused(tmp_path, monkeypatch):
    code = project(tmp_path / "proj")
    (code / "model.pt").write_bytes(b"\0" * (3 << 20))
    monkeypatch.setenv("GPTRAIN_CODE_MAX_MB", "2")
    refused(run_cli("run", "big", "--", "train.py", cwd=code), "more than the 2 MiB a job's code may")
    nothing_recorded()


def test_entrypoint_mistakes(tmp_path):
    code = tmp_path / "proj"
    code.mkdir()
    (code / "notes.txt").write_text("hello\n")
    refused(run_cli("run", "x", "--", "notes.txt", cwd=code), "notes.txt is not executable")
    refused(run_cli("run", "x", "--", "no-such-program-here", cwd=code), "no such program on PATH")
    refused(run_cli("run", "x", "--", "-m", "os;rm", cwd=code), "is not a Python module name")
    refused(run_cli("run", "x", "--", "-m", cwd=code), "-m needs a module name")
    refused(run_cli("run", "x", "--secret", "GPTRAIN_TOKEN=s3cret", "--", "bash", "-c", "true", cwd=code),
            "GPTRAIN_* names are gptrain's own")
    nothing_recorded()
