"""The console launches runs and tries checkpoints, in a real browser (Debian's chromium via
Selenium), through the library's API modules as the CLI does: a new run from the jobs page, a job
run again with its flags and config edited (a bad edit gets the CLI's own one-line error and
records nothing), and text generated from a checkpoint in the job page's prompt box."""

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.browser.conftest import wait_until
from tests.conftest import run_cli
from tests.helpers import TINY, make_dataset

pytestmark = pytest.mark.slow
TRAIN = [f for f in TINY if not f.startswith("--checkpoint.every")] + ["--train.batch_size=4", "--train.do_eval=false"]


@pytest.fixture
def finished(tmp_path, isolated_home, monkeypatch):
    """A pushed dataset and a finished 3-step job `base` on it."""
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    r = run_cli("run", "base", "--dataset", "tiny", "--", *TRAIN, "--train.max_steps=3")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: state("base") in ("succeeded", "failed"), 240, "base never ended")
    assert state("base") == "succeeded"
    return "base"


def state(name):
    from gptrain.jobs import store

    try:
        return store.get_job(name)["state"]
    except Exception:
        return None


def spec(name):
    from gptrain.jobs import store

    return store.get_job(name)["spec"]


def test_generate_and_run_again_with_changes_from_the_job_page(finished, console, browser, tmp_path):
    browser.get(console.url)
    browser.get(console.base + "/jobs/base")
    prompt = wait_until(lambda: browser.find_element(By.ID, "prompt"), 30, "no prompt box")
    prompt.send_keys("the")
    max_new = browser.find_element(By.ID, "max-new-tokens")
    max_new.clear()
    max_new.send_keys("12")
    browser.find_element(By.ID, "generate").click()
    text = wait_until(lambda: (t := browser.find_element(By.ID, "sampled").text) not in ("", "…") and t, 120,
                      "no text generated")
    assert text.startswith("the") and len(text) > len("the"), text
    assert browser.find_element(By.ID, "try-error").text == ""
    browser.save_screenshot(str(tmp_path / "try.png"))

    # a bad edit: the CLI's own one line, nothing recorded
    args = browser.find_element(By.ID, "rerun-args")
    assert "--train.max_steps=3" in args.get_attribute("value")
    name = browser.find_element(By.ID, "rerun-name")
    name.clear()
    name.send_keys("bad")
    edited = args.get_attribute("value").replace("--train.batch_size=4", "--train.batch_size=0")
    browser.execute_script("arguments[0].value = arguments[1]", args, edited)
    browser.find_element(By.ID, "rerun-submit").click()
    said = wait_until(lambda: browser.find_element(By.ID, "rerun-error").text, 30, "no error shown")
    cli = run_cli("run", "bad", "--dataset", "tiny", "--", *edited.split())
    assert cli.returncode == 2 and cli.stderr.strip() == f"gptrain: error: {said}", (cli.stderr, said)
    assert state("bad") is None and browser.current_url.endswith("/jobs/base")

    # a good edit: 4 steps and a config of its own; the new job runs and ends
    name.clear()
    name.send_keys("again")
    browser.execute_script("arguments[0].value = arguments[1]", args, edited.replace(
        "--train.batch_size=0", "--train.batch_size=4").replace("--train.max_steps=3", "--train.max_steps=4"))
    config = browser.find_element(By.ID, "rerun-config")
    browser.execute_script("arguments[0].value = arguments[1]", config, "[train]\nseed = 7\n")
    browser.find_element(By.ID, "rerun-submit").click()
    wait_until(lambda: browser.current_url.endswith("/jobs/again"), 30, "not taken to the new job")
    wait_until(lambda: state("again") in ("succeeded", "failed"), 240, "again never ended")
    assert state("again") == "succeeded"
    s = spec("again")
    assert "--train.max_steps=4" in s["args"] and "seed = 7" in s["config"] and s["datasets"] == ["tiny"]


def test_a_new_run_from_the_jobs_page(finished, console, browser):
    browser.get(console.url)
    browser.find_element(By.CSS_SELECTOR, "#new-run summary").click()
    pick = wait_until(lambda: Select(browser.find_element(By.ID, "launch-dataset")) if
                      len(browser.find_elements(By.CSS_SELECTOR, "#launch-dataset option")) > 1 else None, 30, "no datasets")
    pick.select_by_value("tiny")
    browser.find_element(By.ID, "launch-name").send_keys("fresh")
    browser.execute_script("arguments[0].value = arguments[1]", browser.find_element(By.ID, "launch-args"),
                           " ".join([*TRAIN, "--train.max_steps=2"]))
    # where it runs: the scheduler, 2 nodes of 1 process (the local engine's agents)
    Select(browser.find_element(By.ID, "launch-scheduler")).select_by_value("local")
    browser.find_element(By.ID, "launch-nodes").send_keys("2")
    browser.find_element(By.ID, "launch-accels").send_keys("1")
    browser.find_element(By.ID, "launch-submit").click()
    wait_until(lambda: browser.current_url.endswith("/jobs/fresh"), 30, "not taken to the new job")
    wait_until(lambda: state("fresh") in ("succeeded", "failed"), 240, "fresh never ended")
    assert state("fresh") == "succeeded"
    from gptrain.jobs import store

    job = store.get_job("fresh")
    assert (job["scheduler"], job["nodes"], job["accels"]) == ("local", 2, 1), job
    # a name that is taken: the one line, and the page stays
    browser.get(console.base + "/")
    browser.find_element(By.CSS_SELECTOR, "#new-run summary").click()
    browser.find_element(By.ID, "launch-name").send_keys("fresh")
    browser.find_element(By.ID, "launch-submit").click()
    said = wait_until(lambda: browser.find_element(By.ID, "launch-error").text, 30, "no error shown")
    assert "fresh" in said and "\n" not in said
    # an engine's options are the ones it declares (jobs/engines/options.py), checked as `gptrain
    # run --time` is: Slurm's form shows its flags, and a bad time limit is its one line
    Select(browser.find_element(By.ID, "launch-scheduler")).select_by_value("slurm")
    shown = [e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "#launch-options select, "
                                                                               "#launch-options input")]
    assert shown == [f"launch-opt-{k}" for k in ("partition", "account", "time", "sbatch_args", "port", "accel_type")]
    browser.find_element(By.ID, "launch-name").clear()
    browser.find_element(By.ID, "launch-name").send_keys("onslurm")
    browser.find_element(By.ID, "launch-opt-time").send_keys("soon")
    browser.find_element(By.ID, "launch-submit").click()
    said = wait_until(lambda: (t := browser.find_element(By.ID, "launch-error").text) and "soon" in t and t,
                      30, "no error shown")
    assert "--time 'soon' is not a Slurm time" in said and "\n" not in said, said
    assert run_cli("inspect", "onslurm").returncode == 2  # nothing recorded
