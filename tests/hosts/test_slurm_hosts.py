"""A gptrain job on a real Slurm cluster of two hosts (podman containers h1 and h2, each with
its own address and hostname): slurmctld on h1, a slurmd on each (tests/hosts/slurm_hosts.py).

`--scheduler slurm --nodes 2`: sbatch puts the job on nodes h1 and h2, srun starts one torchrun
agent on each, they meet at h1's bridge address (the NodeAddr the script reads), the job
succeeds, each rank's log says which host it ran on, and its checkpoints are listed.

Then h2 killed mid-run (`podman kill`): rank 0 on h1 loses its peer, slurmctld marks h2 down
(SlurmdTimeout=10 here) and requeues the job (it is submitted with --requeue), which then
waits for two nodes; gptrain records the requeue (`restarting`, from which checkpoint it will
go on) and shows it `queued` again, with Slurm's word, its checkpoint kept. Then h2 comes back
(the same container started again, its munged and slurmd as after a reboot): Slurm puts the
node back in service and runs the job again, which resumes from its latest checkpoint and ends
`succeeded` without anyone typing a command, its final loss within 2% of test 1's uninterrupted
run of the same config. Runs in this order: test 2 kills h2.

Then a SIGTERM to the trainer on h2 alone (an admin, an OOM killer's TERM, a container runtime):
both ranks save at the step they agreed on (0 steps lost), the batch script requeues the job
(`preempted`, no restart spent), and it continues on both hosts to `succeeded`.

The CLI runs on h1 (the login node: its munged signs sbatch's and scontrol's requests); this
process only reads the shared folder.
"""

import json
import re
import shlex
import sys
import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from gptrain.jobs import folder
from gptrain.jobs.logs import rank_log
from tests.helpers import TINY, step_dir, steps_lost
from tests.conftest import ROOT
from tests.browser.conftest import browser, wait_until  # noqa: F401 (browser: the console tests' fixture)
from tests.hosts.conftest import final_eval_loss, gptrain_on_h1, job_home, node_env

pytestmark = pytest.mark.slow
STEPS, EVERY = 120, 30
ARGS = [*TINY, f"--train.max_steps={STEPS}", "--train.batch_size=4", f"--checkpoint.every={EVERY}",
        "--train.seed=1"]
FINAL = {}  # test 1's final loss, the reference of test 2
LONG = 400  # steps of test 3: its SIGTERM is sent once the first step is logged (~10 steps/s here)


@pytest.fixture
def home(slurm_hosts, request, monkeypatch, tmp_path):
    return job_home(slurm_hosts.hosts.shared_dir, request, monkeypatch, tmp_path)


def gptrain(cluster, home, *args):
    """`gptrain ARGS` on h1, against the cluster; its stdout."""
    return gptrain_on_h1(cluster.hosts, home, *args, env={"SLURM_CONF": str(cluster.conf)}).stdout


def until(cluster, home, name, states=("succeeded", "failed", "stopped"), timeout=180) -> tuple[dict, list]:
    """`gptrain inspect NAME --json` (which reads Slurm's state) until the job is in one of
    `states`: its report and the states it showed on the way."""
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        report = json.loads(gptrain(cluster, home, "inspect", name, "--json"))
        if not seen or seen[-1] != report["job"]["state"]:
            seen.append(report["job"]["state"])
        if seen[-1] in states:
            return report, seen
        time.sleep(1)
    raise AssertionError(f"{name} still {seen[-1]} after {timeout} s: {report['events']}")


def slurm_job(cluster, job_id: str) -> dict:
    """Slurm's own fields of the job (scontrol show job), to check what gptrain says against."""
    out = cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def test_two_hosts_one_slurm_job(slurm_hosts, home):
    cluster = slurm_hosts
    gptrain(cluster, home, "run", "two", "--scheduler", "slurm", "--nodes", "2", "--accels", "1",
            "--dataset", "tiny", "--", *ARGS)
    report, _ = until(cluster, home, "two")
    jdir = home / "jobs" / "two"
    logs = folder.logs_dir(jdir)
    out = "\n".join(p.read_text()[-3000:] for p in sorted(logs.glob("*.log")) + sorted(logs.glob("slurm-*.out")))
    assert report["job"]["state"] == "succeeded", (report["events"], out)
    ip1 = cluster.hosts.ips[0]
    assert f"on h[1-2] (rendezvous {ip1})" in "".join(p.read_text() for p in logs.glob("slurm-*.out")), out
    heads = [rank_log(logs, r).read_text().splitlines()[0] for r in (0, 1)]
    assert {h.split(", host ")[1].split(",")[0] for h in heads} == {"h1", "h2"}, heads  # one rank per host
    assert all("world 2" in h for h in heads), heads
    ckpts = json.loads(gptrain(cluster, home, "checkpoints", "two", "--json"))
    assert ckpts[-1]["step"] == STEPS, ckpts
    FINAL["two"] = final_eval_loss(jdir, STEPS)


