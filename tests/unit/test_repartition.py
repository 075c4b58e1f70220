"""A stream re-partitioned at a resume on hosts that cannot read its partitions whole
(data/host_shares.py): every block is still read once an epoch, the position carries over
exactly, each host reads spans of few shards, and the history rebuilds the same stream.

Checked against what an uninterrupted stream guarantees, not against the code's own rule: at
every global batch boundary, every block of the dataset has been read k or k + 1 times (no block
a second time before every block once), over several epochs and resume points, including spans
of unequal length that straddle an epoch's end."""

import numpy as np
import pytest

from gptrain.data.host_shares import Partitions
from gptrain.data.loader import ShardOrder


def order_of(shard_blocks, T=4):
    """A ShardOrder of shards holding the given numbers of whole blocks."""
    starts = np.concatenate([[0], np.cumsum(np.asarray(shard_blocks) * T + T)])  # (+T: room for the +1 token)
    return ShardOrder(starts, T, int((starts[-1] - 1) // T))


def read(parts_of, batch, steps, resumes=()):
    """The blocks of `steps` global batches of `batch` blocks, the stream re-partitioned at each
    (step, parts) of `resumes` as a resumed loader does; and the counts after each batch."""
    shares = parts_of()
    got, counts, seen = [], [], np.zeros(shares.order.lo[-1] + 99, dtype=np.int64)
    moves = dict(resumes)
    for step in range(steps):
        if step in moves:  # a resume: rebuilt from the history, then re-partitioned
            shares = Partitions(shares.order, shares.first, lambda: 3, shares.history)
            shares.repartition(step * batch, moves[step])
        blocks = shares.batch(step * batch, batch)
        np.add.at(seen, blocks, 1)
        got.append(blocks)
        counts.append(seen[shares.order(3, 0)].copy())  # (the blocks an epoch reads)
    return got, counts, shares


def assert_once_an_epoch(counts):
    for step, c in enumerate(counts):
        assert c.max() - c.min() <= 1, f"after batch {step}: a block read {c.max()} times, another {c.min()}"


SHARDS = [7, 5, 9, 6, 8, 4, 7, 6, 5, 9, 3, 8]  # 77 blocks: no number of partitions here divides it


@pytest.mark.parametrize("first,later", [(2, 4), (1, 2), (4, 3), (3, 2), (2, 8), (4, 6)])
def test_a_re_partitioned_stream_reads_every_block_once_an_epoch_from_any_resume_point(first, later):
    order = order_of(SHARDS)
    batch = 24  # divisible by every number of partitions here
    steps = 4 * order.count // batch  # four epochs
    reference, _, _ = read(lambda: Partitions(order, first, lambda: 3), batch, steps)
    for at in range(1, steps):
        got, counts, shares = read(lambda: Partitions(order, first, lambda: 3), batch, steps, [(at, later)])
        assert_once_an_epoch(counts)
        assert all((a == b).all() for a, b in zip(got[:at], reference[:at]))  # before it: the same stream
        assert shares.parts == later and shares.history == [[at * batch, later]]
        # each partition (host) reads runs of whole shards: all of them together switch shards
        # about as often as one stream through the data would (every host reading all: `later` x)
        streams = np.stack([b.reshape(later, -1) for b in got[at:]], axis=1).reshape(later, -1)
        runs = sum(1 + int(np.count_nonzero(np.diff([order.shard_of(int(b)) for b in s]))) for s in streams)
        epochs = streams.size / order.count
        assert runs <= (epochs + 1) * order.n_shards + 2 * later + 2 * first, (runs, epochs)


def test_unequal_spans_straddling_an_epochs_end_are_carried_over_whole():
    """5 partitions of 77 blocks (spans of 15 and 16): at 15 blocks each, the 15-block spans
    have finished epoch 0 and the 16-block ones have a block of it left; at 16, the 15-block
    ones are into epoch 1 and the 16-block ones between two epochs; past 15 * 16 the short spans
    are a whole epoch ahead. The carried blocks bring every block to the same epoch: once they
    are read, every block has been read exactly `epoch` times, and once more after each epoch."""
    order = order_of(SHARDS)
    for done, carried, epoch in ((15, 2, 1), (16, 3 * 14 + 2 * 16, 2), (15 * 16 + 1, None, 17), (500, None, None)):
        shares = Partitions(order, 5, lambda: 3)
        assert sorted({shares.length(p) for p in range(5)}) == [15, 16]
        seen = np.zeros(order.lo[-1] + 99, dtype=np.int64)
        for k in range(done):  # one block from each partition a batch
            np.add.at(seen, shares.batch(5 * k, 5), 1)
        shares.repartition(5 * done, 2)
        seg = shares.segments[-1]
        assert carried is None or len(seg.carried) == carried
        assert epoch is None or seg.epoch == epoch
        valid = order(3, 0)  # (the blocks an epoch reads)
        for q in range(2):  # what each new partition reads first: the carried blocks
            np.add.at(seen, shares.take(q, 0, seg.carried_length(q)), 1)
        assert (seen[valid] == seg.epoch).all(), done  # every block read exactly `epoch` times
        for e in range(2):  # then each new partition's span of each later epoch
            for q in range(2):
                np.add.at(seen, shares.take(q, seg.carried_length(q) + e * shares.length(q), shares.length(q)), 1)
            assert (seen[valid] == seg.epoch + 1 + e).all(), (done, e)


def test_two_resumes_and_the_history_rebuild_the_same_stream():
    order = order_of(SHARDS)
    batch, steps = 24, 3 * order.count // 24
    got, counts, shares = read(lambda: Partitions(order, 2, lambda: 3), batch, steps, [(3, 4), (5, 3), (8, 6)])
    assert_once_an_epoch(counts)
    assert shares.history == [[72, 4], [120, 3], [192, 6]]
    again = Partitions(order, 2, lambda: 3, shares.history)
    assert all((again.batch(s * batch, batch) == got[s]).all() for s in range(8, steps))


def test_the_next_shard_of_carried_blocks_is_the_one_read_next():
    """ahead() inside the carried blocks: the shard now, the blocks left of it, and the next."""
    order = order_of(SHARDS)
    shares = Partitions(order, 2, lambda: 3)
    for k in range(7):
        shares.batch(24 * k, 24)
    shares.repartition(24 * 7, 4)
    seg = shares.segments[-1]
    for p in range(4):
        for done in range(seg.carried_length(p)):
            now, left, size, nxt = shares.ahead(p, done)
            stream = [order.shard_of(int(b)) for b in shares.take(p, done, left + 1)]
            assert stream[:left] == [now] * left and left >= 1 and size >= left
            assert stream[left] == nxt  # the next block's shard (the next epoch's span at the end)
