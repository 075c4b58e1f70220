"""The Kubernetes scheduler: a job becomes a JobSet (jobs/engines/kube_manifest.py), created, read and
deleted through the official `kubernetes` client (the optional extra `gptrain[kubernetes]`)
against the user's kubeconfig (KUBECONFIG or ~/.kube/config, --k8s-context; inside a cluster,
its service account).

    gptrain run NAME --scheduler kubernetes --nodes N --accels M --k8s-volume CLAIM
                [--image IMAGE] [--k8s-namespace NS] [--k8s-secret NAME]... [--queue Q]
                [--dry-run] [-- trainer flags | script.py args]

There is no supervisor: like Slurm's, the job's record is brought up to date when it is read,
from the JobSet's status conditions and its pods (the engine id is the JobSet's uid, so a
stale JobSet of the same name never writes into a newer run's record). Stop deletes the JobSet
(its pods get SIGTERM: the trainer saves a checkpoint); resume creates it again, and the
trainer continues from the newest checkpoint on the volume.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gptrain.errors import UserError
from gptrain.jobs import folder, launch, records, secrets, store
from gptrain.jobs.programs import code
from gptrain.jobs.engines import kube_manifest as km
from gptrain.jobs.logs import agent_log
from gptrain.jobs.store import JobState
from gptrain.jobs.resume import restart_line
from gptrain.jobs.spec import JobSpec

SERVICE_ACCOUNT_NS = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
MISSING = ("the Kubernetes client is not installed here: pip install 'gptrain[kubernetes]' "
           "(or --dry-run to print the manifests without it)")


class Cluster:
    """The two APIs a job needs, connected through the user's kubeconfig; one line on failure."""

    def __init__(self, opts: dict):
        try:
            from kubernetes import client, config
        except ImportError:
            raise UserError(MISSING) from None
        from kubernetes.config.config_exception import ConfigException

        self.namespace, self.context = opts.get("namespace"), opts.get("context")
        try:
            api = config.new_client_from_config(context=self.context)
            contexts, active = config.list_kube_config_contexts()
            ctx = next((c for c in contexts if c["name"] == self.context), active) or {}
            self.context = ctx.get("name", self.context)
            self.namespace = self.namespace or ctx.get("context", {}).get("namespace")
        except (ConfigException, OSError, TypeError) as e:
            try:  # inside a cluster: its service account, and its namespace
                config.load_incluster_config()
                api = client.ApiClient()
                self.namespace = self.namespace or Path(SERVICE_ACCOUNT_NS).read_text().strip()
            except (ConfigException, OSError):
                raise UserError(f"no usable kubeconfig (KUBECONFIG, ~/.kube/config): "
                                f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
        self.namespace, self.host = self.namespace or "default", api.configuration.host
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def call(self, what: str, fn, *args, missing_ok=False, **kw):
        """An API call; None for a 404 when `missing_ok`; else one line naming what failed."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kw)
        except ApiException as e:
            if missing_ok and e.status == 404:
                return None
            try:
                said = json.loads(e.body or "{}").get("message") or e.reason
            except ValueError:
                said = e.reason
            raise UserError(f"{what}: the cluster answered {e.status} {said}") from None
        except HTTPError as e:
            raise UserError(f"{what}: cannot reach the cluster at {self.host} ({type(e).__name__})") from None

    def jobset(self, name: str) -> dict | None:
        return self.call(f"reading JobSet {name}", self.custom.get_namespaced_custom_object, km.GROUP,
                         km.VERSION, self.namespace, km.PLURAL, name, missing_ok=True)

    def pods(self, name: str) -> list:
        got = self.call(f"listing the pods of JobSet {name}", self.core.list_namespaced_pod, self.namespace,
                        label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")
        return list(got.items)


def _connect(spec: JobSpec) -> Cluster:
    cluster = Cluster(spec.kubernetes)
    spec.kubernetes["namespace"] = cluster.namespace  # recorded: refresh/stop/resume look there,
    if cluster.context:  # on that cluster, whichever context is current by then
        spec.kubernetes["context"] = cluster.context
    return cluster


def submit(spec: JobSpec, dry_run: bool = False) -> str | None:
    """Create the job's JobSet (or, with dry_run, only print the manifests); returns its uid."""
    spec.validate()
    km.check_options(spec)
    if dry_run:
        with code.staged(spec):  # (what would be snapshotted is checked, and dropped)
            print(km.to_yaml(spec), end="")
        return None
    cluster = _connect(spec)  # before anything is recorded: no client, no kubeconfig: one line
    with code.staged(spec) as snapshot:
        jdir = prepare(spec, snapshot)
        try:
            uid = _create(cluster, spec)
        except BaseException:
            records.forget(spec.name, jdir)
            raise
    _recorded(spec.name, uid, f"created JobSet {cluster.namespace}/{km.resource_name(spec.name)}")
    return uid


def prepare(spec: JobSpec, snapshot) -> Path:
    """The job's record and its folder on the volume as its pods find it (logs/, checkpoints/,
    the trainer's config, the manifests in kubernetes.yaml): all of it or, on failure, none."""
    jdir = records.create(spec, snapshot, "kubernetes")
    try:
        launch.prepare_dirs(spec, jdir)
        folder.kube_manifests(jdir).write_text(km.to_yaml(spec))
    except BaseException:
        records.forget(spec.name, jdir)
        raise
    return jdir


def _create(cluster: Cluster, spec: JobSpec) -> str:
    """The Secret (when the job has secrets), then the JobSet, which then owns the Secret (so the
    cluster deletes it with the JobSet); the JobSet's uid."""
    ns, body = cluster.namespace, km.secret(spec, secrets.load(spec.name))
    if body is not None:
        body["metadata"]["namespace"] = ns
        if cluster.call("reading the job's Secret", cluster.core.read_namespaced_secret, body["metadata"]["name"], ns,
                        missing_ok=True) is None:
            cluster.call("creating the job's Secret", cluster.core.create_namespaced_secret, ns, body)
        else:  # left by this job's previous run, not yet collected with its JobSet
            cluster.call("replacing the job's Secret", cluster.core.replace_namespaced_secret,
                         body["metadata"]["name"], ns, body)
    manifest = km.jobset(spec)
    manifest["metadata"]["namespace"] = ns
    try:
        made = cluster.call("creating the JobSet", cluster.custom.create_namespaced_custom_object, km.GROUP,
                            km.VERSION, ns, km.PLURAL, manifest)
    except UserError:
        if body is not None:
            cluster.call("deleting the job's Secret", cluster.core.delete_namespaced_secret,
                         body["metadata"]["name"], ns, missing_ok=True)
        raise
    uid = made["metadata"]["uid"]
    if body is not None:
        owner = {"apiVersion": f"{km.GROUP}/{km.VERSION}", "kind": "JobSet", "name": manifest["metadata"]["name"],
                 "uid": uid}
        cluster.call("handing the Secret to the JobSet", cluster.core.patch_namespaced_secret,
                     body["metadata"]["name"], ns, {"metadata": {"ownerReferences": [owner]}})
    return uid


def _recorded(name: str, uid: str, message: str) -> None:
    store.update(name, external_id=uid)
    with store.transaction() as conn:
        store.add_event(conn, name, "kubernetes", f"{message} (uid {uid})")


def _conditions(obj: dict) -> dict:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"}


def _phases(pods) -> dict:
    out: dict = {}
    for p in pods:
        out[p.status.phase] = out.get(p.status.phase, 0) + 1
    return out


def _exit_code(pods) -> int:
    """The first non-zero exit code among the pods' containers (1 when none says)."""
    for p in pods:
        for s in p.status.container_statuses or []:
            ended = s.state and s.state.terminated
            if ended and ended.exit_code:
                return ended.exit_code
    return 1


def _save_pod_logs(cluster: Cluster, pods, logs) -> None:
    """Each pod's own output (its node's torchrun agent) into logs/agent-nodeN.log."""
    for p in pods:
        index = (p.metadata.annotations or {}).get("batch.kubernetes.io/job-completion-index", "0")
        try:
            text = cluster.call(f"reading pod {p.metadata.name}'s log", cluster.core.read_namespaced_pod_log,
                                p.metadata.name, cluster.namespace, missing_ok=True)
        except UserError:
            continue  # (a pod gone meanwhile, or its node unreachable: the rank logs stay)
        if text:
            agent_log(logs, index).write_text(text)


def _state(job: dict, obj: dict | None, pods, stopping: bool) -> tuple[JobState, str]:
    """gptrain's state and a note, from the JobSet (None: gone) and its pods."""
    S = JobState
    if obj is None:
        return (S.STOPPED, "JobSet deleted") if stopping else (S.FAILED, "the JobSet was deleted outside gptrain")
    done = _conditions(obj)
    for kind, state in (("Completed", S.SUCCEEDED), ("Failed", S.FAILED)):
        if kind in done:
            c = done[kind]
            return state, f"JobSet {kind}" + (f" ({c.get('reason')}: {c.get('message')})" if c.get("reason") else "")
    phases = _phases(pods)
    if stopping:
        return S.STOPPING, "JobSet being deleted"
    if (obj.get("status") or {}).get("restarts", 0) > job["restarts"]:
        return S.RESTARTING, f"JobSet restart {obj['status']['restarts']}"
    if "Suspended" in done:
        return S.QUEUED, "JobSet suspended (waiting for Kueue's admission)" if km.QUEUE_LABEL in \
            obj["metadata"].get("labels", {}) else "JobSet suspended"
    if phases.get("Running"):
        return S.RUNNING, f"{phases['Running']} pod(s) running"
    return (S.STARTING, f"{phases['Pending']} pod(s) pending") if phases.get("Pending") else (S.QUEUED, "no pods yet")


def refresh(name: str) -> dict:
    """Bring the stored state of a Kubernetes job up to date; returns the job. Without the client
    or the cluster, the job as last recorded (`inspect` says why)."""
    job = store.get_job(name)
    if job["state"] in store.TERMINAL or not job["external_id"]:
        return job
    spec, jdir = JobSpec.from_dict(job["spec"]), folder.job_dir(name)
    try:
        cluster = Cluster(spec.kubernetes)
        rn = km.resource_name(name)
        obj = cluster.jobset(rn)
        if obj is not None and obj["metadata"].get("uid") != job["external_id"]:
            obj = None  # another JobSet by that name: not this run's
        pods = cluster.pods(rn) if obj is not None else []
    except UserError:
        return job
    state, note = _state(job, obj, pods, folder.stop_request(jdir).is_file())
    restarts = max(job["restarts"], ((obj or {}).get("status") or {}).get("restarts", 0))
    if state == job["state"] and restarts == job["restarts"]:
        return job
    fields: dict = {"restarts": restarts}
    if state in store.TERMINAL:
        _save_pod_logs(cluster, pods, folder.logs_dir(jdir))
        fields["exit_code"] = 0 if state != JobState.FAILED else _exit_code(pods)
    return records.record_seen(name, job, state, note, fields)


def describe(job: dict) -> str | None:
    """The `inspect` line of an active job: the JobSet's conditions, restarts and pods."""
    if not job["external_id"] or job["state"] in store.TERMINAL:
        return None
    spec = JobSpec.from_dict(job["spec"])
    rn = km.resource_name(job["name"])
    try:
        cluster = Cluster(spec.kubernetes)
        obj, pods = cluster.jobset(rn), cluster.pods(rn)
    except UserError as e:
        return f"kubernetes JobSet {rn}: cannot be read here ({e})"
    if obj is None:
        return f"kubernetes JobSet {cluster.namespace}/{rn}: gone"
    phases = ", ".join(f"{n} {p}" for p, n in sorted(_phases(pods).items())) or "no pods"
    conds = ", ".join(sorted(_conditions(obj))) or "no conditions"
    return (f"kubernetes JobSet {cluster.namespace}/{rn}: {conds}; restarts "
            f"{(obj.get('status') or {}).get('restarts', 0)}; pods: {phases}")


def stop(name: str, timeout: float) -> str:
    """Delete the JobSet (foreground: it goes once its pods have; each pod gets SIGTERM, the
    trainer saves a checkpoint, SIGKILL after the pod's grace period: kube_manifest.grace_seconds)."""
    job = refresh(name)
    if job["state"] in store.TERMINAL:
        return job["state"]
    cluster = Cluster(JobSpec.from_dict(job["spec"]).kubernetes)
    jdir = folder.job_dir(name)
    folder.write_stop_request(jdir, timeout)  # (before: a refresh meanwhile sees a stop, not a loss)
    try:
        _delete(cluster, km.resource_name(name), job["external_id"])
    except BaseException:
        folder.stop_request(jdir).unlink(missing_ok=True)
        raise
    grace = km.grace_seconds(JobSpec.from_dict(job["spec"]))
    store.set_state(name, JobState.STOPPING, f"JobSet deleted: pods get SIGTERM (SIGKILL after {grace}s)",
                    engine_job=job["external_id"])
    return "stopping"


def _delete(cluster: Cluster, rn: str, uid: str | None) -> None:
    from kubernetes import client

    opts = client.V1DeleteOptions(propagation_policy="Foreground",
                                  preconditions=client.V1Preconditions(uid=uid) if uid else None)
    cluster.call(f"deleting JobSet {rn}", cluster.custom.delete_namespaced_custom_object, km.GROUP, km.VERSION,
                 cluster.namespace, km.PLURAL, rn, body=opts, missing_ok=True)


def resume(name: str) -> None:
    """Create a failed or stopped job's JobSet again (its old one deleted first, when still
    there): same name, spec, code snapshot and folder; the run continues from the newest
    checkpoint on the volume."""
    job = refresh(name)
    spec = JobSpec.from_dict(job["spec"])
    cluster = Cluster(spec.kubernetes)
    rn = km.resource_name(name)
    if job["state"] not in store.TERMINAL:
        raise UserError(f"job {name} is {job['state']}; only a failed or stopped job can be resumed")
    old = cluster.jobset(rn)
    if old is not None and (old["metadata"].get("annotations") or {}).get(km.JOB_ANNOTATION) != name:
        raise UserError(f"JobSet {cluster.namespace}/{rn} is not job {name}'s; it is left alone (delete or "
                        "rename it, then resume)")
    _delete(cluster, rn, None)
    deadline = time.monotonic() + 120
    while cluster.jobset(rn) is not None:
        if time.monotonic() > deadline:
            raise UserError(f"JobSet {rn} is still being deleted (its pods are ending); try again shortly")
        time.sleep(2)
    store.reopen(name, restart_line(spec, folder.job_dir(name)))
    folder.stop_request(folder.job_dir(name)).unlink(missing_ok=True)
    try:
        uid = _create(cluster, spec)
    except UserError as e:
        store.set_state(name, JobState.FAILED, str(e), exit_code=job["exit_code"])
        raise
    _recorded(name, uid, "created the JobSet again")
