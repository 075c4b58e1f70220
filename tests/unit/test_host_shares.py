"""Each host reads its own share of a dataset at a URL (data/host_shares.py): simulated hosts,
each with its own cache on its own disk, read through a real HTTP server that counts the bytes
it sends; and a run stopped on 4 hosts and resumed on 2 (or 2 -> 4) reads, batch by batch, the
blocks of an uninterrupted run."""

import numpy as np
import pytest

from gptrain.data.formats import open_split, read_meta
from gptrain.data.host_shares import Partitions
from gptrain.data.loader import ShardedLoader, ShardOrder
from gptrain.data.remote_shards import open_remote, open_remote_split
from tests.helpers import char_shards

T, B = 32, 4


@pytest.fixture(scope="module")
def served(serve):
    """(folder served, URL of its dataset, the train split's bytes, the server): 128 small train shards."""
    root, server = serve(lambda root: char_shards(root / "ds", 48, 6000, 2100))
    files = read_meta(root / "ds")["splits"]["train"]["files"]
    return root, f"{server.url}/ds", sum(f["tokens"] for f in files) * 2, server


def host_loaders(url, tmp_path, host: int, hosts: int, per_host: int, batch: int = B, **kw):
    """The loaders of one host's ranks, through that host's own cache (4 shards at most)."""
    shard = max(f["tokens"] for f in read_meta(open_remote(url, 1 << 30, cache_dir=str(tmp_path / "probe")))
                ["splits"]["train"]["files"]) * 2
    folder = open_remote(url, 4 * shard, cache_dir=str(tmp_path / f"host-{host}"))
    world = hosts * per_host
    return [ShardedLoader(open_remote_split(folder, "train"), T, batch, host * per_host + local, world, seed=7,
                          hosts=hosts, **kw) for local in range(per_host)]


def drained(loader):
    if loader.tokens._queue is not None:
        loader.tokens._queue.join()  # (the read-ahead's bytes count too)


