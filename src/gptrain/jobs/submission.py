"""A job to submit, as a user asks for it: a job file's (or an earlier job's) fields, then what
was given on top (flags, a form), then the user's defaults in $GPTRAIN_HOME/config.toml; what
follows `--` classified as the entrypoint. One path for both faces (`gptrain run`, the console's
"run again with changes"): the same checks, the same one-line errors, nothing recorded on one.

    --train.max_steps=100 ...        built-in trainer flags
    train.py ARGS                    a Python script (torchrun, --accels processes per node)
    -m package.module ARGS           a Python module (torchrun)
    run.sh ARGS / ./tool ARGS        a shell script (bash) or any executable file, once per node
    bash run.sh / accelerate launch  any command on PATH, once per node
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from gptrain.errors import UserError

from gptrain.jobs.engines import options


@dataclass
class Request:
    """What to submit. `fields`: the job file's (jobs/programs/job_file.py) or an earlier job's spec;
    the rest, when given (not None), override them. `config` is a TOML file's path, or
    `config_text` its text (the console's edited copy)."""
    fields: dict = field(default_factory=dict)
    name: str | None = None
    entry: list[str] = field(default_factory=list)  # what follows `--`
    datasets: list[str] | None = None
    nodes: str | None = None
    accels: int | None = None
    scheduler: str | None = None
    max_restarts: int | None = None
    config: str | None = None
    config_text: str | None = None
    env: list[str] = field(default_factory=list)  # K=V
    secrets: list[str] = field(default_factory=list)  # K=V, or K from this process's environment
    code: str | None = None
    repository_url: str | None = None
    ref: str | None = None
    source: str | None = None
    requirements: str | None = None
    resume_args: str | None = None
    slurm: dict = field(default_factory=dict)  # jobs/engines/options.SLURM given (key -> value)
    kubernetes: dict = field(default_factory=dict)  # options.KUBERNETES given
    keep_on_failure: float | None = None  # seconds (--keep-on-failure DURATION): jobs/engines/held.py
    hosted: bool = False  # the hosted service's words (`training run`): its /input, /output
    cwd: str = field(default_factory=os.getcwd)  # where relative paths and the code are found


def build(req: Request) -> tuple:
    """(JobSpec, notes) of a request, checked as far as a spec checks itself."""
    from gptrain.jobs.programs import job_file
    from gptrain.jobs import spec as spec_mod
    from gptrain.home import user_setting

    fields, notes = dict(req.fields), []
    notes += fields.pop("notes", [])
    if req.name:
        fields["name"] = req.name
    if "name" not in fields:
        raise UserError("give the job a NAME (gptrain run NAME ...) or `name:` in the job file")
    for key in ("nodes", "accels", "scheduler", "max_restarts", "datasets", "repository_url", "ref", "source",
                "resume_args", "keep_on_failure"):
        if getattr(req, key) is not None:
            fields[key] = getattr(req, key)
    if req.code:
        fields["code"] = os.path.abspath(os.path.join(req.cwd, os.path.expanduser(req.code)))
    if req.requirements and (fields.get("repository_url") or fields.get("source")):
        fields.pop("requirements", None)
        fields["requirements_file"] = req.requirements  # a path in the repository, read from its clone
    elif req.requirements:
        fields.pop("requirements_file", None)
        fields["requirements"] = job_file.read_config_file(req.requirements, "requirements file")
    if req.config:
        fields["config"] = job_file.read_config_file(req.config)
        fields["config_path"] = os.path.abspath(os.path.expanduser(req.config))
    if req.config_text is not None:
        fields["config"], fields["config_path"] = req.config_text, None
    fields["env"] = {**fields.get("env", {}), **spec_mod.parse_env(req.env)}
    fields["secrets"] = {**fields.get("secrets", {}), **spec_mod.parse_env(req.secrets, "--secret")}
    entrypoint(req.entry, fields, req.cwd)
    if req.hosted:
        from gptrain.jobs.programs.hosted_paths import rewrite

        fields["args"], more = rewrite(fields.get("args", []), fields.get("datasets") or [])
        notes += more
    fields.setdefault("scheduler", user_setting("defaults", "scheduler") or "local")
    for engine, given in (("slurm", req.slurm), ("kubernetes", req.kubernetes)):
        if engine == "kubernetes" and fields["scheduler"] != engine:
            continue  # (Slurm's are kept whatever the scheduler, as before: a job file's slurm: section)
        opts = {o.key: v for o in options.OPTIONS[engine] if o.user_default and (v := user_setting(engine, o.key))}
        opts.update(fields.get(engine) or {})
        opts.update({k: v for k, v in given.items() if v is not None})
        fields[engine] = opts
    spec = spec_mod.JobSpec(**fields)  # (its own checks first: a trainer's path setting says which)
    _refuse_recorded_credentials(fields)
    return spec, notes


def _refuse_recorded_credentials(fields: dict) -> None:
    """A job's arguments and environment are recorded and shown (`inspect`, the console): one
    holding a URL with a credential (`?access_token=`, `#access_token=`, `user:pass@`) is refused,
    unechoed; the credential goes in a secret, which the program reads from its environment."""
    from gptrain.errors import names_a_credential, scrub_credentials

    words = [(f"argument {i + 1}", w) for i, w in enumerate(fields.get("args") or [])]
    words += [(f"--env {k}", v) for k, v in (fields.get("env") or {}).items()]
    for where, word in words:
        if isinstance(word, str) and names_a_credential(word):
            raise UserError(f"{where} of the job ({scrub_credentials(word)!r}) must not hold credentials (a "
                            "URL's password, token or signed query would be recorded with the job and shown): "
                            "give them with --secret NAME=VALUE (the program reads $NAME from its environment; "
                            "AWS_* or FSSPEC_HTTPS for the trainer's URLs, see docs/object-storage.md)")


def fields_of(spec: dict, secret_values: dict, code_snapshot: Path) -> dict:
    """An earlier job's fields, to run it again (the console's "run again with changes"): its
    entrypoint, resources, datasets, environment and config; its secrets' values (never sent
    to a page: read here from its 0600 file); its code as it was, from its snapshot (a
    repository at the commit it cloned)."""
    skip = {"name", "secrets", "python", "commit", "entry", "ray", "config_path", "min_nodes"}
    fields = {k: v for k, v in spec.items() if k not in skip and v not in (None, [], {})}
    fields["secrets"] = dict(secret_values)
    if spec.get("min_nodes"):
        fields["nodes"] = f"{spec['min_nodes']}:{spec['nodes']}"
    if spec.get("repository_url") and spec.get("commit"):
        fields["ref"] = spec["commit"]
    elif spec.get("code") and code_snapshot.is_dir():
        fields["code"] = str(code_snapshot)
    return fields


def submit(req: Request, dry_run: bool = False) -> tuple:
    """Build the request's spec and hand it to its scheduler (which records it, all or nothing);
    (spec, notes). With dry_run the scheduler prints what it would submit."""
    from gptrain.jobs.schedulers import scheduler

    spec, notes = build(req)
    scheduler(spec.scheduler).submit(spec, dry_run=dry_run)
    return spec, notes


def sweep_trial(trial: dict) -> Request:
    """The Request of a sweep trial's job: trial = {job, flags (the sweep's, then the trial's
    settings), datasets, accels, scheduler, nodes, slurm, kubernetes} (jobs/sweeps.py)."""
    def given(options):
        return {k: v for k, v in (options or {}).items() if v is not None}
    return Request(name=trial["job"], entry=list(trial["flags"]), datasets=trial["datasets"] or None,
                   accels=trial["accels"], scheduler=trial.get("scheduler") or None,
                   nodes=str(trial["nodes"]) if trial.get("nodes") else None, max_restarts=0,
                   slurm=given(trial.get("slurm")), kubernetes=given(trial.get("kubernetes")))


def check_trial(trial: dict) -> dict:
    """A sweep trial's job (sweep_trial) checked as `gptrain run` checks one, nothing submitted;
    where it runs, resolved: {scheduler (the default one named), nodes, slurm, kubernetes}."""
    request = sweep_trial(trial)
    spec, _ = build(request)
    spec.validate()
    return {"scheduler": spec.scheduler, "nodes": request.nodes, "slurm": request.slurm,
            "kubernetes": request.kubernetes}


def entrypoint(rest: list[str], fields: dict, cwd: str) -> None:
    """What follows `--`, as JobSpec fields (entry kind, script/module/command, args); the
    submit directory becomes the job's code when the entrypoint names something in it."""
    if not rest:
        return
    head, tail = rest[0], rest[1:]
    remote = bool(fields.get("repository_url") or fields.get("source"))
    base = Path(fields.get("code") or cwd)
    if head == "-m":
        if not tail:
            raise UserError("-m needs a module name: gptrain run NAME -- -m package.module ARGS")
        fields.update(module=tail[0], args=tail[1:])
        top = tail[0].split(".")[0]
        local = (base / top).is_dir() or (base / f"{top}.py").is_file()
    elif head.startswith("-"):
        fields["args"] = [*fields.get("args", []), *rest]
        return
    elif head.endswith(".py"):
        here = Path(cwd) / head
        if not remote and not (base / head).is_file() and not (not fields.get("code") and here.is_file()):
            raise UserError(f"script {head} does not exist" + (f" in {base}" if fields.get("code") else ""))
        fields.update(script=head, args=tail)
        local = not os.path.isabs(head)
    else:
        found = base / head if (base / head).is_file() else Path(cwd) / head
        if found.is_file() and not remote and not os.access(found, os.X_OK):
            if not head.endswith(".sh"):
                raise UserError(f"{head} is not executable: `chmod +x {head}`, or name its interpreter "
                                f"(-- bash {head})")
            head, tail = "bash", [head, *tail]
        elif not found.is_file() and not remote and shutil.which(head) is None:
            raise UserError(f"{head}: no such file, and no such program on PATH")
        elif remote and head.endswith(".sh"):
            head, tail = "bash", [head, *tail]
        fields.update(command=head, args=tail)
        local = any(not os.path.isabs(w) and not w.startswith("-") and (base / w).is_file()
                    for w in [head, *tail])
    if local and not remote and not fields.get("code"):
        fields["code"] = cwd  # the submit directory: relative paths work as they do here
