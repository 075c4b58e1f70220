"""`gptrain source add | list | rm`: named git repositories for `gptrain run --source NAME`
(the hosted CLI's `--source-name`); the URL and its default ref are checked when added."""

from __future__ import annotations

from gptrain.cli import render


def register(sub) -> None:
    p = sub.add_parser("source", help="name git repositories for `run --source NAME`")
    ssub = p.add_subparsers(dest="source_command", metavar="ACTION")
    ssub.required = True
    a = ssub.add_parser("add", help="name a repository URL (https://, ssh://, git@host:path, file://, a path)")
    a.add_argument("name")
    a.add_argument("url")
    a.add_argument("--ref", default=None, help="default branch, tag or commit")
    a.set_defaults(func=cmd_add)
    lister = ssub.add_parser("list", help="list named repositories")
    render.json_switch(lister)
    lister.set_defaults(func=cmd_list)
    r = ssub.add_parser("rm", help="forget a named repository")
    r.add_argument("name")
    r.set_defaults(func=cmd_rm)


def cmd_add(args, extra) -> int:
    from gptrain.jobs import api

    url = api.add_source(args.name, args.url, args.ref)
    print(f"source {args.name}: {url}" + (f" @ {args.ref}" if args.ref else ""))
    return 0


def cmd_list(args, extra) -> int:
    from gptrain.jobs import api

    sources = api.sources()
    if not render.as_json(args, sources):
        render.table([("NAME", "URL", "REF"), *((s["name"], s["url"], s["ref"] or "-") for s in sources)])
    return 0


def cmd_rm(args, extra) -> int:
    from gptrain.jobs import api

    api.remove_source(args.name)
    print(f"removed source {args.name}")
    return 0
