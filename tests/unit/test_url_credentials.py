"""A URL holding a credential (a password, a token, a signed query string) is refused wherever a
URL can be named, in one line that does not echo it, and nothing is recorded; the credential
goes in the environment instead, where fsspec reads it (FSSPEC_HTTPS for http headers)."""

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from tests.conftest import run_cli

SECRET = "s3cr3t-Tok3n"
URLS = [f"https://user:{SECRET}@127.0.0.1:9/data", f"http://127.0.0.1:9/data?token={SECRET}",
        f"HTTPS://{SECRET}@127.0.0.1:9/data", f"s3://bucket/data?X-Amz-Signature={SECRET}",
        f"simplecache::https://user:{SECRET}@127.0.0.1:9/data"]  # a link of an fsspec chain


def _commands(url, tmp_path, model):
    return {
        "train": ["train", f"--data.path={url}", "--train.max_steps=1", f"--train.output_dir={tmp_path / 'out'}"],
        "run": ["run", "j", "--", f"--data.path={url}"],
        "mix": ["run", "j", "--", f"--data.mix={url}:0.5,other:0.5"],
        "remote checkpoint": ["run", "j", "--", "--data.path=x", f"--checkpoint.remote={url}"],
        "prepare": ["data", "prepare", url + ".txt", "--out", str(tmp_path / "prep")],
        "eval": ["eval", str(model), "--dataset", url],
        "prepare hf:": ["data", "prepare", "hf:" + url, "--out", str(tmp_path / "prep")],
    }


@pytest.mark.parametrize("url", URLS)
def test_each_credential_form_is_refused_without_echoing_it(url):
    from gptrain.errors import UserError, refuse_credentials

    with pytest.raises(UserError) as e:
        refuse_credentials(url, "--data.path")
    assert "must not hold credentials" in str(e.value) and SECRET not in str(e.value)


@pytest.mark.parametrize("command, url", [*zip(["train", "run", "mix", "remote checkpoint", "prepare", "eval"],
                                                  URLS * 2), ("mix", URLS[-1]),
                                            ("prepare hf:", URLS[0]), ("prepare hf:", f"u:{SECRET}@host/x")])
def test_a_url_with_a_credential_is_refused_unechoed_and_nothing_recorded(url, command, tmp_path, isolated_home,
                                                                            tiny_hf_gpt2):
    """Every command that takes a URL, each credential form on one of them (all forms: above)."""
    r = run_cli(*_commands(url, tmp_path, tiny_hf_gpt2)[command])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "must not hold credentials" in r.stderr, r.stderr
    assert SECRET not in r.stdout + r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "prep").exists()
    assert json.loads(run_cli("jobs", "--json").stdout) == []


def test_a_url_without_credentials_passes_the_check():
    from gptrain.errors import refuse_credentials

    for url in ("https://127.0.0.1:9/data", "s3://bucket/data", "gs://b/p", "/local/path?x", "name"):
        refuse_credentials(url, "--data.path")