def test_the_consoles_launch_form_runs_a_two_node_slurm_job(slurm_hosts, home, browser):
    """The console served from h1 (the login node), opened in a real browser on this machine at
    h1's bridge address: its New run form (scheduler slurm, 2 nodes of 1 process) submits a job
    that sbatch spreads over h1 and h2, and the job page shows it succeed."""
    cluster, hosts = slurm_hosts, slurm_hosts.hosts
    ip, port, said, pid = hosts.ips[0], 8766, home / "ui-h1.log", home / "ui-h1.pid"
    env = {**node_env(), "GPTRAIN_HOME": str(home), "SLURM_CONF": str(cluster.conf)}
    serve = [sys.executable, "-m", "gptrain", "ui", "--host", ip, "--port", str(port)]
    hosts.exec(0, ["sh", "-c", f"echo $$ > {shlex.quote(str(pid))}; exec {shlex.join(serve)} > "
                               f"{shlex.quote(str(said))} 2>&1"], env=env, detach=True)
    try:
        token = wait_until(lambda: re.search(r"\?token=([\w-]+)", said.read_text()), 60,
                           "gptrain ui on h1 printed no URL").group(1)
        browser.get(f"http://{ip}:{port}/?token={token}")
        browser.find_element(By.CSS_SELECTOR, "#new-run summary").click()
        wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#launch-dataset option")) > 1, 30,
                   "no datasets offered")
        Select(browser.find_element(By.ID, "launch-dataset")).select_by_value("tiny")
        browser.find_element(By.ID, "launch-name").send_keys("form")
        browser.execute_script("arguments[0].value = arguments[1]", browser.find_element(By.ID, "launch-args"),
                               " ".join([*TINY, "--train.max_steps=20", "--train.batch_size=4"]))
        Select(browser.find_element(By.ID, "launch-scheduler")).select_by_value("slurm")
        browser.find_element(By.ID, "launch-nodes").send_keys("2")
        browser.find_element(By.ID, "launch-accels").send_keys("1")
        browser.find_element(By.ID, "launch-submit").click()
        wait_until(lambda: browser.current_url.endswith("/jobs/form"), 30, "not taken to the new job")
        report, _ = until(cluster, home, "form")
        logs = folder.logs_dir(home / "jobs" / "form")
        assert report["job"]["state"] == "succeeded", report["events"]
        assert (report["job"]["scheduler"], report["job"]["nodes"]) == ("slurm", 2), report["job"]
        heads = [rank_log(logs, r).read_text().splitlines()[0] for r in (0, 1)]
        assert {h.split(", host ")[1].split(",")[0] for h in heads} == {"h1", "h2"}, heads
        wait_until(lambda: browser.find_element(By.ID, "state").get_attribute("data-state")
                   == "succeeded", 60, "the job page never showed it succeeded")
    finally:
        if pid.exists():
            hosts.exec(0, ["kill", pid.read_text().strip()], check=False)


