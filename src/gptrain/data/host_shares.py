"""Each host of a multi-host job reads its own share of a dataset at a URL.

The shard-grouped order of a remote dataset (data/loader.ShardOrder) has every rank read blocks
of the same shard at a time: with a cache on each host's own disk, every host would fetch every
shard. So the stream is cut into P canonical partitions (as MosaicML streaming's canonical
nodes): epoch e's shard-grouped permutation is cut into P contiguous spans of near-equal length,
and partition p walks its span of epoch 0, then its span of epoch 1, and so on. Every global
batch takes G/P blocks from each partition, partition by partition. With P hosts (or any number
of hosts that divides P), host h reads only partitions h*P/H .. (h+1)*P/H - 1: a span covers
about n_shards/P whole shards, and only the shards at the spans' ends are fetched by two hosts,
so an H-host job fetches each byte it trains on about once.

P is the number of hosts when a run first starts, and is kept in its loader state: the global
order depends on P only, never on how many hosts or ranks read it, so a run resumed on a number
of hosts that divides P (fewer hosts, or one) reads exactly the blocks, batch by batch, of an
uninterrupted run, each host its own partitions. P = 1 is the single global stream of one host.

A run resumed on H' hosts that do not divide P (2 -> 4, 4 -> 3, 1 -> 2) could not read host-
locally, so its stream is re-partitioned there, deterministically: a new segment begins at
the resume's position X in H' partitions. Its first blocks are those the old partitions had
left in their epochs at X (each old partition's rest of its span, partition by partition; a
partition behind the others, when spans of unequal length have drifted across an epoch's end,
also its whole spans up to the epoch the furthest one reached), cut into H' contiguous spans;
then each new partition walks its span of each later epoch as above. Every block is still read
once an epoch and the position carries over exactly; the history [[X, H'], ...] is kept in the
loader state, so a later resume rebuilds the same stream.
"""

from __future__ import annotations

import numpy as np

EMPTY = np.zeros(0, dtype=np.int64)


