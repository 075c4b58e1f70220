"""The loaders' position is global: a run resumed on another number of data-parallel ranks, with
the same global batch, sees the blocks an uninterrupted run sees (a dataset, and a mix)."""

import pytest

from tests.unit.test_mixture import _mix, _single


def _stream(make, world, batch, accum, steps, state=None):
    """Steps of `world` ranks of `batch` rows, `accum` micro-steps each: per step the sorted
    first tokens of every row all ranks saw; and the (global, same on every rank) state after."""
    loaders = [make(rank=r, world=world, batch=batch) for r in range(world)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    seen = []
    for _ in range(steps):
        rows = []
        for _ in range(accum):
            for loader in loaders:
                rows += loader.next_batch()[0][:, 0].tolist()
        seen.append(sorted(rows))
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states)
    return seen, states[0]


@pytest.mark.parametrize("make", [_single, _mix], ids=["single", "mix"])
@pytest.mark.parametrize("first, then", [((2, 4, 1), (1, 4, 2)), ((1, 8, 1), (2, 2, 2))],
                         ids=["2-ranks-then-1", "1-rank-then-2"])
def test_resumed_on_another_world_size_the_same_blocks_follow(make, first, then):
    """With the same global batch (ranks x rows x micro-steps), a run resumed on another number of
    ranks sees, step by step, the blocks an uninterrupted run sees: none repeated, none skipped."""
    straight, end = _stream(make, *first, steps=30)
    head, state = _stream(make, *first, steps=11)
    tail, resumed_end = _stream(make, *then, steps=19, state=state)
    assert head + tail == straight and resumed_end == end
