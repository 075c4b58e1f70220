"""--requirements with --repository-url is the repository's own file (a path inside it, read from
the clone); a program that calls torchrun itself in a --requirements job gives its workers the
job's packages, and the job's failure reason is the failing worker's error, not torchrun's
ChildFailedError (jobs/programs/code.py, jobs/launch.py, jobs/logs.py)."""

import json
import os
import sys
from pathlib import Path

import pytest

from gptrain.errors import UserError
from gptrain.jobs.programs.code import read_in_snapshot
from tests.conftest import run_cli
from tests.job_helpers import wait_for
from tests.jobs_code.programs import git_repository, write
from tests.jobs_code.programs import tiny_wheel
WORKER = """
import os, sys, time, tinypkg
rank = int(os.environ["RANK"])
sys.stdout.write(f"worker {rank} tinypkg {tinypkg.VALUE}\\n")  # one write: the two ranks share the log
sys.stdout.flush()
seen = "rank-0-wrote"  # rank 1 fails only after rank 0's line (torchrun then ends rank 0)
if rank == 0:
    open(seen, "w").close()
    time.sleep(120)
else:
    while not os.path.exists(seen):
        time.sleep(0.05)
    raise ValueError(f"boom from worker {rank}")
"""


def test_a_torchrun_wrapper_in_a_repository_job_with_its_requirements(slots, tmp_path):
    wheel = tiny_wheel(tmp_path)
    repo = git_repository(write(tmp_path / "repo", {
        "requirements.txt": f"{wheel}\n", "worker.py": WORKER,
        "run.sh": "torchrun --standalone --nproc-per-node=2 worker.py\n"}))
    here = tmp_path / "here"
    here.mkdir()
    (here / "requirements.txt").write_text("no-such-package-here==0\n")  # the local file is not the job's
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # gptrain's torchrun on PATH, as when its venv is active
    r = run_cli("run", "wrap", "--repository-url", repo, "--requirements", "requirements.txt",
                "--", "bash", "run.sh", cwd=here, env={"PATH": path})
    assert r.returncode == 0, r.stderr
    job = wait_for("wrap")
    log = run_cli("logs", "wrap").stdout
    assert job["state"] == "failed", (job, log)
    assert "worker 0 tinypkg 42" in log and "worker 1 tinypkg 42" in log, log  # torchrun's workers see it
    assert "ValueError: boom from worker 1" in job["error"] and "ChildFailedError" not in job["error"], job
    spec = json.loads(run_cli("inspect", "wrap", "--json").stdout)["spec"]
    assert spec["requirements"] == f"{wheel}\n" and spec["requirements_file"] == "requirements.txt"


@pytest.mark.parametrize("name", ["/etc/hostname", "../requirements.txt", "sub/../../x", "out.txt", "missing.txt"])
def test_a_requirements_path_outside_the_repository_is_refused(tmp_path, name):
    root = tmp_path / "code"
    root.mkdir()
    (tmp_path / "requirements.txt").write_text("x\n")
    (root / "out.txt").symlink_to(tmp_path / "requirements.txt")
    with pytest.raises(UserError, match="inside it|no such file"):
        read_in_snapshot(root, name)


def test_a_repository_requirements_file_is_refused_on_kubernetes_too():
    from gptrain.jobs.engines.kube_manifest import check_options
    from gptrain.jobs.spec import JobSpec

    spec = JobSpec(name="k", scheduler="kubernetes", kubernetes={"image": "img", "volume": "pvc"},
                   repository_url="https://example.com/r.git", requirements_file="requirements.txt",
                   script="train.py")
    with pytest.raises(UserError, match="--requirements cannot be installed on a cluster"):
        check_options(spec)


def test_a_job_files_requirements_beside_a_repository_is_the_repositorys(tmp_path):
    from gptrain.jobs.programs.job_file import from_yaml

    (tmp_path / "job.yaml").write_text("name: y\nrepository_url: https://example.com/r.git\n"
                                       "script: train.py\nrequirements: reqs/gpu.txt\n")
    fields = from_yaml(str(tmp_path / "job.yaml"))  # no local reqs/gpu.txt is read (there is none)
    assert fields["requirements_file"] == "reqs/gpu.txt" and "requirements" not in fields
