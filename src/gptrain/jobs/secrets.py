"""A job's secrets (`gptrain run --secret K=V`, `secrets:` in job.yaml): values that reach the
workers' environment and nothing else.

They live in $GPTRAIN_HOME/secrets/NAME.env (mode 0600; a shell file of `KEY='value'` lines that
the Slurm script sources at run time), never in job.json, the database or the sbatch script.
The job record keeps only their names (`inspect` shows `***`); `logs`, the console, `fetch`'s zip
and failure summaries mask any secret value of 4 characters or more that a worker prints, escaped
or not (see `forms`), when the log is read (jobs/logs.py). `gptrain rm` deletes the file.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from gptrain.home import home

MASK = "***"
MIN_MASKED = 4  # shorter values would mask ordinary text (and are poor secrets anyway)


def path(name: str) -> Path:
    return home() / "secrets" / f"{name}.env"


def save(name: str, values: dict[str, str]) -> None:
    """Write the job's secrets (0600, in a 0700 directory); nothing when there are none."""
    if not values:
        return
    p = path(name)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(p.parent, 0o700)
    tmp = p.with_name(f".{p.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()))
    os.replace(tmp, p)


def load(name: str) -> dict[str, str]:
    """The job's secrets ({} when it has none)."""
    try:
        text = path(name).read_text()
    except FileNotFoundError:
        return {}
    return dict(token.split("=", 1) for token in shlex.split(text))


def remove(name: str) -> None:
    path(name).unlink(missing_ok=True)


def forms(value: str) -> set[str]:
    """The ways a program may print `value`: as is; escaped as JSON (`json.dumps`, ASCII or not),
    as Python does (`repr`, `%r`, a dict, a traceback: either quote), shell-quoted; those escapes
    once more (a dict holding JSON); and each line of a multi-line value on its own, so a page
    that starts inside the value shows none of its later lines."""
    import json

    def escapes(v: str) -> set[str]:
        return {json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1], repr(v)[1:-1],
                repr(v + "'\"")[1:-4], shlex.quote(v)}

    out = {value} | escapes(value)
    out |= {e2 for e in list(out) for e2 in escapes(e)}
    out |= {line.strip() for line in value.splitlines()}
    return {f for f in out if len(f) >= MIN_MASKED}


def mask(text: str, values) -> str:
    """`text` with every occurrence of a secret value (4+ characters), in any form `forms` lists,
    replaced by ***."""
    every = set()
    for v in values:
        if len(v) >= MIN_MASKED:
            every |= forms(v)
    for form in sorted(every, key=len, reverse=True):
        text = text.replace(form, MASK)
    return text


def masked(name: str, text: str) -> str:
    """`text` (a log, an error) of job `name` with its secret values masked."""
    values = load(name).values()
    return mask(text, values) if values else text
