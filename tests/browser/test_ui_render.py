"""One renderer spec for both faces (gptrain/assets/render.json): the CLI's cli/render.py and
the console's common.js, run in a real browser, show the same numbers the same way: losses,
sizes up to TiB, ages, times, and '-' where there is no value; and a job's row in `gptrain jobs`
reads as the same row of the console's jobs table."""

import time

import pytest
from selenium.webdriver.common.by import By

from tests.browser.conftest import wait_until
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

LOSSES = [None, 0, 2.5, 3.14159265, 1e-5, 12345.678, 0.00005]
SIZES = [None, 0, 1023, 1024, 1536, 5 << 20, int(2.5 * (1 << 30)), 3 << 40, 7 * (1 << 40) + 12345]
AGES = [None, 0, 5, 59, 61, 3599, 3601, 86399, 86401, 10 * 86400]


def test_numbers_read_the_same_in_the_cli_and_the_console(isolated_home, console, browser):
    from gptrain.cli import render

    browser.get(console.url)
    wait_until(lambda: browser.execute_script("return !!window.gp"), 30, "no console script")
    now = time.time()
    js = browser.execute_script("""
        const [losses, sizes, ages, now] = arguments;
        const realNow = Date.now; Date.now = () => now * 1000;   // the same "now" as Python's
        try {
          return { loss: losses.map(gp.loss), size: sizes.map(gp.bytes),
                   age: ages.map((a) => gp.age(a === null ? null : (a === 0 ? 0 : now - a))),
                   time: [null, 1795651234.5].map(gp.time) };
        } finally { Date.now = realNow; }""", LOSSES, SIZES, AGES, now)
    assert js["loss"] == [render.loss(v) for v in LOSSES]
    assert js["size"] == [render.size(v) for v in SIZES]
    real = time.time
    time.time = lambda: now
    try:
        assert js["age"] == [render.age(None if a is None else (0 if a == 0 else now - a)) for a in AGES]
    finally:
        time.time = real
    assert js["time"] == [render.when(None), render.when(1795651234.5)]
    assert js["size"][-1].endswith("TiB") and js["loss"][0] == "-" and js["size"][0] == "-"
    # a chart's axis labels: distinct, with no more digits than that takes (a learning-rate axis
    # from 2.0e-3 to 2.1e-3 read "2.0e-3" three times: issue 38)
    ticks = browser.execute_script("return [gp.ticks([0.002, 0.00205, 0.0021]), gp.ticks([0.001, 0.002, 0.003]),"
                                   " gp.ticks([2.5, 2.55, 2.6]), gp.ticks([0, 1000, 2000])]")
    assert ticks == [["2.00e-3", "2.05e-3", "2.10e-3"], ["1.0e-3", "2.0e-3", "3.0e-3"], ["2.5", "2.55", "2.6"],
                     ["0", "1000", "2000"]]


def test_a_job_row_reads_the_same_in_both_faces(isolated_home, console, browser, tmp_path):
    """A recorded job (its store row, as `gptrain jobs` and the console both read it)."""
    from gptrain.jobs import store

    import json

    from gptrain.jobs import folder

    store.create_job("shown", {"name": "shown"}, 1, 2, "local")
    store.set_state("shown", "failed", "made by the test", exit_code=1)
    store.create_job("going", {"name": "going"}, 1, 1, "local")  # running: step of total, time left
    store.set_state("going", "running", "made by the test")
    metrics = folder.metrics_files(folder.job_dir("going"))[0]
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text(json.dumps({"step": 120, "time": time.time(), "total_steps": 3000, "eta_s": 5400.0,
                                   "train/loss": 2.5}) + "\n")
    cli = run_cli("jobs").stdout.splitlines()
    starts = [cli[0].index(h) for h in cli[0].split()] + [None]  # left-aligned columns
    browser.get(console.url)
    for name in ("shown", "going"):
        row = next(line for line in cli if line.startswith(name))
        cells = {h: row[a:b].strip() for h, a, b in zip(cli[0].split(), starts, starts[1:])}
        tr = wait_until(lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{name}"]'), 30, "no row")
        shown = [td.text for td in tr.find_elements(By.TAG_NAME, "td")][1:]  # (the checkbox)
        assert shown[0] == cells["NAME"] and shown[1] == cells["STATE"] and shown[2] == cells["RESOURCES"]
        assert shown[3] == cells["STEP"] and shown[4] == cells["LOSS"] and shown[5] == cells["ETA"], (shown, cells)
    assert cells["STEP"] == "120/3000" and cells["ETA"] == "1h"  # ('-' each for `shown`: no step, no loss yet)
    # the table's head and its state filter: the facts the CLI reads, served from Python (jobs/api.FACTS)
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#jobs thead th")][1:]
    assert [h.upper() for h in heads] == cli[0].split()
    options = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#state-filter option")]
    assert options == ["", *(s.value for s in store.JobState)]
