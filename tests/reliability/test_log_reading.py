"""Reading a job's logs through `gptrain logs`, the console and `gptrain fetch`'s zip (one reader,
jobs/logs.py): secrets masked in any form a program prints them, a page of any log capped, a
junk rank refused. Real `gptrain` processes, a real console, real log files written by a real
program; the console's memory is read from /proc."""

import json
import os
import shlex
import subprocess
import sys
import urllib.parse
import zipfile

import pytest

from gptrain.jobs import folder
from tests.browser.conftest import Console
from tests.browser.recorded_jobs import record_job
from tests.conftest import run_cli
from tests.job_helpers import rank_log_path, zip_name

# each piece (AAA1 ...) is a part of a secret that must never be shown, whole or in part
SECRETS = {"API_KEY": "AAA1\"BBB2\\CCC3'DDD4",  # a quote, a backslash and the other quote
           "NL_KEY": "EEE5-first\nFFF6-second",  # a newline
           "PEM": "-----BEGIN TEST KEY-----\nGGG7gggggggggggg\nHHH8hhhhhhhhhhhh\n-----END TEST KEY-----"}
PIECES = ["AAA1", "BBB2", "CCC3", "DDD4", "EEE5", "FFF6", "GGG7", "HHH8"]

# the ways a program shows its settings: repr, %r logging, a dict, JSON, shell-quoted, a traceback
PROGRAM = r"""
import json, logging, os, shlex, sys, traceback
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
for k in ("API_KEY", "NL_KEY", "PEM"):
    v = os.environ[k]
    print("step 1 | loss 3.0")
    print(v)
    print(repr(v))
    print({"settings": {k: v}})
    print(json.dumps({k: v}))
    print(json.dumps({"nested": json.dumps({k: v})}))
    print(f"export {k}={shlex.quote(v)}")
    logging.info("%s is %r", k, v)
    try:
        raise KeyError(v)
    except KeyError:
        traceback.print_exc(file=sys.stdout)
print("step 2 | loss 2.9")
"""


def _leaky_job(tmp_path):
    """A recorded job with three secrets whose rank-0 log a real program wrote, printing each."""
    record_job("leaky", secrets=SECRETS, log="")
    log = rank_log_path("leaky")
    with open(log, "ab") as out:
        subprocess.run([sys.executable, "-c", PROGRAM], stdout=out, stderr=subprocess.STDOUT,
                       env={**os.environ, **SECRETS}, check=True)
    raw = log.read_bytes()
    assert b"AAA1\\\"BBB2" in raw and b"EEE5-first\\nFFF6" in raw  # the escaped forms are there
    return log


def _shown(text: str) -> list[str]:
    return [p for p in PIECES if p in text]


def test_escaped_and_multi_line_secrets_are_masked_by_logs(isolated_home, tmp_path):
    _leaky_job(tmp_path)
    r = run_cli("logs", "leaky")
    assert r.returncode == 0, r.stderr
    assert "step 2 | loss 2.9" in r.stdout and "***" in r.stdout
    assert _shown(r.stdout) == [], r.stdout


def test_escaped_and_multi_line_secrets_are_masked_in_the_zip(isolated_home, tmp_path):
    _leaky_job(tmp_path)
    r = run_cli("fetch", "leaky", "--destination", tmp_path / "z")
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(tmp_path / "z" / "leaky.zip") as z:
        log = z.read(zip_name("leaky", rank_log_path("leaky"))).decode()
    assert "step 2 | loss 2.9" in log and _shown(log) == [], log


def test_escaped_and_multi_line_secrets_are_masked_by_the_console(isolated_home, tmp_path):
    """Every page the console gives, from every line start (a page that starts inside the PEM
    or the two-line key once showed their later lines in clear) and from its tail, through the
    API and the event stream."""
    log = _leaky_job(tmp_path)
    raw = log.read_bytes()
    starts = [0] + [i + 1 for i, b in enumerate(raw) if b == ord("\n")]
    c = Console()
    try:
        base = "/api/jobs/leaky/logs/0"
        status, _, body = c.http(base)
        assert status == 200 and _shown(json.loads(body)["text"]) == [], body
        for offset in starts:
            status, _, body = c.http(f"{base}?offset={offset}")
            assert status == 200, body
            assert _shown(json.loads(body)["text"]) == [], (offset, body)
        inside = raw.index(b"GGG7")  # the second line of the PEM
        event = _first_event(c.request(f"{base}/stream?offset={inside}"))
        assert "HHH8" not in event and "***" in event and _shown(event) == [], event
    finally:
        c.close()


def _first_event(url, timeout: float = 20) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        lines = []
        while True:
            line = r.readline().decode()
            if line.startswith("data:"):
                return line
            lines.append(line)
            assert len(lines) < 100, lines


def _memory_kib(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in f) if k in ("VmRSS", "VmHWM")}


