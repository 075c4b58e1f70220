"""What runs on each node of a Ray job: one actor per placement-group bundle (jobs/engines/ray_supervisor.py
makes them), owning that node's torchrun agent as a subprocess.

The agent is the same per-node command as on one machine and on Slurm (jobs/launch.py), started
in the job's folder on the shared filesystem, its output appended to logs/agent-nodeN.log there
(rank_log writes the ranks' logs beside it). It is started in its own session and dies with the
actor (PR_SET_PDEATHSIG, set in the child before it execs the command), so killing the actor
(or the supervisor, the actor's owner) takes the whole tree; `kill` also ends every process of
the node tagged with the job's run id.

Imports only the standard library and jobs/procs.py: Ray unpickles this class on every node.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from gptrain.jobs import procs

DIE_WITH_PARENT = ("import os, sys\nfrom gptrain.jobs.procs import die_with_parent\n"
                   "die_with_parent(int(sys.argv[1]))\nos.execvp(sys.argv[2], sys.argv[2:])")


class NodeAgent:
    def __init__(self, run_id: str):
        self.run_id = run_id
        self.proc: subprocess.Popen | None = None
        self.signaled: set[int] = set()  # workers already asked to stop (once each)

    def where(self) -> dict:
        """This node as Ray knows it: its address (the rendezvous host when it is node 0)."""
        import ray

        return {"ip": ray.util.get_node_ip_address(), "host": socket.gethostname(),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                "node_id": ray.get_runtime_context().get_node_id()}

    def free_port(self) -> int:
        """A TCP port free on this node, for the rendezvous it hosts (node 0)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, cmd: list[str], env: dict, cwd: str, log: str, header: bytes) -> int:
        """Start this node's agent: this node's environment with the job's on top (`env`)."""
        self._end_agent()  # the previous attempt's, if any (its node's leftovers: end_attempt)
        self.signaled = set()
        with open(log, "ab") as out:
            out.write(header)
            out.flush()
            # no preexec_fn in a process with threads (Ray's): the agent sets PR_SET_PDEATHSIG
            # itself, through a first exec, then becomes the node's command
            self.proc = subprocess.Popen([sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), *cmd],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         env={**os.environ, **env}, cwd=cwd, start_new_session=True)
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def signal_workers(self, sig: int, under_torchrun: bool) -> None:
        """Ask the workers to stop: the agent's children under torchrun (so they save and exit
        0 while the agent sees them finish), else the command itself."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = procs.children({self.proc.pid}) if under_torchrun else [self.proc.pid]
        procs.signal_once(pids, sig, self.signaled)

    def kill(self) -> int:
        """SIGKILL the agent's process group and every process of the job on this node."""
        self._end_agent()
        return procs.kill_run(self.run_id)

    def _end_agent(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def sees(self, path: str, token: str) -> bool:
        return sees(path, token)


def sees(path: str, token: str) -> bool:
    """Whether this node reads `token` in `path` (the job folder is shared)."""
    try:
        with open(path) as f:
            return f.read() == token
    except OSError:
        return False
