"""`gptrain train`: the trainer in the foreground (alone or under torchrun)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model in the foreground", add_help=False,
                       description="Train. See `gptrain train --help` for every config field.")
    p.set_defaults(func=cmd_train, takes_extra=True)


def cmd_train(args, extra) -> int:
    from gptrain import stop

    stop.install()
    from gptrain import config

    if "-h" in extra or "--help" in extra:
        print(format_help())
        return 0
    cfg = config.parse_train_args(extra)
    resolve_refs(cfg)
    from gptrain.train.trainer import train

    result = train(cfg)
    # a stop before the last step (a signal: `gptrain stop`, a preemption) has saved its checkpoint,
    # and is not a success: 128 + SIGTERM, as for any program that SIGTERM ended (jobs/supervisor.py)
    return STOPPED_EXIT if result["status"] == "stopped" else 0


STOPPED_EXIT = 143


def resolve_refs(cfg) -> None:
    """model.init_from and checkpoint.resume_from given as a job name or checkpoint ID become
    the path they name (gptrain/refs.py), so the trainer itself sees only paths."""
    from gptrain.refs import resolve

    if cfg.model.init_from:
        cfg.model.init_from = resolve(cfg.model.init_from)
    if cfg.checkpoint.resume_from not in ("auto", "none"):
        cfg.checkpoint.resume_from = resolve(cfg.checkpoint.resume_from)


def format_help() -> str:
    """Every field with its default and doc, then the alias table: `gptrain train --help`."""
    import dataclasses
    import typing

    from gptrain import config, config_check

    out = ["usage: gptrain train [CONFIG.toml] [--section.key=value ...] [HF-Trainer-style flags]",
           "", "Train a GPT model in the foreground (alone or under torchrun).", ""]
    for section, cls in config.SECTIONS.items():
        out.append(f"[{section}]")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            tp = config._base_type(hints[f.name])[0]
            kind = getattr(tp, "__name__", str(tp))
            choices = f.metadata.get("choices")
            kind = "|".join(choices) if choices else kind
            if any(f.metadata[k] is not None for k in ("ge", "gt", "lt", "le")):
                kind += f" {config_check.bounds(f.metadata)}"
            out.append(f"  --{section}.{f.name} ({kind}, default {default!r})")
            out.append(f"      {f.metadata['doc']}")
        out.append("")
    out.append("HF Trainer and FMEngine/DeepSpeed flags accepted as aliases:")
    for name, (key, _) in config.ALIASES.items():
        out.append(f"  --{name:<30} -> {key}")
    for name in config.DEEPSPEED_FLAGS:
        out.append(f"  --{name + ' FILE':<30} -> batch sizes, precision, optimizer, clipping, lr schedule "
                   "of a DeepSpeed JSON")
    return "\n".join(out)
