"""The console over plain HTTP against a real `gptrain ui` process: who may talk to it (its
owner's token, on loopback too), what a hostile URL or a cross-site POST gets, and that secrets
never come out."""

import json
import re
import urllib.request
from http.client import HTTPConnection

import pytest

from gptrain import run_layout
from tests.browser.conftest import Console, http
from tests.browser.recorded_jobs import record_job
from tests.helpers import step_dir


def csrf_of(console, **headers):
    status, _, html = console.http("/", headers=headers)
    assert status == 200, html
    return re.search(r'<meta name="csrf" content="([^"]+)">', html).group(1)


def raw(console, path, headers=None):
    """(status, headers, body) of a GET sent as is (no redirect followed, the path untouched)."""
    conn = HTTPConnection("127.0.0.1", console.port, timeout=20)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read().decode()
    finally:
        conn.close()


# every kind of route: pages, the JSON API, a log, event streams, static files, a download
ROUTES = ("/", "/jobs/victim", "/compare?jobs=victim", "/datasets", "/api/jobs", "/api/jobs?state=failed",
          "/api/jobs/victim", "/api/jobs/victim/curves", "/api/jobs/victim/logs/0",
          "/api/jobs/victim/logs/0?offset=0", "/api/jobs/victim/logs/0/stream", "/api/jobs/stream",
          "/api/jobs/victim/stream", "/api/datasets", "/static/job.js", "/static/uPlot.iife.min.js",
          "/static/page.html", "/api/jobs/victim/checkpoints/0123456789ab.zip", "/jobs/nosuch",
          "/no/such/route", "/sweeps", "/api/sweeps", "/sweeps/nosuch", "/api/sweeps/nosuch")


def refused_everywhere(console, headers: dict, csrf: str) -> None:
    """Every route (and the POST that removes a job) answers 401 in one line, showing nothing:
    no page, no log line, no CSRF token; the job is still there."""
    for path in ROUTES:
        status, _, body = http(console.base + path, headers=headers)
        assert status == 401 and body == "missing or wrong token: open the URL `gptrain ui` printed\n", \
            (path, headers, status, body[:200])
        assert csrf not in body and "secret-line" not in body
    status, _, body = http(console.base + "/api/jobs/victim/remove", "POST",
                           {**headers, "Origin": console.base, "X-CSRF-Token": csrf})
    assert status == 401 and len(body.splitlines()) == 1, (headers, status, body)
    assert console.http("/api/jobs/victim")[0] == 200  # still there


def test_the_loopback_console_admits_only_its_owner(console):
    """Before: bound to 127.0.0.1 the console needed no token, and every local user of a shared
    machine read any job's logs, took the CSRF token from a page and removed jobs with it."""
    record_job("victim", log="secret-line one\n")
    csrf = csrf_of(console)  # as the owner sees it
    wrong = "x" * 43
    for headers in ({}, {"Cookie": f"gptrain_ui_token_{console.port}=nope"},
                    {"Cookie": f"gptrain_ui_token={wrong}; gptrain_ui_token_{console.port}={wrong}"},
                    {"Authorization": "token " + wrong}, {"Authorization": "token "},
                    {"Authorization": f"Bearer {console.token}"},  # only `token T`
                    {"Host": f"localhost:{console.port}"}):
        refused_everywhere(console, headers, csrf)
    for path in ("/?token=" + wrong, "/api/jobs?token=", "/api/jobs/victim/logs/0?token=" + console.token[:-1]):
        assert http(console.base + path)[0] == 401, path
    # with the token (header, ?token=, or the cookie it sets) every route answers
    missing = ("/api/jobs/victim/checkpoints/0123456789ab.zip", "/jobs/nosuch", "/no/such/route", "/sweeps/nosuch",
               "/api/sweeps/nosuch")
    for path in ROUTES:
        status, _, body = console.http(path) if "stream" not in path else _stream_status(console, path)
        assert status == (404 if path in missing else 200), (path, status, body[:200])
    status, headers, body = http(f"{console.base}/api/jobs/victim/logs/0?token={console.token}")
    assert status == 200 and "secret-line" in body
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"gptrain_ui_token_{console.port}=") and "HttpOnly" in cookie and \
        "SameSite=Strict" in cookie, cookie
    status, _, body = http(console.base + "/api/jobs/victim/logs/0", headers={"Cookie": cookie.split(";")[0]})
    assert status == 200 and "secret-line" in body
    status, _, body = console.http("/api/jobs/victim/remove", "POST", {"Origin": console.base, "X-CSRF-Token": csrf})
    assert (status, json.loads(body)) == (200, {"removed": "victim"})


def _stream_status(console, path):
    """An event stream's status (200: it has started) without reading it to its end."""
    with console.open(path, timeout=20) as r:
        return r.status, r.headers, r.readline().decode()


