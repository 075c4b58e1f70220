"""`gptrain jobs | inspect | logs | stop | resume | rm` (submitting: cli/run.py; a job's checkpoints:
cli/checkpoints.py): arguments parsed, jobs/api.py called, its answer shown (cli/render.py)."""

from __future__ import annotations

import sys

from gptrain.cli import render
from gptrain.jobs import api


def register(sub) -> None:
    p = sub.add_parser("jobs", help="list jobs")
    render.json_switch(p)
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("inspect", help="a job's state, lifecycle events, config, metrics, checkpoints")
    p.add_argument("name")
    render.json_switch(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("logs", help="a job's log (rank 0 by default)")
    p.add_argument("name")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--follow", "-f", action="store_true")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("stop", help="stop a job: it saves a checkpoint and exits")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=api.STOP_TIMEOUT_S, help="seconds before the stop is forced "
                   f"(default {api.STOP_TIMEOUT_S:g})")
    p.add_argument("--wait", action="store_true", help="return when the job has stopped and its supervisor has exited (nothing of it runs any more)")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("resume", help="run a failed or stopped job again from its latest checkpoint",
                       description="Queue a failed or stopped local job again, same name and spec: "
                       "the trainer continues from the latest checkpoint in the job's directory; your own "
                       "program is given its --resume-args (see docs/jobs-code.md).")
    p.add_argument("name")
    p.add_argument("--from", dest="from_id", metavar="ID", default=None,
                   help="resume from this checkpoint (an ID from `gptrain checkpoints NAME`) rather "
                   "than the newest; it is verified first")
    p.add_argument("--nodes", metavar="N", default=None,
                   help="run on N nodes from now on (MIN:MAX where elastic runs); the checkpoint is "
                   "resharded and the data goes on where it stopped (docs/multi-host.md)")
    p.add_argument("--allow-unverified", "--allow_unverified", dest="allow_unverified", action="store_true",
                   help="let the job load a checkpoint that has no checksums.json (written before gptrain "
                   "verified checkpoints) from now on, with a warning; refused otherwise")
    p.add_argument("--max-steps", "--max_steps", dest="max_steps", type=int, default=None, metavar="N",
                   help="train to step N in all (gptrain's trainer): extends a job, one that succeeded too; "
                   "its learning-rate schedule is computed for the new length (with --from: branch from "
                   "a warmup-stable-decay run's stable phase, docs/guide.md)")
    p.add_argument("--follow", action="store_true", help="stream rank 0's log until the job ends")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("rm", help="delete a finished job and its files")
    p.add_argument("name")
    p.set_defaults(func=cmd_rm)


# ---- reading jobs ---------------------------------------------------------------------------

def cmd_jobs(args, extra) -> int:
    rows = api.rows(force=True)
    if render.as_json(args, rows):
        return 0
    render.table([render.header("jobs"),
                  *((j["name"], j["state"], f"{render.nodes(j)}x{j['accels']} {j['scheduler']}",
                     render.steps(j["step"], j["total_steps"]), render.loss(j["loss"]), render.eta(j["eta_s"], j.get("stalled_s")),
                     render.age(j["created"])) for j in rows)])
    return 0


