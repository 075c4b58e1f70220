"""Copying a job's files out onto a full disk (a real 2 MiB tmpfs; mounting needs root, skipped
with the reason otherwise): one line, exit 2, and nothing left on that disk. Before,
`checkpoint fetch` traced back (copytree gathers each file's ENOSPC into one shutil.Error) and
left a hidden half-copied directory with zero-byte files; `fetch` left its `.zip.part`."""

import json
import os
import zipfile

import pytest

from tests.browser.recorded_jobs import record_job
from tests.conftest import run_cli


def _job_with_a_big_checkpoint():
    d = record_job("big")
    ck = d / "output" / "checkpoint-12"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 12}))
    (ck / "model.safetensors").write_bytes(os.urandom(3 * 2 ** 20))  # more than the disk holds
    (ck / "optimizer.pt").write_bytes(os.urandom(2 ** 20))
    r = run_cli("checkpoints", "big", "--json")
    assert r.returncode == 0, r.stderr
    return next(c["id"] for c in json.loads(r.stdout) if c["name"] == "output/checkpoint-12")


def _everything_on(disk):
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*"))


@pytest.mark.parametrize("command", ["checkpoint fetch", "fetch"])
def test_copying_out_onto_a_full_disk_is_one_line_and_leaves_nothing(isolated_home, small_disk, command):
    ckpt = _job_with_a_big_checkpoint()
    args = (["checkpoint", "fetch", ckpt, "--destination", small_disk / "got", "--format", "native"]
            if command == "checkpoint fetch"
            else ["fetch", "big", "--destination", small_disk])
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("gptrain: error: no space left on device"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _everything_on(small_disk) == []


def test_the_console_zip_and_checkpoint_fetch_take_the_same_files(isolated_home, tmp_path):
    """One copy-out rule: links inside the job are followed, links out of it never. Before, the
    console's zip left out every link (a checkpoint sharing its tokenizer by a link lost it)
    while `checkpoint fetch` kept it, and a file name that is not UTF-8 made the zip a 500."""
    import io

    from tests.browser.conftest import Console

    d = record_job("shared")
    (d / "output" / "tokenizer").mkdir(parents=True)
    (d / "output" / "tokenizer" / "vocab.json").write_text("{}")
    ck = d / "output" / "checkpoint-3"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    (ck / "model.safetensors").write_bytes(b"weights")
    (ck / "tokenizer").symlink_to(d / "output" / "tokenizer")  # inside the job: taken
    (tmp_path / "secret.txt").write_text("PRIVATE")
    (ck / "stolen.txt").symlink_to(tmp_path / "secret.txt")  # out of the job: never
    with open(os.path.join(os.fsencode(ck), b"notes-\xff.txt"), "wb") as f:
        f.write(b"notes")
    r = run_cli("checkpoints", "shared", "--json")
    assert r.returncode == 0, r.stderr
    ckpt = next(c["id"] for c in json.loads(r.stdout) if c["name"] == "output/checkpoint-3")
    r = run_cli("checkpoint", "fetch", ckpt, "--destination", tmp_path / "got", "--format", "native")
    assert r.returncode == 0, r.stderr
    fetched = sorted(str(p.relative_to(tmp_path / "got")).encode("utf-8", "surrogateescape")
                     .decode("utf-8", "backslashreplace") for p in (tmp_path / "got").rglob("*") if p.is_file())
    assert fetched == ["config.json", "model.safetensors", "notes-\\xff.txt", "tokenizer/vocab.json",
                       "trainer_state.json"], fetched
    c = Console()
    try:
        with c.open(f"/api/jobs/shared/checkpoints/{ckpt}.zip", timeout=120) as resp:
            body = resp.read()
    finally:
        c.close()
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        zipped = sorted(n.split("/", 1)[1] for n in z.namelist())
        assert b"PRIVATE" not in b"".join(z.read(n) for n in z.namelist())
    assert zipped == fetched


@pytest.mark.parametrize("where", ["read-only", "proc"])
def test_a_destination_that_cannot_be_written_is_one_line(isolated_home, tmp_path, tiny_run, where):
    """export --out, checkpoint fetch --destination and fetch --destination onto a read-only disk,
    or under /proc: one line naming it, exit 2 (#47 round 3: an OSError traceback, exit 1)."""
    import subprocess

    ckpt = _job_with_a_big_checkpoint()
    if where == "proc":
        base = "/proc/gptrain-nowhere"
    else:
        base = tmp_path / "ro"
        base.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(base)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {made.stderr.decode().strip()}")
    try:
        for args in (["export", tiny_run, "--out", f"{base}/hf"],
                     ["checkpoint", "fetch", ckpt, "--destination", f"{base}/got", "--format", "native"],
                     ["fetch", "big", "--destination", f"{base}/zips"]):
            r = run_cli(*args)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (args, r.stderr)
            assert "cannot" in lines[0] and str(base) in lines[0], lines[0]
    finally:
        if where != "proc":
            subprocess.run(["umount", "-l", str(base)], capture_output=True)
