"""File names are bytes from elsewhere: a running job's program makes files named with non-UTF-8
bytes, a newline and 255 characters in checkpoints/ and output/. Before: the supervisor's
checkpoint scan raised UnicodeEncodeError (the checkpoint id) within 2 s and killed the job, and
`inspect`, `checkpoints`, `resume`, `fetch` and the console's job API traced back until the file
was renamed. Now such names are not listed (weights/names.py) and everything else goes on."""

import json
import os
import textwrap
import zipfile

from tests.browser.conftest import Console, wait_until
from tests.conftest import run_cli
from tests.job_helpers import ok, wait_for
LONG = "x" * 252 + ".pt"  # 255 bytes: the longest name a file system allows
# Made by the job's own program: os.open with bytes, as any C or shell program could.
PROGRAM = textwrap.dedent("""
    import os, pathlib, time
    job = pathlib.Path(os.environ["GPTRAIN_OUTPUT_DIR"]).parent
    for root in (b"output", b"checkpoints"):
        base = os.fsencode(job) + b"/" + root
        os.makedirs(base, exist_ok=True)
        for name in (b"bad-\\xff\\xfe-7.pt", b"new\\nline-7.pt", b"x" * 252 + b".pt", b"dir-\\xff"):
            if name.startswith(b"dir"):
                os.makedirs(base + b"/" + name + b"/checkpoint-7", exist_ok=True)
                name = name + b"/checkpoint-7/model-7.pt"
            os.close(os.open(base + b"/" + name, os.O_CREAT | os.O_WRONLY, 0o644))
    (job / "output" / "step_1.pt").write_bytes(b"weights 1")  # written after the hostile names
    deadline = time.time() + 900  # only a guard: the test does a lot (CLI calls, a console) first
    while not (job / "output" / "go-on").exists() and time.time() < deadline:
        time.sleep(0.2)
    (job / "output" / "step_2.pt").write_bytes(b"weights 2")
    print("finished", flush=True)
    """)


def _recorded(name: str) -> set[str]:
    """The checkpoint names in the job store, read without a command (which would scan itself):
    only the job's supervisor can have put them there."""
    from gptrain.jobs import store

    return {c["name"] for c in store.checkpoints(name)}


def _no_traceback(*args):
    r = run_cli(*args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stdout, r.stderr)
    return r.stdout


def test_hostile_names_in_a_running_job_are_skipped_and_the_job_goes_on(slots, isolated_home, tmp_path):
    from gptrain.jobs import store

    prog = tmp_path / "names.py"
    prog.write_text(PROGRAM)
    ok("run", "names", "--", prog)
    # the supervisor scanned the folders after the hostile names were made, and lived
    wait_until(lambda: "output/step_1.pt" in _recorded("names") or store.get_job("names")["state"] == "failed",
          300, "checkpoint output/step_1.pt recorded by the supervisor")
    assert store.get_job("names")["state"] == "running", store.get_job("names")
    assert _recorded("names") == {"output/step_1.pt", LONG, "output/" + LONG}  # a long name is a name

    assert "names" in _no_traceback("inspect", "names")
    rows = json.loads(_no_traceback("checkpoints", "names", "--json"))
    assert {r["name"] for r in rows} == _recorded("names")
    console = Console()
    try:
        with console.open("/api/jobs/names", timeout=30) as r:
            assert r.status == 200 and "output/step_1.pt" in r.read().decode()
    finally:
        console.close()

    (isolated_home / "jobs" / "names" / "output" / "go-on").touch()
    assert wait_for("names")["state"] == "succeeded"
    assert _recorded("names") == {"output/step_1.pt", "output/step_2.pt", LONG, "output/" + LONG}

    _no_traceback("fetch", "names", "--destination", tmp_path / "z")
    with zipfile.ZipFile(tmp_path / "z" / "names.zip") as z:
        assert "names/output/step_2.pt" in z.namelist()
        assert "names/output/bad-\\xff\\xfe-7.pt" in z.namelist()  # every file, its name escaped
        assert "names/output/new\\nline-7.pt" in z.namelist()
    ok("checkpoint", "fetch", next(r["id"] for r in rows if r["name"] == "output/step_1.pt"),
       "--destination", tmp_path / "got")
    assert (tmp_path / "got" / "step_1.pt").read_bytes() == b"weights 1"
    r = run_cli("resume", "names")  # a succeeded job may be refused, in one line, never a traceback
    assert "Traceback" not in r.stderr and r.returncode in (0, 2), r.stderr
    if r.returncode == 0:
        assert wait_for("names")["state"] == "succeeded"
    assert os.listdir(isolated_home / "jobs" / "names" / "output")  # the files are still there
