"""What leaves a job through `gptrain fetch` and `checkpoint fetch`: its own files only (a link
its program made to a file outside is left out or refused), and its logs with secrets masked,
as `gptrain logs` shows them. Before: the zip held /etc-style files behind links and the raw
logs with the secret in clear."""

import json
import zipfile

from tests.browser.recorded_jobs import record_job
from tests.conftest import run_cli
from tests.job_helpers import ok
SECRET = "hunter2xyz-do-not-show"


def _job_with_links(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("PRIVATE-OUTSIDE-CONTENT\n")
    d = record_job("leaky", secrets={"API_KEY": SECRET}, log=f"step 1\nkey is {SECRET}\n")
    out = d / "output"
    ck = out / "checkpoint-12"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    (ck / "model.safetensors").write_bytes(b"weights")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 12}))
    (ck / "extra.bin").symlink_to(outside)
    (out / "stolen.txt").symlink_to(outside)
    (out / "weights_9.pt").symlink_to(outside)
    return outside


def test_fetch_zip_holds_no_outside_file_and_masks_secrets(isolated_home, tmp_path):
    _job_with_links(tmp_path)
    ok("fetch", "leaky", "--destination", tmp_path / "z")
    with zipfile.ZipFile(tmp_path / "z" / "leaky.zip") as z:
        content = b"".join(z.read(n) for n in z.namelist())
        names = z.namelist()
    assert b"PRIVATE-OUTSIDE-CONTENT" not in content, names
    assert SECRET.encode() not in content and b"key is ***" in content
    assert "leaky/output/checkpoint-12/model.safetensors" in names


def test_checkpoint_fetch_copies_no_outside_file(isolated_home, tmp_path):
    _job_with_links(tmp_path)
    rows = json.loads(ok("checkpoints", "leaky", "--json"))
    ck = next(r for r in rows if r["name"] == "output/checkpoint-12")
    ok("checkpoint", "fetch", ck["id"], "--destination", tmp_path / "got", "--format", "native")
    got = tmp_path / "got"
    assert (got / "model.safetensors").read_bytes() == b"weights"
    assert not (got / "extra.bin").exists()
    assert all(b"PRIVATE" not in p.read_bytes() for p in got.rglob("*") if p.is_file())
    assert not any(r["name"].endswith(("stolen.txt", "weights_9.pt")) for r in rows)  # links are not listed


def test_a_checkpoint_that_is_a_link_out_is_refused(isolated_home, tmp_path):
    from gptrain.jobs import store
    from gptrain.jobs.found import checkpoint_id

    outside = _job_with_links(tmp_path)
    store.sync_checkpoints("leaky", [{"id": checkpoint_id("leaky", "x"), "name": "x", "kind": "file",
                                      "path": str(outside), "step": 1, "train_loss": None,
                                      "eval_loss": None, "time": 0.0, "mtime": 0.0, "size": 1}])
    r = run_cli("checkpoint", "fetch", checkpoint_id("leaky", "x"), "--destination", tmp_path / "n", "--format", "native")
    assert r.returncode == 2 and "links outside its job's directory" in r.stderr
    assert not (tmp_path / "n").exists()
