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
order depends on P only, never on how many hosts or ranks read it, so a run resumed on another
number of hosts reads exactly the blocks, batch by batch, of an uninterrupted run (host-local
when the new number of hosts divides P; else each rank takes every world-th block of the global
batch, as one host does, fetching more but reading the same). P = 1 is the single global stream
of one host, unchanged.
"""

from __future__ import annotations

import numpy as np


class Partitions:
    """The partitions of one loader's stream; `seed` is the loader's (read at each call: a
    mixture or a resumed state sets it after the loader is made)."""

    def __init__(self, order, parts: int, seed):
        n = order.count  # the blocks of an epoch
        self.order, self.parts, self._seed = order, max(1, min(parts, n)), seed
        self.bounds = [(p * n) // self.parts for p in range(self.parts + 1)]
        self._perms: dict[tuple, np.ndarray] = {}

    @property
    def seed(self) -> int:
        return self._seed()

    def perm(self, epoch: int) -> np.ndarray:
        key = (self.seed, epoch)
        if key not in self._perms:
            if len(self._perms) >= 2:
                self._perms.pop(next(iter(self._perms)))
            self._perms[key] = self.order(*key)
        return self._perms[key]

    def length(self, p: int) -> int:
        return self.bounds[p + 1] - self.bounds[p]

    def locate(self, p: int, done: int) -> tuple[int, int]:
        """(epoch, index in that epoch's permutation) of partition p's next block after `done`."""
        epoch, into = divmod(done, self.length(p))
        return epoch, self.bounds[p] + into

    def take(self, p: int, done: int, count: int) -> np.ndarray:
        """The `count` blocks of partition p after its first `done`."""
        out = []
        while count > 0:
            epoch, at = self.locate(p, done)
            chunk = self.perm(epoch)[at: min(self.bounds[p + 1], at + count)]
            if not len(chunk):
                raise ValueError("an epoch's permutation is shorter than its partitions")
            out.append(chunk)
            done, count = done + len(chunk), count - len(chunk)
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def batch(self, consumed: int, count: int) -> np.ndarray:
        """The next `count` blocks of the global stream after `consumed`: count/P from each
        partition, partition by partition (P = 1: the single stream)."""
        if self.parts == 1:
            return self.take(0, consumed, count)
        if count % self.parts or consumed % self.parts:
            raise ValueError(f"a global batch of {count} blocks does not split into {self.parts} partitions")
        share = count // self.parts
        return np.concatenate([self.take(p, consumed // self.parts, share) for p in range(self.parts)])

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
        it in the span, or the next epoch's first) for partition p's position `done`."""
        epoch, at = self.locate(p, done)
        order, ends, g = self.order.where(self.seed, epoch, at)
        now = int(order[g])
        end = min(int(ends[g]), self.bounds[p + 1])
        start = int(ends[g - 1]) if g else 0
        if end < self.bounds[p + 1]:
            later = order[g + 1:]
            nxt = int(later[self.order.hi[later] > self.order.lo[later]][0])
        else:
            nxt = self.order.shard_of(int(self.perm(epoch + 1)[self.bounds[p]]))
        return now, end - at, int(ends[g]) - start, nxt
