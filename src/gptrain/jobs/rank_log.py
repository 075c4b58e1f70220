"""Run under torchrun in front of every worker: send the worker's output to logs/rank-R.log.

    torchrun ... -m gptrain.jobs.rank_log LOG_DIR -- python -m gptrain train ...

The global RANK is known only once torchrun has started the worker, so the redirection happens
here, then the real program replaces this process (same pid, so signals reach it directly).
"""

import os
import sys
import time


def main() -> None:
    log_dir, sep, *entry = sys.argv[1:]
    assert sep == "--" and entry, "usage: rank_log LOG_DIR -- PROGRAM ARGS..."
    rank = os.environ.get("RANK", "0")
    fd = os.open(os.path.join(log_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    attempt = os.environ.get("GPTRAIN_ATTEMPT", "0")
    os.write(fd, f"--- gptrain: attempt {attempt}, rank {rank}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.execvp(entry[0], entry)


if __name__ == "__main__":
    main()
