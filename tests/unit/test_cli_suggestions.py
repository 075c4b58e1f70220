"""A mistyped option of a gptrain command is one line, exit 2, nothing recorded: the closest
option that command takes, and its own help (was: no suggestion, and `gptrain --help`)."""

from tests.conftest import run_cli
from tests.job_helpers import nothing_recorded


def test_a_mistyped_option_gets_the_commands_closest_and_its_help(isolated_home):
    r = run_cli("run", "x", "--datset", "foo", "--", "--train.max_steps=1")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gptrain run: error: unrecognized arguments: --datset foo (did you mean '--dataset'?) (see gptrain run --help)"]
    nothing_recorded(isolated_home)
    r = run_cli("jobs", "--bogus")
    assert r.returncode == 2 and r.stderr.strip() == \
        "gptrain jobs: error: unrecognized arguments: --bogus (see gptrain jobs --help)"
