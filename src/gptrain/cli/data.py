"""`gptrain data prepare|import|fetch|push|list|inspect|rm`."""

from __future__ import annotations

from gptrain.cli import render


def register(sub) -> None:
    data = sub.add_parser("data", help="prepare and manage token datasets")
    dsub = data.add_subparsers(dest="data_command", metavar="ACTION")
    dsub.required = True

    p = dsub.add_parser("prepare", help="tokenize text into a dataset directory",
                        description="Tokenize SOURCEs (files, folders, globs of .txt/.md/.jsonl/"
                        ".json/.parquet, fsspec URLs, or one Hugging Face dataset name) into "
                        "flat token files + meta.json. `hf:NAME_OR_DIR` forces a Hugging Face "
                        "dataset (hub name, or a local directory in the hub's layout). Memory "
                        "stays bounded whatever the corpus size. Text sources are written into "
                        "OUT.partial beside --out until done: a prepare that is killed or "
                        "interrupted continues where it was when the same command is run again.")
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.add_argument("--out", required=True, help="new directory to write")
    p.add_argument("--tokenizer", default="gpt2", help="gpt2, char, byte, or a HF tokenizer directory")
    p.add_argument("--hf-config", default=None, help="Hugging Face dataset config, e.g. wikitext-2-raw-v1")
    p.add_argument("--text-field", default="text", help="field/column holding the text in records")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="share of documents drawn into the val split, or of the tokens at the end of "
                   "one document (sources without their own); default: about 64 KiB of the text, "
                   "1%% to 10%%")
    p.add_argument("--num-proc", type=int, default=1, help="tokenizer processes")
    p.add_argument("--seed", type=int, default=1337, help="seed of the train/val draw")
    p.add_argument("--shard-tokens", type=int, default=None,
                   help="tokens per token file before the next shard (SPLIT-00000.bin, ...) "
                   "starts; a split that fits in one is SPLIT.bin (default 2^23: 16 MiB of "
                   "uint16, sized for training from a URL)")
    p.add_argument("--fetch-timeout", dest="fetch_timeout", type=float, default=None, metavar="SECONDS",
                   help="a URL source that sends nothing this long is an error (default 60, at most 3600)")
    p.set_defaults(func=cmd_prepare)

    p = dsub.add_parser("import", help="convert a HF save_to_disk dataset with input_ids")
    p.add_argument("source", metavar="DIR")
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", default="gpt2", help="the tokenizer the ids came from")
    p.set_defaults(func=cmd_import)

    p = dsub.add_parser("fetch", help="download an offline demo corpus (shakespeare)")
    p.add_argument("corpus", choices=["shakespeare"])
    p.add_argument("--out", default=None, help="directory (default: $GPTRAIN_HOME/corpora/NAME)")
    p.set_defaults(func=cmd_fetch)

    p = dsub.add_parser("push", help="register a dataset folder under a name",
                        description="Copy DIR into $GPTRAIN_HOME/datasets/NAME, checksummed, all or "
                        "nothing: a prepared dataset (meta.json), nanoGPT's folder (train.bin, "
                        "val.bin, optional meta.pkl; stored as a prepared dataset), a Hugging Face "
                        "save_to_disk folder (kept as is; scripts load_from_disk($GPTRAIN_DATASET_DIR)) "
                        "or any files. The kind is recorded.")
    p.add_argument("name")
    p.add_argument("dir", nargs="?", default=None)
    p.add_argument("--to", default=None, metavar="URL",
                   help="keep a prepared dataset in object storage at this fsspec URL (s3://bucket/path, gs://, "
                   "file:///path) instead of $GPTRAIN_HOME: files checked there, meta.json last; the same command "
                   "resumes a push that stopped; default: [data] store in $GPTRAIN_HOME/config.toml + /NAME if set "
                   "(`--to home` keeps it here)")
    p.add_argument("--from", dest="from_url", default=None, metavar="URL",
                   help="register the prepared dataset already at this URL (no local copy), once every token file "
                   "there matches its meta.json")
    p.add_argument("--fetch-timeout", dest="fetch_timeout", type=float, default=None, metavar="SECONDS",
                   help="with --from: a store that sends nothing this long is an error (default 60, at most 3600)")
    add_push_tokenizer(p)
    p.set_defaults(func=cmd_push)

    p = dsub.add_parser("list", help="list named datasets")
    render.json_switch(p)
    p.set_defaults(func=cmd_list)

    p = dsub.add_parser("inspect", help="show a dataset's meta and a decoded sample")
    p.add_argument("name", help="dataset name or directory")
    p.add_argument("--verify", action="store_true", help="check every file's sha256 and that its token ids are below vocab_size")
    render.json_switch(p)
    p.set_defaults(func=cmd_inspect)

    p = dsub.add_parser("rm", help="delete a named dataset")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="delete it even while a job not yet ended reads it")
    p.set_defaults(func=cmd_rm)


