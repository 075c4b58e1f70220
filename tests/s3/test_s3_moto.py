"""Training from s3:// through a real S3 API (moto's server on 127.0.0.1, authentication on)
and real s3fs: a 2-rank `gptrain run` job reads a prepared dataset from a bucket through a
cache smaller than the dataset, with the keys as secrets and the endpoint as FSSPEC_S3_ENDPOINT_URL.

s3fs and moto live in .venv-s3 (`make s3`: the main virtualenv's kubernetes client needs a
python-dateutil that botocore refuses), which also sees the main virtualenv's packages; every
gptrain process here runs on its interpreter."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from gptrain.data.remote_shards import cached_bytes
from tests.helpers import TINY, write_corpus

from tests.s3.moto_server import S3PY, env_of, serve
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not S3PY.is_file(), reason="needs .venv-s3 (s3fs, moto): make s3")]


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """(local copy of the dataset, S3 environment, [key, secret] that may read meta.json files
    only); s3://data/web/ds is a char dataset of 7 train shards and 3 val ones,
    s3://data/web/empty a folder without meta.json."""
    from gptrain.data.prepare import prepare

    root = tmp_path_factory.mktemp("s3")
    texts = [str(write_corpus(root / f"corpus-{i}.txt", 6000, seed=i)) for i in range(10)]
    prepare(texts, str(root / "up" / "ds"), tokenizer="char", val_fraction=0.2, shard_tokens=7000, quiet=True)
    (root / "up" / "empty").mkdir()
    (root / "up" / "empty" / "README").write_text("not a dataset\n")
    with serve(root / "up") as s3:
        yield root / "up" / "ds", env_of(s3), s3["meta_only"]


@pytest.fixture
def home(isolated_home, bucket):
    """GPTRAIN_HOME; a job still active at the end (a failed assertion) is stopped."""
    yield isolated_home
    from gptrain.jobs import store

    for job in store.list_jobs():
        if job["state"] in store.ACTIVE:
            gptrain("stop", job["name"], "--timeout", "5", "--wait", env=bucket[1])


def gptrain(*args, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env}
    return subprocess.run([S3PY, "-m", "gptrain", *map(str, args)], capture_output=True, text=True,
                          env=full, timeout=timeout)


def shard_bytes(ds: Path) -> int:
    from gptrain.data.formats import read_meta

    return max(f["tokens"] * 2 for info in read_meta(ds)["splits"].values() for f in info["files"])


def submit(name: str, env: dict, *args) -> subprocess.CompletedProcess:
    """A 2-process job training from the bucket: the keys as secrets, the endpoint as --env."""
    return gptrain("run", name, "--accels", "2", "--secret", "AWS_ACCESS_KEY_ID", "--secret",
                   "AWS_SECRET_ACCESS_KEY", "--env", f"FSSPEC_S3_ENDPOINT_URL={env['FSSPEC_S3_ENDPOINT_URL']}",
                   "--env", "AWS_DEFAULT_REGION=us-east-1", "--", "--data.path=s3://data/web/ds",
                   "--train.batch_size=4", *TINY, *args, env=env)


def states(name: str, timeout: float = 400):
    """The job's state every 20 ms until it ends."""
    from gptrain.jobs import store

    deadline = time.time() + timeout
    while time.time() < deadline:
        state = store.get_job(name)["state"]
        yield state
        if state in ("succeeded", "failed", "stopped"):
            return
        time.sleep(0.02)
    raise AssertionError(f"job {name} still {state} after {timeout}s")


def nowhere_but_secrets(home: Path, value: str) -> None:
    """No file of GPTRAIN_HOME (records, database, logs, config.toml, cache) but secrets/ holds `value`."""
    for p in home.rglob("*"):
        if p.is_file() and "secrets" not in p.relative_to(home).parts:
            assert value.encode() not in p.read_bytes(), p


