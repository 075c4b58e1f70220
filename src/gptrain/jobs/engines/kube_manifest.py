"""A gptrain job as what a Kubernetes cluster runs: one JobSet (jobset.x-k8s.io/v1alpha2) and,
when the job has --secret values, one Secret. Built here from the job's spec, with no client and
no cluster (`--dry-run` prints them); jobs/engines/kube.py sends them through the official client.

    JobSet NAME          failurePolicy.maxRestarts = --max-restarts; network: a headless service
      replicatedJob node   one Indexed Job, NODES pods (completion index = node rank), each running
                           the node command of jobs/launch.py (torchrun, static rendezvous at
                           NAME-node-0-0.NAME, the first pod's stable DNS name)
      volume               the PersistentVolumeClaim --k8s-volume, mounted at $GPTRAIN_HOME
    Secret NAME-secrets  --secret values, sent through the API at submit; every manifest that is
                         printed or kept shows only their names (envFrom refers to it by name)

Every user string goes in as data (YAML/JSON, no shell); `$` is doubled in command words and
env values, which Kubernetes would otherwise expand as `$(VAR)`.
"""

from __future__ import annotations

import hashlib
import re

from gptrain.errors import UserError
from gptrain.home import home
from gptrain.jobs import folder, launch
from gptrain.jobs.engines import options
from gptrain.jobs.spec import check_scheduler_options

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
NODE_JOB = "node"  # the replicatedJob's name: pods NAME-node-0-RANK
DEFAULT_IMAGE = "gptrain:0.1.0"
DEFAULT_PYTHON = "python3"
DEFAULT_PORT = 29500
STOP_GRACE_S = 120  # SIGTERM to SIGKILL on stop/suspend/eviction, at least (grace_seconds)
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights and AdamW's two moments (train/checkpoint.py)
SAVE_BYTES_PER_S = 0.18e9  # half the slowest save measured (bench/checkpoint_verify.py: 0.36 GB/s)
MAX_NAME = 40  # pod hostnames NAME-node-0-RANK (and the Job controller's suffix) stay <= 63
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED = {"app.kubernetes.io/managed-by": "gptrain"}
JOB_ANNOTATION = "gptrain/job"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RESTART_ATTEMPT = "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"
MASK = "***"

OPTION_FORMS = options.forms("kubernetes")  # each option declared once (jobs/engines/options.py)
OPTIONS = options.keys("kubernetes")


def check_options(spec) -> None:
    """The kubernetes options of a job, before anything is built: one line naming the bad one."""
    opts = spec.kubernetes
    check_scheduler_options("kubernetes", opts, OPTIONS, OPTION_FORMS, lambda key: options.flag_of("kubernetes", key))
    if not opts.get("volume"):
        raise UserError("--k8s-volume CLAIM is needed: the PersistentVolumeClaim holding $GPTRAIN_HOME "
                        "(job folders, datasets), mounted in every pod (docs/kubernetes.md)")
    names = opts.get("secrets") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and options.DNS_SUBDOMAIN.fullmatch(n) for n in names):
        raise UserError(f"--k8s-secret takes the name of a Secret in the namespace, got {names!r}")
    if spec.requirements or spec.requirements_file:
        raise UserError("--requirements cannot be installed on a cluster: build the packages into the "
                        "--image instead")
    for ds in spec.datasets:
        from gptrain.data.object_store import url_of
        from gptrain.data.store import path_of

        if url_of(ds):
            continue  # in object storage: the pods stream it from its URL
        if not path_of(ds).resolve().is_relative_to(home().resolve()):
            raise UserError(f"dataset {ds} is at {path_of(ds)}, outside $GPTRAIN_HOME ({home()}), which is "
                            "all the pods see: push it again with GPTRAIN_HOME set to the volume's path")


def resource_name(job: str) -> str:
    """The job's name as a Kubernetes name (a DNS-1035 label, as JobSet's service needs): itself
    when it already is one and short enough, else made one, with a hash of the job's name so
    that two jobs never share one."""
    base = re.sub(r"[^a-z0-9-]+", "-", job.lower()).strip("-")
    if not base[:1].isalpha():
        base = f"job-{base}".rstrip("-")
    if base == job and len(base) <= MAX_NAME:
        return base
    return f"{base[:MAX_NAME - 7].rstrip('-')}-{hashlib.sha256(job.encode()).hexdigest()[:6]}"


def secret_name(job: str) -> str:
    return f"{resource_name(job)}-secrets"


def head_host(job: str) -> str:
    """The first pod's stable DNS name (JobSet's headless service, named after the JobSet)."""
    rn = resource_name(job)
    return f"{rn}-{NODE_JOB}-0-0.{rn}"


def accel_kind(spec) -> str:
    return "cpu" if spec.kubernetes.get("accel_type") == "cpu" else "gpu"


def _literal(word: str) -> str:
    """A word Kubernetes passes on as written: `$(X)` would be expanded, `$$` is one `$`."""
    return word.replace("$", "$$")


