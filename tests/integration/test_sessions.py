"""Interactive sessions on the local engine (jobs/sessions.py, jobs/programs/session_shell.py): a
shell in a bubblewrap sandbox holding the tutorials' layout (the code, /input/NAME, and
/output-checkpoint as the session's checkpoints), its accelerators held from the queue while it
lives and freed when its shell exits, is killed, or sits idle; reached through a real pty."""

import os
import select
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import run_cli
from tests.job_helpers import job, ok, refused, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap: apt-get install bubblewrap")]
TRAIN = ["--train.max_steps=3", "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=2", "--model.block_size=32",
         "--train.precision=fp32", "--metrics.peak_flops=1e11"]


class Terminal:
    """`gptrain session attach NAME` on a real pseudo-terminal, as a user's shell runs it."""

    def __init__(self, name, cwd):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "gptrain", "session", "attach", name], stdin=slave,
                                     stdout=slave, stderr=slave, cwd=cwd, close_fds=True)
        os.close(slave)
        self.seen = b""

    def type(self, text: str) -> None:
        os.write(self.master, text.encode() + b"\r")

    def expect(self, needle: str, timeout: float = 60) -> None:
        end = time.time() + timeout
        while needle.encode() not in self.seen:
            assert time.time() < end, self.seen[-2000:]
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:
                    break
        assert needle.encode() in self.seen, self.seen[-2000:]


@pytest.fixture
def project(dataset, tmp_path):
    """The tutorial's repository layout: a folder with its training script, the current folder."""
    code = tmp_path / "repo"
    code.mkdir()
    (code / "train.sh").write_text("exec torchrun --standalone --nproc_per_node 1 -m gptrain train "
                                   "--data.path /input/tiny --train.output_dir /output-checkpoint \"$@\"\n")
    return code


