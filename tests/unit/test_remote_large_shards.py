"""Shards at a URL as a plain web server serves them: `python -m http.server` answers a Range
request with the whole file (status 200), so a shard larger than fsspec's read block (5 MB; a
default `data prepare` shard is 16 MB) must come in one streaming GET, never as ranged reads;
and a shard whose read-ahead failed is not asked for again at every batch (the reader, when it
needs the shard, reads it itself and reports what is wrong)."""

import functools
import http.server
import threading
import time

import numpy as np
import pytest

from gptrain.data.formats import open_split
from gptrain.data.remote_shards import open_remote, open_remote_split
from tests.helpers import write_corpus


class Counting(http.server.SimpleHTTPRequestHandler):
    """The standard library's file server (no Range support), counting GETs per file and
    answering 404 for the files named in `server.missing`."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        with self.server.lock:
            self.server.gets[name] = self.server.gets.get(name, 0) + 1
        if name in self.server.missing:
            self.send_error(404)
            return
        super().do_GET()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A char dataset prepared with the default shard size (2^23 uint16 tokens: 16.8 MB, its
    first train shard), served on 127.0.0.1."""
    from gptrain.data.prepare import prepare

    root = tmp_path_factory.mktemp("big")
    prepare([str(write_corpus(root / "corpus.txt", 8_600_000))], str(root / "ds"), tokenizer="char",
            val_fraction=0.01, quiet=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=str(root)))
    server.lock, server.gets, server.missing = threading.Lock(), {}, set()
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/ds", server
    server.shutdown()


def test_a_shard_larger_than_a_read_block_comes_in_one_get(big):
    root, url, server = big
    tokens = open_remote_split(open_remote(url, 1 << 30), "train")
    local = open_split(root / "ds", "train")
    end = tokens.files[0]["tokens"]
    assert end * 2 > 10 << 20  # larger than fsspec's first read (a block and its read-ahead)
    assert np.array_equal(tokens[end - 1000:end + 100], local[end - 1000:end + 100])  # the end of shard 0, into 1
    assert server.gets["train-00000.bin"] == 1, server.gets


def test_a_failed_read_ahead_is_not_tried_again_at_every_batch(big, tmp_path, monkeypatch):
    root, url, server = big
    monkeypatch.setenv("GPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    server.missing.add("train-00001.bin")
    server.gets.clear()
    tokens = open_remote_split(open_remote(url, 1 << 30), "train")
    for _ in range(5):  # what the loader does at each batch while it reads shard 0
        tokens.prefetch([1])
        done = threading.Thread(target=tokens._queue.join, daemon=True)  # the read-ahead has tried
        done.start()
        done.join(60)
        assert not done.is_alive()
    assert server.gets.get("train-00001.bin") == 1, server.gets
    with pytest.raises(Exception, match="train-00001.bin"):  # the reader, when it needs it, says why
        tokens[tokens.files[0]["tokens"] + 10:tokens.files[0]["tokens"] + 20]


def test_a_short_run_fetches_the_shard_it_trains_on_and_not_the_next(big, tmp_path, monkeypatch):
    """The read-ahead starts once the stream is past half of its shard (or near its end), never
    before the reader has its own shard: 5 batches at the start of a 16.8 MB shard fetch that
    shard alone (they fetched it and the next, 2x what a 5-step run reads)."""
    from gptrain.data.loader import ShardedLoader

    root, url, server = big
    monkeypatch.setenv("GPTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    server.missing.clear()
    server.gets.clear()
    tokens = open_remote_split(open_remote(url, 1 << 30), "train")
    loader = ShardedLoader(tokens, 32, 4, seed=7)
    for _ in range(5):
        loader.next_batch()
    time.sleep(1)  # (a read-ahead, had one started, has asked by now)
    assert sum(n for name, n in server.gets.items() if name.startswith("train-")) == 1, server.gets
