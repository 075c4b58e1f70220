"""What a training run's output folder holds, named once. The built-in trainer writes it
(train.output_dir); a job's folder is its trainer's output folder (jobs/folder.py), and a user's
program's $GPTRAIN_OUTPUT_DIR is read with the same names.

    OUTPUT/
      config.toml      the resolved config the run trained with (train/checkpointing.py)
      metrics.jsonl    one JSON row per logged step (train/metrics.py; jobs/progress.py reads it)
      run.json         how the trainer runs: precision and why, kernels, the MFU basis (`inspect`)
      checkpoints/     step-NNNNNN/ folders and `latest` (weights/layout.py)
"""

from __future__ import annotations

from pathlib import Path

CONFIG = "config.toml"
METRICS = "metrics.jsonl"
RUN_INFO = "run.json"
CHECKPOINTS = "checkpoints"
STEP_PREFIX = "step-"  # checkpoints/step-NNNNNN: one checkpoint (weights/layout.py step_name)
LATEST = "latest"  # checkpoints/latest: the name of the newest complete one (and REMOTE/latest)


def is_step_name(name: str) -> bool:
    """Whether a folder's name is a checkpoint step's (step-N)."""
    return name.startswith(STEP_PREFIX)


def config_file(output_dir) -> Path:
    return Path(output_dir) / CONFIG


def metrics_file(output_dir) -> Path:
    return Path(output_dir) / METRICS


def run_info_file(output_dir) -> Path:
    return Path(output_dir) / RUN_INFO


def checkpoints_dir(output_dir) -> Path:
    return Path(output_dir) / CHECKPOINTS