def test_host_killed_the_job_is_requeued_and_succeeds_when_the_host_returns(slurm_hosts, home):
    if "two" not in FINAL:
        pytest.skip("needs test_two_hosts_one_slurm_job's uninterrupted run first")
    cluster, hosts = slurm_hosts, slurm_hosts.hosts
    gptrain(cluster, home, "run", "k", "--scheduler", "slurm", "--nodes", "2", "--accels", "1",
            "--dataset", "tiny", "--", *ARGS)
    jdir = home / "jobs" / "k"
    deadline = time.time() + 180
    while not step_dir(jdir, EVERY).is_dir():
        assert time.time() < deadline, list(folder.logs_dir(jdir).glob("*"))
        time.sleep(0.2)
    hosts.kill(1)  # h2 dies with its slurmd, torchrun agent and rank
    report, seen = until(cluster, home, "k", states=("queued", "failed", "succeeded", "stopped"), timeout=120)
    story = "\n".join(f"{e['kind']}: {e['message']}" for e in report["events"])
    out = "".join(p.read_text() for p in folder.logs_dir(jdir).glob("slurm-*.out"))
    assert seen[-1] == "queued" and "restarting" in seen, (seen, story, out)
    requeue = [e["message"] for e in report["events"] if e["kind"] == "restarting"]
    assert len(requeue) == 1 and re.match(  # (REQUEUED itself when a look catches its instant)
        r"Slurm (requeued the job \(restart 1\), now PENDING|REQUEUED).*: continues from step-\d{6} \(or the newest one before it that passes verification\)$",
        requeue[0]), story
    assert report["events"][-1]["message"].startswith("Slurm PENDING"), story
    job_id = report["job"]["external_id"]
    fields = slurm_job(cluster, job_id)  # what gptrain says is Slurm's: requeued, waiting
    assert fields["JobState"] == "PENDING" and fields["Restarts"] == "1", fields
    assert "DUE TO NODE FAILURE" in out and "Node failure on h2" in out, out
    rank0 = rank_log(folder.logs_dir(jdir), 0).read_text()
    # h1's rank lost its peer at h2's address (gloo: "Connection reset/closed by peer [IP]:PORT")
    assert f"[{hosts.ips[1]}]:" in rank0 and "by peer" in rank0, rank0[-2000:]

    cluster.host_returns(1)  # h2 reboots: Slurm gives the job its two nodes again, nobody types a command
    report, more = until(cluster, home, "k", timeout=300)
    seen += more[1:] if more[0] == seen[-1] else more
    story = "\n".join(f"{e['kind']}: {e['message']}" for e in report["events"])
    logs = "".join(p.read_text()[-3000:] for p in sorted(folder.logs_dir(jdir).glob("*")))
    assert report["job"]["state"] == "succeeded", (seen, story, logs)
    rank0 = rank_log(folder.logs_dir(jdir), 0).read_text()
    assert re.search(r"resumed from .*step-\d{6}", rank0), rank0[-3000:]
    assert [c["step"] for c in json.loads(gptrain(cluster, home, "checkpoints", "k", "--json"))][-1] == STEPS
    loss, ref = final_eval_loss(jdir, STEPS), FINAL["two"]
    print(f"h2 killed and back: gptrain showed {' -> '.join(seen)}; final loss at step {STEPS}: "
          f"uninterrupted {ref:.4f}, interrupted {loss:.4f}; events:\n{story}")
    assert abs(loss - ref) <= 0.02 * ref, (loss, ref)


# run on h2 (the container sees its own processes only): SIGTERM to the trainer of the job whose
# output folder is argv[1] (what an admin's `kill` does; not the torchrun agent, not Slurm)
KILL_TRAINER = """
import os, signal, sys
from tests.job_helpers import trainer_pids
for pid in trainer_pids(sys.argv[1]):
    os.kill(pid, signal.SIGTERM)
    print(pid)
"""


