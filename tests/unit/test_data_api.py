"""gptrain.data.api.TokenBlocks in one process (tests/distributed/test_data_api.py: under torchrun)."""

import pytest

from gptrain.data.api import TokenBlocks
from gptrain.data.loader import BlockLoader
from gptrain.data.formats import open_split
from gptrain.errors import UserError
from tests.helpers import make_dataset


def test_rank_and_world_from_the_environment(data, monkeypatch):
    monkeypatch.setenv("RANK", "1"), monkeypatch.setenv("WORLD_SIZE", "2")
    blocks = TokenBlocks(str(data), block_size=16, batch_size=2, seed=3)
    assert (blocks.rank, blocks.world) == (1, 2)
    trainer_loader = BlockLoader(open_split(data, "train"), 16, 2, rank=1, world=2, seed=3)
    x, y = next(iter(blocks))
    tx, ty = trainer_loader.next_batch()  # the trainer's loader: the same batches, the same state
    assert x.tolist() == tx.tolist() and y.tolist() == ty.tolist()
    assert blocks.state_dict() == trainer_loader.state_dict()


def test_the_iterable_dataset_is_the_same_stream(data):
    from torch.utils.data import DataLoader

    a = TokenBlocks(str(data), block_size=16, batch_size=3, rank=0, world=1)
    b = TokenBlocks(str(data), block_size=16, batch_size=3, rank=0, world=1)
    via_loader = [x.tolist() for _, (x, _) in zip(range(4), DataLoader(b.dataset(), batch_size=None))]
    assert via_loader == [x.tolist() for _, (x, _) in zip(range(4), a)]
    assert a.state_dict() == b.state_dict()


def test_a_mix_and_the_mistakes(data, tmp_path):
    (tmp_path / "o").mkdir()
    same = make_dataset(tmp_path / "o")  # the same text: the same character vocabulary
    byte = make_dataset(tmp_path / "o", tokenizer="byte")
    with pytest.raises(UserError, match="another tokenizer"):
        TokenBlocks(mix=f"{data}:1,{byte}:1", block_size=16, rank=0, world=1)
    blocks = TokenBlocks(mix=f"{data}:3,{same}:1", block_size=16, batch_size=4, rank=0, world=1)
    assert next(iter(blocks))[0].shape == (4, 16) and "mix" in blocks.state_dict()
    with pytest.raises(UserError, match="another dataset"):
        blocks.load_state_dict(TokenBlocks(str(data), block_size=16, rank=0, world=1).state_dict())
    with pytest.raises(UserError, match="a dataset or a mix"):
        TokenBlocks(block_size=16)
    (tmp_path / "corpus.txt").write_text("text, not a prepared dataset\n")
    with pytest.raises(UserError, match="not a prepared dataset"):
        TokenBlocks(str(tmp_path / "corpus.txt"), block_size=16)
