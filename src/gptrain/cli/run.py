"""`gptrain run NAME [options] -- ENTRYPOINT`: submit a job. The flags become a jobs.api.Request
(jobs/submission.py: what may follow `--`, how a job file, flags and defaults merge)."""

from __future__ import annotations

import sys

from gptrain.jobs.api import ENGINE_OPTIONS, SCHEDULERS


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
    p.add_argument("--keep-on-failure", dest="keep_on_failure", nargs="?", const="1h", default=None,
                   metavar="DURATION", help="when the job fails, keep its environment (and accelerators) for "
                   "`gptrain session attach NAME` until `gptrain stop NAME` or DURATION unused (default 1h; local "
                   "engine; docs/sessions.md)")
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
    add_engine_args(p, dry_run=True)
    p.set_defaults(func=cmd_run)


ENGINES_WITH_OPTIONS = ("slurm", "kubernetes")


def add_engine_args(p, dry_run: bool = False) -> None:
    """Each engine's options as it declares them (jobs/engines/options.py), in a group of its own."""
    groups = {"slurm": "slurm (with --scheduler slurm; defaults from $GPTRAIN_HOME/config.toml [slurm])",
              "kubernetes": "kubernetes (with --scheduler kubernetes; defaults from $GPTRAIN_HOME/config.toml "
                            "[kubernetes]; docs/kubernetes.md)"}
    added = set()
    for engine in ENGINES_WITH_OPTIONS:
        group = p.add_argument_group(groups[engine])
        for option in ENGINE_OPTIONS[engine]:
            if option.flag and option.flag not in added:
                added.add(option.flag)
                kind = {"int": {"type": int}, "list": {"action": "append"},
                        "choice": {"choices": list(option.choices)}}.get(option.kind, {})
                group.add_argument(option.flag, dest=option.dest, default=None, help=option.help,
                                   metavar=option.metavar, **kind)
        if engine == "slurm" and dry_run:
            group.add_argument("--dry-run", dest="dry_run", action="store_true",
                               help="print the sbatch script (Kubernetes: the manifests) instead of submitting")


def engine_args(args) -> dict:
    """{engine: {option key: the value given}} of add_engine_args' flags, for a Request."""
    return {engine: {o.key: getattr(args, o.dest) for o in ENGINE_OPTIONS[engine] if o.flag}
            for engine in ENGINES_WITH_OPTIONS}


def register(sub) -> None:
    p = sub.add_parser("run", help="submit a named training job",
                       description="Submit a job and return at once (or follow its logs). After "
                       "`--` come trainer flags, a script (.py, .sh, any executable) and its "
                       "arguments, `-m module ARGS`, or any command (`bash run.sh`, `accelerate "
                       "launch ...`). See docs/jobs-code.md.")
    add_run_args(p)


def cmd_run(args, extra) -> int:
    from gptrain.jobs import api

    fields: dict = api.read_job_file(args.job_file) if args.job_file else {}
    for note in fields.pop("notes", []):
        print(f"note: {args.job_file}: {note}", file=sys.stderr)
    request = api.Request(
        fields=fields, name=args.name, entry=args.passthrough, datasets=args.datasets, nodes=args.nodes,
        accels=args.accels, scheduler=args.scheduler, max_restarts=args.max_restarts, config=args.config,
        env=args.env, secrets=args.secret, code=args.code, repository_url=args.repository_url, ref=args.ref,
        source=args.source, requirements=args.requirements, resume_args=args.resume_args,
        keep_on_failure=api.parse_duration(args.keep_on_failure, "--keep-on-failure")
        if args.keep_on_failure is not None else None,
        **engine_args(args),
        hosted=getattr(args, "training_command", None) == "run")
    spec, notes = api.submit(request, dry_run=args.dry_run)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.dry_run:
        return 0
    nodes = f"{spec.min_nodes}:{spec.nodes}" if spec.elastic else spec.nodes
    print(f"submitted job {spec.name} ({nodes} node(s) x {spec.accels} accelerator(s), "
          f"{spec.scheduler}); watch it with `gptrain logs {spec.name} --follow`")
    if args.follow:
        from gptrain.cli.jobs import follow

        return follow(spec.name, rank=0)
    return 0