@pytest.mark.parametrize("hosts", [2, 4])
def test_each_host_fetches_its_share_and_all_of_them_about_the_data_once(served, tmp_path, hosts):
    root, url, data_bytes, server = served
    steps, fetched, seen = None, [], []
    for host in range(hosts):
        ranks = host_loaders(url, tmp_path, host, hosts, per_host=1)
        steps = steps or 2 * ranks[0].n_blocks // ranks[0].global_batch  # two epochs
        before = server.sent
        for _ in range(steps):
            for r in ranks:
                x, y = r.next_batch()
                seen.append(x[:, 0])
        drained(ranks[0])
        fetched.append(server.sent - before)
    trained = 2 * data_bytes
    print(f"{hosts} hosts, two epochs: fetched / trained {sum(fetched) / trained:.3f}; "
          f"each host {[round(f / trained, 3) for f in fetched]} of the data trained on")
    assert sum(fetched) / trained <= 1.1, (fetched, trained)
    assert max(fetched) <= 1.2 * trained / hosts  # each host about its share, not the whole
    # was: one stream dealt every world-th block, so each host's cache fetched all of it
    alone = ShardedLoader(open_remote_split(open_remote(url, 4 * (data_bytes // 100), cache_dir=str(tmp_path / "one")),
                                            "train"), T, B, 0, hosts, seed=7)
    before = server.sent
    for _ in range(steps):
        alone.next_batch()
    drained(alone)
    assert server.sent - before >= 0.9 * trained


def test_one_host_reads_what_four_hosts_read_together(served, tmp_path):
    """The global order depends on the partitions only: 4 hosts of one rank, 2 hosts of two and
    one host of four ranks (all with P = 4) read the same blocks in each global batch."""
    _, url, _, _ = served
    runs = {}
    for hosts, per_host in ((4, 1), (2, 2), (1, 4)):
        ranks = [r for h in range(hosts) for r in host_loaders(url, tmp_path, h, hosts, per_host)]
        if hosts < 4:
            for r in ranks:  # the partitions of a run that started on 4 hosts
                r.load_state_dict({**ranks[0].state_dict(), "partitions": 4})
        runs[hosts] = [sorted(np.concatenate([r.next_indices() for r in ranks]).tolist()) for _ in range(30)]
    assert runs[4] == runs[2] == runs[1]


@pytest.mark.parametrize("before,after", [((4, 1), (2, 2)), ((4, 1), (1, 4)), ((2, 2), (1, 4))])
def test_a_run_resumed_on_other_hosts_reads_the_blocks_of_an_uninterrupted_one(served, tmp_path, before, after):
    _, url, _, _ = served
    whole = [r for h in range(before[0]) for r in host_loaders(url, tmp_path, h, *before)]
    n = 3 * whole[0].n_blocks // whole[0].global_batch // 2  # across an epoch's end
    reference = [sorted(np.concatenate([r.next_indices() for r in whole]).tolist()) for _ in range(n)]
    first = [r for h in range(before[0]) for r in host_loaders(url, tmp_path, h, *before)]
    got = [sorted(np.concatenate([r.next_indices() for r in first]).tolist()) for _ in range(n // 3)]
    state = first[0].state_dict()
    assert state["partitions"] == before[0]
    later = [r for h in range(after[0]) for r in host_loaders(url, tmp_path, h, *after)]
    for r in later:
        r.load_state_dict(state)
    got += [sorted(np.concatenate([r.next_indices() for r in later]).tolist()) for _ in range(n - n // 3)]
    assert got == reference and all(r.resume_note is None for r in later)
    # and the tokens are the dataset's own: a resumed rank's rows against the local files
    local = open_split(served[0] / "ds", "train")
    idx = later[0].next_indices()
    x, _ = later[0].batch(idx)
    for row, block in zip(x, idx):
        assert (row.numpy() == local[block * T: block * T + T]).all()


@pytest.mark.parametrize("before,after", [(2, 4), (1, 2), (4, 3)])
def test_a_run_resumed_on_hosts_that_do_not_divide_its_partitions_is_re_partitioned(served, tmp_path, before, after):
    """2 -> 4 hosts: each host fetches its own share again (it fetched most of what was left:
    3.1x on podman hosts, when 4 hosts took every world-th block of 2 partitions), every block
    is read once an epoch, the position carries over, and a later resume of the re-partitioned
    run keeps its order."""
    _, url, data_bytes, server = served
    first = [r for h in range(before) for r in host_loaders(url, tmp_path, h, before, 1, batch=12 // before)]
    epoch, batch = first[0].n_blocks, first[0].global_batch
    stop, steps = epoch // batch // 3, 2 * epoch // batch  # stopped a third into epoch 0, two epochs in all
    seen = np.zeros(first[0].order.hi[-1] + 1, dtype=np.int64)
    for _ in range(stop):
        np.add.at(seen, np.concatenate([r.next_indices() for r in first]), 1)
    state = first[0].state_dict()
    later = [r for h in range(after) for r in host_loaders(url, tmp_path, h, after, 1, batch=12 // after)]
    for r in later:
        r.load_state_dict(state)
    assert "re-partitioned into" in later[0].resume_note and later[0].position == stop * batch
    fetched = server.sent
    valid = first[0].order(7, 0)
    for step in range(stop, steps):
        mine = [r.next_indices() for r in later]
        for r, idx in zip(later, mine):
            r.batch(idx)  # (what fetches)
        np.add.at(seen, np.concatenate(mine), 1)
        c = seen[valid]
        assert c.max() - c.min() <= 2, step  # (spans of unequal length: a block either side of an epoch's end)
    for r in later:
        drained(r)
    trained = (steps - stop) * batch * T * 2
    print(f"{before} -> {after} hosts: fetched / trained after the resume {(server.sent - fetched) / trained:.3f}")
    assert (seen[valid] == 2).sum() >= len(valid) - batch - 2 * after  # (about) two epochs: each block twice
    assert server.sent - fetched <= 1.1 * trained + after * data_bytes // 64, (server.sent - fetched, trained)
    again = host_loaders(url, tmp_path, 0, after, 1, batch=12 // after)[0]  # a later resume on as many hosts: the same stream
    again.load_state_dict(later[0].state_dict())
    assert again.resume_note is None and (again.next_indices() == later[0].next_indices()).all()


def test_partitions_cut_each_epoch_into_equal_spans_and_one_partition_is_the_single_stream(served):
    root, _, _, _ = served
    files = read_meta(root / "ds")["splits"]["train"]["files"]
    starts = np.concatenate([[0], np.cumsum([f["tokens"] for f in files])])
    order = ShardOrder(starts, T, int((starts[-1] - 1) // T))
    n = order.count
    one = Partitions(order, 1, lambda: 7)
    assert (one.batch(0, n) == order(7, 0)).all() and (one.batch(n, 5) == order(7, 1)[:5]).all()
    four = Partitions(order, 4, lambda: 7)
    assert {four.length(p) for p in range(4)} <= {n // 4, n // 4 + 1}
    epoch = np.concatenate([four.batch(k * 4 * B, 4 * B) for k in range(n // (4 * B))])
    assert len(set(epoch.tolist())) == len(epoch)  # no block twice within an epoch


def test_nothing_is_read_ahead_past_the_runs_last_block(served, tmp_path):
    """Host 0 of 2 (a cache of 4 shards) in a run that ends at an epoch's end fetches the shards
    it reads and not its next epoch's first (read ahead for a step that never comes); without
    the run's end known, it does."""
    _, url, data_bytes, server = served
    fetched = {}
    for known in (False, True):
        loader = host_loaders(url, tmp_path / f"c{known}", 0, 2, per_host=1)[0]
        steps = loader.n_blocks // loader.global_batch
        if known:
            loader.ends_at = steps * loader.global_batch
        before = server.sent
        for _ in range(steps):
            loader.next_batch()
        drained(loader)
        fetched[known] = server.sent - before
    shard = data_bytes // 100  # (~128 shards)
    assert fetched[True] + shard // 2 < fetched[False] <= 1.2 * data_bytes / 2, (fetched, data_bytes)
