"""Which rank failed first across nodes, read from the agents' logs as torchrun writes them
(jobs/logs.py): what a Ray (or any multi-node) job reports when one rank is killed outright and
the other node's ranks then fail on the closed connection."""

import pytest

from gptrain.jobs.logs import agent_log, failed_rank

ROOT = """--- gptrain: attempt 0, node {node}: torchrun ...
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_09:46:{second:02d}
  host      : localhost
  rank      : {rank} (local_rank: 0)
  exitcode  : {code} (pid: 4242)
"""


def agents(tmp_path, *failures):
    for node, (rank, code, second) in enumerate(failures):
        agent_log(tmp_path, node).write_text(ROOT.format(node=node, rank=rank, code=code, second=second))
    return tmp_path


@pytest.mark.parametrize("gap", [0, 3])
def test_a_rank_killed_outright_is_the_cause_not_the_other_nodes_connection_error(tmp_path, gap):
    # node 0's rank 0 fails on the closed connection in the same second (gap 0) or later
    assert failed_rank(agents(tmp_path, (0, 1, 37 + gap), (1, -9, 37)), 1) == (1, -9)


def test_an_earlier_error_is_the_cause_and_a_teardown_never_is(tmp_path):
    assert failed_rank(agents(tmp_path, (0, 1, 36), (1, -9, 37)), 1) == (0, 1)
    assert failed_rank(agents(tmp_path, (0, 1, 40), (1, -15, 37)), 1) == (0, 1)
