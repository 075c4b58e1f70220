"""A sweep in the console, in a real browser (#51): 4 trials of a tiny model, 2 at once, over a
log-uniform learning rate and a choice of warmup; the sweeps page lists it, its page shows the
trials sorted by eval loss with the best named, every trial's eval-loss curve on one chart and
each setting against the eval loss, one point per trial. Screenshotted into the test's tmp dir
(docs/ui-sweep.png is one)."""

import time

import pytest
from selenium.webdriver.common.by import By

from tests.browser.conftest import wait_until
from tests.conftest import run_cli
from tests.helpers import make_dataset

pytest.importorskip("optuna")
pytestmark = pytest.mark.slow
FLAGS = ["--train.max_steps=8", "--train.eval_every=2", "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=2",
         "--model.block_size=32", "--train.precision=fp32", "--train.batch_size=4", "--data.max_eval_samples=8",
         "--checkpoint.every=0", "--report_to=none"]


def finished(name, timeout=600):
    from gptrain.jobs import api

    deadline = time.time() + timeout
    while True:
        rep = api.sweep_report(name)
        if rep["driver"] == "not running" and rep["ended"] == rep["spec"]["trials"]:
            return rep
        assert time.time() < deadline, rep
        time.sleep(1)


def test_a_sweep_in_the_browser(console, browser, tmp_path, monkeypatch):
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    r = run_cli("sweep", "sw", "--dataset", "tiny", "--param", "train.lr=loguniform:1e-4:3e-2", "--param",
                "train.warmup_steps=0,2,4", "--trials", "4", "--parallel", "2", "--reduction-factor", "2", "--", *FLAGS)
    assert r.returncode == 0, r.stderr
    rep = finished("sw")
    assert console.http("/sweeps/nosuch")[0] == 404 and console.http("/api/sweeps/a%20b")[0] == 400

    browser.get(console.url)
    browser.get(console.base + "/sweeps")
    row = wait_until(lambda: browser.find_element(By.CSS_SELECTOR, 'tr[data-sweep="sw"]'), 30, "the sweep's row")
    assert "4/4" in row.text and (rep["best"] or "") in row.text
    row.find_element(By.TAG_NAME, "a").click()
    wait_until(lambda: browser.execute_script("return gp.sweep && gp.sweep.name") == "sw", 60, "the sweep page")
    shown = [tr.get_attribute("data-trial") for tr in browser.find_elements(By.CSS_SELECTOR, "#trials-body tr")]
    assert shown == [str(t["number"]) for t in rep["trials"]]  # sorted by the objective, as inspect sorts
    best = browser.find_element(By.CSS_SELECTOR, "#trials-body tr.best")
    assert rep["best"] and rep["best"] in best.text and browser.find_element(By.ID, "best").text == rep["best"]
    # one eval-loss curve per trial that evaluated, each with the points its metrics.jsonl holds
    from gptrain.jobs import api

    curves = browser.execute_script("const c = gp.sweepCharts.curves; return c.series.slice(1).map((s, i) => "
                                    "[s.label, c.data[i + 1].filter(v => v != null).length])")
    def evals(job):
        mf = api.MetricsFile(api.metrics_path(job))
        mf.refresh()
        return len(mf.cols["eval"]["step"])

    evaluated = {t["job"]: evals(t["job"]) for t in rep["trials"]}
    assert all(evaluated.values()), evaluated
    assert dict(curves) == {job: n for job, n in evaluated.items() if n}, (curves, evaluated)
    # each setting against the eval loss: a point per trial with a loss (pruned ones at their best)
    for key in ("train.lr", "train.warmup_steps"):
        n = browser.execute_script(f"const u = gp.sweepCharts.scatter['{key}']; return u.data[1].filter(v => v != null)"
                                   ".length + u.data[2].filter(v => v != null).length")
        assert n == sum((t["value"] if t["state"] != "pruned" else t["best"]) is not None for t in rep["trials"]), key
    assert browser.execute_script("return gp.sweepCharts.scatter['train.lr'].scales.x.distr") == 3  # log axis
    browser.save_screenshot(str(tmp_path / "sweep.png"))