def test_a_200_mib_log_through_the_console_costs_a_page_of_memory(isolated_home, tmp_path):
    """Before: `?offset=0`, or a stream opened without an offset, read the whole log into the
    server (311 MB -> 1.1 GB for a 200 MiB log). Now each answer is one capped page."""
    record_job("huge", secrets={"TOKEN": "sesame-open"})
    line = b"step 1 | loss 3.0 | " + b"x" * 79 + b"\n"  # 100 bytes
    block = line * 10_000  # ~1 MB
    with open(rank_log_path("huge"), "wb") as f:
        for _ in range(210):
            f.write(block)
    size = rank_log_path("huge").stat().st_size
    assert size >= 200 * 2 ** 20
    c = Console()
    try:
        base = "/api/jobs/huge/logs/0"
        assert c.http("/api/jobs")[0] == 200  # the server has served once: its baseline
        before = _memory_kib(c.proc.pid)["VmRSS"]
        pages = {q: c.http(base + q) for q in ("?offset=0", "", f"?offset={size // 2 + 7}", "?offset=-5",
                                            f"?offset={10 ** 15}")}
        events = [_first_event(c.request(f"{base}/stream{q}")) for q in ("", "?offset=0")]
        peak = _memory_kib(c.proc.pid)["VmHWM"]
    finally:
        c.close()
    print(f"console RSS {before} KiB, peak {peak} KiB")
    assert peak - before < 64 * 1024, f"the console grew from {before} KiB to a peak of {peak} KiB"
    for query, (status, _, body) in pages.items():
        assert status == 200, body
        page = json.loads(body)
        assert len(page["text"].encode()) <= 64 * 1024 and page["text"].endswith("\n"), query
        assert page["offset"] <= size
    assert all("step 1" in e for e in events)


@pytest.mark.parametrize("rank", ["\u00b2", "\u0663", "1\u00b2", "99999999999999999999", "-1", "0x1", " 1", "2"])
def test_a_junk_rank_is_a_clear_404(isolated_home, rank):
    """Before: `²` (a digit to str.isdigit, not to int) was a 500."""
    record_job("real")
    c = Console()
    try:
        q = urllib.parse.quote(rank, safe="")
        for path in (f"/api/jobs/real/logs/{q}", f"/api/jobs/real/logs/{q}/stream"):
            status, _, body = c.http(path)
            assert status == 404 and "ranks 0..1" in body, (path, status, body)
    finally:
        c.close()
    r = run_cli("logs", "real", "--rank", "5")
    assert r.returncode == 2 and "ranks 0..1" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_logs_follow_reads_through_the_same_reader(isolated_home, tmp_path):
    """`gptrain logs --follow` on an ended job: the whole log, masked, its last line too even
    without a newline, then the job's end."""
    record_job("ended", secrets={"TOKEN": "sesame-open"}, log="")
    with open(rank_log_path("ended"), "a") as f:
        f.write(f"token {shlex.quote('sesame open')} {json.dumps({'t': 'sesame-open'})}\n")
        f.write("last line without newline")
    r = run_cli("logs", "ended", "--follow")
    assert r.returncode == 0, r.stderr
    assert r.stdout == 'token \'sesame open\' {"t": "***"}\nlast line without newline', r.stdout
    assert "ended succeeded" in r.stderr


def test_a_killed_agent_is_named_by_its_node(slots, tmp_path):
    """kill -9 of the torchrun agent: no rank reported anything, and the reason was
    "rank ? exited with code -9"; now it names the node whose agent died."""
    from tests.job_helpers import job, ok, wait_for
    from tests.job_helpers import job_processes, parent_of, wait_until
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    ok("run", "headless", "--", script)
    log = job_dir_log("headless")
    wait_until(lambda: log.is_file() and "ready" in log.read_text(), 120, "the job never ran")
    sup = job("headless")["supervisor_pid"]
    agent = next(p for p in job_processes("headless") if parent_of(p) == sup)
    os.kill(agent, 9)
    j = wait_for("headless", timeout=180)
    assert j["state"] == "failed", j
    assert j["error"] == "the agent of node 0 (torchrun, or the node's command) was killed by SIGKILL", j


def job_dir_log(name):
    return rank_log_path(name)


def test_fetch_zips_files_with_hostile_names_escaped(isolated_home, tmp_path):
    """A job's program may name a file with any bytes: before, one that was not UTF-8 made
    `gptrain fetch` trace back (UnicodeEncodeError) and write no zip."""
    d = record_job("names", secrets={"TOKEN": "sesame-open"}, log="token sesame-open\n")
    out = os.fsencode(d / "output")
    os.makedirs(out)
    for name in (b"bad\xffname.txt", b"new\nline.txt"):
        with open(os.path.join(out, name), "wb") as f:
            f.write(b"kept")
    with open(os.path.join(os.fsencode(folder.logs_dir(d)), b"rank-\xfe.log"), "wb") as f:
        f.write(b"token sesame-open\n")
    r = run_cli("fetch", "names", "--destination", tmp_path / "z")
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(tmp_path / "z" / "names.zip") as z:
        names = z.namelist()
        assert z.read("names/output/bad\\xffname.txt") == b"kept"
        assert z.read("names/output/new\\nline.txt") == b"kept"
        assert z.read("names/logs/rank-\\xfe.log") == b"token ***\n", names
