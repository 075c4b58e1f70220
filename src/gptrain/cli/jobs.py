"""`gptrain run | jobs | inspect | logs | stop | resume | rm` (a job's checkpoints: cli/checkpoints.py)."""

from __future__ import annotations

import json
import os
import sys
import time


def register(sub) -> None:
    p = sub.add_parser("run", help="submit a named training job",
                       description="Submit a job and return at once (or follow its logs). After "
                       "`--` come trainer flags, or a script path and its arguments.")
    p.add_argument("name", nargs="?", help="job name (or `name:` in -f job.yaml)")
    p.add_argument("-f", "--file", dest="job_file", help="job.yaml describing the job")
    p.add_argument("--dataset", action="append", dest="datasets", default=None,
                   help="named dataset (repeatable; the first feeds the trainer)")
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--accels", type=int, default=None, help="processes (accelerators) per node")
    p.add_argument("--scheduler", choices=["local", "slurm"], default=None)
    p.add_argument("--config", default=None, help="trainer config TOML")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment variable for every worker (repeatable; recorded in plain text)")
    p.add_argument("--secret", action="append", default=[], metavar="K=V",
                   help="like --env, but the value is kept out of every record (a 0600 file), shown "
                   "as *** and masked in logs; a bare K takes its value from this shell (repeatable)")
    p.add_argument("--max-restarts", dest="max_restarts", type=int, default=None)
    p.add_argument("--follow", action="store_true", help="stream rank 0's log until the job ends")
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
                       help="print the sbatch script instead of submitting")
    p.set_defaults(func=cmd_run)

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


# ---- run ------------------------------------------------------------------------------------

def cmd_run(args, extra) -> int:
    from gptrain.errors import UserError
    from gptrain.jobs import spec as spec_mod

    fields: dict = spec_mod.from_yaml(args.job_file) if args.job_file else {}
    if args.name:
        fields["name"] = args.name
    if "name" not in fields:
        raise UserError("give the job a NAME (gptrain run NAME ...) or `name:` in the job file")
    for key in ("nodes", "accels", "scheduler", "max_restarts", "datasets"):
        if getattr(args, key) is not None:
            fields[key] = getattr(args, key)
    if args.config:
        fields["config"] = spec_mod.read_config_file(args.config)
        fields["config_path"] = os.path.abspath(os.path.expanduser(args.config))
    fields["env"] = {**fields.get("env", {}), **spec_mod.parse_env(args.env)}
    fields["secrets"] = {**fields.get("secrets", {}), **spec_mod.parse_env(args.secret, "--secret")}
    rest = args.passthrough
    if rest:
        if rest[0].endswith(".py") or (not rest[0].startswith("-") and _is_file(rest[0])):
            fields["script"], fields["args"] = rest[0], rest[1:]
        else:
            fields["args"] = [*fields.get("args", []), *rest]
    from gptrain.jobs.local import user_setting

    fields.setdefault("scheduler", user_setting("defaults", "scheduler") or "local")
    slurm_opts = {k: user_setting("slurm", k) for k in ("partition", "account", "time")}
    slurm_opts = {k: v for k, v in slurm_opts.items() if v}
    slurm_opts.update(fields.get("slurm") or {})
    for key in ("partition", "account", "time", "sbatch_args", "port", "accel_type"):
        if getattr(args, key) is not None:
            slurm_opts[key] = getattr(args, key)
    fields["slurm"] = slurm_opts
    spec = spec_mod.JobSpec(**fields)
    if args.dry_run and spec.scheduler != "slurm":
        raise UserError("--dry-run prints a Slurm script: add --scheduler slurm")
    if spec.scheduler == "slurm":
        from gptrain.jobs import slurm

        job_id = slurm.submit(spec, dry_run=args.dry_run)
        if job_id is None:
            return 0
    else:
        from gptrain.jobs import local

        local.submit(spec)
    print(f"submitted job {spec.name} ({spec.nodes} node(s) x {spec.accels} accelerator(s), "
          f"{spec.scheduler}); watch it with `gptrain logs {spec.name} --follow`")
    if args.follow:
        return _follow(spec.name, rank=0)
    return 0


def _is_file(path: str) -> bool:
    from pathlib import Path

    return Path(path).is_file()


# ---- reading jobs ---------------------------------------------------------------------------

def _latest_metrics(name: str) -> dict:
    """The last train and eval records of a job's metrics.jsonl (read from the end)."""
    from gptrain.jobs.local import job_dir

    path = job_dir(name) / "metrics.jsonl"
    out: dict = {}
    if not path.is_file():
        return out
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        for prefix in ("train", "eval"):
            if prefix not in out and f"{prefix}/loss" in rec:
                out[prefix] = {"step": rec["step"], **{k.split("/", 1)[1]: v for k, v in rec.items()
                                                       if k.startswith(prefix + "/")}}
        if len(out) == 2:
            break
    return out


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

    from gptrain.jobs.reconcile import reconcile

    unrecorded = reconcile()
    jobs = [_refresh(j["name"]) if j["scheduler"] == "slurm" else {**j, **unrecorded.get(j["name"], {})}
            for j in store.list_jobs()]
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
    from gptrain.jobs.local import job_dir

    job = _refresh(name)
    _sync(name)
    cfg = job_dir(name) / "config.toml"
    return {"job": {k: v for k, v in job.items() if k != "spec"}, "spec": job["spec"],
            "events": store.events(name), "metrics": _latest_metrics(name),
            "checkpoints": store.checkpoints(name),
            "config": cfg.read_text() if cfg.is_file() else None}


