"""A job's `--secret` printed by its program in derived forms (base64 standard and URL-safe, with
and without padding, inside a longer base64 string at each byte offset; hex in either case;
URL-quoted; another case; split across lines) is masked by `gptrain logs`, `fetch`'s zip, the
console's log API from every line start, and the failure summary; a secret too short to mask
is refused at submit. A real job: a detached supervisor runs the program, which reads the
secret from its environment (jobs/secrets.py)."""

import base64
import json
import os
import textwrap
import urllib.parse
import urllib.request
import zipfile

import pytest

from tests.conftest import run_cli
from tests.job_helpers import nothing_recorded, ok, rank_log_path, refused, wait_until_done, zip_name
SECRET = "Zq8#Tok3n>>>???/x é~"  # base64 of it holds + and /; quoting changes #, >, ?, space, é
PIECES = ["Zq8#Tok", "3n>>>???"]  # the two halves of the split print: neither may show
WORKER = r"""
import base64, os, sys, textwrap, urllib.parse
v = os.environ["API_TOKEN"]
b = v.encode()
print("step 1 | loss 3.0")
print("b64:", base64.b64encode(b).decode())
print("b64-nopad:", base64.b64encode(b).decode().rstrip("="))
print("b64url:", base64.urlsafe_b64encode(b).decode())
print("b64url-nopad:", base64.urlsafe_b64encode(b).decode().rstrip("="))
for head in (b"", b"u", b"us", b"user:"):  # the secret at byte offsets 0, 1, 2 (and 5) of a blob
    print("basic:", base64.b64encode(head + b + b"@host").decode())
    print("basic-url:", base64.urlsafe_b64encode(head + b + b"!").decode())
print("hex:", b.hex())
print("HEX:", b.hex().upper())
print("quote:", urllib.parse.quote(v))
print("url: https://h/x?k=" + urllib.parse.quote(v, safe=""))
print("quote_plus:", urllib.parse.quote_plus(v))
print("upper:", v.upper())
print("lower:", v.lower())
print("swapped:", v.swapcase())
print("split:", v[:7])
print(v[7:])
print("key=" + v[:3])
print("    " + v[3:])
print(*textwrap.wrap(base64.b64encode(b * 3).decode(), 16), sep="\n")
print("step 2 | loss 2.9", flush=True)
out = os.environ["GPTRAIN_OUTPUT_DIR"]  # a checkpoint named after the secret
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "model-" + b.hex() + ".pt"), "wb").write(b"weights")
open(os.path.join(out, "metrics.jsonl"), "w").write('{"step": 2, "note": "' + b.hex() + '"}\n')
raise RuntimeError("refused: " + base64.b64encode(b).decode())
"""


