"""The `gptrain` command. Each command group lives in its own module and registers itself.

Modules here stay thin (parse, call the library, print) and import torch only inside the
functions that need it, so `gptrain --help` and `gptrain jobs` answer fast.
"""

from __future__ import annotations

import argparse
import sys

from gptrain import __version__

GROUPS = ("gptrain.cli.data", "gptrain.cli.train", "gptrain.cli.run", "gptrain.cli.jobs",
          "gptrain.cli.checkpoints", "gptrain.cli.model", "gptrain.cli.sources", "gptrain.cli.hosted",
          "gptrain.cli.ui", "gptrain.cli.session", "gptrain.cli.sweep")


class OneLineParser(argparse.ArgumentParser):
    """A mistake in the command line is one line (what is wrong, where the help is) and exit 2,
    not argparse's usage block; every subcommand's parser is one too (add_subparsers' default)."""

    def error(self, message):
        import re

        option = re.fullmatch(r"argument (--[\w-]+)(?:/-\w)?: expected one argument", message)
        if option:  # `--nodes -1:2`: argparse took the value for another option
            message += f"; a value that starts with '-' is written {option[1]}=VALUE"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _unrecognized(parser, argv: list[str], extra: list[str]):
    """One line for options the command does not take: the closest it does, and its own help."""
    from gptrain.errors import closest

    command = parser._subparsers._group_actions[0].choices.get(argv[0]) if argv else None
    if command is None:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    known = [o for o in command._option_string_actions if o.startswith("--")]
    flag = next((w.split("=", 1)[0] for w in extra if w.startswith("--")), None)
    hint = closest(flag, known) if flag else ""
    command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = OneLineParser(
        prog="gptrain", description="Train GPT-style language models and manage each training run.")
    parser.add_argument("--version", action="version", version=f"gptrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in GROUPS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    code = _run(argv)
    if code in (1, 2) and os.environ.get("TORCHELASTIC_RUN_ID"):
        # a torchrun worker that said why it failed leaves at once: tearing down torch's
        # distributed objects at interpreter exit can abort ("terminate called without an active
        # exception"), and torchrun would then report a SIGABRT instead of exit 2
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _error_line(message) -> None:
    # one write: under torchrun every rank's stderr is the same stream, and print's separate
    # write of the newline (stderr unbuffered, as in jobs) lets two ranks' lines run together
    sys.stderr.write(f"gptrain: error: {message}\n")
    sys.stderr.flush()


def _quiet_full_disk_in_threads() -> None:
    """A background writer (TensorBoard's event thread) that meets a full disk prints no
    traceback: the main thread's writes meet the same disk and say so in one line."""
    import threading

    from gptrain.errors import disk_full

    default = threading.excepthook
    if getattr(default, "quiet_full_disk", False):
        return  # installed by an earlier command of this process (main() called in-process)

    def hook(args):
        if disk_full(args.exc_value) is None:
            default(args)
    hook.quiet_full_disk = True
    threading.excepthook = hook


def _run(argv: list[str] | None) -> int:
    import sqlite3

    from gptrain.errors import InfraError, Interrupted, UserError, disk_full, lost_peer
    from gptrain.home import make_private, sweep_leftovers

    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    passthrough: list[str] = []
    if "--" in argv and argv[:1] != ["train"]:  # `gptrain run NAME ... -- trainer flags | script.py args`
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args, extra = parser.parse_known_args(argv)
    args.passthrough = passthrough
    if extra and not getattr(args, "takes_extra", False):
        _unrecognized(parser, argv, extra)
    _quiet_full_disk_in_threads()
    try:
        make_private()
        sweep_leftovers()
        return args.func(args, extra) or 0
    except UserError as e:
        _error_line(e)
        return 2
    except InfraError as e:  # not the user's: a restart may succeed (jobs/engines/supervisor.py restarts on 1)
        _error_line(e)
        return 1
    except RuntimeError as e:  # a collective whose peer died: the survivor says so in one line
        lost = lost_peer(e)
        if lost is None:
            raise
        _error_line(lost)
        return 1
    except Interrupted as e:  # a stop before anything was trained (nothing to save)
        print(f"gptrain: {e}", file=sys.stderr, flush=True)
        return 143
    except sqlite3.DatabaseError as e:  # gptrain.db unreadable past its header: one line too
        from gptrain.jobs.api import database_error

        bad = database_error(e)
        if bad is None:
            raise
        _error_line(bad)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as e:  # a full disk anywhere: one line; writers have removed their partial files
        full = disk_full(e)
        if full is None:
            raise
        _error_line(full)
        return 2
    except KeyboardInterrupt:
        print("gptrain: interrupted", file=sys.stderr)
        return 130