def test_a_browser_opening_the_token_url_is_sent_on_without_the_token(console):
    """The printed URL sets the cookie, then the browser is sent (303) to the same page without
    ?token=, so the token leaves the address bar; a script's ?token= (no text/html) is answered
    as is. A path that would make the redirect leave the console stays on it."""
    record_job("victim")
    html = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    status, headers, body = raw(console, f"/jobs/victim?token={console.token}&x=step", html)
    assert status == 303 and headers["location"] == "/jobs/victim?x=step", (status, dict(headers))
    assert headers["set-cookie"].startswith(f"gptrain_ui_token_{console.port}={console.token};")
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    assert console.token not in headers["location"] and console.token not in body
    cookie = {"Cookie": headers["set-cookie"].split(";")[0]}
    status, _, body = raw(console, "/jobs/victim?x=step", {**html, **cookie})
    assert status == 200 and '<meta name="csrf"' in body
    status, headers, _ = raw(console, f"/?token={console.token}", {"Sec-Fetch-Mode": "navigate"})
    assert (status, headers["location"]) == (303, "/")
    status, headers, _ = raw(console, f"/compare?jobs=victim&%74oken={console.token}", html)
    assert (status, headers["location"]) == (303, "/compare?jobs=victim")
    for path, where in ((f"//evil.example/?token={console.token}", "/evil.example/"),
                        (f"/\\evil.example/?token={console.token}", "/evil.example/")):
        status, headers, _ = raw(console, path, html)
        assert status == 303 and headers["location"] == where, (path, headers["location"])
    assert raw(console, f"/?token=wrong", html)[0] == 401
    status, headers, body = raw(console, f"/api/jobs?token={console.token}")  # a script: no redirect
    assert status == 200 and json.loads(body)[0]["name"] == "victim"


@pytest.fixture
def shared_console(isolated_home):
    c = Console(host="0.0.0.0")
    yield c
    c.close()


def test_a_non_loopback_bind_needs_the_printed_token(shared_console):
    c = shared_console
    token = c.token
    for path in ("/", "/api/jobs", "/api/jobs/stream", "/static/job.js", "/jobs/x", "/datasets"):
        status, _, body = http(c.base + path)
        assert status == 401 and "token" in body, (path, status)
        assert http(c.base + path + "?token=wrong" + token)[0] == 401
        assert http(c.base + path, headers={"Cookie": f"gptrain_ui_token_{c.port}=nope"})[0] == 401
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
    """A page on another domain re-pointed at 127.0.0.1 (DNS rebinding) reads nothing, even
    with the token (which such a page does not have)."""
    assert console.http("/api/jobs")[0] == 200
    for host in ("evil.example", f"evil.example:{console.port}", "192.168.1.5"):
        assert console.http("/api/jobs", headers={"Host": host})[0] == 403
        assert http(console.base + "/api/jobs", headers={"Host": host})[0] == 403
    assert console.http("/api/jobs", headers={"Host": f"localhost:{console.port}"})[0] == 200


def test_traversal_names_get_400_or_404_and_touch_nothing(console, isolated_home, tmp_path):
    record_job("real")
    victim = isolated_home / "victim"
    victim.mkdir()
    run_layout.metrics_file(victim).write_text('{"step": 1, "train/loss": 1.0}\n')
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
        status, _, body = console.http(path)
        assert status in (400, 404), (path, status, body[:200])
        assert "keep me" not in body and "train/loss" not in body
    for path in ("/api/jobs/..%2Fvictim/remove", "/api/jobs/..%2F..%2Foutside.txt/remove",
                 "/api/jobs/%2e%2e/stop", "/api/jobs/ghost/remove"):
        status, _, body = console.http(path, "POST", post)
        assert status in (400, 404), (path, status, body)
    assert run_layout.metrics_file(victim).is_file() and outside.read_text() == "keep me"
    assert json.loads(console.http("/api/jobs")[2])[0]["name"] == "real"


def test_a_cross_site_post_is_refused(console):
    record_job("victim")
    token = csrf_of(console)
    url = "/api/jobs/victim/remove"
    for headers in ({"Origin": "http://evil.example", "X-CSRF-Token": token},  # another site
                    {"Origin": "null", "X-CSRF-Token": token},
                    {"Referer": "http://evil.example/page", "X-CSRF-Token": token},
                    {"Origin": console.base.replace("127.0.0.1", "localhost"), "X-CSRF-Token": token},
                    {"Origin": console.base},  # no token (what an HTML form can send)
                    {"Origin": console.base, "X-CSRF-Token": "guess"},
                    {"X-CSRF-Token": token}):  # neither Origin nor Referer
        status, _, body = console.http(url, "POST", headers)
        assert status == 403 and "cross-site" in body, (headers, status, body)
    assert console.http("/api/jobs/victim")[0] == 200  # still there
    assert console.http(url)[0] == 405  # a GET never acts
    status, _, body = console.http(url, "POST", {"Origin": console.base, "X-CSRF-Token": token})
    assert status == 200 and json.loads(body) == {"removed": "victim"}
    assert console.http("/api/jobs/victim")[0] == 404


