"""Batches of fixed-length blocks for training and evaluation.

Block i covers tokens[i*T : i*T + T + 1] (inputs and the targets shifted by one). Each epoch
draws a seeded permutation of all blocks, and the epochs' permutations form one stream: global
batch s takes the next world*B blocks of the stream and rank r takes every world-th of those.
So over an epoch every block is seen once, by exactly one rank, and every batch is full: the
batch at an epoch's end takes its last blocks and the next epoch's first ones (a pipeline
schedule splits each batch into a fixed number of microbatches, so it needs B rows every step;
and every layout sees the same batches). The position is counted in blocks, so a resumed run
continues with the same batches.

Instruction data (data/sft.py) comes with `examples`: its loss mask and example starts. Then a
"block" is one example: its first block_size + 1 tokens in a row of its own, padded, with the
targets of prompt tokens and of padding -100 (ignored by the loss), so an example never sees
another's tokens and its loss is the one it has alone. Examples with no target within the
first block_size + 1 tokens are left out (`left_out` counts them).

Packed (data.packing; `auto` packs when the examples average at most half a block), a "block" is
a row of several whole examples, one after another in the dataset's order, as many as fit in
block_size inputs; the batch carries each token's example number (`segments`, -1 for the
padding at a row's end), from which the model restarts the positions at each example and lets
a token see only its own example's tokens before it (models/base.Packed): each example's loss is
the one it has padded, without the padding's compute.
"""

from __future__ import annotations

import numpy as np
import torch

from gptrain.data.host_shares import Partitions
from gptrain.errors import UserError


def num_blocks(n_tokens: int, block_size: int, limit: int | None = None) -> int:
    n = max(0, (n_tokens - 1) // block_size)
    return n if limit is None else min(n, limit)


def usable_examples(examples, block_size: int) -> np.ndarray:
    """The examples that have a target among their first block_size + 1 tokens."""
    mask, starts = examples
    targets = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])  # targets before each position
    lo, hi = starts[:-1] + 1, np.minimum(starts[1:], starts[:-1] + block_size + 1)
    return np.flatnonzero(targets[np.maximum(hi, lo)] - targets[lo] > 0).astype(np.int64)


def example_spans(examples, usable, block_size: int) -> np.ndarray:
    """(start, end) in the token file of each usable example, cut to block_size + 1 tokens."""
    starts = examples[1]
    return np.stack([starts[usable], np.minimum(starts[usable + 1], starts[usable] + block_size + 1)], axis=1)


def pack_rows(spans: np.ndarray, block_size: int) -> np.ndarray:
    """Where each packed row starts in the examples (rows + 1 offsets): whole examples in order,
    as many as fit in block_size inputs (an example of n tokens takes n - 1)."""
    bounds, used = [0], 0
    for i, n in enumerate(spans[:, 1] - spans[:, 0] - 1):
        if used + n > block_size:
            bounds.append(i)
            used = 0
        used += n
    bounds.append(len(spans))
    return np.asarray(bounds, dtype=np.int64)


def packs_well(examples, block_size: int) -> bool:
    """data.packing=auto: whether the usable examples average at most half a block."""
    spans = example_spans(examples, usable_examples(examples, block_size), block_size)
    return len(spans) > 0 and float(np.mean(spans[:, 1] - spans[:, 0] - 1)) <= block_size / 2


def count_blocks(n_tokens: int, block_size: int, limit: int | None = None, examples=None) -> int:
    """Training rows: blocks of plain tokens, or usable examples of instruction data."""
    if examples is None:
        return num_blocks(n_tokens, block_size, limit)
    n = len(usable_examples(examples, block_size))
    return n if limit is None else min(n, limit)


