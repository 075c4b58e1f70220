"""`gptrain sweep NAME ... -- FLAGS`, `gptrain sweep inspect|stop|resume NAME`, `gptrain sweep list`:
hyperparameter sweeps (jobs/sweeps.py; docs/sweeps.md)."""

from __future__ import annotations

from gptrain.cli import render
from gptrain.cli.run import add_engine_args, engine_args
from gptrain.jobs.api import SCHEDULERS

ACTIONS = ("inspect", "stop", "resume", "list")


def register(sub) -> None:
    p = sub.add_parser("sweep", help="many trials of one job, sampled and stopped early (Optuna)",
                       description="gptrain sweep NAME --param KEY=SPACE ... [--trials N] [--parallel K] "
                       "[--early-stop asha|none] [--dataset D] -- TRAINER FLAGS: trials NAME-t00, NAME-t01, ... "
                       "as jobs, each ranked by its eval loss; `gptrain sweep inspect|stop|resume NAME`, "
                       "`gptrain sweep list`. A sweep's name stands for its best trial as a MODEL. docs/sweeps.md.")
    p.add_argument("first", metavar="NAME|ACTION", help="the new sweep's name, or inspect, stop, resume, list")
    p.add_argument("second", nargs="?", metavar="NAME", help="the sweep an action is about")
    p.add_argument("--param", action="append", default=[], metavar="KEY=SPACE",
                   help="a setting to search: a,b,c | uniform:LO:HI | loguniform:LO:HI | int:LO:HI (repeatable)")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--parallel", type=int, default=1, help="trials at once (through the job queue)")
    p.add_argument("--early-stop", dest="early_stop", default="asha", help="asha (successive halving) or none")
    p.add_argument("--reduction-factor", dest="reduction_factor", type=int, default=3,
                   help="asha: the share of trials kept at each rung is 1/this")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--dataset", action="append", dest="datasets", default=None)
    p.add_argument("--accels", type=int, default=None, help="processes per node of each trial")
    p.add_argument("--nodes", default=None, metavar="N", help="nodes of each trial (default 1)")
    p.add_argument("--scheduler", choices=list(SCHEDULERS), default=None,
                   help="where the trials run (default: [defaults] scheduler in config.toml, else local)")
    add_engine_args(p)
    render.json_switch(p)
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args, extra) -> int:
    from gptrain.errors import UserError
    from gptrain.jobs import api

    action, name = (args.first, args.second) if args.first in ACTIONS else ("start", args.first)
    if action == "list":
        names = api.sweeps()
        if not render.as_json(args, names):
            print("\n".join(names) if names else "no sweeps")
        return 0
    if name is None:
        raise UserError(f"gptrain sweep {action} NAME: give the sweep's name")
    if action == "start":
        spec = api.create_sweep(name, args.param, args.trials, args.parallel, args.early_stop, args.passthrough,
                                args.datasets, args.accels, args.reduction_factor, args.seed,
                                {"scheduler": args.scheduler, "nodes": args.nodes, **engine_args(args)})
        print(f"sweep {name}: {spec['trials']} trials, {spec['parallel']} at once on {spec['scheduler']}, "
              f"early stop {spec['early_stop']}; "
              f"watch it with `gptrain sweep inspect {name}`")
    elif action == "stop":
        stopped = api.stop_sweep(name)
        print(f"sweep {name} stopped" + (f" (trials {', '.join(stopped)} stopped)" if stopped else ""))
    elif action == "resume":
        api.resume_sweep(name)
        print(f"sweep {name} goes on")
    else:
        return inspect(args, name)
    return 0


def inspect(args, name: str) -> int:
    from gptrain.jobs import api

    report = api.sweep_report(name)
    if render.as_json(args, report):
        return 0
    spec, keys = report["spec"], list(report["spec"]["params"])
    rows = [("TRIAL", "JOB", "STATE", *keys, "EVAL LOSS", "BEST", "STEP")]
    for t in report["trials"]:
        rows.append((str(t["number"]), t["job"] or "-", t["shown"], *(_value(t["params"].get(k)) for k in keys),
                     render.loss(t["value"]), render.loss(t["best"]), str(t["step"] or "-")))
    render.table(rows)
    print(f"{report['ended']} of {spec['trials']} trials ended ({report['pruned']} pruned); driver {report['driver']}"
          + (f"; best: {report['best']} (eval loss {report['best_value']:.4f})" if report["best"] else ""))
    return 0


def _value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v) if v is not None else "-"
