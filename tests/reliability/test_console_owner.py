"""The console admits only its owner, on loopback too (attacker trial: as uid 65534 on the same
machine, `curl 127.0.0.1:PORT/api/jobs/NAME/logs/0` read any job's log, and the CSRF token taken
from any page let a POST remove a job and its checkpoints). The owner's token lives in
$GPTRAIN_HOME/ui-token: made 0600 on first use, the same at each start, refused in one line when
others may read it. Real `gptrain ui` processes; the other user is a real other uid (setpriv)."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.browser.conftest import Console, http
from tests.browser.recorded_jobs import record_job
from tests.conftest import run_cli

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_token_file_is_made_0600_and_kept_across_restarts(isolated_home):
    c = Console()
    try:
        token_file = isolated_home / "ui-token"
        st = token_file.lstat()
        assert stat.S_ISREG(st.st_mode) and _mode(token_file) == 0o600 and st.st_uid == os.geteuid()
        assert token_file.read_text().strip() == c.token and len(c.token) >= 32
        assert str(token_file) in c.line and f"?token={c.token}" in c.line  # the URL to open, and where the token is
        assert c.http("/api/jobs")[0] == 200
    finally:
        c.close()
    again = Console()
    try:
        assert again.token == c.token  # the same token: an open page's cookie works after a restart
        assert http(again.base + "/api/jobs", headers={"Authorization": f"token {c.token}"})[0] == 200
    finally:
        again.close()
    assert [p.name for p in isolated_home.iterdir() if p.name.startswith(".ui-token")] == []  # no leftovers


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_token_file_others_may_read_or_write_is_refused_in_one_line(isolated_home, mode):
    """Refused, not rewritten: someone may have read it already, so the owner decides (chmod 600
    to keep it, or remove it for a new one)."""
    c = Console()
    c.close()
    token_file = isolated_home / "ui-token"
    token_file.chmod(mode)
    r = run_cli("ui", "--port", "0", timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"chmod 600 {token_file}" in r.stderr and f"{mode:04o}" in r.stderr, r.stderr
    assert c.token not in r.stderr + r.stdout and "serving" not in r.stdout
    assert _mode(token_file) == mode  # left as it was: the owner decides
    token_file.chmod(0o600)
    again = Console()
    again.close()
    assert again.token == c.token


def test_a_token_file_that_is_a_link_or_no_token_is_refused_in_one_line(isolated_home, tmp_path):
    isolated_home.mkdir(mode=0o700, exist_ok=True)
    token_file = isolated_home / "ui-token"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("A" * 43 + "\n")
    elsewhere.chmod(0o600)
    for make, says in ((lambda: token_file.symlink_to(elsewhere), "is a symbolic link"),
                       (lambda: token_file.write_text("short\n"), "holds no token"),
                       (lambda: token_file.mkdir(), "not a regular file")):
        make()
        if token_file.is_file():
            token_file.chmod(0o600)
        r = run_cli("ui", "--port", "0", timeout=60)
        assert r.returncode == 2 and says in r.stderr and "remove it" in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1 and "serving" not in r.stdout and "AAAA" not in r.stderr
        token_file.rmdir() if token_file.is_dir() and not token_file.is_symlink() else token_file.unlink()


def test_a_token_file_of_another_user_is_refused(isolated_home):
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the file to another uid")
    isolated_home.mkdir(mode=0o700, exist_ok=True)
    token_file = isolated_home / "ui-token"
    token_file.write_text("B" * 43 + "\n")
    token_file.chmod(0o600)
    os.chown(token_file, NOBODY, NOBODY)  # planted by someone else: they know it
    r = run_cli("ui", "--port", "0", timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"belongs to uid {NOBODY}, not to you" in r.stderr and "BBBB" not in r.stderr


def test_consoles_starting_at_once_share_one_token(isolated_home):
    """Made under a temporary name with O_EXCL and linked into place: no one reads a half-written
    or a second token."""
    code = ("import sys; from pathlib import Path; from gptrain.ui.security import owner_token; "
            "print(owner_token(Path(sys.argv[1])))")
    path = isolated_home / "ui-token"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    tokens = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(tokens) == 1 and tokens == {path.read_text().strip()}, tokens
    assert _mode(path) == 0o600


def test_open_hands_the_browser_no_token_on_its_command_line(isolated_home, tmp_path, monkeypatch):
    """A browser's command line is readable by every user (/proc/PID/cmdline): `--open` gives it
    a 0600 page of ours that sends it on to the token URL."""
    seen = tmp_path / "browser-argv"
    fake = tmp_path / "fake-browser"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}.tmp && mv {seen}.tmp {seen}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("BROWSER", str(fake))
    proc = subprocess.Popen([sys.executable, "-m", "gptrain", "ui", "--port", "0", "--open"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        for _ in range(300):
            if seen.exists():
                break
            time.sleep(0.1)
        argv = seen.read_text()
    finally:
        proc.terminate()
        proc.wait(10)
    token = (isolated_home / "ui-token").read_text().strip()
    page = isolated_home / "ui-open.html"
    assert f"?token={token}" in line and token not in argv, (line, argv)
    assert argv.strip() == page.as_uri(), argv
    assert _mode(page) == 0o600 and f"?token={token}" in page.read_text()


# ---- a real other user of the machine -------------------------------------------------------

ATTACK = r'''
import json, os, sys, urllib.error, urllib.request
base, token_file, pid, csrf = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
out = {"uid": os.getuid(), "answers": {}}
def get(path, method="GET", headers=None):
    req = urllib.request.Request(base + path, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:  # (a stream: its first line)
            return r.status, (r.readline() if "stream" in path else r.read()).decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
for path in json.loads(sys.argv[5]):
    out["answers"][path] = get(path)
    out["answers"]["localhost " + path] = get(path, headers={"Host": "localhost"})
# the trial's attack: the console's own Origin, and the CSRF token if it could be had
out["answers"]["POST remove"] = get("/api/jobs/victim/remove", "POST", {"Origin": base, "X-CSRF-Token": csrf})
try:
    out["token_file"] = open(token_file).read()
except OSError as e:
    out["token_file"] = type(e).__name__
for what in ("cmdline", "environ"):
    try:
        out[what] = open(f"/proc/{pid}/{what}", "rb").read().decode("latin-1")
    except OSError as e:
        out[what] = type(e).__name__
print(json.dumps(out))
'''

ROUTES = ["/", "/jobs/victim", "/datasets", "/compare", "/api/jobs", "/api/jobs/victim", "/api/jobs/victim/logs/0",
          "/api/jobs/victim/logs/0?offset=0", "/api/jobs/victim/logs/0/stream", "/api/jobs/stream",
          "/api/jobs/victim/stream", "/api/jobs/victim/curves", "/api/datasets", "/static/job.js",
          "/static/common.js", "/static/uPlot.iife.min.js"]


@pytest.fixture
def reachable_home(monkeypatch):
    """A $GPTRAIN_HOME other users may enter (0711, as a home directory often is), so that only
    the token file's own mode keeps them from reading it."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a request as another uid (setpriv)")
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to run a request as another uid")
    top = Path(tempfile.mkdtemp(prefix="gptrain-owner-"))
    top.chmod(0o711)
    home = top / "home"
    home.mkdir()
    home.chmod(0o711)
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    yield home
    shutil.rmtree(top, ignore_errors=True)


