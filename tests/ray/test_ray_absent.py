"""`--scheduler ray` where Ray is not installed: one line saying how to get it, nothing recorded.
Runs everywhere (Ray is hidden from the CLI's process, installed or not)."""

import subprocess
import sys

from tests.job_helpers import job_dir, ok
HIDE_RAY = ("import sys; sys.modules['ray'] = None\n"  # `import ray` raises ImportError
            "from gptrain.cli import main; sys.exit(main(sys.argv[1:]))")


def test_without_ray_one_line_exit_2_nothing_recorded(isolated_home):
    r = subprocess.run([sys.executable, "-c", HIDE_RAY, "run", "noray", "--scheduler", "ray", "--nodes", "2",
                        "--", "--train.max_steps=1"], capture_output=True, text=True)
    assert r.returncode == 2, r
    assert r.stderr.strip().splitlines() == ["gptrain: error: --scheduler ray needs Ray on this machine: "
                                             "pip install 'gptrain[ray]'"], r.stderr
    assert "noray" not in ok("jobs") and not job_dir("noray").exists()
