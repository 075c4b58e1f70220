"""`gptrain jobs | inspect | logs | stop | resume | rm` (submitting: cli/run.py; a job's checkpoints:
cli/checkpoints.py). Every scheduler is reached through jobs/schedulers.py."""

from __future__ import annotations

import json
import sys
import time

from gptrain.jobs import records


def register(sub) -> None:
    p = sub.add_parser("jobs", help="list jobs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("inspect", help="a job's state, lifecycle events, config, metrics, checkpoints")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("logs", help="a job's log (rank 0 by default)")
    p.add_argument("name")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--follow", "-f", action="store_true")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("stop", help="stop a job: it saves a checkpoint and exits")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the stop is forced")
    p.add_argument("--wait", action="store_true", help="return when the job has stopped")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("resume", help="run a failed or stopped job again from its latest checkpoint",
                       description="Queue a failed or stopped local job again, same name and spec: "
                       "the trainer continues from the latest checkpoint in the job's directory.")
    p.add_argument("name")
    p.add_argument("--follow", action="store_true", help="stream rank 0's log until the job ends")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("rm", help="delete a finished job and its files")
    p.add_argument("name")
    p.set_defaults(func=cmd_rm)


# ---- reading jobs ---------------------------------------------------------------------------

def _latest_metrics(name: str) -> dict:
    """The last train and eval records of a job, built-in trainer or script (jobs/progress.py)."""
    from gptrain.jobs import progress
    from gptrain.jobs.folder import job_dir

    return progress.latest(job_dir(name))


def _age(t: float | None) -> str:
    if not t:
        return "-"
    s = time.time() - t
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def cmd_jobs(args, extra) -> int:
    from gptrain.cli.data import _table
    from gptrain.jobs import store

    jobs = [records.refresh(j["name"]) for j in store.list_jobs()]
    if args.json:
        print(json.dumps([{k: v for k, v in j.items() if k != "spec"} for j in jobs], indent=2))
        return 0
    rows = [("NAME", "STATE", "RESOURCES", "STEP", "LOSS", "AGE")]
    for j in jobs:
        m = _latest_metrics(j["name"]).get("train", {})
        rows.append((j["name"], j["state"], f"{j['nodes']}x{j['accels']} {j['scheduler']}",
                     m.get("step", "-"), f"{m['loss']:.4f}" if "loss" in m else "-", _age(j["created"])))
    _table(rows)
    return 0


def _job_report(name: str) -> dict:
    from gptrain.jobs import store
    from gptrain.jobs.folder import job_dir, trainer_config

    job = records.refresh(name)
    records.sync_checkpoints(name)
    cfg = trainer_config(job_dir(name))
    return {"job": {k: v for k, v in job.items() if k != "spec"}, "spec": job["spec"],
            "events": store.events(name), "metrics": _latest_metrics(name),
            "checkpoints": store.checkpoints(name),
            "config": cfg.read_text() if cfg.is_file() else None}


def _ts(t) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def cmd_inspect(args, extra) -> int:
    report = _job_report(args.name)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    job = report["job"]
    print(f"job        {job['name']}")
    print(f"state      {job['state']}" + (f"  (exit code {job['exit_code']})" if job["exit_code"] else ""))
    if job["error"]:
        print(f"error      {job['error']}")
    print(f"resources  {job['nodes']} node(s) x {job['accels']} accelerator(s), {job['scheduler']} "
          f"scheduler" + (f", slots {job['slots']}" if job["slots"] else "")
          + (f", id {job['external_id']}" if job["external_id"] else ""))
    from gptrain.jobs.schedulers import scheduler

    line = scheduler(job["scheduler"]).describe(job)
    if line:
        print(line)
    print(f"created    {_ts(job['created'])}   started {_ts(job['started'])}   ended {_ts(job['ended'])}"
          f"   restarts {job['restarts']}")
    spec = report["spec"]
    what = _runs(spec)
    print(f"runs       {what}".rstrip() + (f"   datasets {', '.join(spec['datasets'])}" if spec["datasets"] else ""))
    if spec.get("secrets"):
        print(f"secrets    {'  '.join(f'{k}={v}' for k, v in spec['secrets'].items())}")
    print("events")
    for e in report["events"]:
        print(f"  {_ts(e['time'])}  {e['kind']:<11} {e['message']}")
    for prefix, m in report["metrics"].items():
        vals = "  ".join(f"{k} {v:.4g}" for k, v in m.items() if k != "step" and isinstance(v, (int, float)))
        print(f"{prefix:<10} step {m['step']}  {vals}")
    _print_loss_sparkline(job["name"])
    print(f"checkpoints ({len(report['checkpoints'])})")
    for c in report["checkpoints"]:
        print(f"  {c['id']}  {c['name']}  step {c['step']}")
    if report["config"]:
        print("config")
        print("  " + report["config"].strip().replace("\n", "\n  "))
    return 0


