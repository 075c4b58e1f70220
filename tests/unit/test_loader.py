import numpy as np
import pytest

from gptrain.data.loader import BlockLoader, eval_batches

T = 8


def _tokens(n_blocks):
    # token value = its position, so a block is identified by its first token
    return np.arange(n_blocks * T + 1, dtype=np.uint16)


@pytest.mark.parametrize("n_blocks, batch", [(40, 4), (37, 3), (16, 8)])
def test_two_ranks_cover_every_block_once_per_epoch(n_blocks, batch):
    tokens = _tokens(n_blocks)
    loaders = [BlockLoader(tokens, T, batch, rank=r, world=2, seed=5) for r in range(2)]
    steps = loaders[0].batches_per_epoch()
    dropped = n_blocks % (2 * batch) if n_blocks % (2 * batch) < 2 else 0
    orders = []
    for epoch in range(3):
        seen = []
        for _ in range(steps):
            for loader in loaders:
                x, y = loader.next_batch()
                assert x.shape[1] == T and (y == x + 1).all()
                seen += (x[:, 0] // T).tolist()
        assert len(seen) == len(set(seen)) == n_blocks - dropped
        orders.append(seen)
    assert orders[0] != orders[1]  # a new permutation each epoch


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
