"""`gptrain ARGS` in a process of its own, forked from a server that has imported torch and
gptrain's CLI once (the stdlib's forkserver, preloaded), instead of a new interpreter that
imports them again: each command that loads torch costs ~3 s of CPU less, and the suite runs
hundreds of them on 2 cores.

It is still a process of its own, as `python -m gptrain ARGS` is: its own pid, environment
(the one given, as subprocess.run's env= gives it), working directory, exit code (a signal's
as -N), stdout and stderr captured at the descriptor level, its own signal handlers, os._exit
and atexit. What is shared is only what was imported before the fork, so a command whose
environment differs from the server's in a variable that a library reads while it is imported
(IMPORT_TIME: TORCH*, OMP_*, PYTHONPATH, ...) gets a new interpreter instead, and so does
every command when GPTRAIN_TEST_FRESH=1 (to see the suite pass without the server).
Tests where the command line itself is what is tested (`python -m gptrain`, the installed
script, what /proc says of the process) start it with subprocess themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading

PRELOAD = ["torch", "gptrain.cli", "gptrain.train.trainer", "gptrain.jobs.api"]
# Variables that what PRELOAD imports (torch, numpy, the interpreter itself, coverage) reads while
# it is imported. The Hugging Face libraries read theirs (HF_HUB_OFFLINE, HF_HOME, ...) when they
# are imported too, so they are kept out of PRELOAD: each command imports them itself, with its
# own environment (tests/unit/test_cli_process.py checks that the preload leaves them out).
IMPORT_TIME = ("TORCH", "PYTORCH", "OMP_", "MKL", "KMP_", "CUDA", "NCCL", "GLOO", "TRITON", "LD_",
               "PYTHON", "COVERAGE")
# ...and torch's compiler, imported (reading TORCHINDUCTOR_*/TORCHDYNAMO_*) only by what compiles:
# inductor even sets TORCHINDUCTOR_CACHE_DIR in the process that compiled, the tests' own included.
LAZY = ("TORCHINDUCTOR", "TORCHDYNAMO")
NOT_PRELOADED = ("huggingface_hub", "transformers", "datasets", "tokenizers", "peft", "accelerate",
                 "torch._dynamo", "torch._inductor")
WRITE_THROUGH = "PYTHONUNBUFFERED"  # set in the child itself (its streams are the server's)

_server: dict = {}  # the forkserver context and the environment it was started with
_lock = threading.Lock()


def run(args: list[str], env: dict, cwd=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`python -m gptrain *args` with environment `env` in `cwd`: a CompletedProcess (text)."""
    args = [str(a) for a in args]
    if os.environ.get("GPTRAIN_TEST_FRESH") or _reads_at_import(env, _context(env)["env"]):
        return subprocess.run([sys.executable, "-m", "gptrain", *args], capture_output=True, text=True,
                              env=env, cwd=cwd, timeout=timeout)
    umask = os.umask(0o022)
    os.umask(umask)
    with tempfile.TemporaryDirectory(prefix="gptrain-cli-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        child = _server["ctx"].Process(target=_child, args=(args, env, str(cwd or os.getcwd()), umask, out, err))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["gptrain", *args], timeout, _read(out), _read(err))
        return subprocess.CompletedProcess(["gptrain", *args], child.exitcode, _read(out), _read(err))


def _reads_at_import(env: dict, started: dict) -> bool:
    """Whether `env` differs from the server's in a variable some library reads when imported."""
    changed = {k for k in set(env) | set(started) if env.get(k) != started.get(k)} - {WRITE_THROUGH}
    return any(k.upper().startswith(IMPORT_TIME) and not k.upper().startswith(LAZY) for k in changed)


def _context(env: dict) -> dict:
    """The forkserver, started (once) with the environment of the first command that asks."""
    with _lock:
        if "ctx" not in _server:
            import multiprocessing
            from multiprocessing import forkserver

            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(env)
            try:
                forkserver.ensure_running()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            _server.update(ctx=ctx, env=dict(env))
    return _server


def _read(path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except FileNotFoundError:  # killed before it opened its streams
        return ""


def _child(args, env, cwd, umask, out_path, err_path):
    """In the forked process: become `python -m gptrain ARGS` and leave as its interpreter would."""
    import atexit
    import traceback

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.umask(umask)
    for path, flags, target in ((os.devnull, os.O_RDONLY, 0), (out_path, os.O_WRONLY | os.O_CREAT, 1),
                                (err_path, os.O_WRONLY | os.O_CREAT, 2)):
        fd = os.open(path, flags, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    if env.get(WRITE_THROUGH):
        sys.stdout.reconfigure(write_through=True)
    sys.argv = [os.path.join(os.path.dirname(sys.modules["gptrain"].__file__), "__main__.py"), *args]
    code = 1
    try:
        from gptrain.cli import main

        code = main(args)
    except SystemExit as e:
        code = e.code
    except BaseException:  # as the interpreter prints an uncaught exception
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()  # the interpreter's exit: its threads joined, then atexit
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_ranks(args: list[str], env: dict, nproc: int, cwd=None, timeout: float | None = None):
    """`torchrun --standalone --nproc-per-node=NPROC -m gptrain ARGS` with its ranks forked from
    the server, as PyTorch's own distributed tests start theirs (MultiProcessTestCase): each rank a
    process of its own with the environment torchrun gives a worker (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR/PORT, TORCHELASTIC_*), meeting the others over gloo at a free port; the first rank
    that fails ends the others, as torchrun's agent does. A CompletedProcess: the ranks' output,
    rank by rank, and torchrun's exit code (0, or 1 when a rank failed: its own code is in
    `rank_codes`). The agent itself is what this leaves out: the tests of torchrun's part (its
    report, a killed agent, restarts) start it for real, as do the jobs' supervisors."""
    import socket
    import time
    import uuid
    from multiprocessing.connection import wait

    args = [str(a) for a in args]
    if os.environ.get("GPTRAIN_TEST_FRESH") or _reads_at_import(env, _context(env)["env"]):
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={nproc}", "-m", "gptrain", *args], capture_output=True,
                              text=True, env=env, cwd=cwd, timeout=timeout)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_id = uuid.uuid4().hex
    umask = os.umask(0o022)
    os.umask(umask)
    with tempfile.TemporaryDirectory(prefix="gptrain-ranks-") as tmp:
        ranks, paths = [], []
        for rank in range(nproc):
            rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                        "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
                        "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
                        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False"}
            out, err = os.path.join(tmp, f"out-{rank}"), os.path.join(tmp, f"err-{rank}")
            paths.append((out, err))
            ranks.append(_server["ctx"].Process(target=_child, args=(args, rank_env, str(cwd or os.getcwd()), umask,
                                                                      out, err)))
        for p in ranks:
            p.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(p.exitcode is None for p in ranks):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                _end(ranks, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["torchrun", *args], timeout, *_joined(paths))
            wait([p.sentinel for p in ranks if p.exitcode is None], left)
            if any(p.exitcode not in (None, 0) for p in ranks):  # torchrun: the others are ended
                _end(ranks, signal.SIGTERM)
        codes = [p.exitcode for p in ranks]
        done = subprocess.CompletedProcess(["torchrun", *args], 0 if not any(codes) else 1, *_joined(paths))
        done.rank_codes = codes
        return done


def _end(ranks, sig) -> None:
    for p in ranks:
        if p.exitcode is None:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
    for p in ranks:
        p.join(30)
        if p.exitcode is None:
            p.kill()
            p.join()


def _joined(paths) -> tuple[str, str]:
    return "".join(_read(o) for o, _ in paths), "".join(_read(e) for _, e in paths)
