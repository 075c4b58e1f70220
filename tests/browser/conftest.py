"""Fixtures for the console's tests: `gptrain ui` as a real subprocess on a free loopback port,
and Debian's chromium driven by Selenium through chromium-driver (installed by `make test` where
it can be: root on Debian; skipped with the reason elsewhere)."""

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest


def http(url, method="GET", headers=None):
    """(status, headers, body text) of a URL or Request, without raising on 4xx."""
    import urllib.error
    import urllib.request

    req = url if isinstance(url, urllib.request.Request) else urllib.request.Request(
        url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Console:
    """A running `gptrain ui`: the URL it printed (with the owner's token), its base URL (without:
    `open` and `http` add the token as an Authorization header) and its process."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None):
        import re

        self.port = port or free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "gptrain", "ui", "--host", host, "--port",
                                      str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=os.environ.copy())
        line = self.proc.stdout.readline()
        m = re.search(r"(http://\S+)", line)
        assert m, f"gptrain ui printed {line!r}"
        self.line, self.printed = line, m.group(1)
        token = re.search(r"\?token=([\w-]+)", self.printed)
        self.token = token.group(1) if token else None  # (None: a console from before tokens on loopback)
        self.auth = {"Authorization": f"token {self.token}"} if token else {}
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/?token={self.token}"  # what a browser opens first
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("gptrain ui did not start listening")

    def request(self, path: str, method: str = "GET", headers: dict | None = None):
        """A request for `path` carrying the owner's token."""
        import urllib.request

        return urllib.request.Request(self.base + path, method=method, headers={**self.auth, **(headers or {})})

    def open(self, path: str, timeout: float = 60):
        import urllib.request

        return urllib.request.urlopen(self.request(path), timeout=timeout)

    def http(self, path: str, method: str = "GET", headers: dict | None = None):
        """(status, headers, body text) of `path` with the owner's token, without raising on 4xx."""
        return http(self.request(path, method, headers))

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def console(isolated_home):
    c = Console()
    yield c
    c.close()


def chromium_or_skip():
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[dev]'")
    for tool in ("chromium", "chromedriver"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed: `make test` installs it as root on Debian "
                        "(apt-get install chromium chromium-driver)")


@pytest.fixture
def browser(tmp_path):
    chromium_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1600",
                "--disable-gpu"):
        opts.add_argument(arg)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    driver.downloads = downloads
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def wait_until(fn, timeout: float = 60, what: str = "condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # the page is still loading: try again
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
