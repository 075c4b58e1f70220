import numpy as np
import pytest

from gptrain.data.loader import BlockLoader, eval_batches

T = 8


def _tokens(n_blocks):
    # token value = its position, so a block is identified by its first token
    return np.arange(n_blocks * T + 1, dtype=np.uint16)


@pytest.mark.parametrize("n_blocks, batch", [(40, 4), (37, 3), (16, 8), (5, 4)])
def test_two_ranks_cover_every_block_once_per_epoch_in_full_batches(n_blocks, batch):
    """The epochs form one stream: every batch is full (an epoch's last batch takes the next
    epoch's first blocks), and each epoch's n_blocks blocks are all seen once, by one rank."""
    tokens = _tokens(n_blocks)
    loaders = [BlockLoader(tokens, T, batch, rank=r, world=2, seed=5) for r in range(2)]
    assert loaders[0].batches_per_epoch() == n_blocks / (2 * batch)
    stream = []
    for _ in range(3 * n_blocks):  # 3 * n_blocks global batches = 2 * batch * 3 epochs' blocks
        rows = []
        for loader in loaders:
            x, y = loader.next_batch()
            assert x.shape == (batch, T) and (y == x + 1).all()
            rows.append((x[:, 0] // T).tolist())
        stream += [b for pair in zip(*rows) for b in pair]  # rank r holds every 2nd block
    epochs = [stream[i:i + n_blocks] for i in range(0, len(stream), n_blocks)]
    assert all(sorted(e) == list(range(n_blocks)) for e in epochs)
    assert epochs[0] != epochs[1]  # a new permutation each epoch


def test_resume_continues_with_the_same_batches():
    tokens = _tokens(50)
    straight = BlockLoader(tokens, T, 4, seed=1)
    expected = [straight.next_batch()[0].tolist() for _ in range(20)]
    first = BlockLoader(tokens, T, 4, seed=1)
    got = [first.next_batch()[0].tolist() for _ in range(7)]
    resumed = BlockLoader(tokens, T, 4, seed=1)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next_batch()[0].tolist() for _ in range(13)]
    assert got == expected


def test_eval_batches_are_sequential_and_capped():
    tokens = _tokens(10)
    rows = [x[:, 0].tolist() for x, _ in eval_batches(tokens, T, 3, max_blocks=7)]
    assert sum(rows, []) == [i * T for i in range(7)]
