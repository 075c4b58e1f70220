"""The Ray scheduler: a job on the nodes of an existing Ray cluster.

    gptrain run NAME --scheduler ray --nodes N --accels M [-- trainer flags | script.py args]

The cluster is found the way Ray's own tools find it: RAY_ADDRESS, else `[ray] address` in
$GPTRAIN_HOME/config.toml, else the cluster started on this machine (`auto`). The job is owned,
like a local one, by a detached supervisor on this machine (jobs/engines/ray_supervisor.py): it places
one bundle per node (STRICT_SPREAD: M GPUs, or M CPUs on a cluster without GPUs), runs one actor
per bundle that starts that node's torchrun agent (the same command as local and Slurm,
jobs/launch.py), polls them, restarts from the latest checkpoint and records every transition in
the store. So `refresh`, `stop` and `resume` are the local scheduler's: they talk to that
supervisor. The nodes must share the filesystem holding $GPTRAIN_HOME/jobs (logs and checkpoints
are written there): `submit` checks that every node able to hold a bundle reads a marker written
in the new job's folder, and records nothing when one does not.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

from gptrain.errors import UserError
from gptrain.home import user_setting
from gptrain.jobs import store
from gptrain.jobs.engines import local, options
from gptrain.jobs.spec import JobSpec, check_scheduler_options

CHECK_S = 120.0  # how long each node has to answer the shared-filesystem check
REACH_S = 10.0  # how long the cluster's address has to answer a connection
INSTALL = "pip install 'gptrain[ray]'"


def ray_module():
    """Ray, or one line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--scheduler ray needs Ray on this machine: {INSTALL}") from None
    return ray


def address() -> str:
    """Where the cluster is, as Ray's tools look for it (a job file's `ray: {address: ...}` first)."""
    return os.environ.get("RAY_ADDRESS") or user_setting("ray", "address") or "auto"


def connect(where: str):
    """Ray, connected to the cluster at `where` (a driver of this process); one line when it
    cannot be reached."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    if where != "auto":  # (ray.init retries an unreachable cluster for minutes)
        host, _, port = where.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=REACH_S).close()
        except (OSError, ValueError) as e:
            raise UserError(f"cannot reach a Ray cluster at {where!r} ({e.strerror or e}); start one (`ray "
                            "start --head`) and set RAY_ADDRESS or [ray] address in config.toml") from None
    try:
        ray.init(address=where, namespace="gptrain", log_to_driver=False, logging_level=logging.ERROR,
                 include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot reach a Ray cluster at {where!r} ({first}); start one (`ray start "
                        "--head`) and set RAY_ADDRESS or [ray] address in config.toml") from None
    return ray


def resource(kind: str) -> str:
    """The Ray resource one accelerator of a job is."""
    return "GPU" if kind == "gpu" else "CPU"


def bundle_nodes(ray, spec: JobSpec) -> tuple[str, list[dict]]:
    """(gpu or cpu, the alive nodes able to hold one bundle of the job); one line when fewer
    than the job's nodes can."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    kind = "gpu" if any(n["Resources"].get("GPU", 0) for n in alive) else "cpu"
    fit = [n for n in alive if n["Resources"].get(resource(kind), 0) >= spec.accels]
    if len(fit) < spec.nodes:
        raise UserError(f"job needs {spec.nodes} node(s) with {spec.accels} {kind.upper()}(s) each, but the "
                        f"Ray cluster has {len(fit)} such node(s) of {len(alive)}; ask for fewer")
    return kind, fit


def check_shared(ray, jdir, nodes: list[dict]) -> None:
    """Every node in `nodes` reads the marker written in the job's folder (and runs gptrain's
    code), or one line naming those that do not."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from gptrain.jobs.engines import ray_node

    token = uuid.uuid4().hex
    marker = jdir / ".ray-shared-check"
    try:
        marker.write_text(token)
    except OSError as e:
        raise UserError(f"cannot write {marker}: {e.strerror or e}; nothing was recorded") from None
    task = ray.remote(num_cpus=0, max_retries=0)(ray_node.sees)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(str(marker), token) for n in nodes]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=CHECK_S)
    blind, broken = [], []
    for n, ref in zip(nodes, refs):
        where = f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})"
        try:
            if ref not in ready or not ray.get(ref):
                blind.append(where)
        except ray.exceptions.RayError as e:
            broken.append(f"{where}: {(str(e).strip().splitlines() or ['?'])[-1]}")
    marker.unlink(missing_ok=True)
    if broken:
        raise UserError(f"Ray node {broken[0]} cannot run gptrain (every node needs the same Python "
                        "environment, with gptrain installed); nothing was recorded")
    if blind:
        raise UserError(f"Ray node(s) {', '.join(blind)} do not see {jdir.parent}: $GPTRAIN_HOME must be on "
                        "a filesystem every node shares (docs/ray.md); nothing was recorded")


def submit(spec: JobSpec, dry_run: bool = False) -> str | None:
    if dry_run:
        raise UserError("--dry-run prints a Slurm script: add --scheduler slurm")
    spec.validate()
    check_scheduler_options("ray", spec.ray, options.keys("ray"), options.forms("ray"),  # (the rest is found here)
                            flag=lambda key: options.flag_of("ray", key))
    ray = connect(spec.ray.get("address") or address())
    try:
        kind, nodes = bundle_nodes(ray, spec)
        spec.ray = {"address": ray.get_runtime_context().gcs_address, "accel_type": kind}
        local.record_and_start(spec, "ray", check=lambda d: check_shared(ray, d, nodes))
    finally:
        ray.shutdown()  # this CLI's driver; the supervisor is the job's
    return None


def resume(name: str) -> None:
    """Queue a failed or stopped job again under a new supervisor, which places it on the
    cluster again; the trainer continues from the latest checkpoint in the job's folder."""
    job = store.get_job(name)
    ray = connect(job["spec"].get("ray", {}).get("address") or address())
    ray.shutdown()
    local.resume(name)


def describe(job: dict) -> str | None:
    """The `inspect` line of an active Ray job: its cluster and placement group."""
    if job["state"] in store.TERMINAL:
        return None
    where = store.get_job(job["name"])["spec"].get("ray", {}).get("address", "?")  # (`job` may come without its spec)
    group = job["external_id"]
    return f"ray        cluster {where}, " + (f"placement group {group}" if group else "waiting for its placement group")


refresh = local.refresh
stop = local.stop
