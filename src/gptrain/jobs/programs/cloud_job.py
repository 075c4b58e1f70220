"""A cloud job service's own job file (Oracle ADS: `ads opctl run -f job.yaml`) read as a gptrain
job, so the seed's YAML runs as its users wrote it (`gptrain run -f job.yaml`):

    kind: distributed | job
    spec:
      infrastructure: {spec: {shapeName: VM.GPU.A10.2, ...}}      -> accels (the shape's GPUs)
      cluster: {spec: {name, config: {env: [...]},                 -> name, env
                       main: {replicas: 1}, worker: {replicas: 1}}} -> nodes (main + workers)
      runtime: {type: git, spec: {uri, branch|commit, entryPoint,  -> repository_url, ref, script
                                  args: [...], env: [...]}}           or command, args, env

What has no meaning here (OCIDs, image, workDir, codeDir, storage sizes, ...) is named in one note
each, never silently dropped; a field of the wrong shape is one line.
"""

from __future__ import annotations

import re
from pathlib import Path

from gptrain.errors import UserError

KINDS = ("job", "distributed")
IGNORED_WHY = {
    "infrastructure": "the service's machines (OCIDs, subnet, logs, storage): jobs run on this "
                      "scheduler's hosts",
    "image": "no container image: the job runs in gptrain's environment (--requirements for packages)",
    "workDir": "job folders live under $GPTRAIN_HOME/jobs",
    "codeDir": "the code is cloned into the job's folder",
}


def is_cloud_job(data: dict) -> bool:
    return data.get("kind") in KINDS and isinstance(data.get("spec"), dict)


def _mapping(value, where: str, path: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where} in {path} must be a mapping")
    return value


def _env(items, where: str, path: str) -> dict:
    """ADS's env list ([{name, value}, ...]) as a mapping."""
    if items is None:
        return {}
    if not isinstance(items, list) or not all(isinstance(i, dict) and "name" in i for i in items):
        raise UserError(f"{where} in {path} must be a list of {{name: ..., value: ...}}")
    return {str(i["name"]): str(i.get("value", "")) for i in items}


def _replicas(node: dict) -> int:
    n = node.get("replicas", node.get("replica", 1))
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise UserError(f"replicas must be a whole number, got {n!r}")
    return n


def gpus_of(shape: str) -> int | None:
    """The GPUs of an OCI shape from its name (VM.GPU.A10.2 -> 2, BM.GPU4.8 -> 8); None for a
    CPU shape."""
    m = re.fullmatch(r"(?:VM|BM)\.GPU[\w.]*?\.(\d+)", shape)
    return int(m.group(1)) if m else None


def translate(data: dict, path: str) -> tuple[dict, list[str]]:
    """(gptrain job fields, notes on what was left out) for the cloud job file `data`."""
    spec = data["spec"]
    infra = _mapping(_mapping(spec.get("infrastructure"), "spec.infrastructure", path).get("spec"),
                     "spec.infrastructure.spec", path)
    cluster = _mapping(_mapping(spec.get("cluster"), "spec.cluster", path).get("spec"), "spec.cluster.spec", path)
    runtime = _mapping(spec.get("runtime"), "spec.runtime", path)
    rspec = _mapping(runtime.get("spec"), "spec.runtime.spec", path)
    fields: dict = {}
    notes = [f"spec.infrastructure ignored: {IGNORED_WHY['infrastructure']}"] if infra else []
    name = cluster.get("name") or rspec.get("name") or infra.get("displayName") or spec.get("name")
    if name:
        fields["name"] = str(name).lower()
    gpus = gpus_of(str(infra.get("shapeName", "")))
    fields["accels"] = gpus or 1
    if data["kind"] == "distributed":
        main = _mapping(cluster.get("main"), "spec.cluster.spec.main", path)
        worker = cluster.get("worker")
        fields["nodes"] = _replicas(main) + (_replicas(_mapping(worker, "spec.cluster.spec.worker", path))
                                             if worker is not None else 0)
        if fields["nodes"] < 1:
            raise UserError(f"spec.cluster.spec in {path} asks for no nodes (main and worker replicas)")
    env = {**_env(_mapping(cluster.get("config"), "spec.cluster.spec.config", path).get("env"),
                  "spec.cluster.spec.config.env", path),
           **_env(rspec.get("env"), "spec.runtime.spec.env", path)}
    if env:
        fields["env"] = env
    kind = runtime.get("type", "script")
    entry = rspec.get("entryPoint") or rspec.get("entrypoint")
    if kind == "git":
        if not rspec.get("uri"):
            raise UserError(f"spec.runtime.spec.uri in {path}: a git runtime needs the repository's URI")
        fields["repository_url"] = str(rspec["uri"])
        ref = rspec.get("commit") or rspec.get("branch")
        if ref:
            fields["ref"] = str(ref)
    elif rspec.get("scriptPathURI"):  # a local folder (or one file) of code
        code = Path(str(rspec["scriptPathURI"])).expanduser()
        code = code if code.is_absolute() else Path(path).expanduser().resolve().parent / code
        fields["code"] = str(code.parent if code.is_file() else code)
        entry = entry or (code.name if code.is_file() else None)
    else:
        raise UserError(f"spec.runtime in {path}: type {kind!r} is not one gptrain runs (git, or a "
                        "local scriptPathURI)")
    if not entry:
        raise UserError(f"spec.runtime.spec.entryPoint in {path}: name the program to run")
    args = rspec.get("args") or []
    if not isinstance(args, list):
        raise UserError(f"spec.runtime.spec.args in {path} must be a list")
    if str(entry).endswith(".py"):
        fields["script"] = str(entry)
    else:
        fields["command"] = "bash" if str(entry).endswith(".sh") else str(entry)
        args = [str(entry), *args] if str(entry).endswith(".sh") else args
    fields["args"] = [str(a) for a in args]
    for key in ("image", "workDir"):
        if cluster.get(key):
            notes.append(f"spec.cluster.spec.{key} ignored: {IGNORED_WHY[key]}")
    if rspec.get("codeDir"):
        notes.append(f"spec.runtime.spec.codeDir ignored: {IGNORED_WHY['codeDir']}")
    return fields, notes
