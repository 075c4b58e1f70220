"""The hosted service's fixed paths in a program's arguments, as its tutorials type them, made the
job's own (`gptrain training run ...`, the hosted words; docs/hosted-cli.md):

    /input                 the job's first dataset          -> ${GPTRAIN_DATASET_DIR}
    /input/NAME[/...]      its dataset NAME                 -> ${GPTRAIN_DATASET_NAME_DIR}[/...]
    /input/other[/...]     a path in its first dataset      -> ${GPTRAIN_DATASET_DIR}/other[/...]
    /output[/...]          the program's output folder      -> ${GPTRAIN_OUTPUT_DIR}[/...]
    /output-checkpoint     where its checkpoints go         -> ${GPTRAIN_CHECKPOINT_DIR}[/...]

An argument is rewritten when it is such a path, or ends in one after `=` (`--out=/output`).
The workers expand the variables at launch (jobs/launch.expand), so no host path such as the
machine's own /output is ever written to, and `inspect` shows what the program was given.
"""

from __future__ import annotations

import re

from gptrain.errors import UserError
from gptrain.jobs.launch import dataset_var

HOSTED = re.compile(r"^(?P<head>.*=)?(?P<root>/input|/output-checkpoint|/output)(?P<rest>/.*)?$")


def rewrite(args: list[str], datasets: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments with the hosted paths made the job's, a note for each one rewritten)."""
    out, notes = [], []
    for arg in args:
        m = HOSTED.match(arg)
        if m is None:
            out.append(arg)
            continue
        root, rest = m.group("root"), m.group("rest") or ""
        if root == "/input":
            if not datasets:
                raise UserError(f"{arg}: /input is the job's dataset; name it with --dataset NAME")
            first = rest.strip("/").split("/", 1)[0]
            if first in datasets:
                var, rest = dataset_var(first), rest[len(first) + 1:]
            else:
                var = "GPTRAIN_DATASET_DIR"
        else:
            var = "GPTRAIN_OUTPUT_DIR" if root == "/output" else "GPTRAIN_CHECKPOINT_DIR"
        new = f"{m.group('head') or ''}${{{var}}}{rest}"
        out.append(new)
        notes.append(f"{arg} -> {new}")
    return out, notes
