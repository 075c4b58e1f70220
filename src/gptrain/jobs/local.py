"""The local scheduler: jobs on this machine, each watched by a detached supervisor.

`submit` records the job and starts `python -m gptrain.jobs.supervisor NAME` in a new session
(it outlives the CLI and the terminal). The supervisor waits for accelerator slots, runs
torchrun, restarts on failure, and records every transition (jobs/supervisor.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gptrain.errors import UserError
from gptrain.home import home
from gptrain.jobs import store
from gptrain.jobs.spec import JobSpec


def job_dir(name: str) -> Path:
    return home() / "jobs" / name


def local_slots() -> tuple[str, int]:
    """('gpu', n) on a machine with NVIDIA GPUs, else ('cpu', cores); GPTRAIN_LOCAL_SLOTS overrides
    the count. Read without importing torch, so the CLI stays fast."""
    gpus = Path("/proc/driver/nvidia/gpus")
    kind, count = ("gpu", len(list(gpus.iterdir()))) if gpus.is_dir() else ("cpu", os.cpu_count() or 1)
    override = os.environ.get("GPTRAIN_LOCAL_SLOTS") or user_setting("local", "slots")
    return kind, int(override) if override else count


def user_setting(section: str, key: str):
    """A value from $GPTRAIN_HOME/config.toml, or None."""
    import tomllib

    path = home() / "config.toml"
    if not path.is_file():
        return None
    try:
        return tomllib.loads(path.read_text()).get(section, {}).get(key)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {e}") from None


def submit(spec: JobSpec) -> None:
    spec.validate()
    kind, total = local_slots()
    need = spec.nodes * spec.accels
    if need > total:
        raise UserError(f"job needs {spec.nodes} x {spec.accels} = {need} {kind} slots but this "
                        f"machine has {total}; ask for fewer (or set GPTRAIN_LOCAL_SLOTS)")
    store.create_job(spec.name, spec.to_dict(), spec.nodes, spec.accels, "local")
    d = job_dir(spec.name)
    (d / "logs").mkdir(parents=True, exist_ok=True)
    (d / "job.json").write_text(json.dumps(spec.to_dict(), indent=2))
    log = open(d / "supervisor.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "gptrain.jobs.supervisor", spec.name],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                            close_fds=True, env={**os.environ, "GPTRAIN_HOME": str(home())})
    store.update(spec.name, supervisor_pid=proc.pid)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True


def stop(name: str, timeout: float) -> str:
    """Ask a job to stop: graceful (checkpoint, then exit), forced after `timeout` seconds."""
    job = store.get_job(name)
    if job["state"] in store.TERMINAL:
        return job["state"]
    (job_dir(name) / "stop-request").write_text(json.dumps({"timeout": timeout}))
    if pid_alive(job["supervisor_pid"]):
        os.kill(job["supervisor_pid"], signal.SIGTERM)
        return "stopping"
    store.set_state(name, "stopped", "stopped (its supervisor was not running)")
    return "stopped"


def checkpoint_id(job: str, name: str) -> str:
    return hashlib.sha1(f"{job}/{name}".encode()).hexdigest()[:12]


def scan_checkpoints(job: str) -> list[dict]:
    """The complete checkpoints in a job's checkpoint directory (built-in trainer or script)."""
    import re

    from gptrain.errors import UserError
    from gptrain.train.checkpoint_files import is_checkpoint_dir, read_state

    root = job_dir(job) / "checkpoints"
    found = []
    if not root.is_dir():
        return found
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or p.name == "latest":
            continue
        entry = {"id": checkpoint_id(job, p.name), "name": p.name, "path": str(p), "step": None,
                 "train_loss": None, "eval_loss": None, "time": p.stat().st_mtime, "size": _size(p)}
        try:
            state = read_state(p) if is_checkpoint_dir(p) else None
        except UserError:  # listed, step from its name: using it says what is wrong with it
            state = None
        if state is not None:
            entry.update(step=state["step"], train_loss=state.get("train_loss"),
                         eval_loss=state.get("eval_loss"), time=state.get("saved_at", entry["time"]))
        else:
            digits = re.findall(r"\d+", p.name)
            entry["step"] = int(digits[-1]) if digits else None
        found.append(entry)
    return found


def _size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
