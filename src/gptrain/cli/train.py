"""`gptrain train`: the trainer in the foreground (alone or under torchrun)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model in the foreground", add_help=False,
                       description="Train. See `gptrain train --help` for every config field.")
    p.set_defaults(func=cmd_train, takes_extra=True)


def cmd_train(args, extra) -> int:
    from gptrain.train import stop

    stop.install()
    from gptrain import config

    if "-h" in extra or "--help" in extra:
        print(config.format_help())
        return 0
    cfg = config.parse_train_args(extra)
    from gptrain.train.trainer import train

    train(cfg)
    return 0