def test_the_interpreter_keeps_its_own_botocore_and_the_main_torch():
    code = ("import sys, dateutil, botocore, s3fs, torch, gptrain.cli, gptrain.cli.run, gptrain.cli.train, "
            "gptrain.train.trainer, gptrain.jobs.engines.supervisor, gptrain.data.remote_shards; "
            "print(dateutil.__version__, botocore.__file__, torch.__file__, 'kubernetes' in sys.modules)")
    r = subprocess.run([S3PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    dateutil_version, botocore_at, torch_at, kubernetes = r.stdout.split()
    assert dateutil_version.startswith("2.") and ".venv-s3" in botocore_at and ".venv-s3" not in torch_at
    assert kubernetes == "False"  # nothing gptrain trains with imports the client that needs the newer dateutil


def test_a_two_rank_job_trains_from_s3_through_a_cache_smaller_than_the_data(bucket, home):
    ds, s3, meta_only = bucket
    bound = 3 * shard_bytes(ds)
    assert bound < sum(p.stat().st_size for p in ds.glob("*.bin"))
    env = {**s3, "GPTRAIN_LOCAL_SLOTS": "2"}
    r = submit("s3job", env, f"--data.cache_bytes={bound}", "--train.max_steps=6", "--train.eval_every=6",
               "--data.max_eval_samples=8", "--checkpoint.every=6", "--checkpoint.remote=s3://data/runs/s3job")
    assert r.returncode == 0, r.stderr
    peak, state, cache = 0, None, Path(os.environ["GPTRAIN_CACHE_DIR"])  # this host's shard cache
    for state in states("s3job"):  # the cache, watched while the job runs
        peak = max(peak, cached_bytes(cache))
        assert peak <= bound
    logs = gptrain("logs", "s3job", env=env).stdout
    assert state == "succeeded", logs[-3000:]
    assert "completed at step 6" in logs and peak > shard_bytes(ds)
    report = json.loads(gptrain("inspect", "s3job", "--json", env=env).stdout)
    assert report["metrics"]["train"]["step"] == 6
    assert "rank 1" in gptrain("logs", "s3job", "--rank", "1", env=env).stdout  # two processes
    code = ("import fsspec; fs = fsspec.filesystem('s3'); print(fs.cat_file('data/runs/s3job/latest')"
            ".decode().strip(), len(fs.find('data/runs/s3job/step-000006')))")
    listing = subprocess.run([S3PY, "-c", code], capture_output=True, text=True, env={**os.environ, **s3}, timeout=120)
    latest, files = listing.stdout.split()
    assert latest == "step-000006" and int(files) > 2, listing  # the checkpoint went to the bucket too
    # another job (its own folder: no local checkpoint) goes on from the bucket's newest checkpoint
    assert submit("again", env, f"--data.cache_bytes={bound}", "--train.max_steps=8", "--checkpoint.every=8",
                  "--checkpoint.remote=s3://data/runs/s3job").returncode == 0
    *_, state = states("again")
    again = gptrain("logs", "again", env=env).stdout
    assert state == "succeeded" and re.search(r"resumed from \S+ at step 6", again), again[-3000:]
    assert "completed at step 8" in again
    kept = b"".join(p.read_bytes() for p in (home / "secrets").rglob("*") if p.is_file())
    assert s3["AWS_SECRET_ACCESS_KEY"].encode() in kept  # where --secret keeps it (0600), apart
    # the keys reached the workers and nothing else: no record, log, config or cache file holds them
    for value in (s3["AWS_ACCESS_KEY_ID"], s3["AWS_SECRET_ACCESS_KEY"]):
        assert value not in logs + again + json.dumps(report) + r.stdout + r.stderr
        nowhere_but_secrets(home, value)
        nowhere_but_secrets(cache, value)


def test_the_s3_order_is_the_local_copys(bucket):
    """The blocks read from the bucket are those of the local copy, in the same shard-grouped order."""
    ds, s3, meta_only = bucket
    code = f"""
import numpy as np
from gptrain.data.formats import open_split, read_meta
from gptrain.data.loader import BlockLoader, ShardedLoader, ShardOrder
from gptrain.data.remote_shards import open_remote, open_remote_split
folder = open_remote("s3://data/web/ds", {3 * shard_bytes(ds)})
got = ShardedLoader(open_remote_split(folder, "train"), 32, 4, 1, 2, seed=7)
ref = BlockLoader(open_split("{ds}", "train"), 32, 4, 1, 2, seed=7)
counts = [f["tokens"] for f in read_meta("{ds}")["splits"]["train"]["files"]]
ref.order = ShardOrder(np.concatenate([[0], np.cumsum(counts)]), 32, ref.n_blocks)
ref.n_blocks = ref.order.count  # (no block across two shards)
for _ in range(int(1.2 * ref.n_blocks / 8)):
    assert (got.next_batch()[0] == ref.next_batch()[0]).all()
print("same")
"""
    r = subprocess.run([S3PY, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **s3, "OMP_NUM_THREADS": "1"})
    assert r.stdout.strip() == "same", r.stderr[-3000:]


@pytest.mark.parametrize("path, change, what", [
    ("s3://data/web/ds", {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "Forbidden; the store refused the credentials"),
    ("s3://no-such-bucket/ds", {}, "bucket does not exist"),
    ("s3://data/web/empty", {}, "no meta.json"),
    ("s3://data/web/ds", "meta_only", r"cannot read s3://data/web/ds/train-\d+\.bin: .*refused the credentials"),
])
def test_a_wrong_bucket_folder_or_key_is_one_line(bucket, tmp_path, path, change, what):
    ds, s3, meta_only = bucket
    if change == "meta_only":  # a key that may read meta.json, not the shards
        change = dict(zip(("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), meta_only))
    r = gptrain("train", f"--data.path={path}", *TINY, f"--train.output_dir={tmp_path / 'out'}",
                env={**s3, **change})
    assert r.returncode == 2 and re.search(what, r.stderr), r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert s3["AWS_SECRET_ACCESS_KEY"] not in r.stderr + r.stdout


def test_a_job_with_a_wrong_key_fails_with_one_masked_line(bucket, home):
    ds, s3, meta_only = bucket
    env = {**s3, "GPTRAIN_LOCAL_SLOTS": "2", "AWS_SECRET_ACCESS_KEY": "wrong-secret-4711"}
    assert submit("badkey", env, "--train.max_steps=2").returncode == 0
    *_, state = states("badkey")
    from gptrain.jobs import store

    job = store.get_job("badkey")
    assert state == "failed" and job["exit_code"] == 2, job  # the trainer's user error: no restarts
    assert "refused the credentials" in job["error"] and "\n" not in job["error"].strip(), job["error"]
    nowhere_but_secrets(home, "wrong-secret-4711")


def test_a_dataset_pushed_to_s3_is_streamed_by_its_name_and_a_changed_shard_refused(bucket, home, tmp_path):
    """`data push NAME DIR --to s3://...` through moto's S3 API (data/object_store.py): listed
    available with its URL; a 2-process job given `--dataset NAME` streams it from the bucket;
    a shard overwritten in the bucket afterwards fails `inspect --verify` and the next job, by sha256."""
    ds, s3, _ = bucket
    r = gptrain("data", "push", "pushed", ds, "--to", "s3://data/pushed/ds", env=s3)
    assert r.returncode == 0 and "s3://data/pushed/ds" in r.stdout, r.stderr
    listed = json.loads(gptrain("data", "list", "--json", env=s3).stdout)
    assert [(d["name"], d["state"], d["path"]) for d in listed] == [("pushed", "available", "s3://data/pushed/ds")]
    assert gptrain("data", "inspect", "pushed", "--verify", env=s3).returncode == 0
    job = ["--accels", "2", "--dataset", "pushed", "--secret", "AWS_ACCESS_KEY_ID", "--secret", "AWS_SECRET_ACCESS_KEY",
           "--env", f"FSSPEC_S3_ENDPOINT_URL={s3['FSSPEC_S3_ENDPOINT_URL']}", "--env", "AWS_DEFAULT_REGION=us-east-1",
           "--", "--train.batch_size=4", *TINY, "--train.max_steps=3", "--train.do_eval=false"]
    r = gptrain("run", "fromname", *job, env={**s3, "GPTRAIN_LOCAL_SLOTS": "2"})
    assert r.returncode == 0, r.stderr
    *_, state = states("fromname")
    logs = gptrain("logs", "fromname", env=s3).stdout
    assert state == "succeeded" and "completed at step 3" in logs, logs[-3000:]
    code = ("import fsspec; fs = fsspec.filesystem('s3')\n"  # one byte of every train shard changed
            "for p in fs.glob('data/pushed/ds/train-*.bin'):\n"
            "    b = bytearray(fs.cat_file(p)); b[10] ^= 1; fs.pipe_file(p, bytes(b))")
    flipped = subprocess.run([S3PY, "-c", code], capture_output=True, text=True, env={**os.environ, **s3}, timeout=120)
    assert flipped.returncode == 0, flipped.stderr
    r = gptrain("data", "inspect", "pushed", "--verify", env=s3)
    assert r.returncode == 2 and "does not match meta.json's size and sha256" in r.stderr, r.stderr
    r = gptrain("run", "tampered", *job, "--data.cache_dir=" + str(tmp_path / "fresh"), env={**s3, "GPTRAIN_LOCAL_SLOTS": "2"})
    assert r.returncode == 0, r.stderr
    *_, state = states("tampered")
    assert state == "failed" and "fails its sha256 check" in gptrain("logs", "tampered", env=s3).stdout
