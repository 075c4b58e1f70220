"""An interactive session's program: what a session job runs (`gptrain session start`).

It starts one shell on a pseudo-terminal inside a sandbox made by bubblewrap: the machine's own
filesystem, plus the job's datasets, read-only, at the hosted tutorials' literal paths `/input/NAME` and the
job's checkpoint folder at `/output-checkpoint` (so what a script saves there is the session's
checkpoints: listed, fetched and generated from like a job's), in the job's code folder, with
the job's environment and secrets. Nothing is mounted on the machine itself.

It then serves a Unix socket in the job's folder (`session.sock`, 0600): a client's first line
is JSON, {"op": "attach", "rows", "cols"} (the shell's terminal, relayed both ways until the
client leaves) or {"op": "exec", "argv"} (a command run in the same sandbox, its output and then
its exit status sent in frames: b"O" + 4-byte length + bytes, then b"X" + 4-byte status).

The session ends when its shell ends (`exit`: status 0; killed: 128 + the signal, so the job is
`failed`, never a success nobody had), when nobody was attached or running a command for
`--idle-timeout` seconds, or on SIGTERM (`gptrain stop`). Its accelerators are the job's: held
from the queue while it lives, freed when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

SOCKET = "session.sock"
PROGRAM = "gptrain.jobs.programs.session_shell"
SCROLLBACK = 64 << 10  # what the shell printed while nobody was attached, shown at the next attach
HIDDEN_TOP = ("proc", "dev", "input", "output-checkpoint")


def sandbox(datasets: dict, checkpoints: str, cwd: str) -> list[str]:
    """bwrap's arguments: a fresh root holding each top-level entry of this machine's (bound as
    they are), /proc, /dev, /input/NAME for each dataset folder and /output-checkpoint."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    args = [bwrap, "--die-with-parent", "--tmpfs", "/"]
    for entry in sorted(os.listdir("/")):
        if entry in HIDDEN_TOP:
            continue
        path = f"/{entry}"
        args += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--bind", path, path]
    pushed = Path(os.environ.get("GPTRAIN_HOME", "/nonexistent")) / "datasets"
    if pushed.is_dir():  # the pushed datasets where they really are: read-only too (immutable, checksummed)
        args += ["--ro-bind", str(pushed), str(pushed)]
    args += ["--proc", "/proc", "--dev-bind", "/dev", "/dev", "--tmpfs", "/input"]
    for name, folder in datasets.items():  # read-only: a pushed dataset is immutable, its checksums kept
        args += ["--ro-bind", folder, f"/input/{name}"]
    return args + ["--bind", checkpoints, "/output-checkpoint", "--chdir", cwd, "--"]


def shell_command(jdir, idle_timeout: float, datasets: list[str], jupyter: bool = False) -> list[str]:
    """The session's shell (jobs/programs/session_shell.py) for the job folder `jdir`, its pushed
    `datasets` at /input/NAME, ending after `idle_timeout` seconds nobody used it; with a Jupyter
    Server (session_jupyter.py) when `jupyter`."""
    from gptrain.data.object_store import url_of
    from gptrain.data.store import path_of

    folders = []
    for name in datasets:
        if not url_of(name):  # (a dataset in object storage is read by its URL, not at /input)
            folders += ["--dataset", f"{name}={path_of(name)}"]
    return [sys.executable, "-m", PROGRAM, "--job-dir", str(jdir), "--idle-timeout", str(idle_timeout), *folders,
            *(["--jupyter"] if jupyter else [])]


def _send_frame(conn, kind: bytes, data: bytes) -> None:
    conn.sendall(kind + struct.pack(">I", len(data)) + data)