def test_a_session_holds_the_tutorial_layout_and_its_checkpoints_are_the_jobs(project):
    started("s", "--dataset", "tiny", "--env", "WHO=tutorial", cwd=project)
    r = run_cli("session", "exec", "s", "--", "sh", "-c", "ls /input/tiny; ls; echo $WHO $GPTRAIN_JOB", cwd=project)
    assert r.returncode == 0 and "meta.json" in r.stdout and "train.sh" in r.stdout and "tutorial s" in r.stdout, r
    r = run_cli("session", "exec", "s", "--", "sh", "-c", "touch /input/tiny/evil")
    assert r.returncode != 0 and "Read-only file system" in r.stdout, r  # the pushed dataset stays as it was
    # round 6 (E.envdir): its variables name /input/NAME, and the real folder is read-only there too
    r = run_cli("session", "exec", "s", "--", "sh", "-c", 'echo "$GPTRAIN_DATASET_DIR $GPTRAIN_DATASET_TINY_DIR"; '
                'touch "$GPTRAIN_HOME/datasets/tiny/evil"')
    assert r.stdout.startswith("/input/tiny /input/tiny") and "Read-only file system" in r.stdout, r
    r = run_cli("session", "exec", "s", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7  # a command's status is the exec's
    # torchrun of the repository's script inside writes /output-checkpoint: the session's checkpoints
    r = run_cli("session", "exec", "s", "--", "bash", "train.sh", *TRAIN)
    assert r.returncode == 0 and "completed at step 3" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    wait_for_checkpoint("s")
    g = run_cli("generate", "s", "--prompt", "th", "--max-new-tokens", "4", "--seed", "0")
    assert g.returncode == 0 and g.stdout.startswith("th"), g.stderr
    # its accelerator is held: a job needing both slots waits until the session's shell exits
    ok("run", "after", "--dataset", "tiny", "--accels", "2", "--", *TRAIN)
    time.sleep(3)
    assert job("after")["state"] == "queued" and job("s")["state"] == "running"
    term = Terminal("s", project)
    term.expect("code# ")  # the shell's prompt, kept while nobody was attached
    term.type("echo $((6*7)) $(ls /input)")
    term.expect("42 tiny")
    term.type("exit")
    assert term.proc.wait(60) == 0
    assert wait_for("s")["state"] == "succeeded"
    assert wait_for("after")["state"] == "succeeded"  # the slot freed went to the queue
    listed = run_cli("session", "list", "--json")
    assert '"name": "s"' in listed.stdout and '"after"' not in listed.stdout
    refused(run_cli("session", "attach", "s"), "session s is succeeded: nothing to attach to")
    refused(run_cli("session", "exec", "after", "--", "true"), "after is a job, not a session")


def started(name, *args, cwd):
    r = run_cli("session", "start", name, *args, "--detach", cwd=cwd)
    assert r.returncode == 0 and f"session {name} ready" in r.stderr, (r.stdout, r.stderr)


def wait_for_checkpoint(name, timeout=60):
    end = time.time() + timeout
    while True:
        r = run_cli("checkpoints", name, "--json")
        if r.returncode == 0 and '"step": 3' in r.stdout:
            return
        assert time.time() < end, r.stdout + r.stderr
        time.sleep(0.5)


def test_a_killed_shell_or_an_idle_session_ends_it_and_frees_its_accelerator(dataset, tmp_path):
    started("k", cwd=tmp_path)
    term = Terminal("k", tmp_path)
    term.expect("code# ")
    term.type("echo ready; kill -9 $$")
    term.expect("ready")
    state = wait_for("k")
    assert state["state"] == "failed" and "137" in (state["error"] or "") + str(state["exit_code"]), state
    started("idle", "--idle-timeout", "2s", cwd=tmp_path)
    assert wait_for("idle", timeout=60)["state"] == "succeeded"
    assert "idle for 2 s" in run_cli("logs", "idle").stdout
    # both slots free again: a 2-process job runs at once
    ok("run", "both", "--dataset", "tiny", "--accels", "2", "--", *TRAIN)
    assert wait_for("both")["state"] == "succeeded"
    refused(run_cli("session", "start", "x", "--idle-timeout", "soon"), "--idle-timeout 'soon'")


def test_a_failed_job_keeps_its_environment_until_it_is_stopped(dataset, tmp_path):
    """`gptrain run --keep-on-failure`: a job made to fail at step 5 is `held`, its accelerators
    still claimed (a job needing them waits); `session exec JOB -- cat /proc/self/environ`
    shows the job's own environment (its --env, its secret, GPTRAIN_JOB), the failed script's
    files are there in its code folder; `gptrain stop` ends it `failed`, with the failure it had,
    and frees the accelerators."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "fails.py").write_text("import sys\nfor step in range(1, 6):\n    print(f'step {step}', flush=True)\n"
                                   "open('left-behind.txt', 'w').write('state at step 5')\nsys.exit('diverged at step 5')\n")
    ok("run", "f", "--dataset", "tiny", "--accels", "2", "--keep-on-failure", "10m", "--env", "MY_SETTING=42",
       "--secret", "MY_TOKEN=tok-abcdef-123456", "--code", str(code), "--", "fails.py")
    held = wait_for("f", states=("held", "failed", "succeeded"))
    assert held["state"] == "held" and "exited with code 1" in held["error"], held
    ok("run", "after", "--dataset", "tiny", "--accels", "2", "--", *TRAIN)
    time.sleep(3)
    assert job("after")["state"] == "queued"  # the held job's 2 slots are still claimed
    r = run_cli("session", "exec", "f", "--", "cat", "/proc/self/environ")
    env = dict(kv.split("=", 1) for kv in r.stdout.split("\0") if "=" in kv)
    assert r.returncode == 0 and env["MY_SETTING"] == "42" and env["GPTRAIN_JOB"] == "f", r.stderr
    assert env["MY_TOKEN"] == "tok-abcdef-123456"  # the job's secret, to its owner's own terminal
    r = run_cli("session", "exec", "f", "--", "sh", "-c", "cat left-behind.txt; ls /input/tiny")
    assert "state at step 5" in r.stdout and "meta.json" in r.stdout, r.stdout + r.stderr
    assert "stopping" in ok("stop", "f") or job("f")["state"] == "failed"
    ended = wait_for("f")
    assert ended["state"] == "failed" and ended["error"] == held["error"] and ended["exit_code"] == 1, ended
    assert wait_for("after")["state"] == "succeeded"
    refused(run_cli("session", "exec", "f", "--", "true"), "f is a job, not a session", "--keep-on-failure")
    refused(run_cli("run", "g", "--keep-on-failure", "soon", "--", "fails.py"), "--keep-on-failure 'soon'")


def test_a_sessions_notebook_runs_a_cell_that_reads_the_dataset(dataset, tmp_path):
    """`session start --jupyter`: a Jupyter Server in the session's sandbox behind a token of its
    own; through Jupyter's own REST API and kernel websocket, a cell imports gptrain and reads
    /input/tiny; without the token the API answers 403; the token is in no log."""
    pytest.importorskip("jupyter_server")
    pytest.importorskip("ipykernel")
    import json
    import urllib.error
    import urllib.request
    import uuid

    import websocket

    r = run_cli("session", "start", "nb", "--dataset", "tiny", "--jupyter", "--detach", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    url = r.stdout.strip().splitlines()[-1]
    base, token = url.split("?token=")
    assert json.loads(run_cli("session", "jupyter", "nb", "--json").stdout) == {"url": base, "token": token}
    auth = {"Authorization": f"token {token}"}
    for headers in ({}, {"Authorization": "token " + "x" * len(token)}):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(base + "api/kernels", headers=headers), timeout=30)
        assert e.value.code == 403
    post = urllib.request.Request(base + "api/kernels", data=b"{}", method="POST",
                                  headers={**auth, "Content-Type": "application/json"})
    kernel = json.loads(urllib.request.urlopen(post, timeout=60).read())["id"]
    ws = websocket.create_connection(f"{base.replace('http', 'ws')}api/kernels/{kernel}/channels",
                                     header=[f"Authorization: token {token}"], timeout=120)
    msg_id = uuid.uuid4().hex
    code = ("import gptrain, json, os; meta = json.load(open('/input/tiny/meta.json')); "
            "print('cell:', gptrain.__name__, sorted(os.listdir('/input/tiny'))[:1], meta['tokenizer_name'])")
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "t", "session": "s",
                                   "version": "5.3"}, "parent_header": {}, "metadata": {}, "channel": "shell",
                        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                                    "allow_stdin": False, "stop_on_error": True}}))
    out = ""
    while True:
        reply = json.loads(ws.recv())
        if reply.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if reply["msg_type"] == "stream":
            out += reply["content"]["text"]
        elif reply["msg_type"] == "error":
            raise AssertionError(reply["content"])
        elif reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
            break
    ws.close()
    assert out.startswith("cell: gptrain") and "char" in out, out
    assert run_cli("session", "stop", "nb").returncode == 0
    from gptrain.jobs.folder import job_dir

    logs = "".join(p.read_text(errors="replace") for p in job_dir("nb").rglob("*.log"))
    assert "jupyter" in logs.lower() and token not in logs and token not in run_cli("logs", "nb").stdout
    assert not (job_dir("nb") / "jupyter.json").exists()  # gone with the server
