"""One launcher for every scheduler: what a job's workers run (the entry command), with which
environment (GPTRAIN_*), under which torchrun arguments, in which directory, and where a stop
request is written. The local supervisor (jobs/engines/supervisor.py) and the Slurm script
(jobs/engines/slurm.py) both build their commands here; jobs/rank_log.py, in front of every worker,
finishes the launch at launch time (GPTRAIN_RESUME_FROM, `$GPTRAIN_*` in arguments, the job's
resume arguments on a restart: jobs/resume.py).

Entrypoints (JobSpec.entry):
    trainer   the built-in trainer (`-- --train.max_steps=100 ...`): torchrun, nproc per node;
              a job of one process (1 node x 1 accel) runs it alone, as `gptrain train` is
    script    a .py file (`-- train.py ARGS`): torchrun, nproc per node; a job of one process
              runs it as `python train.py`, with no RANK, WORLD_SIZE, ...
    module    `-- -m package.module ARGS`: as a script
    command   anything else (`-- bash run.sh`, `-- ./run.sh`, `-- accelerate launch ...`): once per
              node, with the rendezvous environment (RENDEZVOUS_VARS) to start its own workers
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

from gptrain.models.shapes import ALLOW_LARGE
from gptrain.home import home
from gptrain.jobs.folder import (SUBMITTED_CONFIG, checkpoints_dir, code_dir, logs_dir,
                                 output_dir)

ENTRY_KINDS = ("trainer", "script", "module", "command")
# What a command entrypoint (run once per node) gets to start its own workers with.
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE")
# An elastic job's rendezvous waits this long, once MIN nodes are there, for the others (at
# start, and after a node is lost: then the lost node never comes and the rest go on).
ELASTIC_LAST_CALL_S = 10
EXPANDED = re.compile(r"\$(?:\{(GPTRAIN_[A-Z0-9_]*)\}|(GPTRAIN_[A-Z0-9_]*))")


def workdir(spec, jdir: Path) -> Path:
    """Where workers start: the job's code snapshot when it has one (so relative imports and
    paths work), else the job's folder (trainer) or its output folder (other programs)."""
    if spec.code:
        return code_dir(jdir)
    return output_dir(spec, jdir)


def single_process(spec) -> bool:
    """A Python program of one process (1 node x 1 accel): run as `python train.py` is, without
    torchrun, whose RANK/WORLD_SIZE/LOCAL_RANK make programs (nanoGPT, HF Trainer) take the
    distributed path (nanoGPT then asks for NCCL on a CPU machine). The built-in trainer too: an
    agent in front of one worker only cost the job ~3 s of start (its own torch import) and
    memory; gptrain restarts, signals and reads the worker itself either way."""
    return spec.entry in ("trainer", "script", "module") and spec.nodes == 1 and spec.accels == 1


def under_torchrun(spec) -> bool:
    return spec.entry != "command" and not single_process(spec)


def meets_by_rendezvous(spec) -> bool:
    """A command: run once per node, told where to meet (RENDEZVOUS_VARS)."""
    return spec.entry == "command"


def python(spec) -> str:
    """The interpreter of a job's Python entrypoint: gptrain's, or the job's --requirements
    virtualenv layered on it (jobs/programs/code.py)."""
    return spec.python or sys.executable


def entry_command(spec, jdir: Path, python_exe: str | None = None) -> list[str]:
    """What every worker (torchrun) or every node (command) runs. Reads the trainer config from
    jdir (see write_config); nothing is written here. `python_exe`: the interpreter where the
    job runs when it is not this one (a container image's)."""
    if spec.entry == "script":
        return [python_exe or python(spec), spec.script, *spec.args]
    if spec.entry == "module":
        return [python_exe or python(spec), "-m", spec.module, *spec.args]
    if spec.entry == "command":
        return [spec.command, *spec.args]
    cmd = [python_exe or sys.executable, "-m", "gptrain", "train"]
    if spec.config is not None:
        cmd.append(str(jdir / SUBMITTED_CONFIG))
    if spec.datasets and not sets_mix(spec):
        cmd.append(f"--data.path={spec.datasets[0]}")
    return [*cmd, *spec.args, f"--train.output_dir={jdir}"]


