"""The detached process that owns one Ray job, on the machine it was submitted from.

    python -m gptrain.jobs.engines.ray_supervisor NAME      (started by `gptrain run --scheduler ray`)

The local supervisor (jobs/engines/supervisor.py) with its agents on the cluster: instead of claiming
slots here it places the job on the cluster (a placement group, one bundle per node,
STRICT_SPREAD) and waits, queued, until Ray has room; then one actor per bundle
(jobs/engines/ray_node.py) starts that node's torchrun agent, which meets the others at node 0's address
as Ray reports it (node 0 hosts the c10d store: --rdzv-conf=is_host=1; it is the bundle on this
supervisor's own node when there is one, so that losing any other host leaves the store, and an
elastic job goes on: jobs/elastic.py). Everything else is the
local supervisor's: polling, the failed node, restarts from the latest checkpoint, stop (SIGTERM
to the workers, SIGKILL after the timeout), owner-token writes. This process is the job's Ray
driver: when it ends, even by kill -9, Ray ends its actors, and with them (PR_SET_PDEATHSIG) the
agents and their workers on every node.
"""

from __future__ import annotations

import signal

from gptrain.jobs import folder, launch
from gptrain.jobs.logs import agent_log
from gptrain.jobs.engines.ray_cluster import connect, resource
from gptrain.jobs.engines.ray_node import NodeAgent
from gptrain.jobs.store import JobState
from gptrain.jobs.engines.supervisor import POLL_S, Supervisor, main


DEAD = -9  # the exit code of a node whose actor died (its host lost)


class RaySupervisor(Supervisor):
    def __init__(self, name: str):
        super().__init__(name)
        self.ray = None
        self.group = None
        self.nodes: list = []  # one NodeAgent actor per bundle, node 0 first
        self.hosts: list[dict] = []  # where each runs (NodeAgent.where)
        self.dead: dict[int, str] = {}  # an elastic job's nodes whose actor died, and Ray's words

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.release()

    def wait_for_slots(self) -> list[int] | None:
        """Place the job on the cluster and wait until Ray has room for it; None if stopped
        meanwhile. The job stays queued while it waits."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        spec, ray_opts = self.spec, self.spec.ray
        self.ray = ray = connect(ray_opts["address"])
        signal.signal(signal.SIGTERM, self._on_sigterm)  # ours, whatever Ray's start installed
        kind = ray_opts.get("accel_type", "cpu")
        self.group = placement_group([{resource(kind): spec.accels}] * spec.nodes, strategy="STRICT_SPREAD",
                                     name=f"gptrain-{self.name}-{self.run_id[:8]}")
        ready = self.group.ready()
        while not ray.wait([ready], timeout=POLL_S)[0]:
            self._check_db()
            if self._stop_asked():
                return None
        cpus, gpus = (0, spec.accels) if kind == "gpu" else (spec.accels, 0)
        actor = ray.remote(NodeAgent)
        self.nodes = [actor.options(num_cpus=cpus, num_gpus=gpus, max_restarts=0, scheduling_strategy=
                                    PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i))
                      .remote(self.run_id) for i in range(spec.nodes)]
        self.hosts = ray.get([n.where.remote() for n in self.nodes])
        # node 0 hosts the rendezvous store: on this supervisor's own node when the job has a
        # bundle there, so that no other host's loss takes it (an elastic job survives it)
        here = ray.get_runtime_context().get_node_id()
        order = sorted(range(spec.nodes), key=lambda i: self.hosts[i]["node_id"] != here)
        self.nodes, self.hosts = [self.nodes[i] for i in order], [self.hosts[i] for i in order]
        blind = [h["ip"] for h, ok in zip(self.hosts, self._all("sees", str(folder.spec_file(self.dir)),
                                                                 folder.spec_file(self.dir).read_text())) if not ok]
        if blind:
            raise RuntimeError(f"Ray node(s) {', '.join(blind)} do not see {self.dir}: $GPTRAIN_HOME must be "
                          "on a filesystem every node shares")
        where = ", ".join(f"node {i}: {h['ip']} ({h['host']})" for i, h in enumerate(self.hosts))
        self._set(JobState.STARTING, f"placement group {self.group.id.hex()}: {where}",
                  external_id=self.group.id.hex())
        return list(range(spec.nodes))

    def launch(self, attempt: int, slots: list[int]) -> None:
        spec, logs = self.spec, folder.logs_dir(self.dir)
        env = self.job_env(attempt)
        launch.prepare_dirs(spec, self.dir)
        host, port = self.hosts[0]["ip"], self.ray.get(self.nodes[0].free_port.remote())
        self.agent_logs, self.failed_node, self.signaled = [], None, set()
        started = []
        for node, actor in enumerate(self.nodes):
            if node in self.lost:  # an elastic job goes on without the nodes it lost (their actors died)
                self.agent_logs.append(agent_log(logs, node))
                continue
            node_env = dict(env)
            cmd = self.node_command(node, attempt, host, port, node_env, bool(self.hosts[node]["gpus"]))
            self.agent_logs.append(agent_log(logs, node))
            started.append(actor.start.remote(cmd, node_env, str(launch.workdir(spec, self.dir)),
                                              str(self.agent_logs[-1]), self.header(attempt, node, cmd)))
        self.ray.get(started)
        self.agents = self.nodes

    # ---- the agents, through their actors ------------------------------------------------------

    def _all(self, method: str, *args) -> list:
        """`method` on every node's actor; a lost node's (an elastic job's) is skipped, None."""
        refs = {i: getattr(n, method).remote(*args) for i, n in enumerate(self.nodes) if i not in self.lost}
        done = dict(zip(refs, self.ray.get(list(refs.values()))))
        return [done.get(i) for i in range(len(self.nodes))]

    def poll_agents(self) -> list[int | None]:
        """Each node's agent's exit code; an elastic job's node whose actor died (its host gone)
        ends with DEAD, to be counted lost (jobs/elastic.py); a fixed job's raises, as before."""
        if not self.spec.elastic:
            return self._all("poll")
        from ray.exceptions import GetTimeoutError, RayActorError

        codes = []
        for i, n in enumerate(self.nodes):
            if i in self.lost:
                codes.append(DEAD)
                continue
            try:
                codes.append(self.ray.get(n.poll.remote(), timeout=60))
            except GetTimeoutError:  # (Ray has not yet decided whether that node is gone)
                codes.append(None)
            except RayActorError as e:
                if i == 0:
                    raise
                self.dead[i] = str(e).splitlines()[0][:160]
                codes.append(DEAD)
        return codes

    def lost_why(self, node: int, code: int) -> str:
        h = self.hosts[node]
        if node in self.dead:
            return f"its Ray actor on {h['ip']} ({h['host']}) died: {self.dead[node]}"
        return f"its torchrun agent on {h['ip']} ({h['host']}) exited with {code}"

    def _signal_workers(self, sig) -> None:
        self._all("signal_workers", int(sig), launch.under_torchrun(self.spec))

    def kill_agents(self, wait: bool = True) -> None:
        if self.nodes:
            self._all("kill")

    def end_attempt(self) -> None:
        if self.nodes:
            self._all("kill")

    def release(self) -> None:
        """The actors and the placement group given back to the cluster (nothing left of the job
        on any node), and this driver disconnected."""
        if self.ray is None:
            return
        try:
            for n in self.nodes:
                try:
                    self.ray.kill(n)
                except Exception:  # (a lost node's actor)
                    pass
            if self.group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.group)
            self.ray.shutdown()
        except Exception:  # the cluster is gone: Ray ends a dead driver's actors anyway
            pass


if __name__ == "__main__":
    main(RaySupervisor)