def _derived(value: str) -> list[str]:
    """Every string the worker prints that encodes the secret (or part of it) alone."""
    b = value.encode()
    out = [base64.b64encode(b).decode(), base64.urlsafe_b64encode(b).decode(), b.hex(), b.hex().upper(),
           urllib.parse.quote(value), urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value),
           value, value.upper(), value.lower(), value.swapcase(), *PIECES,
           *textwrap.wrap(base64.b64encode(b * 3).decode(), 16)]
    for head in (b"", b"u", b"us", b"user:"):
        for enc, tail in ((base64.b64encode, b"@host"), (base64.urlsafe_b64encode, b"!")):
            blob = enc(head + b + tail).decode()
            own = blob[-(-8 * len(head) // 6):8 * (len(head) + len(b)) // 6]  # characters of the secret alone
            out += [own[i:i + 8] for i in range(len(own) - 7)]  # no 8 of them in a row
    return out


def _shown(text: str) -> list[str]:
    return [f for f in _derived(SECRET) if f in text] + (["tok3n"] if "tok3n" in text.lower() else [])


def test_a_secret_printed_encoded_or_split_is_masked_everywhere(tmp_path, isolated_home, monkeypatch):
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "worker.py").write_text(WORKER)
    ok("run", "leak", "--secret", f"API_TOKEN={SECRET}", "--", tmp_path / "worker.py")
    report = wait_until_done("leak")
    raw = rank_log_path("leak").read_text()
    assert "step 2 | loss 2.9" in raw and len(_shown(raw)) > 20  # the worker printed every form

    assert report["job"]["state"] == "failed"
    assert report["job"]["error"] == "rank 0: RuntimeError: refused: ***", report["job"]["error"]
    logs = run_cli("logs", "leak").stdout
    assert "step 2 | loss 2.9" in logs and "b64: ***" in logs and "split: ***" in logs, logs
    assert _shown(logs) == [], logs

    ok("fetch", "leak", "--destination", tmp_path / "z")
    with zipfile.ZipFile(tmp_path / "z" / "leak.zip") as z:
        zipped = z.read(zip_name("leak", rank_log_path("leak"))).decode()
        names = "\n".join(z.namelist())
        metrics = next(z.read(n).decode() for n in z.namelist() if n.endswith("metrics.jsonl"))
    assert "step 2 | loss 2.9" in zipped and _shown(zipped) == [], zipped
    # a checkpoint the program named after the secret: listed, reported and zipped masked; its ID reaches it
    listed = ok("checkpoints", "leak", "--json")
    assert "model-***.pt" in listed and _shown(listed) == [], listed
    assert _shown(ok("checkpoints", "leak")) == [] and _shown(ok("inspect", "leak", "--json")) == []
    assert "model-***.pt" in names and _shown(names) == [], names
    assert '"note": "***"' in metrics and _shown(metrics) == [], metrics  # a text file the program wrote
    fetched = ok("checkpoint", "fetch", json.loads(listed)[0]["id"], "--destination", tmp_path / "got")
    assert _shown(fetched) == [], fetched
    assert [p.read_bytes() for p in (tmp_path / "got").iterdir()] == [b"weights"]

    _every_console_page_is_masked(raw.encode())


def _every_console_page_is_masked(raw: bytes):
    """The console's log API from every line start (a page that starts at the second half of a
    split secret, or inside the wrapped base64) and from its tail."""
    from tests.browser.conftest import Console

    c = Console()
    try:
        token = urllib.parse.parse_qs(urllib.parse.urlsplit(c.printed).query).get("token")
        headers = {"Authorization": f"token {token[0]}"} if token else {}
        starts = [None, 0] + [i + 1 for i, b in enumerate(raw) if b == ord("\n")]
        for offset in starts:
            query = "" if offset is None else f"?offset={offset}"
            req = urllib.request.Request(f"{c.base}/api/jobs/leak/logs/0{query}", headers=headers)
            with urllib.request.urlopen(req, timeout=30) as r:
                text = json.loads(r.read())["text"]
            assert _shown(text) == [], (offset, text)
    finally:
        c.close()


@pytest.mark.parametrize("how", ["flag", "yaml", "shell"])
def test_a_secret_too_short_to_mask_is_refused_unshown(tmp_path, isolated_home, how, monkeypatch):
    """1-3 characters would blank ordinary text wherever they appear; never masked before."""
    monkeypatch.setenv("Q7_KEY", "q7Z")
    args = {"flag": ["run", "j", "--secret", "API_TOKEN=q7Z", "--", "train.py"],
            "shell": ["run", "j", "--secret", "Q7_KEY", "--", "train.py"],
            "yaml": ["run", "-f", tmp_path / "job.yaml"]}[how]
    (tmp_path / "job.yaml").write_text("name: j\nscript: train.py\nsecrets: {API_TOKEN: q7Z}\n")
    (tmp_path / "train.py").write_text("print('hello')\n")
    r = run_cli(*args, cwd=tmp_path)
    refused(r, "shorter than 4 characters", "--env")
    assert "q7Z" not in r.stderr.replace("Q7_KEY", "") and "q7z" not in r.stderr.lower().replace("q7_key", "")
    nothing_recorded(isolated_home)
    assert not (isolated_home / "secrets").exists() or not os.listdir(isolated_home / "secrets")


def test_a_value_typed_alone_after_secret_is_not_echoed(isolated_home):
    r = run_cli("run", "j", "--secret", "s3cr3t-v@lue", "--", "train.py")
    refused(r, "--secret takes KEY=VALUE")
    assert "s3cr3t" not in r.stderr
    nothing_recorded(isolated_home)
