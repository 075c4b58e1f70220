"""`--secret` on the local scheduler, end to end (real detached supervisor, torchrun, SQLite):
the worker sees the value; the only copy gptrain keeps is a 0600 file; job.json, the database,
`inspect` (text and --json), `logs` and the failure summary never show it; everything under
$GPTRAIN_HOME is private (files 0600, directories 0700); `gptrain rm` deletes the secret."""

import json
import stat

from tests.conftest import run_cli
from tests.job_helpers import ok, rank_log_path, wait_until_done

SECRET = "s3cr3t-value"
WORKER = """import os
key = os.environ["WANDB_API_KEY"]
print("the key is", key, flush=True)
raise RuntimeError(f"login refused for key {key}")
"""


def test_secret_reaches_the_worker_and_nothing_else(tmp_path, isolated_home, monkeypatch):
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "worker.py").write_text(WORKER)
    ok("run", "sec", "--secret", f"WANDB_API_KEY={SECRET}", "--env", "PLAIN=visible",
       "--", tmp_path / "worker.py")
    report = wait_until_done("sec")
    home = isolated_home
    raw_log = rank_log_path("sec").read_text()
    assert f"the key is {SECRET}" in raw_log  # the worker saw the value (its own raw log)

    # the records and every command's output: masked
    assert report["job"]["state"] == "failed"
    assert report["job"]["error"] == "rank 0: RuntimeError: login refused for key ***", report["job"]
    assert report["spec"]["secrets"] == {"WANDB_API_KEY": "***"} and report["spec"]["env"] == {"PLAIN": "visible"}
    text = ok("inspect", "sec")
    assert "WANDB_API_KEY=***" in text and "login refused for key ***" in text
    logs, followed = ok("logs", "sec"), run_cli("logs", "sec", "--follow").stdout  # exit 1: it failed
    assert "the key is ***" in logs and "the key is ***" in followed
    for output in (json.dumps(report), text, logs, followed, (home / "jobs" / "sec" / "job.json").read_text()):
        assert SECRET not in output

    # the only copies on disk: the 0600 secrets file, and the worker's raw logs
    holders = sorted(str(p.relative_to(home)) for p in home.rglob("*")
                     if p.is_file() and SECRET.encode() in p.read_bytes())
    assert "secrets/sec.env" in holders and all(
        h == "secrets/sec.env" or h.startswith("jobs/sec/logs/") for h in holders), holders
    assert not [h for h in holders if "gptrain.db" in h]
    loose = {str(p.relative_to(home)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in [home, *home.rglob("*")] if stat.S_IMODE(p.stat().st_mode) & 0o077}
    assert loose == {}, loose  # nobody but the user can read anything gptrain wrote

    ok("rm", "sec")
    assert not (home / "secrets" / "sec.env").exists() and not (home / "jobs" / "sec").exists()
