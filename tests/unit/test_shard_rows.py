"""A batch of rows from a URL's cached shards (ShardTokens.rows, the fast path every URL batch
takes) against the simple reference: the same tokens as the local files' slices, rows across two
shards included, and a shard mapped before another rank evicted it still reads right.

Before, each of a batch's rows looked its shard up, checked the cache and opened the file: 9.8-12.7
ms a batch of 128 blocks of 128 tokens against 2.5-3.8 ms from local files, now 0.7-1.6 ms (AMD
EPYC, 2 cores; the loader timing of bench/remote_prefetch.py --train DS --repeat 0)."""

import numpy as np
import pytest

from gptrain.data.formats import open_split
from gptrain.data.loader import ShardedLoader
from gptrain.data.remote_shards import open_remote, open_remote_split
from tests.helpers import char_shards


@pytest.fixture(scope="module")
def served(serve):
    root, server = serve(lambda root: char_shards(root / "ds", 8, 3000, 1500, val_fraction=0.1))
    return root / "ds", f"{server.url}/ds"


def remote(url, tmp_path, split="train"):
    return open_remote_split(open_remote(url, 1 << 30, cache_dir=str(tmp_path / "cache")), split)


@pytest.mark.parametrize("split", ["train", "val"])
def test_rows_are_the_local_files_slices_across_shards_too(served, tmp_path, split):
    local_dir, url = served
    tokens, local = remote(url, tmp_path, split), open_split(local_dir, split)
    rng = np.random.default_rng(0)
    L = 33
    starts = rng.integers(0, len(local) - L, 300)
    across = [int(b) - 5 for b in tokens.starts[1:-1][:4]]  # rows that run from one shard into the next
    starts = np.concatenate([starts, across, [0, len(local) - L]])
    got = tokens.rows(starts, L)
    want = np.stack([np.asarray(local[a: a + L]) for a in starts])
    assert got.dtype == want.dtype and (got == want).all()
    assert (np.stack([tokens[int(a): int(a) + L] for a in starts]) == want).all()  # the slice path agrees


def test_a_held_shard_reads_right_after_another_rank_evicts_its_file(served, tmp_path):
    local_dir, url = served
    tokens, local = remote(url, tmp_path), open_split(local_dir, "train")
    tokens.hold({0})
    first = tokens.rows([0, 100], 20)
    for f in (tmp_path / "cache").rglob(f"*-{tokens.files[0]['name']}"):
        f.unlink()  # (another rank's eviction)
    again = tokens.rows([0, 100, 200], 20)
    assert (again[:2] == first).all() and (again == np.stack([local[a: a + 20] for a in (0, 100, 200)])).all()


def test_a_url_loaders_batches_are_the_local_files_blocks(served, tmp_path):
    local_dir, url = served
    loader = ShardedLoader(remote(url, tmp_path), 16, 8, 0, 1, seed=3)
    local = open_split(local_dir, "train")
    for _ in range(40):
        idx = loader.next_indices()
        x, y = loader.batch(idx)
        want = np.stack([local[b * 16: b * 16 + 17] for b in idx]).astype(np.int64)
        assert (x.numpy() == want[:, :-1]).all() and (y.numpy() == want[:, 1:]).all()
