"""`gptrain checkpoints NAME | checkpoint fetch ID | fetch NAME`: what a job wrote, listed and copied out."""

from __future__ import annotations

from gptrain.cli import render



def register(sub) -> None:
    p = sub.add_parser("checkpoints", help="list a job's checkpoints")
    p.add_argument("name")
    render.json_switch(p)
    p.add_argument("--verify", action="store_true", help="check each checkpoint's files against the "
                   "checksums written with it (reads them all)")
    p.set_defaults(func=cmd_checkpoints)

    p = sub.add_parser("checkpoint", help="checkpoint actions")
    csub = p.add_subparsers(dest="checkpoint_command", metavar="ACTION")
    csub.required = True
    f = csub.add_parser("fetch", help="a checkpoint as a Hugging Face model folder (or its own files)",
                        description="Write checkpoint ID where its next reader opens it: a model checkpoint "
                        "as a Hugging Face folder (config.json, model.safetensors: "
                        "AutoModelForCausalLM.from_pretrained(DIR) loads it), any other file as it is; "
                        "--format native copies a checkpoint's own files (DCP shards, to resume from).")
    f.add_argument("id", metavar="ID")
    f.add_argument("--destination", default=None, help="directory to create (default ./ID; a "
                   "single-file checkpoint is copied into it)")
    f.add_argument("--format", choices=["auto", "hf", "native"], default="auto",
                   help="auto (default): hf for a model checkpoint gptrain loads, native otherwise; "
                   "native: the checkpoint's own files")
    f.set_defaults(func=cmd_checkpoint_fetch)

    p = sub.add_parser("fetch", help="a job's outputs as a zip file")
    p.add_argument("name")
    p.add_argument("--destination", default=".", help="directory for NAME.zip")
    p.set_defaults(func=cmd_fetch)


def cmd_checkpoints(args, extra) -> int:
    from gptrain.jobs import api

    api.job(args.name)
    rows = api.checkpoints(args.name, verify=args.verify)
    if render.as_json(args, rows):
        return 0
    notes = args.verify or any(c.get("damaged") for c in rows)
    render.table([(*render.header("checkpoints"), *(("VERIFIED",) if notes else ())),
                  *((c["id"], c["name"], c["kind"], c["step"], render.loss(c["train_loss"]),
                     render.loss(c["eval_loss"]), render.when(c["time"]), render.size(c["size"]),
                     *((_verified(c),) if notes else ())) for c in rows)])
    return 0


def _verified(row: dict) -> str:
    """What is known of a checkpoint's bytes: checked now (--verify), and a resume's refusal."""
    said = [row["verified"]] if row.get("verified") else []
    if row.get("damaged"):
        said.append(f"refused by a resume: {row['damaged']}")
    return "; ".join(said) or "-"


def cmd_checkpoint_fetch(args, extra) -> int:
    from pathlib import Path

    from gptrain.jobs import api

    ckpt = api.checkpoint(args.id)
    dest = Path(args.destination or args.id)
    fmt = api.export_checkpoint(ckpt, dest, args.format)
    shown = "a Hugging Face model folder" if fmt == "hf" else "its own files"
    print(f"fetched checkpoint {args.id} of job {ckpt['job']} to {dest} as {shown} ({fmt})")
    return 0


def cmd_fetch(args, extra) -> int:
    from pathlib import Path

    from gptrain.jobs import api

    dest = Path(args.destination) / f"{args.name}.zip"
    api.zip_job(args.name, dest)
    print(f"wrote {dest}")
    return 0