class BlockLoader:
    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, rank: int = 0,
                 world: int = 1, seed: int = 0, max_blocks: int | None = None,
                 vocab_size: int | None = None, source: str = "the dataset", examples=None, order=None,
                 pack: bool = False):
        self.tokens, self.T, self.B = tokens, block_size, batch_size
        self.order = order  # None: a seeded permutation of all blocks; else order(seed, epoch) gives it
        self.vocab_size, self.source = vocab_size, source
        self.rank, self.world, self.seed = rank, world, seed
        self.examples, self.left_out, self.rows = examples, 0, None
        if examples is None:
            self.n_blocks = num_blocks(len(tokens), block_size, max_blocks)
        else:
            self.usable = usable_examples(examples, block_size)
            self.left_out = len(examples[1]) - 1 - len(self.usable)
            self.spans = example_spans(examples, self.usable, block_size)
            if pack:
                self.rows = pack_rows(self.spans, block_size)  # row r: examples rows[r]..rows[r+1]-1
            n = len(self.usable) if self.rows is None else len(self.rows) - 1
            self.n_blocks = n if max_blocks is None else min(n, max_blocks)
        if self.n_blocks < world:
            raise ValueError("fewer blocks than ranks")
        self.epoch = 0
        self.offset = 0  # blocks of this epoch's permutation already handed out (all ranks)
        self._perm_epoch, self._perm = None, None

    @property
    def global_batch(self) -> int:
        return self.B * self.world

    def batches_per_epoch(self) -> float:
        """Global batches in one pass over the data (a fraction when the last one spans two)."""
        return self.n_blocks / self.global_batch

    def _permutation(self):
        if self._perm_epoch != self.epoch:
            self._perm = self.order(self.seed, self.epoch) if self.order is not None else \
                np.random.default_rng([self.seed, self.epoch]).permutation(self.n_blocks)
            self._perm_epoch = self.epoch
        return self._perm

    def next_indices(self) -> np.ndarray:
        """Block indices of this rank's next batch (moves the position on)."""
        return self.take(self.global_batch)[self.rank:: self.world]

    @property
    def position(self) -> int:
        """Blocks of the stream handed out so far (all ranks, all epochs)."""
        return self.epoch * self.n_blocks + self.offset

    def take(self, need: int) -> np.ndarray:
        """The next `need` block indices of the global stream, for all ranks (moves the position on)."""
        take: list[np.ndarray] = []
        while need:
            chunk = self._permutation()[self.offset: self.offset + need]
            take.append(chunk)
            need -= len(chunk)
            self.offset += len(chunk)
            if self.offset >= self.n_blocks:  # this epoch is used up: the stream goes on
                self.epoch, self.offset = self.epoch + 1, 0
        return np.concatenate(take) if take else np.zeros(0, dtype=np.int64)

    def blocks(self, indices) -> torch.Tensor:
        starts = np.asarray(indices, dtype=np.int64) * self.T
        if hasattr(self.tokens, "rows"):  # (a URL's cached shards: each mapped once a batch)
            return self._checked(self.tokens.rows(starts, self.T + 1).astype(np.int64))
        return self._checked(np.stack([self.tokens[s: s + self.T + 1] for s in starts]).astype(np.int64))

    def _checked(self, rows: np.ndarray) -> torch.Tensor:
        if self.vocab_size is not None and rows.size and rows.max() >= self.vocab_size:
            # a hostile or mismatched token file: the embedding would read past the vocabulary
            raise UserError(f"{self.source} holds token id {int(rows.max())}, outside its vocab_size "
                            f"{self.vocab_size} in meta.json; check it with `gptrain data inspect "
                            "--verify` and prepare the dataset again")
        return torch.from_numpy(rows)

    def batch(self, indices):
        """(inputs, targets), each (rows, block_size) int64, of the blocks `indices`; packed,
        (inputs, targets, segments)."""
        if self.examples is None:
            rows = self.blocks(indices)  # (rows, T + 1): inputs and targets overlap in it
            return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        indices = np.asarray(indices, dtype=np.int64)
        x = np.zeros((len(indices), self.T), dtype=np.int64)  # padding: any id (never a target, never seen)
        y = np.full((len(indices), self.T), -100, dtype=np.int64)
        if self.rows is None:
            for row, i in enumerate(indices):
                self._place(x, y, row, 0, i)
            self._checked(x)
            return torch.from_numpy(x), torch.from_numpy(y)
        seg = np.full((len(indices), self.T), -1, dtype=np.int64)
        for row, r in enumerate(indices):
            at = 0
            for n, i in enumerate(range(self.rows[r], self.rows[r + 1])):
                end = self._place(x, y, row, at, i)
                seg[row, at:end], at = n, end
        self._checked(x)
        return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(seg)

    def _place(self, x, y, row: int, at: int, i: int) -> int:
        """Usable example i's inputs and targets into row `row` from column `at`; where it ends."""
        mask = self.examples[0]
        a, b = self.spans[i]
        ids = np.asarray(self.tokens[a:b], dtype=np.int64)
        end = at + len(ids) - 1
        x[row, at:end] = ids[:-1]
        y[row, at:end] = np.where(mask[a + 1: b] > 0, ids[1:], -100)
        return end

    def next_batch(self):
        """(inputs, targets), each (rows, block_size) int64."""
        return self.batch(self.next_indices())

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "offset": self.offset, "seed": self.seed,
                 "n_blocks": self.n_blocks, "block_size": self.T}
        return {**state, "packed": True} if self.rows is not None else state  # (the keys of older states)

    def load_state_dict(self, state: dict) -> None:
        """The position of a saved stream. It is global (no rank or world size in it), so a run
        resumed on another number of data-parallel ranks, with the same global batch, goes on
        with the next unseen blocks."""
        if "n_blocks" not in state or state["n_blocks"] != self.n_blocks or state["block_size"] != self.T \
                or state.get("packed", False) != (self.rows is not None):
            raise ValueError("loader state is for a different dataset, block size or data.packing")
        self.epoch, self.offset, self.seed = state["epoch"], state["offset"], state["seed"]


