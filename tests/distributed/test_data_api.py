"""gptrain.data.api.TokenBlocks in a user's own script under torchrun (gloo, 2 processes)."""

import json
import subprocess
import sys

import pytest

from gptrain.data.api import TokenBlocks
from tests.helpers import env, make_dataset

pytestmark = pytest.mark.slow  # real multi-process runs

SCRIPT = """
import json, sys
import torch.distributed as dist
from gptrain.data.api import TokenBlocks

data, out, state = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
dist.init_process_group("gloo")
blocks = TokenBlocks(data, block_size=16, batch_size=2, seed=7)  # rank and world from torch.distributed
if state:
    blocks.load_state_dict(json.load(open(state)))
rows = [x.tolist() for _, (x, y) in zip(range(5), blocks)]
json.dump({"rank": blocks.rank, "world": blocks.world, "rows": rows, "state": blocks.state_dict()},
          open(f"{out}/rank{dist.get_rank()}.json", "w"))
dist.destroy_process_group()
"""


def _torchrun(script, *args):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(script), *map(str, args)], capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_two_ranks_split_the_single_process_stream_and_resume_from_its_state(tmp_path):
    data = make_dataset(tmp_path)
    script = tmp_path / "user_train.py"
    script.write_text(SCRIPT)
    alone = TokenBlocks(str(data), block_size=16, batch_size=4, seed=7, rank=0, world=1)
    expected = [x.tolist() for _, (x, _) in zip(range(10), alone)]  # a global batch: 4 rows

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    _torchrun(script, data, first)
    ranks = [json.loads((first / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    for step in range(5):
        a, b = ranks[0]["rows"][step], ranks[1]["rows"][step]
        assert not {tuple(r) for r in a} & {tuple(r) for r in b}  # disjoint
        assert [a[0], b[0], a[1], b[1]] == expected[step]  # together: the one-process batch
    assert ranks[0]["state"] == ranks[1]["state"]  # the position is global
    (tmp_path / "state.json").write_text(json.dumps(ranks[0]["state"]))

    _torchrun(script, data, second, tmp_path / "state.json")
    ranks = [json.loads((second / f"rank{r}.json").read_text()) for r in range(2)]
    for step in range(5):
        a, b = ranks[0]["rows"][step], ranks[1]["rows"][step]
        assert [a[0], b[0], a[1], b[1]] == expected[5 + step]  # the next unseen blocks