def sets_mix(spec) -> bool:
    """Whether a trainer job's config or flags set data.mix: then its datasets are named there,
    and the first one is not also given as data.path (the two are exclusive)."""
    import tomllib

    from gptrain.config_options import canonical_key, split_options

    if spec.config is not None and tomllib.loads(spec.config).get("data", {}).get("mix"):
        return True
    return any(canonical_key(name) == "data.mix" and value for name, value, _ in split_options(spec.args))


def write_config(spec, jdir: Path) -> None:
    """The job's trainer config, where entry_command points the trainer at it."""
    if spec.config is not None and spec.entry == "trainer":
        (jdir / SUBMITTED_CONFIG).write_text(spec.config)


def prepare_dirs(spec, jdir: Path) -> None:
    for d in (logs_dir(jdir), checkpoints_dir(jdir), output_dir(spec, jdir)):
        d.mkdir(parents=True, exist_ok=True)
    write_config(spec, jdir)


def dataset_var(name: str) -> str:
    """The variable naming dataset `name`'s folder in a worker: GPTRAIN_DATASET_<NAME>_DIR."""
    return f"GPTRAIN_DATASET_{re.sub(r'[^A-Z0-9]', '_', name.upper())}_DIR"


def dataset_env(spec) -> dict:
    """GPTRAIN_DATASET_DIR (the first dataset) and GPTRAIN_DATASET_<NAME>_DIR for each."""
    from gptrain.data.store import location_of

    from gptrain.data.object_store import PINS_ENV, pins

    env, pinned, known = {}, {}, pins() if spec.datasets else {}
    for i, name in enumerate(spec.datasets):
        path = location_of(name)  # a folder here, or the URL of one in object storage
        if i == 0:
            env["GPTRAIN_DATASET_DIR"] = path
        env[dataset_var(name)] = path
        if known.get(path):  # (its meta.json's sha256 as pushed: workers anywhere check the store against it)
            pinned[path] = known[path]
    if pinned:
        env[PINS_ENV] = json.dumps(pinned)
    return env


