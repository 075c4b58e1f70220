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
"""

from __future__ import annotations

import numpy as np
import torch

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


def count_blocks(n_tokens: int, block_size: int, limit: int | None = None, examples=None) -> int:
    """Training rows: blocks of plain tokens, or usable examples of instruction data."""
    if examples is None:
        return num_blocks(n_tokens, block_size, limit)
    n = len(usable_examples(examples, block_size))
    return n if limit is None else min(n, limit)


class BlockLoader:
    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, rank: int = 0,
                 world: int = 1, seed: int = 0, max_blocks: int | None = None,
                 vocab_size: int | None = None, source: str = "the dataset", examples=None):
        self.tokens, self.T, self.B = tokens, block_size, batch_size
        self.vocab_size, self.source = vocab_size, source
        self.rank, self.world, self.seed = rank, world, seed
        self.examples, self.left_out = examples, 0
        if examples is None:
            self.n_blocks = num_blocks(len(tokens), block_size, max_blocks)
        else:
            self.usable = usable_examples(examples, block_size)
            self.left_out = len(examples[1]) - 1 - len(self.usable)
            self.n_blocks = len(self.usable) if max_blocks is None else min(len(self.usable), max_blocks)
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
            self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n_blocks)
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
        return self._checked(np.stack([self.tokens[s: s + self.T + 1] for s in starts]).astype(np.int64))

    def _checked(self, rows: np.ndarray) -> torch.Tensor:
        if self.vocab_size is not None and rows.size and rows.max() >= self.vocab_size:
            # a hostile or mismatched token file: the embedding would read past the vocabulary
            raise UserError(f"{self.source} holds token id {int(rows.max())}, outside its vocab_size "
                            f"{self.vocab_size} in meta.json; check it with `gptrain data inspect "
                            "--verify` and prepare the dataset again")
        return torch.from_numpy(rows)

    def batch(self, indices):
        """(inputs, targets), each (rows, block_size) int64, of the blocks `indices`."""
        if self.examples is None:
            rows = self.blocks(indices)
            return rows[:, :-1], rows[:, 1:]
        mask, starts = self.examples
        x = np.zeros((len(indices), self.T), dtype=np.int64)  # padding: any id (never a target, never seen)
        y = np.full((len(indices), self.T), -100, dtype=np.int64)
        for row, i in enumerate(self.usable[np.asarray(indices, dtype=np.int64)]):
            a, b = starts[i], min(starts[i + 1], starts[i] + self.T + 1)
            ids = np.asarray(self.tokens[a:b], dtype=np.int64)
            x[row, : len(ids) - 1] = ids[:-1]
            y[row, : len(ids) - 1] = np.where(mask[a + 1: b] > 0, ids[1:], -100)
        self._checked(x)
        return torch.from_numpy(x), torch.from_numpy(y)

    def next_batch(self):
        """(inputs, targets), each (rows, block_size) int64."""
        return self.batch(self.next_indices())

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed,
                "n_blocks": self.n_blocks, "block_size": self.T}

    def load_state_dict(self, state: dict) -> None:
        """The position of a saved stream. It is global (no rank or world size in it), so a run
        resumed on another number of data-parallel ranks, with the same global batch, goes on
        with the next unseen blocks."""
        if "n_blocks" not in state or state["n_blocks"] != self.n_blocks or state["block_size"] != self.T:
            raise ValueError("loader state is for a different dataset or block size")
        self.epoch, self.offset, self.seed = state["epoch"], state["offset"], state["seed"]


def open_train_loader(path, block_size: int, batch_size: int, rank: int, world: int, seed: int,
                      max_blocks: int | None, vocab_size: int) -> BlockLoader:
    """The training stream of one prepared dataset (data.path): its train split as blocks, or
    as examples of instruction data; one line when it has fewer of them than ranks."""
    from gptrain.data.formats import open_examples, open_split

    tokens = open_split(path, "train")
    examples = open_examples(path, "train", len(tokens))  # instruction data, or None
    if count_blocks(len(tokens), block_size, max_blocks, examples) < world:
        what = "examples with a completion token in their first" if examples else "blocks of"
        raise UserError(f"the training split has fewer {what} {block_size} tokens than data-parallel ranks "
                        f"({world}); use more data or another model.block_size")
    return BlockLoader(tokens, block_size, batch_size, rank, world, seed=seed, max_blocks=max_blocks,
                       vocab_size=vocab_size, source=f"dataset {path}", examples=examples)


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
