"""A finished multi-rank run leaves no native thread of its process groups behind when gptrain's
train returns (issue #47 row 0). Before, every DeviceMesh kept its gloo groups alive after
destroy_process_group, and their worker threads (pt_gloo_runloop, gloo_tcp_loop) ran on into
the interpreter's finalization, where one that dropped its last collective's tensor took the GIL
of a dying interpreter: a rank of a completed run could exit SIGABRT ("terminate called without
an active exception") and torchrun reported the run failed. The process boundary, the
interpreter's exit under real torchrun, is what this tests; scripts/exit_stress.py counts the
aborts of many such runs under load."""

import re
import subprocess
import sys

import pytest

from tests.helpers import TINY, env

pytestmark = pytest.mark.slow

AFTER_TRAIN = """
import os, sys
from gptrain.cli import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # a thread that ended as we looked
    print(f"rank {os.environ['RANK']} threads after train: {sorted(names)}", flush=True)
    sys.exit(code)
"""


@pytest.mark.parametrize("layout", [[], ["--parallel.dp_shard=1", "--parallel.pp=2"]], ids=["fsdp2", "pp"])
def test_a_finished_two_rank_run_leaves_no_process_group_thread(data, tmp_path, layout):
    script = tmp_path / "after_train.py"
    script.write_text(AFTER_TRAIN)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(script), "train", f"--data.path={data}", f"--train.output_dir={tmp_path / 'out'}",
                        "--train.max_steps=4", "--checkpoint.every=2", "--train.batch_size=4",
                        "--train.do_eval=false", *TINY, *layout],
                       env=env(GPTRAIN_HOME=str(tmp_path / "home")), cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    seen = dict(re.findall(r"rank (\d) threads after train: (\[[^\]]*\])", p.stdout))  # (ranks' lines may interleave)
    assert sorted(seen) == ["0", "1"], p.stdout[-3000:]
    for rank, threads in seen.items():
        assert "gloo" not in threads, (rank, threads)
