"""The hosted CLI's words, as aliases of our commands (docs/hosted-cli.md maps them), so its
tutorials run with `flexai` replaced by `gptrain`:

    gptrain training run|inspect|logs|checkpoints|fetch ...   = run|inspect|logs|checkpoints|fetch
    gptrain dataset push NAME --file DIR                       = data push NAME DIR
    gptrain checkpoint fetch ID --destination DIR              (our own command: cli/checkpoints.py)
"""

from __future__ import annotations

import argparse

from gptrain.cli.data import add_push_tokenizer

TRAINING = ("run", "inspect", "logs", "checkpoints", "fetch")


class _Only:
    """A subparsers object that keeps only the named commands (the others are built and
    dropped), so an alias has exactly the arguments of the command it names."""

    def __init__(self, sub, names):
        self.sub, self.names = sub, names

    def add_parser(self, name, **kwargs):
        if name in self.names:
            return self.sub.add_parser(name, **kwargs)
        return argparse.ArgumentParser(add_help=False)


def register(sub) -> None:
    from gptrain.cli import checkpoints, jobs, run

    t = sub.add_parser("training", help="hosted-CLI aliases: training run|inspect|logs|checkpoints|fetch",
                       description="The hosted CLI's `training` words: the same as gptrain run, "
                       "inspect, logs, checkpoints and fetch (docs/hosted-cli.md).")
    tsub = t.add_subparsers(dest="training_command", metavar="ACTION")
    tsub.required = True
    only = _Only(tsub, TRAINING)
    for module in (run, jobs, checkpoints):
        module.register(only)

    d = sub.add_parser("dataset", help="hosted-CLI alias: dataset push NAME --file DIR (= data push)")
    dsub = d.add_subparsers(dest="dataset_command", metavar="ACTION")
    dsub.required = True
    p = dsub.add_parser("push", help="register a dataset directory under a name (= data push NAME DIR)")
    p.add_argument("name")
    p.add_argument("--file", dest="dir", required=True, metavar="DIR", help="the dataset directory")
    add_push_tokenizer(p)
    p.set_defaults(func=_data_push)


def _data_push(args, extra) -> int:
    from gptrain.cli.data import cmd_push

    return cmd_push(args, extra)
