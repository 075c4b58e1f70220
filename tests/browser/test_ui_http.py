"""The console over plain HTTP against a real `gptrain ui` process: who may talk to it, what a
hostile URL or a cross-site POST gets, and that secrets never come out."""

import json
import re
import urllib.error
import urllib.request

import pytest

from tests.browser.conftest import Console
from tests.browser.recorded_jobs import record_job


def http(url, method="GET", headers=None):
    """(status, headers, body text) without raising on 4xx."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def csrf_of(console, **headers):
    status, _, html = http(console.base + "/", headers=headers)
    assert status == 200, html
    return re.search(r'<meta name="csrf" content="([^"]+)">', html).group(1)


@pytest.fixture
def shared_console(isolated_home):
    c = Console(host="0.0.0.0")
    yield c
    c.close()


def test_a_non_loopback_bind_needs_the_printed_token(shared_console):
    c = shared_console
    token = re.search(r"\?token=([\w-]+)", c.printed).group(1)
    for path in ("/", "/api/jobs", "/api/jobs/stream", "/static/job.js", "/jobs/x", "/datasets"):
        status, _, body = http(c.base + path)
        assert status == 401 and "token" in body, (path, status)
        assert http(c.base + path + "?token=wrong" + token)[0] == 401
        assert http(c.base + path, headers={"Cookie": "gptrain_ui_token=nope"})[0] == 401
    status, headers, _ = http(f"{c.base}/?token={token}")
    assert status == 200
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    value = cookie.split(";")[0]
    status, _, body = http(c.base + "/api/jobs", headers={"Cookie": value})
    assert (status, body) == (200, "[]")
    assert http(c.base + "/static/uPlot.iife.min.js", headers={"Cookie": value})[0] == 200
    assert http(c.base + "/api/jobs", headers={"Authorization": f"token {token}"})[0] == 200


def test_loopback_console_refuses_other_host_names(console):
    """A page on another domain re-pointed at 127.0.0.1 (DNS rebinding) reads nothing."""
    assert http(console.base + "/api/jobs")[0] == 200
    for host in ("evil.example", f"evil.example:{console.port}", "192.168.1.5"):
        assert http(console.base + "/api/jobs", headers={"Host": host})[0] == 403
    assert http(console.base + "/api/jobs", headers={"Host": f"localhost:{console.port}"})[0] == 200


def test_traversal_names_get_400_or_404_and_touch_nothing(console, isolated_home, tmp_path):
    record_job("real")
    victim = isolated_home / "victim"
    victim.mkdir()
    (victim / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    token = csrf_of(console)
    post = {"Origin": console.base, "X-CSRF-Token": token}
    bad = ["/api/jobs/..%2Fvictim", "/api/jobs/..", "/api/jobs/%2e%2e", "/api/jobs/Real",
           "/api/jobs/..%2F..%2Foutside.txt/curves", "/jobs/..%2Fvictim", "/jobs/%2e%2e",
           "/api/jobs/real/logs/..%2F..%2Fjob.json", "/api/jobs/real/logs/-1", "/api/jobs/real/logs/2",
           "/api/jobs/real/logs/0x1/stream", "/api/jobs/real/checkpoints/..%2F..%2Fjob.json.zip",
           "/api/jobs/..%2Fvictim/stream", "/static/..%2F..%2Fviews.py", "/static/%2e%2e/views.py",
           "/api/jobs/nosuchjob", "/api/jobs/a%00b"]
    for path in bad:
        status, _, body = http(console.base + path)
        assert status in (400, 404), (path, status, body[:200])
        assert "keep me" not in body and "train/loss" not in body
    for path in ("/api/jobs/..%2Fvictim/remove", "/api/jobs/..%2F..%2Foutside.txt/remove",
                 "/api/jobs/%2e%2e/stop", "/api/jobs/ghost/remove"):
        status, _, body = http(console.base + path, "POST", post)
        assert status in (400, 404), (path, status, body)
    assert (victim / "metrics.jsonl").is_file() and outside.read_text() == "keep me"
    assert json.loads(http(console.base + "/api/jobs")[2])[0]["name"] == "real"


def test_a_cross_site_post_is_refused(console):
    record_job("victim")
    token = csrf_of(console)
    url = console.base + "/api/jobs/victim/remove"
    for headers in ({"Origin": "http://evil.example", "X-CSRF-Token": token},  # another site
                    {"Origin": "null", "X-CSRF-Token": token},
                    {"Referer": "http://evil.example/page", "X-CSRF-Token": token},
                    {"Origin": console.base.replace("127.0.0.1", "localhost"), "X-CSRF-Token": token},
                    {"Origin": console.base},  # no token (what an HTML form can send)
                    {"Origin": console.base, "X-CSRF-Token": "guess"},
                    {"X-CSRF-Token": token}):  # neither Origin nor Referer
        status, _, body = http(url, "POST", headers)
        assert status == 403 and "cross-site" in body, (headers, status, body)
    assert http(console.base + "/api/jobs/victim")[0] == 200  # still there
    assert http(url)[0] == 405  # a GET never acts
    status, _, body = http(url, "POST", {"Origin": console.base, "X-CSRF-Token": token})
    assert status == 200 and json.loads(body) == {"removed": "victim"}
    assert http(console.base + "/api/jobs/victim")[0] == 404


def test_an_action_a_job_refuses_is_one_clear_message(console):
    record_job("busy", state="running")
    token = csrf_of(console)
    status, _, body = http(console.base + "/api/jobs/busy/remove", "POST",
                           {"Origin": console.base, "X-CSRF-Token": token})
    assert status == 409 and "stop busy` first" in json.loads(body)["error"]


def test_secrets_are_never_shown(console):
    secret = "hunter2-very-secret"
    record_job("sec", state="failed", secrets={"API_KEY": secret},
               log=f"token is {secret}\nTraceback...\nRuntimeError: bad key {secret}\n")
    for path in ("/api/jobs/sec", "/api/jobs/sec/logs/0", "/api/jobs/sec/logs/1", "/jobs/sec", "/api/jobs"):
        status, _, body = http(console.base + path)
        assert status == 200 and secret not in body, path
    log = json.loads(http(console.base + "/api/jobs/sec/logs/0")[2])["text"]
    assert "token is ***" in log
    assert json.loads(http(console.base + "/api/jobs/sec")[2])["spec"]["secrets"] == {"API_KEY": "***"}


def test_a_checkpoint_download_never_leaves_the_job_directory(console, isolated_home, tmp_path):
    """A checkpoint row whose path leads out of its job's directory (a link, or a row left from
    elsewhere) is not served; a link inside a checkpoint stays out of its zip; another job's
    checkpoint ID under this job's name is 404."""
    import io
    import zipfile

    from gptrain.jobs import store

    d = record_job("linky")
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "id_rsa").write_text("PRIVATE KEY")
    real = d / "checkpoints" / "step-000002"
    real.mkdir(parents=True)
    (real / "model.safetensors").write_bytes(b"weights")
    (real / "config.json").write_text('{"model_type": "gpt2"}')  # a HF model directory
    (real / "leak").symlink_to(outside / "id_rsa")
    (real / "leak-dir").symlink_to(outside)
    found = json.loads(http(console.base + "/api/jobs/linky")[2])["checkpoints"]
    assert found, "discovery lists the weights"
    with urllib.request.urlopen(f"{console.base}/api/jobs/linky/checkpoints/{found[0]['id']}.zip") as r:
        with zipfile.ZipFile(io.BytesIO(r.read())) as z:
            assert b"PRIVATE" not in b"".join(z.read(n) for n in z.namelist())
            assert all("leak" not in n for n in z.namelist())
            assert "linky-step-000002/config.json" in z.namelist()
    (d / "checkpoints" / "step-000001").symlink_to(outside)
    row = {"id": "0123456789ab", "name": "step-000001", "kind": "gptrain", "step": 1, "train_loss": None,
           "eval_loss": None, "time": 0.0, "size": 11, "mtime": 0.0, "path": str(d / "checkpoints" / "step-000001")}
    store.sync_checkpoints("linky", [*store.checkpoints("linky"), row])  # as if discovery had listed it
    for path in (d / "checkpoints" / "step-000001", outside):
        store.sync_checkpoints("linky", [*[c for c in store.checkpoints("linky") if c["id"] != row["id"]],
                                         {**row, "path": str(path)}])
        status, _, body = http(f"{console.base}/api/jobs/linky/checkpoints/{row['id']}.zip")
        assert status == 404 and "PRIVATE" not in body, (path, status)
    record_job("other")
    assert http(f"{console.base}/api/jobs/other/checkpoints/{found[0]['id']}.zip")[0] == 404


