"""`gptrain session start|list|attach|exec|stop`: a shell in the environment a job would get
(jobs/sessions.py; docs/sessions.md)."""

from __future__ import annotations

import sys

from gptrain.cli import render


def register(sub) -> None:
    session = sub.add_parser("session", help="an interactive shell in a job's environment",
                             description="A shell, on a terminal, in the environment a job of the same spec "
                             "gets: the code (this folder, --source or --repository-url), the datasets at "
                             "/input/NAME, /output-checkpoint kept as the session's checkpoints, the job's "
                             "--env and --secret; its accelerators held from the queue until it ends (exit, "
                             "`gptrain session stop`, or --idle-timeout). docs/sessions.md.")
    ssub = session.add_subparsers(dest="session_command", metavar="ACTION")
    ssub.required = True
    p = ssub.add_parser("start", help="start a session (and attach to it, unless --detach)")
    p.add_argument("name")
    p.add_argument("--dataset", action="append", dest="datasets", default=None, help="a pushed dataset, at /input/NAME")
    p.add_argument("--accels", type=int, default=None, help="accelerators (processes) to hold for it")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--secret", action="append", default=[], metavar="K=V",
                   help="K=V, or K from this environment: in the session's environment, masked in records")
    p.add_argument("--source", "--source-name", dest="source", default=None, metavar="NAME",
                   help="a registered code source (`gptrain source add`) to check out")
    p.add_argument("--repository-url", dest="repository_url", default=None, metavar="URL")
    p.add_argument("--ref", default=None, help="branch, tag or commit of --repository-url / --source")
    p.add_argument("--idle-timeout", dest="idle_timeout", default="1h",
                   help="end it after this long with nobody attached and no command running (90s, 30m, 2h; "
                   "default 1h)")
    p.add_argument("--detach", action="store_true", help="return once it is ready instead of attaching")
    p.add_argument("--jupyter", action="store_true", help="a Jupyter Server in the session too, behind a token: "
                   "its URL printed (and by `gptrain session jupyter NAME`); pip install 'gptrain[session]'")
    p.set_defaults(func=cmd_start)
    p = ssub.add_parser("list", help="the sessions and their state")
    render.json_switch(p)
    p.set_defaults(func=cmd_list)
    p = ssub.add_parser("attach", help="attach this terminal to a session's shell")
    p.add_argument("name")
    p.set_defaults(func=cmd_attach)
    p = ssub.add_parser("exec", help="run one command in a session: gptrain session exec NAME -- CMD ...")
    p.add_argument("name")
    p.set_defaults(func=cmd_exec)
    p = ssub.add_parser("jupyter", help="the URL, with its token, of a session's Jupyter Server (--jupyter)")
    p.add_argument("name")
    render.json_switch(p)
    p.set_defaults(func=cmd_jupyter)
    p = ssub.add_parser("stop", help="end a session (its shell and commands) and free its accelerators")
    p.add_argument("name")
    p.set_defaults(func=cmd_stop)


def cmd_start(args, extra) -> int:
    from gptrain.jobs import api

    idle = api.parse_duration(args.idle_timeout)
    request = api.Request(name=args.name, datasets=args.datasets, accels=args.accels, env=args.env,
                          secrets=args.secret, source=args.source, repository_url=args.repository_url, ref=args.ref)
    spec, notes = api.start_session(request, idle, args.jupyter)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    api.wait_session(spec.name)
    print(f"session {spec.name} ready ({spec.accels} accelerator(s), local); ends after {render.duration(idle)} idle",
          file=sys.stderr)
    if args.jupyter:
        print(_jupyter_url(api.session_jupyter(spec.name)))
    if args.detach:
        print(f"attach with `gptrain session attach {spec.name}`; end it with `gptrain session stop {spec.name}`",
              file=sys.stderr)
        return 0
    api.attach_session(spec.name)
    return 0


def cmd_list(args, extra) -> int:
    from gptrain.jobs import api

    names = api.session_names()
    rows = [r for r in api.rows() if r["name"] in names]
    shown = [{"name": r["name"], "state": r["state"], "accels": r.get("accels"), "created": r.get("created")}
             for r in rows]
    if render.as_json(args, shown):
        return 0
    render.table([("NAME", "STATE", "ACCELS", "STARTED")] +
                 [(r["name"], r["state"], str(r["accels"]), render.when(r["created"])) for r in shown])
    return 0


def cmd_attach(args, extra) -> int:
    from gptrain.jobs import api

    api.attach_session(args.name)
    return 0


def cmd_exec(args, extra) -> int:
    from gptrain.jobs import api

    return api.run_in_session(args.name, args.passthrough)


def cmd_jupyter(args, extra) -> int:
    from gptrain.jobs import api

    found = api.session_jupyter(args.name)
    if not render.as_json(args, found):
        print(_jupyter_url(found))
    return 0


def _jupyter_url(found: dict) -> str:
    return f"{found['url']}?token={found['token']}"


def cmd_stop(args, extra) -> int:
    from gptrain.jobs import api

    api.check_is_session(args.name)
    state = api.stop(args.name, wait=True)
    print(f"session {args.name}: {state}")
    return 0
