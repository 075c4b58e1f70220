"""`gptrain run NAME [options] -- ENTRYPOINT`: submit a job (to the scheduler's module in
jobs/schedulers.py). What may follow `--`:

    --train.max_steps=100 ...        built-in trainer flags
    train.py ARGS                    a Python script (torchrun, --accels processes per node)
    -m package.module ARGS           a Python module (torchrun)
    run.sh ARGS / ./tool ARGS        a shell script (bash) or any executable file, once per node
    bash run.sh / accelerate launch  any command on PATH, once per node
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from gptrain.errors import UserError
from gptrain.jobs.schedulers import SCHEDULERS


def add_run_args(p) -> None:
    p.add_argument("name", nargs="?", help="job name (or `name:` in -f job.yaml)")
    p.add_argument("-f", "--file", dest="job_file", help="job.yaml describing the job")
    p.add_argument("--dataset", action="append", dest="datasets", default=None,
                   help="named dataset (repeatable; the first feeds the trainer)")
    p.add_argument("--nodes", default=None, metavar="N|MIN:MAX",
                   help="nodes; MIN:MAX is elastic (local and ray): a lost node and the job goes on "
                   "with those left, from its latest checkpoint (docs/multi-host.md)")
    p.add_argument("--accels", type=int, default=None, help="processes (accelerators) per node")
    p.add_argument("--scheduler", choices=list(SCHEDULERS), default=None)
    p.add_argument("--config", default=None, help="trainer config TOML")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment variable for every worker (repeatable; recorded in plain text)")
    p.add_argument("--secret", action="append", default=[], metavar="K=V",
                   help="like --env, but the value is kept out of every record (a 0600 file), shown "
                   "as *** and masked in logs; a bare K takes its value from this shell (repeatable)")
    p.add_argument("--max-restarts", dest="max_restarts", type=int, default=None)
    p.add_argument("--follow", action="store_true", help="stream rank 0's log until the job ends")
    code = p.add_argument_group("code (docs/jobs-code.md)")
    code.add_argument("--code", default=None, metavar="DIR",
                      help="snapshot DIR as the job's code, its workers' working directory (default: "
                      "this directory, when the entrypoint is a relative path here)")
    code.add_argument("--repository-url", dest="repository_url", default=None, metavar="URL",
                      help="clone this git repository as the job's code")
    code.add_argument("--ref", default=None, help="branch, tag or commit of --repository-url / --source")
    code.add_argument("--source", "--source-name", dest="source", default=None, metavar="NAME",
                      help="a repository named with `gptrain source add`")
    code.add_argument("--requirements", default=None, metavar="FILE",
                      help="extra packages (pip requirements) in a virtualenv layered on gptrain's; "
                      "with --repository-url/--source, a path inside the repository")
    code.add_argument("--resume-args", dest="resume_args", default=None, metavar="ARGS",
                      help="your program's own resume arguments, appended on a restart that finds a "
                      "checkpoint, {checkpoint} its path: hf (--resume_from_checkpoint {checkpoint}), "
                      "nanogpt (--init_from=resume), or your words (--resume-args='--resume {checkpoint}')")
    slurm = p.add_argument_group("slurm (with --scheduler slurm; defaults from $GPTRAIN_HOME/config.toml [slurm])")
    slurm.add_argument("--partition", default=None)
    slurm.add_argument("--account", default=None)
    slurm.add_argument("--time", default=None, help="time limit, e.g. 04:00:00")
    slurm.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=None,
                       metavar="ARG", help="extra sbatch option, e.g. --sbatch-arg=--exclusive")
    slurm.add_argument("--port", type=int, default=None, help="rendezvous port on the first node (29500)")
    slurm.add_argument("--accel-type", dest="accel_type", choices=["auto", "gpu", "cpu"], default=None,
                       help="--accels as GPUs (--gres=gpu:M) or CPUs per node; auto asks sinfo")
    slurm.add_argument("--dry-run", dest="dry_run", action="store_true",
                       help="print the sbatch script (Kubernetes: the manifests) instead of submitting")
    kube = p.add_argument_group("kubernetes (with --scheduler kubernetes; defaults from $GPTRAIN_HOME/config.toml "
                                "[kubernetes]; docs/kubernetes.md)")
    kube.add_argument("--image", default=None, help="container image with gptrain (default gptrain:0.1.0)")
    kube.add_argument("--k8s-volume", dest="k8s_volume", default=None, metavar="CLAIM",
                      help="PersistentVolumeClaim holding $GPTRAIN_HOME, mounted there in every pod")
    kube.add_argument("--k8s-namespace", dest="k8s_namespace", default=None, metavar="NS")
    kube.add_argument("--k8s-context", dest="k8s_context", default=None, metavar="CONTEXT",
                      help="kubeconfig context (default: the current one)")
    kube.add_argument("--k8s-secret", dest="k8s_secrets", action="append", default=None, metavar="NAME",
                      help="a Secret in the namespace whose keys every pod gets as variables (repeatable)")
    kube.add_argument("--queue", default=None, help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)")
    p.set_defaults(func=cmd_run)


def register(sub) -> None:
    p = sub.add_parser("run", help="submit a named training job",
                       description="Submit a job and return at once (or follow its logs). After "
                       "`--` come trainer flags, a script (.py, .sh, any executable) and its "
                       "arguments, `-m module ARGS`, or any command (`bash run.sh`, `accelerate "
                       "launch ...`). See docs/jobs-code.md.")
    add_run_args(p)


def cmd_run(args, extra) -> int:
    from gptrain.jobs import api
    from gptrain.jobs import job_file
    from gptrain.jobs import spec as spec_mod
    from gptrain.jobs.local import user_setting

    fields: dict = job_file.from_yaml(args.job_file) if args.job_file else {}
    for note in fields.pop("notes", []):
        print(f"note: {args.job_file}: {note}", file=sys.stderr)
    if args.name:
        fields["name"] = args.name
    if "name" not in fields:
        raise UserError("give the job a NAME (gptrain run NAME ...) or `name:` in the job file")
    for key in ("nodes", "accels", "scheduler", "max_restarts", "datasets", "repository_url", "ref", "source",
                "resume_args"):
        if getattr(args, key) is not None:
            fields[key] = getattr(args, key)
    if args.code:
        fields["code"] = os.path.abspath(os.path.expanduser(args.code))
    if args.requirements and (fields.get("repository_url") or fields.get("source")):
        fields.pop("requirements", None)
        fields["requirements_file"] = args.requirements  # a path in the repository, read from its clone
    elif args.requirements:
        fields.pop("requirements_file", None)
        fields["requirements"] = job_file.read_config_file(args.requirements, "requirements file")
    if args.config:
        fields["config"] = job_file.read_config_file(args.config)
        fields["config_path"] = os.path.abspath(os.path.expanduser(args.config))
    fields["env"] = {**fields.get("env", {}), **spec_mod.parse_env(args.env)}
    fields["secrets"] = {**fields.get("secrets", {}), **spec_mod.parse_env(args.secret, "--secret")}
    entrypoint(args.passthrough, fields)
    if getattr(args, "training_command", None) == "run":  # the hosted words: its /input, /output
        from gptrain.jobs.hosted_paths import rewrite

        fields["args"], notes = rewrite(fields.get("args", []), fields.get("datasets") or [])
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    fields.setdefault("scheduler", user_setting("defaults", "scheduler") or "local")
    slurm_opts = {k: user_setting("slurm", k) for k in ("partition", "account", "time")}
    slurm_opts = {k: v for k, v in slurm_opts.items() if v}
    slurm_opts.update(fields.get("slurm") or {})
    for key in ("partition", "account", "time", "sbatch_args", "port", "accel_type"):
        if getattr(args, key) is not None:
            slurm_opts[key] = getattr(args, key)
    fields["slurm"] = slurm_opts
    if fields["scheduler"] == "kubernetes":
        fields["kubernetes"] = kube_options(args, fields.get("kubernetes") or {})
    spec = spec_mod.JobSpec(**fields)
    api.submit(spec, dry_run=args.dry_run)
    if args.dry_run:
        return 0
    nodes = f"{spec.min_nodes}:{spec.nodes}" if spec.elastic else spec.nodes
    print(f"submitted job {spec.name} ({nodes} node(s) x {spec.accels} accelerator(s), "
          f"{spec.scheduler}); watch it with `gptrain logs {spec.name} --follow`")
    if args.follow:
        from gptrain.cli.jobs import follow

        return follow(spec.name, rank=0)
    return 0


def kube_options(args, from_file: dict) -> dict:
    """--scheduler kubernetes options: config.toml [kubernetes], then the job file, then flags."""
    from gptrain.jobs.local import user_setting

    keys = {"image": "image", "volume": "k8s_volume", "namespace": "k8s_namespace", "context": "k8s_context",
            "secrets": "k8s_secrets", "queue": "queue", "port": "port", "accel_type": "accel_type"}
    opts = {k: user_setting("kubernetes", k) for k in (*keys, "python")}
    opts = {k: v for k, v in opts.items() if v is not None}
    opts.update(from_file)
    opts.update({k: getattr(args, a) for k, a in keys.items() if getattr(args, a) is not None})
    return opts


def entrypoint(rest: list[str], fields: dict) -> None:
    """What follows `--`, as JobSpec fields (entry kind, script/module/command, args); the
    submit directory becomes the job's code when the entrypoint names something in it."""
    if not rest:
        return
    head, tail = rest[0], rest[1:]
    remote = bool(fields.get("repository_url") or fields.get("source"))
    base = Path(fields.get("code") or os.getcwd())
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
        if not remote and not (base / head).is_file() and not (not fields.get("code") and Path(head).is_file()):
            raise UserError(f"script {head} does not exist" + (f" in {base}" if fields.get("code") else ""))
        fields.update(script=head, args=tail)
        local = not os.path.isabs(head)
    else:
        found = base / head if (base / head).is_file() else Path(head)
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
        fields["code"] = os.getcwd()  # the submit directory: relative paths work as they do here