def test_an_action_a_job_refuses_is_one_clear_message(console):
    record_job("busy", state="running")
    token = csrf_of(console)
    status, _, body = console.http("/api/jobs/busy/remove", "POST",
                           {"Origin": console.base, "X-CSRF-Token": token})
    assert status == 409 and "stop busy` first" in json.loads(body)["error"]


def test_a_deeply_nested_or_huge_body_is_one_clear_message(console):
    """#47 row 9: a 100,000-deep JSON body to POST /api/runs was a 500 with a RecursionError
    traceback. Nesting and item count are bounded (files.parse_user_text): 400, one line."""
    token = csrf_of(console)
    post = {"Origin": console.base, "X-CSRF-Token": token, "Content-Type": "application/json"}
    bodies = {"deep": b"[" * 100_000 + b"]" * 100_000, "not a dict": b"[1, 2]", "not JSON": b"{nope",
              "many": json.dumps({"config": {"x": list(range(200_000))}}).encode()}
    for kind, body in bodies.items():
        req = console.request("/api/runs", "POST", post)
        req.data = body
        status, _, text = http(req)
        assert status == 400 and len(text.strip().splitlines()) == 1, (kind, status, text[:300])
        assert "Traceback" not in text and "Recursion" not in text, (kind, text[:300])
    req = console.request("/api/runs", "POST", post)  # a misspelled field launched a run without it
    req.data = json.dumps({"name": "typo", "flags": "--train.max_steps=1"}).encode()
    status, _, text = http(req)
    assert status == 400 and "unknown field 'flags'" in text and "args" in text, (status, text[:300])


def test_secrets_are_never_shown(console):
    secret = "hunter2-very-secret"
    record_job("sec", state="failed", secrets={"API_KEY": secret},
               log=f"token is {secret}\nTraceback...\nRuntimeError: bad key {secret}\n")
    for path in ("/api/jobs/sec", "/api/jobs/sec/logs/0", "/api/jobs/sec/logs/1", "/jobs/sec", "/api/jobs"):
        status, _, body = console.http(path)
        assert status == 200 and secret not in body, path
    log = json.loads(console.http("/api/jobs/sec/logs/0")[2])["text"]
    assert "token is ***" in log
    assert json.loads(console.http("/api/jobs/sec")[2])["spec"]["secrets"] == {"API_KEY": "***"}


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
    real = step_dir(d, 2)
    real.mkdir(parents=True)
    (real / "model.safetensors").write_bytes(b"weights")
    (real / "config.json").write_text('{"model_type": "gpt2"}')  # a HF model directory
    (real / "leak").symlink_to(outside / "id_rsa")
    (real / "leak-dir").symlink_to(outside)
    found = json.loads(console.http("/api/jobs/linky")[2])["checkpoints"]
    assert found, "discovery lists the weights"
    with console.open(f"/api/jobs/linky/checkpoints/{found[0]['id']}.zip") as r:
        with zipfile.ZipFile(io.BytesIO(r.read())) as z:
            assert b"PRIVATE" not in b"".join(z.read(n) for n in z.namelist())
            assert all("leak" not in n for n in z.namelist())
            assert "linky-step-000002/config.json" in z.namelist()
    step_dir(d, 1).symlink_to(outside)
    row = {"id": "0123456789ab", "name": "step-000001", "kind": "gptrain", "step": 1, "train_loss": None,
           "eval_loss": None, "time": 0.0, "size": 11, "mtime": 0.0, "path": str(step_dir(d, 1))}
    store.sync_checkpoints("linky", [*store.checkpoints("linky"), row])  # as if discovery had listed it
    for path in (step_dir(d, 1), outside):
        store.sync_checkpoints("linky", [*[c for c in store.checkpoints("linky") if c["id"] != row["id"]],
                                         {**row, "path": str(path)}])
        status, _, body = console.http(f"/api/jobs/linky/checkpoints/{row['id']}.zip")
        assert status == 404 and "PRIVATE" not in body, (path, status)
    record_job("other")
    assert console.http(f"/api/jobs/other/checkpoints/{found[0]['id']}.zip")[0] == 404


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
    assert browser.current_url == c.base + "/"  # the token went into a cookie, out of the address bar
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
    wait_until(lambda: c.http("/api/jobs/rec")[0] == 404, 30, "the job to be removed")
