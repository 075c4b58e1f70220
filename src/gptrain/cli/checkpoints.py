"""`gptrain checkpoints NAME | checkpoint fetch ID | fetch NAME`: what a job wrote, listed and copied out."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("checkpoints", help="list a job's checkpoints")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_checkpoints)

    p = sub.add_parser("checkpoint", help="checkpoint actions")
    csub = p.add_subparsers(dest="checkpoint_command", metavar="ACTION")
    csub.required = True
    f = csub.add_parser("fetch", help="copy a checkpoint out (native) or export it (hf)")
    f.add_argument("id", metavar="ID")
    f.add_argument("--destination", default=None, help="directory to create (default ./ID; a "
                   "single-file checkpoint is copied into it)")
    f.add_argument("--format", choices=["native", "hf"], default="native")
    f.set_defaults(func=cmd_checkpoint_fetch)

    p = sub.add_parser("fetch", help="a job's outputs as a zip file")
    p.add_argument("name")
    p.add_argument("--destination", default=".", help="directory for NAME.zip")
    p.set_defaults(func=cmd_fetch)


def cmd_checkpoints(args, extra) -> int:
    from gptrain.cli import render
    from gptrain.jobs import api

    api.job(args.name)
    rows = api.checkpoints(args.name)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    render.table([("ID", "NAME", "KIND", "STEP", "TRAIN LOSS", "EVAL LOSS", "TIME", "SIZE"),
                  *((c["id"], c["name"], c["kind"], c["step"], render.loss(c["train_loss"]),
                     render.loss(c["eval_loss"]), render.when(c["time"]), render.size(c["size"])) for c in rows)])
    return 0


def cmd_checkpoint_fetch(args, extra) -> int:
    from pathlib import Path

    from gptrain.jobs import api

    ckpt = api.checkpoint(args.id)
    dest = Path(args.destination or args.id)
    api.export_checkpoint(ckpt, dest, args.format)
    print(f"fetched checkpoint {args.id} ({ckpt['job']}/{ckpt['name']}) to {dest} ({args.format})")
    return 0


def cmd_fetch(args, extra) -> int:
    from pathlib import Path

    from gptrain.jobs import api

    dest = Path(args.destination) / f"{args.name}.zip"
    api.known(args.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    api.zip_job(args.name, dest)
    print(f"wrote {dest}")
    return 0
