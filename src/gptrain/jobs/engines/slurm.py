"""The Slurm scheduler: one sbatch script per job, `srun torchrun` on every node.

    gptrain run NAME --scheduler slurm --nodes 4 --accels 8 [--partition P] [--account A]
                [--time T] [--sbatch-arg ARG]... [--dry-run] [-- trainer flags | script.py args]

The script starts one torchrun agent per node (srun, one task per node); the agents meet by c10d
rendezvous on the first node of the allocation, with a rendezvous id unique to the job and its
restart count. $GPTRAIN_HOME (job files, checkpoints) must be on a filesystem every node sees.
There is no supervisor: the CLI reads the job's state from Slurm (scontrol, or sacct when
accounting exists, or the exit code the script leaves behind) and records each transition it sees.

Preemption and time limits: the script asks for SIGUSR1 SIGNAL_GRACE_S before the time limit
(`--signal=B:USR1@120`; not TERM, which a `scancel` also sends) and traps it (srun runs in the
background so the trap runs at once): every task is sent SIGTERM, the trainer saves a checkpoint
at the step it reached and exits, and the script requeues the job (`--requeue`), which continues
from that checkpoint (jobs/engines/slurm_attempt.py decides, and stops requeuing a job whose time limit
ends attempt after attempt before a new checkpoint). Slurm's own preemption (PreemptMode=REQUEUE) signals the tasks and
requeues the job itself. Either is
`preempted`, never `failed` or `succeeded`; `gptrain stop` (a stop request, then SIGTERM to the
tasks) and a user's `scancel` end `stopped`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

from gptrain.errors import UserError
from gptrain.jobs import folder, launch, records, secrets, store
from gptrain.jobs.programs import code
from gptrain.jobs import resume as resume_mod
from gptrain.jobs.logs import agent_log
from gptrain.jobs.store import JobState
from gptrain.jobs.engines import options
from gptrain.jobs.spec import ENV_NAME, JobSpec, check_scheduler_options

# Slurm job state -> gptrain state
S = JobState
STATES = {  # Slurm's job states as gptrain's
    "PENDING": S.QUEUED, "REQUEUE_HOLD": S.QUEUED, "SUSPENDED": S.QUEUED, "CONFIGURING": S.STARTING,
    "RUNNING": S.RUNNING, "COMPLETING": S.RUNNING, "RESIZING": S.RUNNING, "SIGNALING": S.RUNNING,
    "STAGE_OUT": S.RUNNING, "REQUEUED": S.RESTARTING, "REQUEUE_FED": S.RESTARTING,
    "PREEMPTED": S.PREEMPTED, "COMPLETED": S.SUCCEEDED, "CANCELLED": S.STOPPED, "STOPPED": S.STOPPED,
    "FAILED": S.FAILED, "TIMEOUT": S.FAILED, "NODE_FAIL": S.FAILED, "OUT_OF_MEMORY": S.FAILED,
    "BOOT_FAIL": S.FAILED, "DEADLINE": S.FAILED, "SPECIAL_EXIT": S.FAILED, "REVOKED": S.FAILED,
}
PASS_THROUGH = ("NCCL_", "UCX_", "FI_", "GLOO_", "TORCH_", "CUDA_", "HF_", "WANDB_")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")  # such pass-through variables are secrets
DEFAULT_PORT = 29500
SIGNAL_GRACE_S = 120  # SIGUSR1 this long before the time limit (--sbatch-arg=--signal=B:USR1@S overrides)

# What may go into the script's #SBATCH lines (which Slurm parses, but no shell runs): each
# option's form, declared once (jobs/engines/options.py)
OPTION_FORMS = options.forms("slurm")
OPTIONS = options.keys("slurm")


def check_options(opts: dict) -> None:
    """The Slurm options of a job, before they go into a script: one line naming the bad one."""
    check_scheduler_options("slurm", opts, OPTIONS, OPTION_FORMS)
    args = opts.get("sbatch_args") or []
    if not isinstance(args, list):
        raise UserError(f"sbatch_args must be a list of options, got {args!r}")
    for arg in args:
        if not isinstance(arg, str) or not arg.startswith("--") or any(c in arg for c in "\n\r\0"):
            raise UserError(f"--sbatch-arg {arg!r} must be one sbatch option on one line, starting "
                            "with -- (e.g. --sbatch-arg=--exclusive)")
    _check_time_left(opts.get("time"), args)


SLURM_CHECK_S = 30  # slurmctld looks at time limits this often: the signal comes up to this much early
MIN_TRAIN_S = 30  # what an attempt must have, at least, between its start and the time limit's signal


def time_limit_s(value: str) -> int | None:
    """The seconds of a Slurm time (OPTION_FORMS["time"]); None when unlimited."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, dash, rest = value.partition("-") if "-" in value else ("0", "", value)
    parts = [int(p) for p in rest.split(":")]
    if dash:  # D-H, D-H:M, D-H:M:S
        h, m, sec = parts + [0] * (3 - len(parts))
    elif len(parts) == 3:  # H:M:S
        h, m, sec = parts
    else:  # M, M:S
        h, (m, sec) = 0, (parts + [0])[:2]
    return ((int(days) * 24 + h) * 60 + m) * 60 + sec


