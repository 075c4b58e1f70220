"""Run under torchrun in front of every worker: send the worker's output to logs/rank-R.log.

    torchrun ... -m gptrain.jobs.rank_log LOG_DIR -- python -m gptrain train ...
    python -m gptrain.jobs.rank_log --node LOG_DIR -- bash run.sh ...   (a command, once per node:
        its output goes to the log of the node's first rank, NODE_RANK x NPROC_PER_NODE; also a
        Python program of one process, with no torchrun: rank 0)

Here, in the worker's own environment, the launch is finished (jobs/launch.py): GPTRAIN_RESUME_FROM
names the latest checkpoint when there is one, `$GPTRAIN_*` written in the arguments are
replaced by their values, and the job's resume arguments are appended on a restart.

The global RANK is known only once torchrun has started the worker, so the redirection happens
here, then the real program replaces this process (same pid, so signals reach it directly).
Before that, the worker asks to die with its torchrun agent (torchrun starts workers in their
own session, so without this a killed agent or supervisor would leave them training on).
"""

import os
import socket
import sys
import time


def main() -> None:
    from pathlib import Path

    from gptrain.jobs.launch import finish
    from gptrain.jobs.logs import rank_log

    argv = sys.argv[1:]
    node = argv[:1] == ["--node"]
    log_dir, sep, *entry = argv[1:] if node else argv
    assert sep == "--" and entry, "usage: rank_log [--node] LOG_DIR -- PROGRAM ARGS..."
    if node:
        from gptrain.jobs.procs import die_with_parent

        die_with_parent(os.getppid())
        rank = str(int(os.environ.get("NODE_RANK", "0")) * int(os.environ.get("NPROC_PER_NODE", "1")))
    else:
        _die_with_agent()
        rank = os.environ.get("RANK", "0")
    entry, resumes = finish(os.environ, Path(log_dir).parent, entry)
    fd = os.open(rank_log(Path(log_dir), int(rank)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    attempt = os.environ.get("GPTRAIN_ATTEMPT", "0")
    where = f", host {socket.gethostname()}, world {os.environ.get('WORLD_SIZE', '1')}"  # (an elastic job's shrinks)
    os.write(fd, f"--- gptrain: attempt {attempt}, rank {rank}, {time.strftime('%Y-%m-%d %H:%M:%S')}{where}{resumes}\n"
             .encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.execvp(entry[0], entry)


def _die_with_agent() -> None:
    """PR_SET_PDEATHSIG to the agent; exit now if the agent already died (we were reparented)."""
    from gptrain.jobs.procs import die_with_parent

    if not os.path.isdir("/proc"):
        return  # not Linux: no parent-death signal to ask for
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            launched_by_torchrun = b"torch" in f.read()
    except OSError:
        launched_by_torchrun = False
    if not launched_by_torchrun:
        os._exit(137)
    die_with_parent(parent)


if __name__ == "__main__":
    main()