def _runs(spec: dict) -> str:
    """What a job runs, as typed after `--` (and where its code came from)."""
    from gptrain.jobs.code import redact
    from gptrain.jobs.spec import JobSpec

    js = JobSpec.from_dict(spec)
    what = f"{js.entry} {' '.join(js.argv)}" if js.entry != "trainer" else f"gptrain train {' '.join(js.args)}"
    if js.repository_url:
        what += f"   code {redact(js.repository_url)}" + (f" @ {js.commit[:12]}" if js.commit else "")
    elif js.code:
        what += f"   code {js.code}"
    return what


def _print_loss_sparkline(name: str) -> None:
    from gptrain.jobs.folder import job_dir
    from gptrain.jobs.progress import jsonl_path
    from gptrain.jobs.sparkline import loss_line

    line = loss_line(jsonl_path(job_dir(name)))
    if line:
        print(f"loss       {line}")


# ---- logs -----------------------------------------------------------------------------------

def _log_path(name: str, rank: int):
    from gptrain.jobs.folder import job_dir, logs_dir
    from gptrain.jobs.logs import rank_log

    return rank_log(logs_dir(job_dir(name)), rank)


def _follow(name: str, rank: int) -> int:
    """Print the rank's log as it is written (jobs/logs.follow) until the job ends."""
    from gptrain.jobs import logs, secrets, store

    state = {}

    def ended() -> bool:
        state["now"] = records.refresh(name)["state"]
        return state["now"] in store.TERMINAL

    for page in logs.follow(_log_path(name, rank), secrets.load(name).values(), ended):
        sys.stdout.write(page)
        sys.stdout.flush()
    print(f"--- job {name} {state['now']}", file=sys.stderr)
    return 0 if state["now"] == "succeeded" else 1


def cmd_logs(args, extra) -> int:
    from gptrain.jobs import logs, secrets

    job = records.refresh(args.name)
    logs.check_rank(str(args.rank), job["nodes"] * job["accels"])
    if args.follow:
        return _follow(args.name, args.rank)
    path = _log_path(args.name, args.rank)
    if path.is_file():
        for page in logs.pages(path, secrets.load(args.name).values()):
            sys.stdout.write(page)
    else:
        print(f"(no log for rank {args.rank} yet: the job is {job['state']})", file=sys.stderr)
    return 0


# ---- stop, resume, rm ------------------------------------------------------------------------

def cmd_stop(args, extra) -> int:
    from gptrain.jobs import store

    from gptrain.jobs.schedulers import scheduler

    state = scheduler(store.get_job(args.name)["scheduler"]).stop(args.name, args.timeout)
    if args.wait:
        while records.refresh(args.name)["state"] not in store.TERMINAL:
            time.sleep(0.5)
        state = store.get_job(args.name)["state"]
    print(f"job {args.name}: {state}")
    return 0


def cmd_resume(args, extra) -> int:
    from gptrain.jobs import records

    records.resume(args.name)
    print(f"resumed job {args.name}; watch it with `gptrain logs {args.name} --follow`")
    return _follow(args.name, rank=0) if args.follow else 0


def cmd_rm(args, extra) -> int:
    from gptrain.jobs import records

    records.remove(args.name)
    print(f"removed job {args.name}")
    return 0