def job_env(spec, jdir: Path) -> dict:
    """The GPTRAIN_* environment every worker of the job gets, on every scheduler (the attempt
    number and the rendezvous are the scheduler's; secrets are added apart, never written)."""
    env = {"GPTRAIN_HOME": str(home()), "GPTRAIN_JOB": spec.name,
           "GPTRAIN_OUTPUT_DIR": str(output_dir(spec, jdir)),
           "GPTRAIN_CHECKPOINT_DIR": str(checkpoints_dir(jdir)), "PYTHONUNBUFFERED": "1",
           **dataset_env(spec)}
    if spec.code:
        env["GPTRAIN_CODE_DIR"] = str(code_dir(jdir))
    if spec.resume_args:  # (schedulers drop one inherited from where gptrain runs: inherited_env)
        from gptrain.jobs import resume

        env[resume.ENV] = spec.resume_args
    if os.environ.get(ALLOW_LARGE):  # the submitter's word that the model is sharded over more
        env[ALLOW_LARGE] = os.environ[ALLOW_LARGE]  # memory than one machine: its workers check again
    if spec.python:  # the job's virtualenv first on PATH (its console scripts: accelerate, its
        # torchrun, ...) and its packages on PYTHONPATH: a program that starts other Pythons itself
        # (torchrun, accelerate launch from gptrain's environment) gives its workers the job's packages
        venv = str(Path(spec.python).parent.parent)
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = f"{venv}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}"
        site = sorted(Path(venv).glob("lib/python*/site-packages"))
        env["PYTHONPATH"] = os.pathsep.join([str(p) for p in site[:1]] + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def inherited_env(spec) -> dict:
    """The environment gptrain runs in, as the workers of a scheduler that passes it on get it:
    without resume arguments that are not this job's (a job submitted from inside another)."""
    from gptrain.jobs import resume

    return {k: v for k, v in os.environ.items() if k != resume.ENV or spec.resume_args}


def rendezvous_env(nnodes, node_rank, nproc, addr, port) -> dict:
    """For a command entrypoint, once per node: what `torchrun --nnodes=$NNODES
    --node-rank=$NODE_RANK --nproc-per-node=$NPROC_PER_NODE --master-addr=$MASTER_ADDR
    --master-port=$MASTER_PORT` (or accelerate's --num_machines/--machine_rank/...) needs.
    WORLD_SIZE is the job's total number of processes (nodes x processes per node)."""
    env = {"MASTER_ADDR": str(addr), "MASTER_PORT": str(port), "NNODES": str(nnodes),
           "NODE_RANK": str(node_rank), "NPROC_PER_NODE": str(nproc)}
    env["WORLD_SIZE"] = str(nnodes * nproc) if isinstance(nnodes, int) else "$((NNODES * NPROC_PER_NODE))"
    return env


def torchrun_args(spec, *, nnodes, endpoint, rdzv_id=None, is_host=None) -> list[str]:
    """torchrun's arguments for one node's agent (no restarts of its own: gptrain restarts).
    Without is_host, a static rendezvous at endpoint: each node's rank is fixed and torchrun
    reads it from PET_NODE_RANK (Kubernetes: the pod's completion index)."""
    if getattr(spec, "elastic", False) and is_host is not None:
        # torchrun's elastic form: when a node is lost its workers' collectives fail, the agents
        # left restart their workers (up to one restart per node that can go) and meet again,
        # with whoever is there after ELASTIC_LAST_CALL_S, down to MIN nodes; the trainer
        # resumes from the latest checkpoint, resharded to the smaller world (docs/multi-host.md)
        return [f"--nproc-per-node={spec.accels}", f"--max-restarts={spec.nodes - spec.min_nodes}",
                f"--nnodes={spec.min_nodes}:{spec.nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id={rdzv_id}", f"--rdzv-conf=is_host={is_host},last_call_timeout={ELASTIC_LAST_CALL_S}"]
    cmd = [f"--nproc-per-node={spec.accels}", "--max-restarts=0"]
    if nnodes == 1:
        return [*cmd, "--standalone"]
    if is_host is None:
        return [*cmd, f"--nnodes={nnodes}", "--rdzv-backend=static", f"--rdzv-endpoint={endpoint}"]
    return [*cmd, f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}", f"--rdzv-conf=is_host={is_host}"]


def node_command(spec, jdir: Path, torchrun: list[str], python_exe: str | None = None) -> list[str]:
    """One node's process: torchrun in front of every worker, or the command itself; either way
    behind rank_log, which sends the output to logs/ and finishes the environment. `python_exe`:
    the interpreter where the node runs when it is not this one (a container image's)."""
    logs, entry = str(logs_dir(jdir)), entry_command(spec, jdir, python_exe)
    if under_torchrun(spec):
        return [python_exe or sys.executable, "-m", "torch.distributed.run", *torchrun, "-m",
                "gptrain.jobs.rank_log", logs, "--", *entry]
    return [python_exe or sys.executable, "-m", "gptrain.jobs.rank_log", "--node", logs, "--", *entry]


# ---- at launch time (rank_log, in the worker's own environment) -------------------------------

def expand(args: list[str], env) -> list[str]:
    """`$GPTRAIN_X` / `${GPTRAIN_X}` in arguments replaced by the job's values; other `$NAMES`
    (and unknown GPTRAIN_ ones) are left as typed."""
    def one(m):
        name = m.group(1) or m.group(2)
        return env.get(name, m.group(0))

    return [EXPANDED.sub(one, a) for a in args]


def finish(env: dict, jdir: Path, entry: list[str]) -> tuple[list[str], str]:
    """What only the launch can know, in the worker's own environment: GPTRAIN_RESUME_FROM (the
    latest checkpoint, when a restart, a requeue or `gptrain resume` finds one), `$GPTRAIN_*` in
    the arguments, and the job's resume arguments appended on such a restart (jobs/resume.py).
    Returns the program's argv and a few words on how it resumes, for the log."""
    from gptrain.jobs import found, resume

    latest = found.latest(jdir)
    if latest is not None:
        env["GPTRAIN_RESUME_FROM"] = str(latest)
    else:
        env.pop("GPTRAIN_RESUME_FROM", None)
    extra, _ = resume.words(env.get(resume.ENV), latest)
    said = f", resumes with {shlex.join(extra)}" if extra else \
        f", GPTRAIN_RESUME_FROM={latest}" if latest is not None else ""
    return [*expand(entry, env), *extra], said
