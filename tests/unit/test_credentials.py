"""No error a user sees shows a credential held in a URL (errors.scrub_credentials), whatever
raised it; a file:// remote with a host part is refused rather than written under the current
directory."""

import pytest

from gptrain.errors import UserError, scrub_credentials
from tests.conftest import run_cli


@pytest.mark.parametrize("text, shown", [
    ("cannot open https://user:hunter2@10.0.0.1:9/in.txt: refused", "cannot open https://***@10.0.0.1:9/in.txt: refused"),
    ("s3://bucket/key?X-Amz-Signature=abc123 failed", "s3://bucket/key?*** failed"),
    ("oci://token@bucket/run/step-000001", "oci://***@bucket/run/step-000001"),
    ("plain words, /a/path and https://host/p stay", "plain words, /a/path and https://host/p stay"),
])
def test_urls_lose_their_credentials(text, shown):
    assert scrub_credentials(text) == shown
    assert str(UserError(text)) == shown


def test_a_data_url_with_a_password_is_not_echoed(tmp_path):
    r = run_cli("data", "prepare", "https://user:hunter2pass@127.0.0.1:9/input.txt",
                "--out", tmp_path / "d", "--tokenizer", "char")
    assert r.returncode == 2 and "hunter2pass" not in r.stderr + r.stdout, r.stderr
    assert "https://***@127.0.0.1:9/input.txt" in r.stderr and not (tmp_path / "d").exists()


def test_a_file_remote_with_a_host_part_is_refused(tmp_path, monkeypatch):
    from gptrain.train import remote

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="names an absolute local path") as e:
        remote.check("file://user:hunter2pass@/tmp/run", tmp_path / "out")
    assert "hunter2pass" not in str(e.value) and list(tmp_path.iterdir()) == []
