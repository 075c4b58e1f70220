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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Console:
    """A running `gptrain ui`: its base URL (with token when it printed one) and process."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None):
        import re

        self.port = port or free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "gptrain", "ui", "--host", host, "--port",
                                      str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=os.environ.copy())
        line = self.proc.stdout.readline()
        m = re.search(r"(http://\S+)", line)
        assert m, f"gptrain ui printed {line!r}"
        self.printed = m.group(1)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("gptrain ui did not start listening")

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
