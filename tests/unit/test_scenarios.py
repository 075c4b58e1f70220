"""tests/SCENARIOS.md lists every end-to-end scenario of the suite, and only those."""

from pathlib import Path

from tests import scenarios

TESTS = Path(__file__).resolve().parents[1]


def test_every_scenario_has_its_row_and_every_row_its_scenario():
    found, listed = scenarios.found_in(TESTS), scenarios.listed(TESTS / "SCENARIOS.md")
    missing = {k: sorted(v) for k, v in found.items() if k not in listed}
    stale = sorted(k for k in listed if k not in found)
    wrong = {k: (sorted(listed[k]), sorted(v)) for k, v in found.items() if k in listed and listed[k] != v}
    assert not missing, f"scenarios without a row in tests/SCENARIOS.md: {missing}"
    assert not stale, f"rows of tests/SCENARIOS.md without their test: {stale}"
    assert not wrong, f"rows whose `runs` are not what the test runs (listed, found): {wrong}"


PLANTED = '''
from tests.job_helpers import ok, wait_for
from tests.helpers import train

def _long_job(name):
    ok("run", name, "--", "--train.max_steps=3")
    return wait_for(name)

def test_a_job_through_a_helper(slots):
    assert _long_job("x")["state"] == "succeeded"

def test_two_ranks(tmp_path):
    train("--data.path=x", nproc=2)

def test_one_rank_and_a_refusal(tmp_path):
    train("--data.path=x", nproc=1)
    ok("run", "y", "--nodes", "0")
'''


def test_a_planted_scenario_is_found_and_would_be_refused_without_its_row(tmp_path):
    found = scenarios.of_module("integration/test_planted.py", PLANTED)
    assert found == {"integration/test_planted.py::test_a_job_through_a_helper": {"job"},
                     "integration/test_planted.py::test_two_ranks": {"ranks"}}
    table = tmp_path / "SCENARIOS.md"
    table.write_text("| `integration/test_planted.py::test_two_ranks` | ranks | two ranks |\n")
    assert set(found) - set(scenarios.listed(table)) == {"integration/test_planted.py::test_a_job_through_a_helper"}
    assert scenarios.of_module("slurm/test_planted.py", "def test_x(slurm):\n    pass\n") == {
        "slurm/test_planted.py::test_x": {"cluster"}}