def signal_lead_s(sbatch_args: list[str]) -> int:
    """How long before the time limit the job's script asks for SIGUSR1: the last --signal=...@S
    of --sbatch-arg (sbatch takes the last one), else SIGNAL_GRACE_S."""
    leads = [m.group(1) for a in sbatch_args for m in [re.fullmatch(r"--signal=\S*@(\d+)", a)] if m]
    return int(leads[-1]) if leads else SIGNAL_GRACE_S


def _check_time_left(time: str | None, sbatch_args: list[str]) -> None:
    """Refuse a --time that leaves no time to train before its own signal: Slurm sends it at its
    first check with less than lead + SLURM_CHECK_S seconds left, and the requeued attempts would
    get it as soon as they start (jobs/engines/slurm_attempt.py ends such a job after 3 of them)."""
    limit = time_limit_s(time) if time else None
    lead = signal_lead_s(sbatch_args)
    if limit is not None and limit - lead - SLURM_CHECK_S < MIN_TRAIN_S:
        least = -(-(lead + SLURM_CHECK_S + MIN_TRAIN_S) // 60)
        raise UserError(f"--time {time} leaves no time to train: Slurm signals the job {lead} s before its "
                        f"time limit (up to {SLURM_CHECK_S} s earlier) to save and requeue it; give --time {least} "
                        f"or more, or a shorter lead with --sbatch-arg=--signal=B:USR1@SECONDS")


def _sbatch_value(value: str) -> str:
    """A value as sbatch reads it from a #SBATCH line: double-quoted (with \\ and \\" escaped)
    when it holds blanks, quotes, backslashes or # (which starts a comment there)."""
    if "\n" in value or "\r" in value:
        raise UserError(f"{value!r} cannot go into an sbatch script: it holds a line break")
    if not re.search(r"[\s\"'\\#]", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pass_through() -> tuple[dict, dict]:
    """This shell's NCCL_*, HF_*, WANDB_*, ... variables for the job: (plain ones, written into
    the script; secret ones, named like *KEY*, *TOKEN*, *SECRET*, *PASSWORD*, kept in the job's
    secrets file like --secret)."""
    found = {k: v for k, v in os.environ.items() if k.startswith(PASS_THROUGH) and ENV_NAME.fullmatch(k)}
    hidden = {k: v for k, v in found.items() if any(w in k.upper() for w in SECRET_WORDS)}
    return {k: v for k, v in found.items() if k not in hidden}, hidden


def _secrets_of(spec: JobSpec) -> dict:
    """What goes into the job's secrets file: --secret values and secret pass-through variables."""
    hidden = {k: v for k, v in pass_through()[1].items() if k not in spec.env}
    return {**hidden, **spec.secrets}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def require(tool: str) -> None:
    if shutil.which(tool) is None:
        raise UserError(f"{tool} is not on PATH: this machine is not a Slurm submit host; install "
                        "Slurm's client tools or use --scheduler local")


def accel_type(spec: JobSpec) -> str:
    """gpu or cpu: as asked, else from the partition's generic resources (gpu when unknown)."""
    asked = spec.slurm.get("accel_type", "auto")
    if asked != "auto":
        return asked
    if shutil.which("sinfo") is None:
        return "gpu"
    cmd = ["sinfo", "-h", "-o", "%G"] + (["-p", spec.slurm["partition"]] if spec.slurm.get("partition") else [])
    return "gpu" if "gpu" in _run(cmd).stdout else "cpu"


def build_script(spec: JobSpec) -> str:
    jdir = folder.job_dir(spec.name)
    logs = folder.logs_dir(jdir)
    s = spec.slurm
    kind = accel_type(spec)
    port = int(s.get("port") or DEFAULT_PORT)
    lines = ["#!/bin/bash", f"# gptrain job {spec.name}: written by `gptrain run --scheduler slurm`",
             f"#SBATCH --job-name={spec.name}", f"#SBATCH --nodes={spec.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    lines.append(f"#SBATCH --gres=gpu:{spec.accels}" if kind == "gpu" else f"#SBATCH --cpus-per-task={spec.accels}")
    for option in options.SLURM:
        if option.sbatch and s.get(option.key):
            lines.append(f"#SBATCH --{option.key}={_sbatch_value(s[option.key])}")
    lines += [f"#SBATCH --output={_sbatch_value(f'{logs}/slurm-%j.out')}", "#SBATCH --open-mode=append",
              "#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{SIGNAL_GRACE_S}"]
    lines += [f"#SBATCH {arg}" for arg in s.get("sbatch_args", [])]
    env = launch.job_env(spec, jdir)
    if kind == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    env.update(pass_through()[0])
    env.update(spec.env)
    lines += ["", "set -uo pipefail", "umask 077"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    if not spec.resume_args:  # sbatch passes this shell's environment on: not another job's
        lines.append(f"unset {resume_mod.ENV}")
    if _secrets_of(spec):  # the values stay in the 0600 file, read when the job starts
        lines.append(f"set -a; . {shlex.quote(str(secrets.path(spec.name)))}; set +a")
    dirs = " ".join(shlex.quote(str(d)) for d in (logs, folder.checkpoints_dir(jdir), folder.output_dir(spec, jdir)))
    lines += [
        'export GPTRAIN_ATTEMPT="${SLURM_RESTART_COUNT:-0}"',
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# the rendezvous host: the first node's address (its name, unless NodeAddr says otherwise)",
        "export HEAD_ADDR=$(scontrol show node \"$HEAD_NODE\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        f"mkdir -p {dirs}",
        'echo "--- gptrain: attempt $GPTRAIN_ATTEMPT, slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (rendezvous $HEAD_ADDR)"',
    ]
    torchrun, prefix = [], ""  # (one process of Python: neither)
    if launch.under_torchrun(spec):
        torchrun = launch.torchrun_args(spec, nnodes="$SLURM_NNODES", endpoint=f"$HEAD_ADDR:{port}",
                                        rdzv_id="$SLURM_JOB_ID-$GPTRAIN_ATTEMPT",
                                        is_host='$([ "$SLURM_NODEID" = 0 ] && echo 1 || echo 0)')
    if launch.meets_by_rendezvous(spec):  # a command, once per node (launch.RENDEZVOUS_VARS)
        rdzv = launch.rendezvous_env("$SLURM_NNODES", "$SLURM_NODEID", spec.accels, "$HEAD_ADDR", port)
        prefix = " ".join(f"export {k}={v};" for k, v in rdzv.items()) + " "
    # the node's process: only the entry command's words are quoted (the rest is ours, with
    # the shell variables of each node expanded by its own bash)
    node = launch.node_command(spec, jdir, torchrun)
    cut = len(node) - len(launch.entry_command(spec, jdir))
    words = [shlex.quote(w) if i < 1 or i >= cut or w == str(logs) else w for i, w in enumerate(node)]
    agent = f"{prefix}cd {shlex.quote(str(launch.workdir(spec, jdir)))} && exec {' '.join(words)}"
    marker, gave_up, stop_file = (shlex.quote(str(p)) for p in (
        folder.slurm_preempted(jdir), folder.slurm_gave_up(jdir), folder.stop_request(jdir)))
    lines += [
        f"rm -f {marker} {gave_up}",
        "# SIGUSR1: the time limit is near (--signal). Every task gets SIGTERM and saves a checkpoint;",
        "# then, unless the user asked for a stop meanwhile, the job is requeued and continues from it",
        'near_limit=""',
        'trap \'near_limit=near-limit; scancel --signal=TERM "$SLURM_JOB_ID"\' USR1',
        f"srun --kill-on-bad-exit=1 --output={shlex.quote(str(agent_log(logs, '%n')))} "
        f"--open-mode=append bash -c {shlex.quote(agent)} &",
        "tasks=$!",
        'wait "$tasks"; rc=$?',
        'while kill -0 "$tasks" 2>/dev/null; do wait "$tasks"; rc=$?; done  # (a trap cut the wait short)',
        f"echo $rc > {shlex.quote(str(folder.slurm_exit(jdir)))}",
        "# requeued after its time limit's signal, or a SIGTERM nobody asked for with `gptrain stop` (an",
        "# admin, an eviction): preempted; not after a time limit that leaves no time for a checkpoint",
        f'if [ ! -e {stop_file} ] && {{ [ -n "$near_limit" ] || [ "$rc" != 0 ]; }} && '
        f'{shlex.quote(sys.executable)} -m gptrain.jobs.engines.slurm_attempt {shlex.quote(str(jdir))} "$rc" $near_limit; then',
        '  [ -e {} ] || scontrol requeue "$SLURM_JOB_ID"'.format(stop_file),
        "fi",
        "exit $rc", ""]
    return "\n".join(lines)


def submit(spec: JobSpec, dry_run: bool = False) -> str | None:
    """Submit (or, with dry_run, only print) the job; returns the Slurm job id."""
    spec.validate()
    check_options(spec.slurm)
    if dry_run:
        with code.staged(spec):  # (what would be snapshotted is checked, and dropped)
            print(build_script(spec), end="")
        return None
    require("sbatch")
    partition = spec.slurm.get("partition")
    if partition and _run(["scontrol", "show", "partition", partition]).returncode != 0:
        known = _run(["sinfo", "-h", "-o", "%R"]).stdout.split()
        raise UserError(f"Slurm partition {partition!r} does not exist (partitions: {', '.join(known) or 'none'})")
    with code.staged(spec) as snapshot:  # the code, before anything is recorded
        return _submit(spec, snapshot)


def _submit(spec: JobSpec, snapshot) -> str:
    jdir = records.create(spec, snapshot, "slurm")  # the record and the folder: all or nothing
    try:
        secrets.save(spec.name, _secrets_of(spec))  # with the passed-through ones (SLURM_*)
        launch.write_config(spec, jdir)
        script = folder.sbatch_script(jdir)
        script.write_text(build_script(spec))
        r = _run(["sbatch", "--parsable", str(script)])
        if r.returncode != 0:
            raise UserError(f"sbatch refused the job: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    except BaseException:
        records.forget(spec.name, jdir)
        raise
    job_id = r.stdout.strip().split(";")[0]
    store.update(spec.name, external_id=job_id)
    with store.transaction() as conn:
        store.add_event(conn, spec.name, "slurm", f"submitted as Slurm job {job_id}")
    return job_id


def resume(name: str) -> str:
    """Submit a failed or stopped job's batch script again (`gptrain resume`): same name, spec,
    code snapshot and folder; the run continues from the job's newest checkpoint, as after a
    requeue. Returns the new Slurm job id."""
    require("sbatch")
    jdir = folder.job_dir(name)
    script = folder.sbatch_script(jdir)
    if not script.is_file():
        raise UserError(f"job {name} has no batch script {script} any more; submit it again with `gptrain run`")
    job = refresh(name)
    store.reopen(name, resume_mod.restart_line(JobSpec.from_dict(job["spec"]), jdir))
    folder.stop_request(jdir).unlink(missing_ok=True)
    for path in (folder.slurm_exit(jdir), folder.slurm_requeues(jdir)):
        path.unlink(missing_ok=True)
    # (--nodes from the record: `gptrain resume --nodes N` may have changed it since the script)
    r = _run(["sbatch", "--parsable", f"--nodes={job['spec']['nodes']}", str(script)])
    if r.returncode != 0:
        reason = f"sbatch refused the job: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
        store.set_state(name, JobState.FAILED, reason, exit_code=job["exit_code"])
        raise UserError(reason)
    job_id = r.stdout.strip().split(";")[0]
    store.update(name, external_id=job_id)
    with store.transaction() as conn:
        store.add_event(conn, name, "slurm", f"submitted again as Slurm job {job_id}")
    return job_id


def query(job_id: str) -> dict | None:
    """{'state', 'reason', 'exit_code'} from scontrol, or sacct for jobs scontrol has forgotten."""
    r = _run(["scontrol", "show", "job", "-o", job_id])
    if r.returncode == 0 and "JobState=" in r.stdout:
        fields = dict(tok.split("=", 1) for tok in r.stdout.split() if "=" in tok)
        return {"state": fields["JobState"], "reason": fields.get("Reason", "None"),
                "exit_code": int(fields.get("ExitCode", "0:0").split(":")[0]),
                "restarts": int(fields.get("Restarts", "0") or 0)}
    if shutil.which("sacct"):
        r = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode,Reason"])
        if r.returncode == 0 and r.stdout.strip():
            state, code, reason = (r.stdout.strip().splitlines()[0].split("|") + ["", ""])[:3]
            return {"state": state.split()[0], "reason": reason or "None",
                    "exit_code": int(code.split(":")[0] or 0)}
    return None


def describe(job: dict) -> str | None:
    """The `inspect` line of an active job: Slurm's own state and reason."""
    if not job["external_id"] or job["state"] in store.TERMINAL:
        return None
    info = query(job["external_id"])
    return info and (f"slurm      job {job['external_id']}: {info['state']}"
                     + (f" (reason: {info['reason']})" if info["reason"] != "None" else ""))


def seen_state(info: dict, was: str) -> tuple[JobState, str]:
    """The gptrain state of what `query` said, and Slurm's words for the event. A job that
    was starting or running and is PENDING with its restarts counted was requeued between two
    looks (a node failed, `scontrol requeue`: Slurm shows REQUEUED only for an instant)."""
    state = STATES.get(info["state"], S.RUNNING)
    said = info["state"] + (f" ({info['reason']})" if info["reason"] not in ("None", "") else "")
    if state == S.QUEUED and was in (S.STARTING, S.RUNNING) and info.get("restarts", 0) > 0:
        return S.RESTARTING, f"requeued the job (restart {info['restarts']}), now {said}"
    return state, said


def refresh(name: str) -> dict:
    """Bring the stored state of a Slurm job up to date; returns the job."""
    job = store.get_job(name)
    if job["state"] in store.TERMINAL or not job["external_id"]:
        return job
    jdir = folder.job_dir(name)
    info = query(job["external_id"])
    if info is None:  # forgotten by Slurm, no accounting: the script's own exit code
        exit_file = folder.slurm_exit(jdir)
        if not exit_file.is_file():
            return job
        code = int(exit_file.read_text().strip() or 1)
        info = {"state": "COMPLETED" if code == 0 else "FAILED", "reason": "None", "exit_code": code}
    state, said = seen_state(info, job["state"])
    if state == S.RESTARTING and folder.slurm_preempted(jdir).is_file():  # the script requeued it
        state, said = S.PREEMPTED, f"{said}: {folder.slurm_preempted(jdir).read_text(errors='replace').strip()[:200]}"
    if folder.stop_request(jdir).is_file():
        state = S.STOPPED if state in store.TERMINAL else (S.STOPPING if state == S.RUNNING else state)
    if state == job["state"]:
        return job
    note, fields = f"Slurm {said}", {}
    if state in (S.FAILED, S.SUCCEEDED, S.STOPPED):
        fields["exit_code"] = info["exit_code"]
    gave_up = folder.slurm_gave_up(jdir)  # its time limit ends every attempt (jobs/engines/slurm_attempt.py)
    if state == S.FAILED and gave_up.is_file():
        fields["error"] = gave_up.read_text(errors="replace").strip()[:400]
    elif state in (S.RESTARTING, S.PREEMPTED):  # a requeue: what the program is given when it starts again
        note = f"{note}: {resume_mod.restart_line(JobSpec.from_dict(job['spec']), jdir)}"
    return records.record_seen(name, job, state, note, fields)


def stop(name: str, timeout: float) -> str:
    """SIGTERM to every task (the trainer saves a checkpoint and exits); scancel after timeout."""
    require("scancel")
    job = refresh(name)
    if job["state"] in store.TERMINAL:
        return job["state"]
    folder.write_stop_request(folder.job_dir(name), timeout)
    job_id = job["external_id"]
    if job["state"] == "queued":
        _run(["scancel", job_id])
    else:
        _run(["scancel", "--signal=TERM", job_id])
        subprocess.Popen(["sh", "-c", f"sleep {float(timeout)}; scancel {shlex.quote(job_id)}"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    store.set_state(name, S.STOPPING, f"SIGTERM sent to every task; scancel after {timeout:.0f}s", engine_job=job_id)
    return store.get_job(name)["state"]