def test_where_the_console_cannot_listen_is_one_line(isolated_home):
    import socket

    from tests.conftest import run_cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, says in ((["--port", str(port)], "in use?"), (["--port", "99999"], "is not a port"),
                           (["--host", "no.such.host.invalid"], "give an address of this machine")):
            r = run_cli("ui", *args, timeout=60)
            assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
            assert "serving" not in r.stdout


def test_the_token_url_opens_a_working_console_in_a_browser(shared_console, browser, tmp_path):
    """Bound to 0.0.0.0, the printed URL is all a browser needs: the cookie it sets carries the
    pages' scripts, event streams and POSTs (here: remove, after its confirm dialog)."""
    from selenium.webdriver.common.by import By

    from tests.browser.conftest import wait_until

    from selenium.webdriver.support.ui import Select

    record_job("rec", rows=100)
    # a terminal state is final (jobs/store.py): the failure is recorded with the job
    record_job("bad", state="failed", secrets={"TOKEN": "sesame-open"},
               error="rank 1: ValueError: bad key sesame-open")
    c = shared_console
    browser.get(c.printed.replace("0.0.0.0", "127.0.0.1"))
    wait_until(lambda: browser.find_element(By.CSS_SELECTOR, 'tr[data-job="rec"] .state').text == "succeeded",
               30, "the jobs table over the event stream")
    Select(browser.find_element(By.ID, "state-filter")).select_by_value("failed")
    shown = 'return [...document.querySelectorAll("#jobs-body tr")].map(r => r.dataset.job)'
    wait_until(lambda: browser.execute_script(shown) == ["bad"], 30, "only the failed job")
    browser.get(c.base + "/jobs/bad")
    wait_until(lambda: browser.find_element(By.ID, "error").text ==
               "failed: rank 1: ValueError: bad key ***", 30, "the failure reason, masked")
    browser.get(c.base + "/jobs/rec")  # no token in the URL: the cookie carries it
    wait_until(lambda: browser.execute_script("return gp.curves.loss.x.length") == 100, 30, "the curves")
    browser.save_screenshot(str(tmp_path / "token-job.png"))
    browser.find_element(By.ID, "remove").click()
    browser.switch_to.alert.accept()
    wait_until(lambda: http(c.base + "/api/jobs/rec", headers={"Authorization": "token " +
                                                               c.printed.split("token=")[1]})[0] == 404,
               30, "the job to be removed")
