"""A failed job's environment kept (`gptrain run --keep-on-failure [DURATION]`, the local engine):
Baseten's "interactive session on failure". When its last attempt fails, the job's supervisor
moves it to `held` (an active state: its accelerator slots stay claimed, so the queue counts
them) and starts the session shell (jobs/programs/session_shell.py) in the job's own
environment: its code folder, its datasets at /input/NAME, /output-checkpoint as its checkpoint
folder, its --env and --secret. `gptrain session attach NAME` and `session exec NAME -- CMD`
reach it. It ends with `gptrain stop NAME` or after DURATION with nobody attached and no command
running; then the job is `failed`, with the failure it had (a hold is no stop and no success).
"""

from __future__ import annotations

import signal
import subprocess
import time

from gptrain.jobs import folder, launch, procs, store
from gptrain.jobs.logs import agent_log
from gptrain.jobs.programs.session_shell import shell_command

POLL_S = 0.5


def keep(sup, error: str, exit_code: int | None, attempt: int) -> None:
    """Hold the failed job `sup` (a Supervisor) until it is stopped or idle, then record it failed
    with `error` and `exit_code`."""
    name, spec = sup.name, sup.spec
    sup._set(store.JobState.HELD, f"failed ({error}); its environment is kept for `gptrain session attach "
             f"{name}` until `gptrain stop {name}` or {spec.keep_on_failure:g} s unused",
             error=error, exit_code=exit_code)
    env = {**launch.inherited_env(spec), **sup.job_env(attempt)}
    log = agent_log(folder.logs_dir(sup.dir), 0)
    with open(log, "ab") as out:
        out.write(b"--- gptrain: the job failed; its environment is kept (--keep-on-failure)\n")
        out.flush()
        shell = subprocess.Popen(shell_command(sup.dir, spec.keep_on_failure, spec.datasets),
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                 cwd=launch.workdir(spec, sup.dir), start_new_session=True,
                                 preexec_fn=procs.parent_preexec())
    try:
        while shell.poll() is None:
            sup._check_db()
            if sup.signalled or sup._stop_asked():  # `gptrain stop NAME` (or a SIGTERM): its end
                shell.send_signal(signal.SIGTERM)
                try:
                    shell.wait(10)
                except subprocess.TimeoutExpired:
                    shell.kill()
                break
            time.sleep(POLL_S)
    finally:
        if shell.poll() is None:
            shell.kill()
    sup._set(store.JobState.FAILED, error, exit_code=exit_code, error=error)
