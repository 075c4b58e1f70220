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
    from gptrain.cli.data import _bytes, _table
    from gptrain.cli.jobs import _ts
    from gptrain.jobs import records
    from gptrain.jobs import store

    records.refresh(args.name)
    records.sync_checkpoints(args.name)
    rows = store.checkpoints(args.name)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("ID", "NAME", "KIND", "STEP", "TRAIN LOSS", "EVAL LOSS", "TIME", "SIZE")]
    for c in rows:
        table.append((c["id"], c["name"], c["kind"] or "-", c["step"] if c["step"] is not None else "-",
                      f"{c['train_loss']:.4f}" if c["train_loss"] is not None else "-",
                      f"{c['eval_loss']:.4f}" if c["eval_loss"] is not None else "-",
                      _ts(c["time"]), _bytes(c["size"])))
    _table(table)
    return 0


def cmd_checkpoint_fetch(args, extra) -> int:
    import shutil
    from pathlib import Path

    from gptrain.errors import UserError
    from gptrain.jobs import store

    ckpt = store.checkpoint_by_id(args.id)
    src = Path(ckpt["path"])
    if not src.exists():
        raise UserError(f"checkpoint {args.id} is no longer on disk (pruned by keep_last?)")
    from gptrain.files import within
    from gptrain.jobs.folder import job_dir

    jdir = job_dir(ckpt["job"])
    if not within(src, jdir):
        raise UserError(f"checkpoint {args.id} ({ckpt['name']}) links outside its job's directory; "
                        "it is not copied")
    dest = Path(args.destination or args.id)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"destination {dest} exists and is not empty; choose another --destination")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.fetch"  # filled, then renamed: a failed copy leaves nothing
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_out(ckpt, src, jdir, tmp, args.format)
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        from gptrain.errors import disk_full

        full = disk_full(e, dest) if isinstance(e, Exception) else None
        if full is not None:
            raise full from None
        raise
    print(f"fetched checkpoint {args.id} ({ckpt['job']}/{ckpt['name']}) to {dest} ({args.format})")
    return 0


def _copy_out(ckpt: dict, src, jdir, tmp, fmt: str) -> None:
    """The checkpoint written into the new directory `tmp`: exported as a HF model (hf), else
    the directory as it is (links out of the job left out), a single file inside it."""
    import shutil

    if fmt == "hf":
        from gptrain.models.hf import export_hf
        from gptrain.models.load import load_model
        from gptrain.refs import resolve

        model, tok = load_model(resolve(str(src)))  # gptrain, Hugging Face or nanoGPT; others refused
        export_hf(model, tok, tmp)
    else:  # as it is, by the one copy-out rule (jobs/records.py)
        from gptrain.jobs import records

        tmp.mkdir()
        for f, rel in records.checkpoint_files(ckpt, jdir):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, tmp / rel)


def cmd_fetch(args, extra) -> int:
    from pathlib import Path

    from gptrain.jobs import records

    dest = Path(args.destination) / f"{args.name}.zip"
    dest.parent.mkdir(parents=True, exist_ok=True)
    records.zip_job(args.name, dest)
    print(f"wrote {dest}")
    return 0