class Session:
    def __init__(self, jdir: Path, datasets: dict, idle_timeout: float):
        self.jdir, self.idle_timeout = jdir, idle_timeout
        self.box = sandbox(datasets, os.environ["GPTRAIN_CHECKPOINT_DIR"], os.getcwd())
        self.jupyter = None  # session_jupyter.Jupyter, with --jupyter
        self.client = None  # the attached terminal
        self.execs = {}  # socket -> its command's process
        self.scrollback = b""
        self.last_active = time.time()

    def start_shell(self) -> None:
        import fcntl
        import termios

        self.master, slave = os.openpty()
        shell = os.environ.get("SHELL") or "/bin/bash"
        if not os.path.exists(shell):
            shell = "/bin/sh"

        def own_terminal():
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        self.shell = subprocess.Popen([*self.box, shell, "-i"], stdin=slave, stdout=slave, stderr=slave,
                                      preexec_fn=own_terminal, close_fds=True)
        os.close(slave)

    def listen(self) -> None:
        here = os.getcwd()
        os.chdir(self.jdir)  # (a relative name: a socket path may not exceed 107 bytes)
        try:
            if os.path.exists(SOCKET):
                os.unlink(SOCKET)
            self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)
            try:
                self.server.bind(SOCKET)
            finally:
                os.umask(old)
            self.server.listen(8)
        finally:
            os.chdir(here)

    def run(self) -> int:
        while True:
            status = self.shell.poll()
            if status is not None:
                self._drain_pty()
                # (bwrap gives its child's status, and 128 + the signal that killed it)
                return -status + 128 if status < 0 else status
            for sock, proc in list(self.execs.items()):
                if proc.poll() is not None:
                    self._finish_exec(sock, proc)
            used = self.jupyter.last_activity() if self.jupyter else None
            if used is not None:
                self.last_active = max(self.last_active, used)
            if self.client is None and not self.execs and time.time() - self.last_active > self.idle_timeout:
                print(f"session: idle for {self.idle_timeout:.0f} s (nobody attached, no command running): "
                      "ending it", flush=True)
                self._end_shell()
                return 0
            watched = [self.server, self.master] + ([self.client] if self.client else []) + \
                [p.stdout for p in self.execs.values()]
            ready, _, _ = select.select(watched, [], [], 0.5)
            for r in ready:
                if r is self.server:
                    self._accept()
                elif r is self.master:
                    self._from_shell()
                elif r is self.client:
                    self._from_client()
                else:
                    self._from_exec(r)

    def _accept(self) -> None:
        conn, _ = self.server.accept()
        conn.settimeout(10)
        try:
            line = b""
            while not line.endswith(b"\n") and len(line) < 65536:
                chunk = conn.recv(1)
                if not chunk:
                    break
                line += chunk
            request = json.loads(line or b"{}")
        except (OSError, ValueError):
            conn.close()
            return
        conn.settimeout(None)
        self.last_active = time.time()
        if request.get("op") == "attach":
            if self.client is not None:
                conn.sendall(b"gptrain: another terminal is attached to this session\r\n")
                conn.close()
                return
            self._resize(request.get("rows"), request.get("cols"))
            self.client = conn
            if self.scrollback:
                conn.sendall(self.scrollback)
                self.scrollback = b""
        elif request.get("op") == "exec" and isinstance(request.get("argv"), list) and request["argv"]:
            argv = [str(a) for a in request["argv"]]
            try:
                proc = subprocess.Popen([*self.box, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
            except OSError as e:
                _send_frame(conn, b"O", f"gptrain: cannot run {argv[0]}: {e.strerror}\n".encode())
                _send_frame(conn, b"X", struct.pack(">i", 127))
                conn.close()
                return
            proc.conn = conn
            self.execs[conn] = proc
        else:
            conn.close()

    def _resize(self, rows, cols) -> None:
        import fcntl
        import termios

        if isinstance(rows, int) and isinstance(cols, int) and 0 < rows < 10000 and 0 < cols < 10000:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def _from_shell(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:
            data = b""
        if not data:
            return
        if self.client is not None:
            try:
                self.client.sendall(data)
                return
            except OSError:
                self._detach()
        self.scrollback = (self.scrollback + data)[-SCROLLBACK:]

    def _from_client(self) -> None:
        try:
            data = self.client.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._detach()
            return
        self.last_active = time.time()
        os.write(self.master, data)

    def _detach(self) -> None:
        self.client.close()
        self.client = None
        self.last_active = time.time()

    def _from_exec(self, pipe) -> None:
        sock = next(s for s, p in self.execs.items() if p.stdout is pipe)
        data = os.read(pipe.fileno(), 65536)
        if data:
            try:
                _send_frame(sock, b"O", data)
            except OSError:
                pass

    def _finish_exec(self, sock, proc) -> None:
        rest = proc.stdout.read()
        try:
            if rest:
                _send_frame(sock, b"O", rest)
            code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
            _send_frame(sock, b"X", struct.pack(">i", code))
        except OSError:
            pass
        sock.close()
        del self.execs[sock]
        self.last_active = time.time()

    def _drain_pty(self) -> None:
        try:
            while select.select([self.master], [], [], 0)[0]:
                data = os.read(self.master, 65536)
                if not data:
                    break
                if self.client is not None:
                    self.client.sendall(data)
        except OSError:
            pass

    def _end_shell(self) -> None:
        if self.jupyter is not None:
            self.jupyter.stop()
        for sig in (signal.SIGHUP, signal.SIGKILL):
            if self.shell.poll() is None:
                os.killpg(self.shell.pid, sig)
                try:
                    self.shell.wait(5)
                except subprocess.TimeoutExpired:
                    continue


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gptrain-session")
    p.add_argument("--job-dir", required=True)
    p.add_argument("--dataset", action="append", default=[], metavar="NAME=FOLDER")
    p.add_argument("--idle-timeout", type=float, default=3600.0)
    p.add_argument("--jupyter", action="store_true", help="a Jupyter Server in the sandbox too (session_jupyter.py)")
    args = p.parse_args(argv)
    datasets = dict(d.split("=", 1) for d in args.dataset)
    at_input = {folder: f"/input/{name}" for name, folder in datasets.items()}
    for key, value in list(os.environ.items()):  # GPTRAIN_DATASET_DIR, GPTRAIN_DATASET_<NAME>_DIR: /input/NAME
        if key.startswith("GPTRAIN_DATASET") and value in at_input:
            os.environ[key] = at_input[value]
    # the interpreter gptrain runs on, first on PATH: its python, torchrun and gptrain, as a job's
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    session = Session(Path(args.job_dir), datasets, args.idle_timeout)
    session.start_shell()
    if args.jupyter:
        from gptrain.jobs.programs.session_jupyter import Jupyter

        session.jupyter = Jupyter(session.box, Path(args.job_dir), os.getcwd())
        deadline = time.time() + 120
        while not session.jupyter.ready():
            if session.jupyter.proc.poll() is not None or time.time() > deadline:
                print("session: the Jupyter Server did not start (its log: jupyter.log in the job folder)",
                      flush=True)
                session._end_shell()
                return 1
            time.sleep(0.2)
    session.listen()

    def stop(signum, frame):
        session._end_shell()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    print(f"session ready: {len(datasets)} dataset(s) at /input, checkpoints at /output-checkpoint; "
          f"`gptrain session attach {os.environ.get('GPTRAIN_JOB', '')}`", flush=True)
    try:
        return session.run()
    finally:
        if session.jupyter is not None:
            session.jupyter.stop()
        try:
            os.unlink(Path(args.job_dir) / SOCKET)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
