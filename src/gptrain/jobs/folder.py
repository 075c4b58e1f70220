"""A job's folder, $GPTRAIN_HOME/jobs/NAME: every path inside it is named here (the file names
inside `logs/` are jobs/logs.py's; what checkpoints it holds, jobs/found.py's), and what is
read from it as a whole: the free space of its disk, a stop request.

    NAME/
      job.json             the job's spec (secrets left out)       code/      the code snapshot
      supervisor.log       the local supervisor's own words        output/    a program's GPTRAIN_OUTPUT_DIR
      logs/                rank-R.log, agent-nodeN.log             checkpoints/  GPTRAIN_CHECKPOINT_DIR
      stop-request         a stop asked for (its timeout)          submitted-config.toml, job.sbatch,
      resume-from          the checkpoint `resume --from` chose
                                                                   slurm-exit, slurm-preempted, slurm-gave-up,
                                                                   slurm-requeues.json (Slurm's), kubernetes.yaml
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gptrain import run_layout
from gptrain.home import home

SUBMITTED_CONFIG = "submitted-config.toml"
PROGRAM_OUTPUT = "output"
CHECKPOINT_ROOTS = (run_layout.CHECKPOINTS, PROGRAM_OUTPUT)  # where a job's checkpoints can be
DISK_FULL_BYTES = 2 << 20  # less free than this where a job writes: its disk is full


def jobs_root() -> Path:
    return home() / "jobs"


def job_dir(name: str) -> Path:
    return jobs_root() / name


def logs_dir(jdir: Path) -> Path:
    return jdir / "logs"


def checkpoints_dir(jdir: Path) -> Path:
    return run_layout.checkpoints_dir(jdir)


def code_dir(jdir: Path) -> Path:
    return jdir / "code"


def program_output_dir(jdir: Path) -> Path:
    return jdir / PROGRAM_OUTPUT


def output_dir(spec, jdir: Path) -> Path:
    """GPTRAIN_OUTPUT_DIR: the built-in trainer writes into the job's folder (metrics, config,
    checkpoints/); a user's program gets a folder of its own, apart from gptrain's logs."""
    return jdir if spec.entry == "trainer" else program_output_dir(jdir)


def metrics_files(jdir: Path) -> tuple[Path, Path]:
    """Where a job's metrics.jsonl can be: the built-in trainer's, else its program's."""
    return run_layout.metrics_file(jdir), run_layout.metrics_file(program_output_dir(jdir))


def trainer_config(jdir: Path) -> Path:
    """The config the built-in trainer resolved and ran with."""
    return run_layout.config_file(jdir)


def trainer_run_info(jdir: Path) -> Path:
    """How the built-in trainer runs (precision and why, kernels, MFU basis): run_layout's run.json."""
    return run_layout.run_info_file(jdir)


def spec_file(jdir: Path) -> Path:
    return jdir / "job.json"


def ended_file(jdir: Path) -> Path:
    """How the job ended ({state, message, exit_code, time}), kept beside its files so a database
    made new finds a finished job finished (jobs/store.py writes it with each terminal state)."""
    return jdir / "ended.json"


def supervisor_log(jdir: Path) -> Path:
    return jdir / "supervisor.log"


def sbatch_script(jdir: Path) -> Path:
    return jdir / "job.sbatch"


def kube_manifests(jdir: Path) -> Path:
    """The manifests a Kubernetes job was created from (its Secret's values masked)."""
    return jdir / "kubernetes.yaml"


def slurm_preempted(jdir: Path) -> Path:
    """Written by a Slurm job's batch script when a SIGTERM before the time limit (or a
    preemption) made it requeue the job; removed when the job starts again."""
    return jdir / "slurm-preempted"


def slurm_requeues(jdir: Path) -> Path:
    """The newest checkpoint at a Slurm job's last requeue and how many time-limit requeues in a
    row saw no new one (jobs/engines/slurm_attempt.py)."""
    return jdir / "slurm-requeues.json"


def slurm_gave_up(jdir: Path) -> Path:
    """Why a Slurm job's batch script stopped requeuing it (a time limit that ends every attempt
    before a checkpoint); removed when the job starts again."""
    return jdir / "slurm-gave-up"


def slurm_exit(jdir: Path) -> Path:
    """Where a Slurm job's batch script writes its exit code (read when Slurm forgot the job)."""
    return jdir / "slurm-exit"


def resume_pin(jdir: Path) -> Path:
    """The name of the checkpoint `gptrain resume NAME --from ID` chose (jobs/found.py)."""
    return jdir / "resume-from"


# ---- stop requests ------------------------------------------------------------------------

def stop_request(jdir: Path) -> Path:
    return jdir / "stop-request"


def write_stop_request(jdir: Path, timeout: float) -> None:
    stop_request(jdir).write_text(json.dumps({"timeout": timeout}))


STOP_TIMEOUT_S = 120.0  # a stop's grace before it is forced: `gptrain stop`'s default, the console's


def stop_timeout(jdir: Path, default: float = STOP_TIMEOUT_S) -> float:
    try:
        return float(json.loads(stop_request(jdir).read_text())["timeout"])
    except (OSError, ValueError, KeyError, TypeError):
        return default


# ---- what is in it --------------------------------------------------------------------------


def full_disk_of(job: str) -> str | None:
    """'no space left on device on the disk holding DIR (N KiB free)' when it is full, else None."""
    d = job_dir(job)
    try:
        st = os.statvfs(d if d.is_dir() else home())
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return f"no space left on device on the disk holding {d} ({free // 1024} KiB free)" \
        if free < DISK_FULL_BYTES else None