def test_another_uid_on_the_machine_gets_401_everywhere_and_no_token(reachable_home):
    record_job("victim", log="secret-line: the owner's data\n")
    c = Console()
    try:
        csrf = _csrf(c)
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            python, "-I", "-c", ATTACK, c.base, str(reachable_home / "ui-token"),
                            str(c.proc.pid), csrf, json.dumps(ROUTES)],
                           capture_output=True, text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
        assert seen["uid"] == NOBODY
        for what, (status, body) in seen["answers"].items():
            assert status == 401, (what, status, body[:200])
            assert body == "missing or wrong token: open the URL `gptrain ui` printed\n", (what, body)
            assert csrf not in body and "secret-line" not in body and c.token not in body
        assert seen["token_file"] == "PermissionError"  # mode 0600 in a home it may enter
        assert _mode(reachable_home / "ui-token") == 0o600 and _mode(reachable_home) == 0o711
        assert c.token not in seen["cmdline"]  # the server's command line, readable by all, has no token
        assert c.token not in seen["environ"]
        # the owner still has everything, the job was not removed
        status, _, body = c.http("/api/jobs/victim/logs/0")
        assert status == 200 and "secret-line" in body
        assert [j["name"] for j in json.loads(c.http("/api/jobs")[2])] == ["victim"]
    finally:
        c.close()


def _csrf(console) -> str:
    import re

    status, _, page = console.http("/")
    assert status == 200
    return re.search(r'<meta name="csrf" content="([^"]+)">', page).group(1)