def _sync(name: str) -> None:
    import sqlite3

    from gptrain.db import out_of_space
    from gptrain.jobs import local, store

    if local.job_dir(name).is_dir():
        try:
            store.sync_checkpoints(name, local.scan_checkpoints(name))
        except sqlite3.OperationalError as e:
            if not out_of_space(e):
                raise  # a full disk: list what was recorded


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
    if job["scheduler"] == "slurm" and job["external_id"] and job["state"] not in ("succeeded", "failed", "stopped"):
        from gptrain.jobs import slurm

        info = slurm.query(job["external_id"])
        if info:
            print(f"slurm      job {job['external_id']}: {info['state']}"
                  + (f" (reason: {info['reason']})" if info["reason"] != "None" else ""))
    print(f"created    {_ts(job['created'])}   started {_ts(job['started'])}   ended {_ts(job['ended'])}"
          f"   restarts {job['restarts']}")
    spec = report["spec"]
    what = f"script {spec['script']} {' '.join(spec['args'])}" if spec["script"] else \
        f"gptrain train {' '.join(spec['args'])}"
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


def _print_loss_sparkline(name: str) -> None:
    from gptrain.jobs.local import job_dir
    from gptrain.ui.sparkline import loss_line

    line = loss_line(job_dir(name) / "metrics.jsonl")
    if line:
        print(f"loss       {line}")


# ---- logs -----------------------------------------------------------------------------------

def _log_path(name: str, rank: int):
    from gptrain.jobs.local import job_dir

    return job_dir(name) / "logs" / f"rank-{rank}.log"


def _refresh(name: str) -> dict:
    """The job, with its state first brought up to date: from Slurm, or for a local job by
    reconciling (a dead supervisor's job is ended or handed to a new supervisor)."""
    from gptrain.jobs import store

    job = store.get_job(name)
    if job["scheduler"] == "local" and job["state"] in store.ACTIVE:
        from gptrain.jobs.reconcile import reconcile

        unrecorded = reconcile()
        job = {**store.get_job(name), **unrecorded.get(name, {})}
    if job["scheduler"] == "slurm":
        from gptrain.jobs import slurm

        job = slurm.refresh(name)
    return job


def _follow(name: str, rank: int) -> int:
    from gptrain.jobs import secrets, store

    path = _log_path(name, rank)
    pos = 0
    values = secrets.load(name).values()
    while True:
        state = _refresh(name)["state"]
        if path.is_file():
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
            if state not in store.TERMINAL and b"\n" in chunk:
                chunk = chunk[:chunk.rindex(b"\n") + 1]  # whole lines, so a secret is masked whole
            elif state not in store.TERMINAL:
                chunk = b""
            pos += len(chunk)
            if chunk:
                sys.stdout.write(secrets.mask(chunk.decode(errors="replace"), values))
                sys.stdout.flush()
        if state in store.TERMINAL and (not path.is_file() or path.stat().st_size == pos):
            print(f"--- job {name} {state}", file=sys.stderr)
            return 0 if state == "succeeded" else 1
        time.sleep(0.5)


def cmd_logs(args, extra) -> int:
    from gptrain.errors import UserError

    job = _refresh(args.name)
    if args.rank < 0 or args.rank >= job["nodes"] * job["accels"]:
        raise UserError(f"job {args.name} has ranks 0..{job['nodes'] * job['accels'] - 1}")
    if args.follow:
        return _follow(args.name, args.rank)
    path = _log_path(args.name, args.rank)
    if path.is_file():
        from gptrain.jobs.secrets import masked

        sys.stdout.write(masked(args.name, path.read_text(errors="replace")))
    else:
        print(f"(no log for rank {args.rank} yet: the job is {job['state']})", file=sys.stderr)
    return 0


# ---- stop, resume, rm ------------------------------------------------------------------------

def cmd_stop(args, extra) -> int:
    from gptrain.jobs import store

    job = store.get_job(args.name)
    if job["scheduler"] == "slurm":
        from gptrain.jobs import slurm

        state = slurm.stop(args.name, args.timeout)
    else:
        from gptrain.jobs import local

        state = local.stop(args.name, args.timeout)
    if args.wait:
        while _refresh(args.name)["state"] not in store.TERMINAL:
            time.sleep(0.5)
        state = store.get_job(args.name)["state"]
    print(f"job {args.name}: {state}")
    return 0


def cmd_resume(args, extra) -> int:
    from gptrain.jobs import local

    local.resume(args.name)
    print(f"resumed job {args.name}; watch it with `gptrain logs {args.name} --follow`")
    return _follow(args.name, rank=0) if args.follow else 0


def cmd_rm(args, extra) -> int:
    import shutil

    from gptrain.errors import UserError
    from gptrain.jobs import store
    from gptrain.jobs.local import job_dir

    job = _refresh(args.name)
    if job["state"] in store.ACTIVE:
        raise UserError(f"job {args.name} is {job['state']}; `gptrain stop {args.name}` first")
    store.delete_job(args.name)
    shutil.rmtree(job_dir(args.name), ignore_errors=True)
    from gptrain.jobs import secrets

    secrets.remove(args.name)
    print(f"removed job {args.name}")
    return 0