class _NeedsHeader(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != f"Bearer {SECRET}":
            self.send_error(401)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


def test_an_http_credential_in_fsspec_https_reaches_the_server(tmp_path):
    """The documented way: FSSPEC_HTTP(S)='{"headers": {...}}' in the environment (a --secret in
    a job) is sent with gptrain's reads of a dataset URL; without it the server refuses."""
    (tmp_path / "meta.json").write_text('{"ok": 1}')
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: _NeedsHeader(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/meta.json"
    read = ("import sys; from gptrain.data.remote_shards import _read_url; "
            "sys.stdout.write(_read_url(sys.argv[1], 1000).decode())")
    try:
        env = {**os.environ, "FSSPEC_HTTP": json.dumps({"headers": {"Authorization": f"Bearer {SECRET}"}})}
        r = subprocess.run([sys.executable, "-c", read, url], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout == '{"ok": 1}', r.stderr
        r = subprocess.run([sys.executable, "-c", read, url], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if not k.startswith("FSSPEC_")})
        assert r.returncode != 0 and "401" in r.stderr, r.stderr
    finally:
        server.shutdown()


# a credential in a URL's `;name=value` path parameter (attacker trial: passed the check, stored)
PARAM_URLS = [f"http://127.0.0.1:9/x;token={SECRET}", f"https://127.0.0.1:9/d;X-Amz-Signature={SECRET}/y",
              f"s3://bucket/d;Api-Key={SECRET}", f"http://127.0.0.1:9/x;%74oken={SECRET}",
              f"simplecache::https://127.0.0.1:9/x;access_token={SECRET}"]


@pytest.mark.parametrize("command, url", [*zip(["train", "run", "mix", "remote checkpoint", "prepare", "eval"],
                                                  PARAM_URLS * 2), ("prepare hf:", PARAM_URLS[0])])
def test_a_credential_in_a_url_parameter_is_refused_unechoed_and_nothing_recorded(
        url, command, tmp_path, isolated_home, tiny_hf_gpt2):
    test_a_url_with_a_credential_is_refused_unechoed_and_nothing_recorded(url, command, tmp_path, isolated_home,
                                                                            tiny_hf_gpt2)


def test_a_repository_url_with_a_credential_parameter_is_refused_unechoed(isolated_home):
    r = run_cli("source", "add", "repo", f"https://127.0.0.1:9/r.git;token={SECRET}")
    assert r.returncode == 2 and "must not hold credentials" in r.stderr and ";token=***" in r.stderr, r.stderr
    assert SECRET not in r.stdout + r.stderr


def test_url_parameters_that_name_no_credential_pass_the_check():
    from gptrain.errors import redact, refuse_credentials

    for url in ("http://127.0.0.1:9/x;type=a", "s3://bucket/a;b.txt", "https://h/d;v=2/data.bin", "/local/a;token=x"):
        refuse_credentials(url, "--data.path")
        assert redact(url) == url


@pytest.mark.parametrize("words", [["--", f"--metrics.sample_prompt=see http://h/x#access_token={SECRET}"],
                                   ["--", "--data.path=x", f"--checkpoint.remote=http://h/c#token={SECRET}"],
                                   ["--", "train.py", f"--url=https://h/x?page=2&access_token={SECRET}"],
                                   ["--env", f"FEED=https://bot:{SECRET}@h/feed", "--", "train.py"]],
                         ids=["fragment-in-a-text-flag", "fragment-in-a-path-flag", "query-in-a-script-arg", "env"])
def test_a_job_argument_holding_a_credential_url_is_refused_unechoed_and_nothing_recorded(words, isolated_home,
                                                                                          tmp_path):
    """#47 row 10: `http://h/x#access_token=...` in a trainer flag was recorded and shown by
    inspect (a fragment was not taken for a credential, and a flag that is not a path was not
    looked at); arguments and --env values are recorded with the job."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = run_cli("run", "j", *words, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert "credential" in r.stderr and "--secret" in r.stderr, r.stderr
    assert SECRET not in r.stdout + r.stderr
    assert json.loads(run_cli("jobs", "--json").stdout) == []


def test_a_plain_query_or_an_ssh_user_in_a_job_argument_is_no_credential():
    from gptrain.errors import names_a_credential

    for text in ("http://h/x?page=2", "see http://h/x#L10", "git+ssh://git@h/r.git", "https://h/a#section=2"):
        assert not names_a_credential(text), text


def test_a_secret_printed_as_base32_is_masked():
    """#47 row 10: a base32-encoded secret was shown in clear (base64 and hex were masked)."""
    import base64

    from gptrain.jobs.secrets import mask

    value = "Zq8#Tok3n>>>???/x"
    raw = value.encode()
    for head in (b"", b"u", b"us", b"use", b"user", b"user:"):  # at each offset of a longer blob
        blob = base64.b32encode(head + raw + b"@host").decode()
        own = blob[-(-8 * len(head) // 5):8 * (len(head) + len(raw)) // 5]
        shown = mask(f"seed: {blob}\n", [value])
        assert own not in shown and own.lower() not in mask(f"seed: {blob.lower()}\n", [value]), (head, shown)
    assert base64.b32encode(raw).decode().rstrip("=") not in mask(base64.b32encode(raw).decode(), [value])