class ShardOrder:
    """The order of a dataset read from a URL through a bounded cache (data/remote_shards.py): a
    global permutation of all blocks would touch every shard all the time, so each epoch takes a
    seeded permutation of the shards, and within each a seeded permutation of the blocks that
    start in it. It is one global stream like the default order, so the state (epoch, offset) and
    resume on any world size hold. order(seed, epoch): that epoch's permutation of blocks
    0..n_blocks-1 of `starts` (each shard's first token, then the total)."""

    def __init__(self, starts, block_size: int, n_blocks: int):
        starts = np.asarray(starts, dtype=np.int64)
        self.T = block_size
        first = np.minimum(-(-starts // block_size), n_blocks)  # the first block starting in or after each
        # blocks lo..hi lie whole in the shard: the one that would run into the next shard is left
        # out (it would fetch a whole shard for a token, and tie two hosts' shares together)
        whole = np.maximum((starts[1:] - block_size - 1) // block_size + 1, first[:-1])
        self.lo, self.hi = first[:-1], np.minimum(first[1:], np.append(whole[:-1], first[-1]))
        self.n_shards = len(self.lo)
        self.count = int((self.hi - self.lo).sum())  # the blocks of an epoch

    def shard_order(self, seed: int, epoch: int):
        rng = np.random.default_rng([seed, epoch])
        return rng.permutation(self.n_shards), rng

    def __call__(self, seed: int, epoch: int) -> np.ndarray:
        order, rng = self.shard_order(seed, epoch)
        return np.concatenate([self.lo[s] + rng.permutation(self.hi[s] - self.lo[s]) for s in order])

    def reads(self, s: int, tokens) -> list[int]:
        """The shards the blocks of shard s read: its own and, when its last block runs into it, the next."""
        return list(tokens.shards_of(int(self.lo[s]) * self.T, int(self.hi[s] - 1) * self.T + self.T + 1))

    def shard_of(self, block: int) -> int:
        return int(np.searchsorted(self.lo, block, "right") - 1)

    def where(self, seed: int, epoch: int, offset: int):
        """(the epoch's shard order, where each shard's blocks end in the stream, the index in that
        order of the shard holding stream position `offset`)."""
        order, _ = self.shard_order(seed, epoch)
        ends = np.cumsum(self.hi[order] - self.lo[order])
        return order, ends, int(np.searchsorted(ends, offset, "right"))


def make_loader(tokens, *args, hosts: int = 1, **kwargs) -> BlockLoader:
    """A BlockLoader over `tokens`; over a ShardTokens (data/remote_shards.py), a ShardedLoader
    whose `hosts` (of the run's data-parallel ranks, consecutive per host) read their own shares."""
    if getattr(tokens, "remote", False):
        return ShardedLoader(tokens, *args, hosts=hosts, **kwargs)
    return BlockLoader(tokens, *args, **kwargs)


READ_AHEAD_BATCHES = 64  # the next shard is fetched at the latest this many global batches before it is read


class ShardedLoader(BlockLoader):
    """A BlockLoader over a ShardTokens: the shard-grouped order in P partitions, one per host
    that first ran it (data/host_shares.py; P = 1 on one host), each host reading its own; the
    shards of each batch held while it is read, and the next shard of each partition the host
    reads fetched meanwhile."""

    def __init__(self, tokens, *args, hosts: int = 1, **kwargs):
        super().__init__(tokens, *args, **kwargs)
        if self.examples is not None:
            raise ValueError("instruction data is not read from a URL")
        self.order = ShardOrder(tokens.starts, self.T, self.n_blocks)
        self.n_blocks = self.order.count  # (a block across two shards is not read from a URL)
        if self.n_blocks < self.world:
            raise ValueError("fewer blocks than ranks")
        self.hosts = hosts
        self.shares = Partitions(self.order, hosts, lambda: self.seed)
        self.ends_at: int | None = None  # the run's last block (position), when known: nothing read ahead past it
        self.resume_note: str | None = None  # what a loaded state changed in the order, to log

    def take(self, need: int) -> np.ndarray:
        blocks = self.shares.batch(self.position, need)
        self.epoch, self.offset = divmod(self.position + need, self.n_blocks)
        return blocks

    def next_indices(self) -> np.ndarray:
        """This rank's blocks of the next global batch: its host's partitions' (a contiguous
        slice of the batch), dealt to the host's ranks; else every world-th, as on one host."""
        blocks = self.take(self.global_batch)
        if not self.shares.local(self.hosts, self.world):
            return blocks[self.rank:: self.world]
        per_host = self.world // self.hosts
        host, local = divmod(self.rank, per_host)
        mine = blocks.reshape(self.hosts, -1)[host]
        return mine[local:: per_host]

    def batch(self, indices):
        """Hold what this batch and the rest of its shards' blocks read; read this batch (its own
        shards first: a run's first step waits for one shard, never for the read-ahead); then,
        for each partition this host reads, once it is past half of its shard or within
        READ_AHEAD_BATCHES global batches of its end, have the next shard fetched meanwhile (so a
        short run fetches about the shard it trains on, not the ones after it, and a long one
        never waits); never a shard after the run's last block (`ends_at`, set by the trainer)."""
        starts = np.asarray(indices, dtype=np.int64) * self.T
        host = self.rank // max(1, self.world // self.hosts) if self.shares.local(self.hosts, self.world) else 0
        mine = self.shares.owned(host, self.hosts if self.shares.local(self.hosts, self.world) else 1)
        done = self.shares.done(self.position)
        ahead = [self.shares.ahead(p, done) for p in mine if self.shares.length(p)]
        edges = np.searchsorted(self.tokens.starts, np.concatenate([starts, starts + self.T]), "right") - 1
        self.tokens.hold(set(np.unique(edges).tolist())  # (a row's first and last token's shards)
                         | {s for now, *_ in ahead for s in self.order.reads(now, self.tokens)})
        rows = super().batch(indices)
        share = self.global_batch // self.shares.parts
        end = None if self.ends_at is None else self.shares.done(self.ends_at, up=True)  # (in each partition)
        for now, left, size, nxt in ahead:
            if end is not None and done + left >= end:
                continue  # the run ends before the next shard
            if 2 * left <= size or left <= READ_AHEAD_BATCHES * share:
                self.tokens.prefetch(self.order.reads(nxt, self.tokens))
        return rows

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.shares.first > 1:
            state["partitions"] = self.shares.first
        if self.shares.history:
            state["repartitions"] = self.shares.history
        return state

    def load_state_dict(self, state: dict) -> None:
        """As BlockLoader's, and the partitions the run started with (1 in a state without them)
        and its re-partitions; on hosts that cannot each read whole partitions, the stream is
        re-partitioned here, one partition per host (data/host_shares.py), and `resume_note`
        says so."""
        super().load_state_dict(state)
        first, history = int(state.get("partitions", 1)), [[int(a), int(b)] for a, b in state.get("repartitions", [])]
        if (first, history) != (self.shares.first, self.shares.history):
            self.shares = Partitions(self.order, first, lambda: self.seed, history)
        if self.hosts > 1 and self.shares.parts % self.hosts:
            was = self.shares.parts
            self.shares.repartition(self.position, self.hosts)
            self.resume_note = (f"data: the stream's {was} partition(s) re-partitioned into {self.hosts}, one per "
                                f"host, at block {self.position:,} (each host fetches its own share; every block is "
                                "still read once an epoch)")


def notes(loader, block_size: int) -> list[str]:
    """What a run says at its start about how its instruction data is read (any loader)."""
    out = []
    if getattr(loader, "rows", None) is not None:
        out.append(f"instruction data packed: {len(loader.usable):,} examples in {loader.n_blocks:,} rows of "
                   f"{block_size} tokens (data.packing; each example sees only its own tokens)")
    if loader.left_out:
        out.append(f"note: {loader.left_out} example(s) have no completion token within their first "
                   f"{block_size + 1} tokens and are left out (a larger model.block_size keeps them)")
    return out


def open_train_loader(path, block_size: int, batch_size: int, rank: int, world: int, seed: int,
                      max_blocks: int | None, vocab_size: int, packing: bool | None = False,
                      hosts: int = 1) -> BlockLoader:
    """The training stream of one prepared dataset (data.path): its train split as blocks, or
    as examples of instruction data (packed by `packing`: True, False, or None: when they
    average at most half a block); one line when it has fewer rows than ranks."""
    from gptrain.data.formats import open_examples
    from gptrain.data.remote_shards import open_tokens

    tokens = open_tokens(path, "train")
    examples = open_examples(path, "train", len(tokens))  # instruction data, or None
    if count_blocks(len(tokens), block_size, max_blocks, examples) < world:
        what = "examples with a completion token in their first" if examples else "blocks of"
        raise UserError(f"the training split has fewer {what} {block_size} tokens than data-parallel ranks "
                        f"({world}); use more data or another model.block_size")
    pack = examples is not None and (packing or (packing is None and packs_well(examples, block_size)))
    loader = make_loader(tokens, block_size, batch_size, rank, world, seed=seed, max_blocks=max_blocks,
                         vocab_size=vocab_size, source=f"dataset {path}", examples=examples, pack=pack,
                         hosts=hosts)
    if loader.n_blocks < world:
        raise UserError(f"the training split packs into {loader.n_blocks} row(s) of {block_size} tokens, "
                        f"fewer than data-parallel ranks ({world}); use more data or data.packing=false")
    return loader


def eval_batches(tokens: np.ndarray, block_size: int, batch_size: int, rank: int = 0,
                 world: int = 1, max_blocks: int | None = None, vocab_size: int | None = None,
                 source: str = "the dataset", examples=None):
    """The validation blocks in order, dealt to ranks like training batches (no shuffle)."""
    n = count_blocks(len(tokens), block_size, max_blocks, examples)
    loader = BlockLoader(tokens, block_size, batch_size, rank, world, max_blocks=n,
                         vocab_size=vocab_size, source=source, examples=examples) if n >= world else None
    if loader is None:
        return
    order = np.arange(n)
    for start in range(0, n, loader.global_batch):
        take = order[start: start + loader.global_batch]
        if len(take) < world:
            break
        yield loader.batch(take[rank::world])