def _env(spec, jdir) -> list[dict]:
    """The container's environment: the job's GPTRAIN_* (jobs/launch.py) and --env values as
    data; the attempt and the node's rank from the pod's own labels and annotations."""
    port = int(spec.kubernetes.get("port") or DEFAULT_PORT)
    plain = {**launch.job_env(spec, jdir), **spec.env}
    if accel_kind(spec) == "cpu":
        plain.setdefault("OMP_NUM_THREADS", "1")
    ranked = spec.nodes > 1
    if launch.meets_by_rendezvous(spec):  # a command, once per node (launch.RENDEZVOUS_VARS)
        plain.update(launch.rendezvous_env(spec.nodes, 0, spec.accels, head_host(spec.name), port))
    rank_var = "PET_NODE_RANK" if launch.under_torchrun(spec) else "NODE_RANK"
    env = [{"name": k, "value": _literal(v)} for k, v in sorted(plain.items()) if not (ranked and k == rank_var)]
    env.append({"name": "GPTRAIN_ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": RESTART_ATTEMPT}}})
    if ranked:
        env.append({"name": rank_var, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}})
    return env


def container(spec) -> dict:
    """The one container of every node's pod."""
    opts, jdir = spec.kubernetes, folder.job_dir(spec.name)
    port = int(opts.get("port") or DEFAULT_PORT)
    torchrun = []
    if launch.under_torchrun(spec):
        torchrun = launch.torchrun_args(spec, nnodes=spec.nodes, endpoint=f"{head_host(spec.name)}:{port}")
    command = launch.node_command(spec, jdir, torchrun, opts.get("python") or DEFAULT_PYTHON)
    gptrain_home = str(home())
    c = {"name": NODE_JOB, "image": opts.get("image") or DEFAULT_IMAGE,
         "command": [_literal(w) for w in command], "workingDir": str(launch.workdir(spec, jdir)),
         "env": _env(spec, jdir)}
    names = ([secret_name(spec.name)] if spec.secrets else []) + list(opts.get("secrets") or [])
    if names:  # by name only: the values stay in the cluster
        c["envFrom"] = [{"secretRef": {"name": n}} for n in names]
    amount = str(spec.accels)
    c["resources"] = ({"limits": {"nvidia.com/gpu": amount}} if accel_kind(spec) == "gpu"
                      else {"requests": {"cpu": amount}})
    if spec.nodes > 1:
        c["ports"] = [{"name": "rendezvous", "containerPort": port}]
    c["volumeMounts"] = [{"name": "gptrain-home", "mountPath": gptrain_home},
                         {"name": "dshm", "mountPath": "/dev/shm"}]
    return c


def grace_seconds(spec) -> int:
    """SIGTERM to SIGKILL for the job's pods: a minute for the step under way, then its
    checkpoint written twice over at SAVE_BYTES_PER_S, each node writing its share (DCP spreads
    the writes over the ranks); never below STOP_GRACE_S. The trainer's model size is what its
    config builds; a program of the user's gets STOP_GRACE_S."""
    import math

    if spec.entry != "trainer":
        return STOP_GRACE_S
    try:
        from gptrain.models.registry import build_model_config

        params = build_model_config(spec.trainer_config().model).param_estimate()
    except Exception:  # (a config that submit refuses anyway, a model named by weights only)
        return STOP_GRACE_S
    per_node = params * CHECKPOINT_BYTES_PER_PARAM / max(spec.nodes, 1)
    return max(STOP_GRACE_S, math.ceil(60 + 2 * per_node / SAVE_BYTES_PER_S))


def jobset(spec) -> dict:
    opts, rn = spec.kubernetes, resource_name(spec.name)
    labels = dict(MANAGED)
    if opts.get("queue"):
        labels[QUEUE_LABEL] = opts["queue"]
    pod = {"metadata": {"labels": dict(MANAGED), "annotations": {JOB_ANNOTATION: spec.name}},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace_seconds(spec),
                    "containers": [container(spec)],
                    "volumes": [{"name": "gptrain-home", "persistentVolumeClaim": {"claimName": opts["volume"]}},
                                {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}
    job = {"parallelism": spec.nodes, "completions": spec.nodes, "completionMode": "Indexed",
           "backoffLimit": 0, "template": pod}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "JobSet",
            "metadata": {"name": rn, "namespace": opts.get("namespace") or "default", "labels": labels,
                         "annotations": {JOB_ANNOTATION: spec.name}},
            "spec": {"failurePolicy": {"maxRestarts": spec.max_restarts},
                     "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "replicatedJobs": [{"name": NODE_JOB, "replicas": 1, "template": {"spec": job}}]}}


def secret(spec, values: dict | None = None) -> dict | None:
    """The job's Secret of --secret values: with `values` only for the API, else masked."""
    if not spec.secrets:
        return None
    data = values if values is not None else {k: MASK for k in spec.secrets}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret_name(spec.name), "namespace": spec.kubernetes.get("namespace") or "default",
                         "labels": dict(MANAGED), "annotations": {JOB_ANNOTATION: spec.name}},
            "stringData": dict(sorted(data.items()))}


def manifests(spec) -> list[dict]:
    """What a submit creates, in order (the Secret masked)."""
    return [m for m in (secret(spec), jobset(spec)) if m is not None]


def to_yaml(spec) -> str:
    import yaml

    head = (f"# gptrain job {spec.name}: written by `gptrain run --scheduler kubernetes`\n"
            + (f"# the Secret's values ({MASK} here) are sent through the API at submit, never written\n"
               if spec.secrets else ""))
    return head + yaml.safe_dump_all(manifests(spec), sort_keys=False, default_flow_style=False)