def spans(n: int, parts: int) -> list[int]:
    """The bounds of `parts` contiguous near-equal spans of n items."""
    return [(p * n) // parts for p in range(parts + 1)]


class Segment:
    """The stream from global position `start` on, in `parts` partitions: partition q reads its
    span of `carried` (the blocks the segment before left unread in their epochs), then its
    span of epoch `epoch`, `epoch + 1`, ... of the order."""

    def __init__(self, start: int, parts: int, carried: np.ndarray, epoch: int, n: int):
        self.start, self.parts, self.carried, self.epoch = start, parts, carried, epoch
        self.cut = spans(len(carried), parts)
        self.bounds = spans(n, parts)
        self._carried_shards = None

    def carried_length(self, q: int) -> int:
        return self.cut[q + 1] - self.cut[q]

    def length(self, q: int) -> int:
        return self.bounds[q + 1] - self.bounds[q]

    def locate(self, q: int, done: int) -> tuple[int | None, int]:
        """(epoch, index in its permutation) of partition q's next block after `done`; epoch
        None: index into `carried`."""
        if done < self.carried_length(q):
            return None, self.cut[q] + done
        epoch, into = divmod(done - self.carried_length(q), self.length(q))
        return self.epoch + epoch, self.bounds[q] + into


class Partitions:
    """The partitions of one loader's stream; `seed` is the loader's (read at each call: a
    mixture or a resumed state sets it after the loader is made); `history` the re-partitions
    of a resumed run ([[position, parts], ...])."""

    def __init__(self, order, parts: int, seed, history=()):
        self.order, self._seed, self.n = order, seed, order.count  # the blocks of an epoch
        self._perms: dict[tuple, np.ndarray] = {}
        self.segments = [Segment(0, self._clamp(parts), EMPTY, 0, self.n)]
        for at, later in history:
            self.repartition(int(at), int(later))

    def _clamp(self, parts: int) -> int:
        return max(1, min(int(parts), self.n))

    @property
    def seed(self) -> int:
        return self._seed()

    @property
    def first(self) -> int:
        """The partitions the run started with."""
        return self.segments[0].parts

    @property
    def parts(self) -> int:
        """The partitions read now."""
        return self.segments[-1].parts

    @property
    def history(self) -> list[list[int]]:
        return [[s.start, s.parts] for s in self.segments[1:]]

    def perm(self, epoch: int) -> np.ndarray:
        key = (self.seed, epoch)
        if key not in self._perms:
            if len(self._perms) >= 2:
                self._perms.pop(next(iter(self._perms)))
            self._perms[key] = self.order(*key)
        return self._perms[key]

    def _span(self, seg: Segment, q: int, epoch: int | None) -> np.ndarray:
        if epoch is None:
            return seg.carried[seg.cut[q]: seg.cut[q + 1]]
        return self.perm(epoch)[seg.bounds[q]: seg.bounds[q + 1]]

    def repartition(self, at: int, parts: int) -> None:
        """From position `at` on, read in `parts` partitions (module doc)."""
        seg = self.segments[-1]
        if at < seg.start or (at - seg.start) % seg.parts:
            raise ValueError(f"position {at} is not between two global batches of {seg.parts} partitions")
        done = (at - seg.start) // seg.parts
        rests, nexts = [], []
        for q in range(seg.parts):
            epoch, at_q = seg.locate(q, done)
            first = seg.cut[q] if epoch is None else seg.bounds[q]
            # the rest of its span (nothing when it is at its span's start: it is between two epochs)
            rests.append(self._span(seg, q, epoch)[at_q - first:] if at_q > first or epoch is None else EMPTY)
            nexts.append(seg.epoch if epoch is None else epoch + (at_q > first))
        epoch = max(nexts)
        carried = [np.concatenate([rest] + [self._span(seg, q, e) for e in range(nxt, epoch)])
                   for q, (rest, nxt) in enumerate(zip(rests, nexts))]
        self.segments.append(Segment(at, self._clamp(parts), np.concatenate(carried).astype(np.int64),
                                     epoch, self.n))

    def done(self, position: int, up: bool = False) -> int:
        """Blocks each partition of the segment read now has given at global `position` (rounded
        up when `up`)."""
        seg = self.segments[-1]
        rel = position - seg.start
        return -(-rel // seg.parts) if up else rel // seg.parts

    def length(self, p: int) -> int:
        """Blocks of partition p's span of an epoch."""
        return self.segments[-1].length(p)

    def take(self, p: int, done: int, count: int) -> np.ndarray:
        """The `count` blocks of partition p after its first `done`."""
        seg, out = self.segments[-1], []
        while count > 0:
            epoch, at = seg.locate(p, done)
            first = seg.cut[p] if epoch is None else seg.bounds[p]
            chunk = self._span(seg, p, epoch)[at - first: at - first + count]
            if not len(chunk):
                raise ValueError("an epoch's permutation is shorter than its partitions")
            out.append(chunk)
            done, count = done + len(chunk), count - len(chunk)
        return np.concatenate(out) if out else EMPTY

    def batch(self, consumed: int, count: int) -> np.ndarray:
        """The next `count` blocks of the global stream after `consumed`: count/P from each
        partition, partition by partition (P = 1: the single stream)."""
        seg = self.segments[-1]
        if consumed < seg.start:
            raise ValueError(f"position {consumed} is before the stream's last re-partition ({seg.start})")
        if seg.parts == 1:
            return self.take(0, consumed - seg.start, count)
        if count % seg.parts or (consumed - seg.start) % seg.parts:
            raise ValueError(f"a global batch of {count} blocks does not split into {seg.parts} partitions")
        share = count // seg.parts
        return np.concatenate([self.take(p, self.done(consumed), share) for p in range(seg.parts)])

    def local(self, hosts: int, world: int) -> bool:
        """Whether `hosts` hosts of world // hosts ranks each can read only their own partitions."""
        return hosts > 1 and self.parts % hosts == 0 and world % hosts == 0

    def owned(self, host: int, hosts: int) -> range:
        """The partitions host `host` of `hosts` reads (all of them when hosts does not divide P)."""
        if self.parts % hosts:
            return range(self.parts)
        per = self.parts // hosts
        return range(host * per, (host + 1) * per)

    def ahead(self, p: int, done: int) -> tuple[int, int, int, int]:
        """(shard now, blocks left of it in partition p's span, its blocks in all, the shard after
        it in the span, or the next span's first) for partition p's position `done`."""
        seg = self.segments[-1]
        epoch, at = seg.locate(p, done)
        if epoch is None:
            return self._ahead_carried(seg, p, at)
        order, ends, g = self.order.where(self.seed, epoch, at)
        now = int(order[g])
        end = min(int(ends[g]), seg.bounds[p + 1])
        start = int(ends[g - 1]) if g else 0
        if end < seg.bounds[p + 1]:
            later = order[g + 1:]
            nxt = int(later[self.order.hi[later] > self.order.lo[later]][0])
        else:
            nxt = self.order.shard_of(int(self.perm(epoch + 1)[seg.bounds[p]]))
        return now, end - at, int(ends[g]) - start, nxt

    def _ahead_carried(self, seg: Segment, p: int, at: int) -> tuple[int, int, int, int]:
        """ahead() within the carried blocks: the run of blocks of one shard that `at` is in."""
        if seg._carried_shards is None:
            seg._carried_shards = np.searchsorted(self.order.lo, seg.carried, "right") - 1
        shards, lo, hi = seg._carried_shards, seg.cut[p], seg.cut[p + 1]
        now = int(shards[at])
        other = np.flatnonzero(shards[at:hi] != now)
        end = at + int(other[0]) if len(other) else hi
        before = np.flatnonzero(shards[lo:at] != now)
        start = lo + int(before[-1]) + 1 if len(before) else lo
        nxt = int(shards[end]) if end < hi else self.order.shard_of(int(self.perm(seg.epoch)[seg.bounds[p]]))
        return now, end - at, end - start, nxt