def test_a_sigterm_to_the_trainer_on_one_host_preempts_and_the_job_continues(slurm_hosts, home):
    import sys

    cluster, hosts = slurm_hosts, slurm_hosts.hosts
    gptrain(cluster, home, "run", "t", "--scheduler", "slurm", "--nodes", "2", "--accels", "1",
            "--dataset", "tiny", "--", *TINY, f"--train.max_steps={LONG}", "--train.batch_size=4",
            "--checkpoint.every=100000", "--train.do_eval=false")
    jdir = home / "jobs" / "t"
    rank0 = rank_log(folder.logs_dir(jdir), 0)  # (rank 0 logs the steps)
    deadline = time.time() + 180
    while not (rank0.is_file() and re.search(r"step\s+\d+/", rank0.read_text(errors="replace"))):
        assert time.time() < deadline, list(folder.logs_dir(jdir).glob("*"))
        time.sleep(0.2)
    killed = hosts.exec(1, [sys.executable, "-c", KILL_TRAINER, str(jdir)],
                        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"}).stdout.split()
    assert len(killed) == 1, killed  # the trainer on h2, and nothing else
    report, seen = until(cluster, home, "t", timeout=400)
    story = "\n".join(f"{e['kind']}: {e['message']}" for e in report["events"])
    logs = "".join(p.read_text()[-3000:] for p in sorted(folder.logs_dir(jdir).glob("*")))
    assert report["job"]["state"] == "succeeded", (seen, story, logs)
    assert any(e["kind"] == "preempted" and "got SIGTERM" in e["message"] for e in report["events"]), story
    assert report["job"]["restarts"] == 0, story  # a preemption spends no restart meant for crashes
    lost = steps_lost(rank0.read_text(errors="replace"))
    assert lost == [0], logs
    assert [c["step"] for c in json.loads(gptrain(cluster, home, "checkpoints", "t", "--json"))][-1] == LONG
    print(f"SIGTERM to the trainer on h2: gptrain showed {' -> '.join(seen)}; steps lost {lost}; events:\n{story}")


def test_a_sweep_runs_its_trials_across_both_hosts_and_resumes_after_its_driver_dies(slurm_hosts, home):
    """#51's sweep on Slurm: `gptrain sweep --scheduler slurm` on h1 (the login node), 4 trials
    of one whole node each (--sbatch-arg=--exclusive), 2 at once, so Slurm runs one on each host; its driver (on h1) killed with
    SIGKILL once trials are under way and `gptrain sweep resume` finishes the sweep with no trial
    run twice; the best trial is the minimum of the complete ones."""
    cluster, hosts = slurm_hosts, slurm_hosts.hosts
    flags = ["--train.max_steps=12", "--train.eval_every=3", "--model.n_layer=1", "--model.n_embd=32",
             "--model.n_head=2", "--model.block_size=32", "--train.precision=fp32", "--train.batch_size=4",
             "--data.max_eval_samples=8", "--checkpoint.every=0", "--report_to=none"]
    said = gptrain(cluster, home, "sweep", "hs", "--scheduler", "slurm", "--nodes", "1", "--accels", "1",
                   "--sbatch-arg=--exclusive",  # (a host's two CPUs would take both trials: one a host)
                   "--dataset", "tiny", "--param", "train.lr=loguniform:1e-4:3e-2", "--trials", "4",
                   "--parallel", "2", "--reduction-factor", "2", "--", *flags)
    assert "on slurm" in said, said

    def report():
        return json.loads(gptrain(cluster, home, "sweep", "inspect", "hs", "--json"))

    wait_until(lambda: len([t for t in report()["trials"] if t["job"]]) >= 2, 180, "two trials submitted")
    pid = (home / "sweeps" / "hs" / "driver.pid").read_text().strip()
    hosts.exec(0, ["kill", "-9", pid])
    wait_until(lambda: report()["driver"] == "not running", 30, "the driver to die")
    gptrain(cluster, home, "sweep", "resume", "hs")
    rep = wait_until(lambda: (lambda r: r if r["driver"] == "not running" and r["ended"] == 4 else None)(report()),
                     600, "the sweep to end")
    driver_log = (home / "sweeps" / "hs" / "driver.log").read_text()
    trials = rep["trials"]
    assert len(trials) == 4 and len({t["job"] for t in trials}) == 4, (trials, driver_log[-3000:])
    assert not [t for t in trials if t["state"] == "fail"], (trials, driver_log[-3000:])
    hosts_of = set()
    for t in trials:
        job = json.loads(gptrain(cluster, home, "inspect", t["job"], "--json"))["job"]
        assert job["scheduler"] == "slurm", job
        starts = [e for e in json.loads(gptrain(cluster, home, "inspect", t["job"], "--json"))["events"]
                  if e["kind"] == "slurm"]
        assert len(starts) == 1, starts  # submitted once: no trial ran twice
        head = rank_log(folder.logs_dir(home / "jobs" / t["job"]), 0).read_text().splitlines()[0]
        hosts_of.add(head.split(", host ")[1].split(",")[0])
    assert hosts_of == {"h1", "h2"}, hosts_of  # 2 at once, one node each: Slurm used both hosts
    complete = [t for t in trials if t["state"] == "complete"]
    assert complete and rep["best"] == min(complete, key=lambda t: t["value"])["job"], trials
