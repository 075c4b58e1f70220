"""`gptrain train`: the trainer in the foreground (alone or under torchrun)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model in the foreground", add_help=False,
                       description="Train. See `gptrain train --help` for every config field.")
    p.set_defaults(func=cmd_train, takes_extra=True)


def cmd_train(args, extra) -> int:
    from gptrain.train import api

    api.install_stop()  # first: a stop that comes while the process starts is not lost

    if "-h" in extra or "--help" in extra:
        print(api.help_text())
        return 0
    from gptrain.jobs.api import model_source

    return api.train(extra, resolve=model_source)