def cmd_inspect(args, extra) -> int:
    report = api.report(args.name)
    if render.as_json(args, report):
        return 0
    job = report["job"]
    print(f"job        {job['name']}")
    print(f"state      {job['state']}" + (f"  (exit code {job['exit_code']})" if job["exit_code"] else ""))
    if job["error"]:
        print(f"error      {job['error']}")
    print(f"resources  {render.nodes(job)} node(s) x {job['accels']} accelerator(s), {job['scheduler']} "
          f"scheduler" + (f", slots {job['slots']}" if job["slots"] else "")
          + (f", id {job['external_id']}" if job["external_id"] else ""))
    if report["describe"]:
        print(report["describe"])
    print(f"created    {render.when(job['created'])}   started {render.when(job['started'])}   "
          f"ended {render.when(job['ended'])}   restarts {job['restarts']}")
    spec = report["spec"]
    print(f"runs       {_runs(spec, report['runs'])}".rstrip() + (f"   datasets {', '.join(spec['datasets'])}" if spec["datasets"] else ""))
    if spec.get("secrets"):
        print(f"secrets    {'  '.join(f'{k}={v}' for k, v in spec['secrets'].items())}")
    print("events")
    saved = [e for e in report["events"] if e["kind"] == "checkpoint"]
    for e in report["events"]:
        if e["kind"] != "checkpoint" or e is saved[-1]:  # checkpoints folded into one line: the newest
            more = f"  (and {len(saved) - 1} before it: gptrain checkpoints {job['name']})" \
                if e["kind"] == "checkpoint" and len(saved) > 1 else ""
            print(f"  {render.when(e['time'])}  {e['kind']:<11} {e['message']}{more}")
    for prefix, m in report["metrics"].items():
        print(f"{prefix:<10} {render.record(m)}")
    summary = report.get("summary") or {}
    if summary:
        print(f"run        {render.run_summary(summary)}")
    line = api.loss_line(args.name)
    if line:
        print(f"loss       {line}")
    for i, key in enumerate(("precision", "kernels", "mfu_basis")):  # how the built-in trainer runs
        if (report["trainer"] or {}).get(key):
            print(f"{'trainer' if i == 0 else '':<10} {key.replace('_', ' ')} {report['trainer'][key]}")
    print(f"checkpoints ({len(report['checkpoints'])})")
    for c in report["checkpoints"]:
        print(f"  {c['id']}  {c['name']}  " + (f"step {c['step']}" if c["step"] is not None else "(no step recorded)"))
    if report["config"]:
        print("config")
        print("  " + report["config"].strip().replace("\n", "\n  "))
    return 0


def _runs(spec: dict, runs: dict) -> str:
    """What a job runs, as typed after `--` (and where its code came from)."""
    what = f"{runs['entry']} {' '.join(runs['argv'])}" if runs["entry"] != "trainer" \
        else f"gptrain train {' '.join(runs['args'])}"
    if spec.get("repository_url"):
        what += f"   code {spec['repository_url']}" + (f" @ {runs['commit'][:12]}" if runs["commit"] else "")
    elif spec.get("code"):
        what += f"   code {spec['code']}"
    return what


# ---- logs -----------------------------------------------------------------------------------

def follow(name: str, rank: int) -> int:
    """Print the rank's log as it is written until the job ends; 0 when it succeeded."""
    for page in api.follow_log(name, rank):
        sys.stdout.write(page)
        sys.stdout.flush()
    state = api.job(name)["state"]
    print(f"--- job {name} {state}", file=sys.stderr)
    return 0 if state == "succeeded" else 1


def cmd_logs(args, extra) -> int:
    job = api.job(args.name)
    path = api.log_path(args.name, args.rank)
    if args.follow:
        return follow(args.name, args.rank)
    if not path.is_file():
        print(f"(no log for rank {args.rank} yet: the job is {job['state']})", file=sys.stderr)
    for page in api.log_pages(args.name, args.rank):
        sys.stdout.write(page)
    return 0


# ---- stop, resume, rm ------------------------------------------------------------------------

def cmd_stop(args, extra) -> int:
    print(f"job {args.name}: {api.stop(args.name, args.timeout, args.wait)}")
    return 0


def cmd_resume(args, extra) -> int:
    api.resume(args.name, args.from_id, args.nodes, args.allow_unverified, args.max_steps)
    where = (f" on {args.nodes} node(s)" if args.nodes else "") + (f" to step {args.max_steps:,}" if args.max_steps else "")
    print(f"resumed job {args.name}{f' from checkpoint {args.from_id}' if args.from_id else ''}{where}; watch it with `gptrain logs {args.name} --follow`")
    return follow(args.name, rank=0) if args.follow else 0


def cmd_rm(args, extra) -> int:
    api.remove(args.name)
    print(f"removed job {args.name}")
    return 0
