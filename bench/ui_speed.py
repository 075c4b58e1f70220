"""How fast the web console answers with many jobs and a long run.

    python bench/ui_speed.py [--jobs 1000] [--rows 100000] [--repeat 5] [--no-browser]

Records --jobs finished jobs (50 metric rows each) and one job "big" with --rows metric rows in a
throw-away GPTRAIN_HOME (real job store rows, the trainer's metrics.jsonl format), starts
`gptrain ui` as a subprocess, and times each API answer over HTTP: the first (cold: the metrics
files not yet read by the server) and the median of --repeat more (warm: read incrementally from
where the last read stopped). With chromium + chromium-driver installed it also loads each page
in headless chromium and reports, from the navigation start, its first contentful paint and the
moment its data is drawn (the jobs table filled, the charts drawn; `gp.drawnAt` in the page).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def record(n_jobs: int, rows: int) -> None:
    from tests.browser.recorded_jobs import record_job

    for i in range(n_jobs):
        record_job(f"job-{i:04d}", rows=50, state=("succeeded", "failed", "stopped")[i % 3])
    record_job("big", rows=rows, log="".join(f"step {s} | loss 2.0\n" for s in range(20000)))


def get(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return (time.perf_counter() - start) * 1000, len(body)


def first_event(url: str) -> float:
    """ms until the first Server-Sent Event of a stream has arrived."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        while not r.readline().startswith(b"data:"):
            pass
    return (time.perf_counter() - start) * 1000


def time_api(base: str, repeat: int) -> None:
    urls = [("jobs list (1,001 jobs)", "/api/jobs"), ("jobs list, one state", "/api/jobs?state=failed"),
            ("job detail", "/api/jobs/big"), ("curves, 100k rows -> 4000 pts", "/api/jobs/big/curves"),
            ("curves, x = tokens", "/api/jobs/big/curves?x=tokens"),
            ("curves of a small job", "/api/jobs/job-0001/curves"),
            ("log tail (64 KiB)", "/api/jobs/big/logs/0"), ("datasets", "/api/datasets"),
            ("jobs page HTML", "/"), ("job page HTML", "/jobs/big"), ("compare page HTML", "/compare")]
    print(f"{'API answer':<34}{'cold ms':>10}{'warm ms':>10}{'bytes':>10}")
    for label, path in urls:
        cold, size = get(base + path)
        warm = statistics.median(get(base + path)[0] for _ in range(repeat))
        print(f"{label:<34}{cold:>10.1f}{warm:>10.1f}{size:>10}")
    for label, path in (("jobs stream, first event", "/api/jobs/stream"),
                        ("job stream, first event", "/api/jobs/big/stream?train=100000&eval=10000")):
        print(f"{label:<34}{'':>10}{statistics.median(first_event(base + path) for _ in range(repeat)):>10.1f}")


PAGES = [("jobs", "/"), ("job (100k rows)", "/jobs/big"), ("compare (big + 1)", "/compare?jobs=big,job-0001"),
         ("datasets", "/datasets")]


def wait_for(driver, script: str, timeout: float = 60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(script)


def time_pages(base: str, token: str, repeat: int) -> None:
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        print("(no chromium + chromium-driver: page timings skipped)")
        return
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    print(f"\n{'page (headless chromium)':<34}{'paint ms':>10}{'drawn ms':>10}")
    try:
        driver.get(f"{base}/?token={token}")  # the printed URL: the token becomes the session cookie
        for label, path in PAGES:
            paints, drawn = [], []
            for _ in range(repeat):
                driver.get("about:blank")
                driver.get(base + path)
                # ms from navigation start: first contentful paint, and the page's data drawn
                drawn.append(wait_for(driver, "return window.gp && gp.drawnAt"))
                paints.append(wait_for(driver, "const p = performance.getEntriesByName("
                                       "'first-contentful-paint')[0]; return p && p.startTime"))
            print(f"{label:<34}{statistics.median(paints):>10.1f}{statistics.median(drawn):>10.1f}")
    finally:
        driver.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    import subprocess

    from tests.browser.conftest import free_port

    home = Path(tempfile.mkdtemp(prefix="gptrain-ui-bench-"))
    os.environ["GPTRAIN_HOME"] = str(home)
    try:
        start = time.perf_counter()
        record(args.jobs, args.rows)
        print(f"recorded {args.jobs} jobs + 'big' ({args.rows:,} metric rows) in {time.perf_counter() - start:.1f} s")
        port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-m", "gptrain", "ui", "--port", str(port)],
                                stdout=subprocess.PIPE, text=True, env=env)
        import re

        token = re.search(r"\?token=([\w-]+)", proc.stdout.readline()).group(1)
        opener = urllib.request.build_opener()  # every request carries the owner's token
        opener.addheaders = [("Authorization", f"token {token}")]
        urllib.request.install_opener(opener)
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/static/style.css", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        try:
            time_api(base, args.repeat)
            if not args.no_browser:
                time_pages(base, token, args.repeat)
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
