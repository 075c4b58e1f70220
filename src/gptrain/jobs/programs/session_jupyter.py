"""A session's Jupyter Server (`gptrain session start NAME --jupyter`): started by the session's
program (session_shell.py) in the same bubblewrap sandbox as its shell (the code folder, the
datasets at /input/NAME, /output-checkpoint, the job's environment), on 127.0.0.1 at a free port,
behind a token of its own, as the console is: its URL and token are written to `jupyter.json` in
the job folder (mode 0600, its owner's only) for `gptrain session start` and `gptrain session
jupyter NAME` to show; the server's own log (`jupyter.log`, 0600) never shows the token (its
display URL is set without it; jupyter_server scrubs tokens from the URLs it logs), and its
runtime files (which hold the token too) stay in the job folder's `jupyter-runtime/`. What the
notebook does keeps the session alive: its last activity (Jupyter's /api/status) counts against
--idle-timeout like a terminal's.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

STATE = "jupyter.json"
LOG = "jupyter.log"
CHECK_EVERY_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Jupyter:
    def __init__(self, box: list[str], jdir: Path, cwd: str):
        self.token, self.port, self.jdir = secrets.token_urlsafe(32), free_port(), jdir
        self.url = f"http://127.0.0.1:{self.port}/"
        old = os.umask(0o177)
        try:
            log = open(jdir / LOG, "ab")
            self.proc = subprocess.Popen(
                [*box, sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1",
                 f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", "--ServerApp.open_browser=False",
                 f"--ServerApp.root_dir={cwd}", f"--ServerApp.custom_display_url={self.url} (token: `gptrain "
                 f"session jupyter {os.environ.get('GPTRAIN_JOB', '')}`)",
                 *(["--allow-root"] if os.geteuid() == 0 else [])],  # (root: the sandbox is the job's, as a job's)
                env={**os.environ, "JUPYTER_TOKEN": self.token, "JUPYTER_RUNTIME_DIR": str(jdir / "jupyter-runtime")},
                stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, start_new_session=True)
            log.close()
            (jdir / STATE).write_text(json.dumps({"url": self.url, "token": self.token, "pid": self.proc.pid}))
        finally:
            os.umask(old)
        self.checked = 0.0

    def ready(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def last_activity(self) -> float | None:
        """When the notebook was last used (Jupyter's own /api/status), at most every 10 s; None
        when not asked now or not answered."""
        if time.time() - self.checked < CHECK_EVERY_S:
            return None
        self.checked = time.time()
        request = urllib.request.Request(self.url + "api/status", headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                stamp = json.loads(r.read()).get("last_activity")
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except (OSError, ValueError, AttributeError, TypeError):
            return None

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
        try:
            (self.jdir / STATE).unlink()
        except OSError:
            pass


def shown(jdir: Path) -> dict | None:
    """{url, token} of the session's running Jupyter Server, or None."""
    try:
        state = json.loads((jdir / STATE).read_text())
        return {"url": str(state["url"]), "token": str(state["token"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None