def add_push_tokenizer(p) -> None:
    p.add_argument("--tokenizer", default="", help="the tokenizer the token ids came from: needed for a "
                   "save_to_disk folder with input_ids (gpt2, byte or a HF tokenizer directory) unless it "
                   "holds its own tokenizer files; for a "
                   "nanoGPT folder without meta.pkl (default gpt2)")


def _summary(meta: dict) -> str:
    sft = meta.get("sft")
    unit = "examples" if sft else "docs"
    parts = [f"{s}: {v['tokens']:,} tokens, " + (f"{v['documents']:,} {unit}" if "note" not in v else v["note"])
             for s, v in meta["splits"].items()]  # (a note: val is train's tail, no documents of its own)
    kind = (f"instruction data ({sft['format']}, {sft['template']}; loss on the completions only); "
            if sft else "")
    return kind + f"tokenizer {meta['tokenizer_name']} (vocab {meta['vocab_size']}, {meta['dtype']}); " + "; ".join(parts)


def cmd_prepare(args, extra) -> int:
    from gptrain.data import api

    meta = api.prepare(args.sources, args.out, tokenizer=args.tokenizer, hf_config=args.hf_config,
                       text_field=args.text_field, val_fraction=args.val_fraction,
                       num_proc=args.num_proc, seed=args.seed, shard_tokens=args.shard_tokens,
                       fetch_timeout=args.fetch_timeout)
    print(f"prepared {args.out}: {_summary(meta)}")
    return 0


def cmd_import(args, extra) -> int:
    from gptrain.data import api

    meta = api.import_saved(args.source, args.out, args.tokenizer)
    print(f"imported {args.source} -> {args.out}: {_summary(meta)}")
    return 0


def cmd_fetch(args, extra) -> int:
    from gptrain.data import api

    print(api.fetch_corpus(args.corpus, args.out))
    return 0


def cmd_push(args, extra) -> int:
    from gptrain.data import api

    kind, dest = api.push(args.name, args.dir, args.tokenizer, to=getattr(args, "to", None),  # (the hosted
                          from_url=getattr(args, "from_url", None),  # `dataset push` has neither)
                          fetch_timeout=getattr(args, "fetch_timeout", None))
    print(f"pushed dataset {args.name} ({kind}, {dest})")
    return 0


def cmd_list(args, extra) -> int:
    from gptrain.data import api

    datasets = api.datasets()
    if render.as_json(args, datasets):
        return 0
    rows = [("NAME", "KIND", "STATE", "TOKENIZER", "TOKENS", "SIZE", "CREATED", "WHERE")]
    for d in datasets:
        rows.append((d["name"], d["kind"], d["state"], d["tokenizer"],
                     render.count(d["tokens"]) if d["kind"] == "prepared" else "-",
                     render.size(d["bytes"]), render.when(d["created"]), d["path"]))
    render.table(rows)
    return 0


def cmd_inspect(args, extra) -> int:
    from gptrain.data import api

    info = api.inspect(args.name, verify=args.verify)
    if render.as_json(args, info):
        return 0
    print(f"dataset  {args.name}  ({info['path']})")
    if info.get("state", "available") != "available" or info.get("error"):
        print(f"state    {info['state']}" + (f": {info['error']}" if info.get("error") else ""))
    if info["kind"] == "prepared" and info["meta"] is None:  # (a push not finished: meta.json goes last)
        print(f"         no meta.json at the URL yet: run its `gptrain data push {args.name}` again to finish it")
        return 0
    if info["kind"] == "prepared":
        meta = info["meta"]
        print(f"         {_summary(meta)}")
        for name, split in meta["splits"].items():
            for f in split["files"]:
                print(f"  {name:<6} {f['name']:<18} {f['tokens']:>14,} tokens  sha256 {f['sha256'][:16]}")
    else:
        total = sum(f["bytes"] for f in info["files"])
        print(f"         kind {info['kind']}; {len(info['files'])} files, {render.size(total)}")
        for f in info["files"][:20]:
            print(f"  {f['name']:<40} {render.size(f['bytes']):>10}  sha256 {f['sha256'][:16]}")
        if len(info["files"]) > 20:
            print(f"  ... and {len(info['files']) - 20} more")
    print(f"checksums: {'verified' if args.verify else 'sizes checked (--verify for sha256)'}")
    if info["kind"] == "prepared" and info.get("sample") is not None:
        print(f"sample:  {info['sample']!r}")
    return 0


def cmd_rm(args, extra) -> int:
    from gptrain.jobs import api as jobs_api

    jobs_api.remove_dataset(args.name, args.force)
    print(f"removed dataset {args.name}")
    return 0
