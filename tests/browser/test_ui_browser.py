"""The console in a real browser (Debian's chromium via Selenium) while real 2-process jobs run:
rows and states change without a reload, curves and logs grow live, a checkpoint downloads as a
zip, the stop button stops a job, compare overlays two curves. Each page is screenshotted into
the test's tmp dir."""

import json
import urllib.request
import zipfile

import pytest
from selenium.webdriver.common.by import By

from gptrain import run_layout
from tests.browser.conftest import wait_until
from tests.conftest import run_cli
from tests.helpers import TINY, make_dataset

pytestmark = pytest.mark.slow
TRAIN = [f for f in TINY if not f.startswith("--checkpoint.every")] + ["--train.batch_size=4"]


@pytest.fixture
def dataset(tmp_path, isolated_home, monkeypatch):
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    yield "tiny"
    from gptrain.jobs import store

    for job in store.list_jobs():
        if job["state"] in store.ACTIVE:
            run_cli("stop", job["name"], "--timeout", "5", "--wait")


def submit(name, *flags, accels=2):
    r = run_cli("run", name, "--dataset", "tiny", "--accels", str(accels), "--", *TRAIN, *flags)
    assert r.returncode == 0, r.stderr


def state(name):
    from gptrain.jobs import store

    return store.get_job(name)["state"]


def train_rows(name):
    from gptrain.jobs.folder import job_dir

    lines = run_layout.metrics_file(job_dir(name)).read_text().splitlines()
    return sum("train/loss" in json.loads(line) for line in lines)


def row_state(browser, name):
    return browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{name}"] .state').text


def test_a_job_watched_in_the_browser(dataset, console, browser, tmp_path):
    browser.get(console.url)  # the URL `gptrain ui` printed: its token becomes a cookie
    assert browser.current_url == console.base + "/"  # and leaves the address bar
    browser.execute_script("window.notReloaded = true")
    jobs_tab = browser.current_window_handle
    submit("live", "--train.max_steps=300", "--checkpoint.every=100")
    wait_until(lambda: row_state(browser, "live") in ("queued", "starting", "running"), 60, "the job row")
    browser.save_screenshot(str(tmp_path / "jobs.png"))

    browser.switch_to.new_window("tab")
    browser.get(console.base + "/jobs/live")
    browser.execute_script("window.notReloaded = true")
    log = browser.find_element(By.ID, "log")
    wait_until(lambda: "| loss" in log.text, 300, "rank 0's log lines")
    assert state("live") == "running"  # they came while it ran, not at the end
    first = log.text.count("| loss")
    wait_until(lambda: state("live") != "running" or log.text.count("| loss") > first, 60, "more log lines")
    wait_until(lambda: browser.find_element(By.ID, "state").get_attribute("data-state") == "succeeded",
               300, "the job page to say succeeded")
    rows = train_rows("live")
    assert rows == 300
    drawn = "return [gp.curves.loss.x.length, gp.charts.loss.data[1].filter(v => v != null).length]"
    wait_until(lambda: browser.execute_script(drawn) == [rows, rows], 30, f"{rows} points in the loss chart")
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#checkpoints tr")) >= 3, 30, "checkpoints")
    browser.save_screenshot(str(tmp_path / "job.png"))

    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow",
                                                            "downloadPath": str(browser.downloads)})
    browser.find_element(By.CSS_SELECTOR, "#checkpoints a.download").click()
    zips = wait_until(lambda: [p for p in browser.downloads.glob("*.zip")], 60, "the checkpoint zip")
    with zipfile.ZipFile(zips[0]) as z:
        assert z.testzip() is None
        names = z.namelist()
    assert names and all(n.startswith("live-step-") for n in names), names
    hf_zip = tmp_path / "hf.zip"
    link = browser.find_element(By.CSS_SELECTOR, "#checkpoints a.download-hf").get_attribute("href")
    with urllib.request.urlopen(urllib.request.Request(link, headers=console.auth), timeout=120) as r:
        hf_zip.write_bytes(r.read())
    with zipfile.ZipFile(hf_zip) as z:
        files = {n.split("/", 1)[1] for n in z.namelist()}
    assert {"config.json", "model.safetensors"} <= files, files
    assert browser.execute_script("return window.notReloaded") is True

    browser.switch_to.window(jobs_tab)
    wait_until(lambda: row_state(browser, "live") == "succeeded", 30, "the row to turn succeeded")
    assert browser.execute_script("return window.notReloaded") is True
    browser.get(console.base + "/datasets")
    wait_until(lambda: browser.find_element(By.CSS_SELECTOR, 'tr[data-dataset="tiny"] .sample').text, 30,
               "a decoded sample")
    browser.save_screenshot(str(tmp_path / "datasets.png"))


def test_stop_button_and_compare(dataset, console, browser, tmp_path):
    submit("long", "--train.max_steps=100000", "--checkpoint.every=0")
    submit("short", "--train.max_steps=30")  # queued behind long: both need the 2 slots
    browser.get(f"{console.base}/jobs/long?token={console.token}")
    wait_until(lambda: "| loss" in browser.find_element(By.ID, "log").text, 300, "long to train")
    assert state("long") == "running" and state("short") == "queued"
    browser.find_element(By.ID, "stop").click()
    wait_until(lambda: browser.find_element(By.ID, "state").get_attribute("data-state") == "stopped",
               300, "the job page to say stopped")
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#checkpoints tr")) >= 1, 30,
               "the checkpoint saved on stop")
    assert state("long") == "stopped"
    browser.save_screenshot(str(tmp_path / "stopped.png"))

    wait_until(lambda: state("short") == "succeeded", 300, "short to run after long stopped")
    browser.get(console.base + "/compare?jobs=short,long&x=step")
    curves = ("return gp.compareChart && gp.compareChart.series.slice(1).map((s, i) => "
              "[s.label, gp.compareChart.data[i + 1].filter(v => v != null).length])")
    drawn = wait_until(lambda: browser.execute_script(curves), 30, "the compare chart")
    assert [label for label, _ in drawn] == ["short", "long"]
    assert drawn[0][1] == train_rows("short") == 30 and drawn[1][1] == train_rows("long") > 0
    for x in ("tokens", "time"):
        browser.find_element(By.CSS_SELECTOR, f'#x-axis option[value="{x}"]').click()
        wait_until(lambda: browser.execute_script(curves) and
                   browser.execute_script("return gp.compareChart.axes[0].label") == x, 30, f"x = {x}")
        assert all(n > 0 for _, n in browser.execute_script(curves))
    browser.save_screenshot(str(tmp_path / "compare.png"))
