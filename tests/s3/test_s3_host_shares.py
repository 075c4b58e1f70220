"""Each host of a multi-host job fetches only its share of a dataset in S3 (issue #36): moto's
real S3 API (tests/s3/moto_s3.py, authentication on) behind a proxy that counts the bytes S3
sends (tests/byte_counting.py), and 2 or 4 torchrun agents, each a host to gptrain (its own node
rank, one process; torchrun's static rendezvous on 127.0.0.1) with its own shard cache folder
(GPTRAIN_CACHE_DIR, as each host's own disk), training one epoch with `gptrain train`: all of
them together fetch at most 1.1x the bytes trained on (each host fetched all of it before), and
each host's cache holds about 1/N of the data."""

import os
import socket
import subprocess

import pytest

from gptrain.data.remote_shards import cached_bytes
from tests.byte_counting import CountingProxy
from tests.helpers import TINY, streaming_dataset

from tests.s3.moto_server import S3PY, env_of, serve

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not S3PY.is_file(), reason="needs .venv-s3 (s3fs, moto): make s3")]
T, GLOBAL, PER_RANK = 128, 256, 64


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """(S3 environment through the counting proxy, the proxy, the train split's blocks, the
    dataset's local folder): the dataset of tests/helpers.streaming_dataset at s3://data/web/ds."""
    root = tmp_path_factory.mktemp("s3hosts")
    tokens = streaming_dataset(root / "up" / "ds")
    with serve(root / "up") as info:
        host, port = info["endpoint"].split("//")[1].split(":")
        proxy = CountingProxy((host, int(port)))
        yield env_of(info, proxy.endpoint), proxy, tokens // T, root / "up" / "ds"
        proxy.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("hosts, source", [(2, "url"), (4, "url"), (2, "pushed")])
def test_each_host_fetches_its_share_from_s3(s3, isolated_home, tmp_path, hosts, source):
    """`pushed` (#50): the dataset pushed with `gptrain data push NAME DIR --to s3://...` and each
    host given its name: it streams from the bucket, each host its share, as from its URL."""
    env, proxy, blocks, folder = s3
    path = "s3://data/web/ds"
    if source == "pushed":
        r = subprocess.run([S3PY, "-m", "gptrain", "data", "push", "web", str(folder), "--to", "s3://data/pushed/ds"],
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
        assert r.returncode == 0 and "s3://data/pushed/ds" in r.stdout, r.stderr
        path = "web"  # its name
    steps = blocks // GLOBAL  # one epoch
    port = free_port()
    args = ["train", *TINY, f"--model.block_size={T}", f"--data.path={path}", f"--train.output_dir={tmp_path / 'out'}",
            f"--train.max_steps={steps}", f"--train.global_batch_size={GLOBAL}", f"--train.batch_size={PER_RANK}",
            "--train.do_eval=false", "--checkpoint.every=100000", "--metrics.log_every=50"]
    before = proxy.sent
    agents = []
    for h in range(hosts):
        full = {**os.environ, **env, "OMP_NUM_THREADS": "1", "GPTRAIN_CACHE_DIR": str(tmp_path / f"host-{h}")}
        agents.append(subprocess.Popen(
            [S3PY, "-m", "torch.distributed.run", f"--nnodes={hosts}", f"--node-rank={h}", "--nproc-per-node=1",
             "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "gptrain", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full))
    outs = [a.communicate(timeout=900)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(o[-3000:] for o in outs)
    assert f"completed at step {steps}" in outs[0], outs[0][-3000:]
    fetched, trained = proxy.sent - before, steps * GLOBAL * T * 2
    cached = [cached_bytes(tmp_path / f"host-{h}") for h in range(hosts)]
    print(f"S3 ({source}), {hosts} hosts, one epoch ({steps} steps): fetched / trained {fetched / trained:.3f} (S3's "
          f"responses, headers and all); each host's cache {[round(c / trained, 3) for c in cached]} of it")
    assert fetched <= 1.1 * trained, (fetched, trained)
    assert all(0 < c <= 1.25 * trained / hosts for c in cached), (cached, trained)
