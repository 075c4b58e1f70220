"""A job's secrets (`gptrain run --secret K=V`, `secrets:` in job.yaml): values that reach the
workers' environment and nothing else.

They live in $GPTRAIN_HOME/secrets/NAME.env (mode 0600; a shell file of `KEY='value'` lines that
the Slurm script sources at run time), never in job.json, the database or the sbatch script.
The job record keeps only their names (`inspect` shows `***`); `logs`, the console, `fetch`'s zip
and failure summaries mask every secret value that a worker prints, escaped, encoded, in any case
or split across lines (see `forms` and `mask`), when the log is read (jobs/logs.py). A value
shorter than 4 characters is refused at submit (`check`): masking it would blank ordinary text.
`gptrain rm` deletes the file.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from pathlib import Path

from gptrain.errors import UserError
from gptrain.home import home

MASK = "***"
MIN_MASKED = 4  # shorter values would mask ordinary text (and are poor secrets anyway)
# a line break, and what starts the next line before the program's own text: indentation, and
# the `[rank0]:` torch's excepthook writes in front of each line of a traceback
_BREAK = re.compile(r"\r?\n(?:\[(?:rank|default)\d+\]:)?[ \t]*")
_LEAD = re.compile(r"(?:\[(?:rank|default)\d+\]:)?[ \t]*")


def path(name: str) -> Path:
    return home() / "secrets" / f"{name}.env"


def check(values: dict[str, str]) -> None:
    """Refuse (at submit, before anything is recorded) a secret too short to be masked: a value
    of 1-3 characters would blank those characters wherever they appear in a log, so it is never
    masked, and it is no secret (guessed at once). The value is never shown."""
    short = sorted(k for k, v in values.items() if len(v) < MIN_MASKED)
    if short:
        raise UserError(f"secret {short[0]} is shorter than {MIN_MASKED} characters, too short to be masked "
                        "in logs (it would blank ordinary text): give a real secret, or pass a value that "
                        "is not secret with --env")


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
    """The ways a program may print `value`, as `mask` looks for them (line breaks taken out):
    as is; escaped as JSON (`json.dumps`, ASCII or not), as Python does (`repr`, `%r`, a dict, a
    traceback: either quote), shell-quoted; those escapes once more (a dict holding JSON); each
    line of a multi-line value on its own (a page that starts inside the value); and encoded
    (`encoded`). Any case matches (`mask`); upper- and lower-cased forms are added for the
    letters whose case changes their length (ß, SS)."""
    import json

    def escapes(v: str) -> set[str]:
        return {json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1], repr(v)[1:-1],
                repr(v + "'\"")[1:-4], shlex.quote(v)}

    out = {value} | escapes(value)
    out |= {e2 for e in list(out) for e2 in escapes(e)}
    out |= {line.strip() for line in value.splitlines()}
    out |= encoded(value) | {value.upper(), value.lower(), value.casefold()}
    return {f for f in map(flat, out) if len(f) >= MIN_MASKED}


def encoded(value: str) -> set[str]:
    """`value` (its UTF-8 bytes) as base64 (standard and URL-safe, with and without `=`), with
    the characters that depend on it alone when it sits at each of the 3 byte offsets of a longer
    base64 string (`base64(b"token=" + value)`); as base32 likewise (5 offsets); as hex (either
    case: `mask` ignores case); and URL-quoted (`quote`, with and without `/` kept, `quote_plus`)."""
    import base64
    from urllib.parse import quote, quote_plus

    raw, b64 = value.encode(), set()
    for align in range(3):
        text = base64.b64encode(b"\0" * align + raw).decode()
        first, end = -(-8 * align // 6), 8 * (align + len(raw)) // 6  # whole 6-bit groups of value
        b64 |= {text[first:end]} | ({text, text.rstrip("=")} if align == 0 else set())
    b64 |= {f.replace("+", "-").replace("/", "_") for f in b64}
    b32 = set()
    for align in range(5):  # base32: 5 bytes to 8 characters (a TOTP seed, a cloud key)
        text = base64.b32encode(b"\0" * align + raw).decode()
        first, end = -(-8 * align // 5), 8 * (align + len(raw)) // 5
        b32 |= {text[first:end]} | ({text, text.rstrip("=")} if align == 0 else set())
    return b64 | b32 | {raw.hex(), quote(value), quote(value, safe=""), quote_plus(value)}


def flat(text: str) -> str:
    """`text` with its line breaks taken out (with the indentation or `[rankN]:` after each)."""
    return _BREAK.sub("", text)


@functools.lru_cache(maxsize=16)
def _forms(values: tuple[str, ...]) -> tuple[str, ...]:
    """Every form of every value (4+ characters), longest first."""
    every = set()
    for v in values:
        if len(v) >= MIN_MASKED:
            every |= forms(v)
    return tuple(sorted(every, key=lambda f: (-len(f), f)))


@functools.lru_cache(maxsize=16)
def _pattern(every: tuple[str, ...]) -> re.Pattern:
    """A pattern finding each of `every` in any case (where `str.lower` cannot compare them)."""
    return re.compile("|".join(map(re.escape, every)), re.IGNORECASE)


def mask(text: str, values, edges: bool = False) -> str:
    """`text` with every secret value (4+ characters), in any form `forms` lists and any case,
    replaced by ***, also when the program split it across lines (`print(key[:8]); print(key[8:])`,
    a wrapped base64): the lines are looked at joined (a break and the indentation or `[rankN]:`
    after it taken out), and the part of a secret on each line is masked on that line, so the
    lines stay lines. With `edges` (a page of a log: the lines before or after it are not in
    `text`), a first line starting with the end of a secret's form and a last line ending with
    its start are masked too when that piece has 4+ characters: a secret split across a page
    boundary shows at most 3 characters on either side."""
    every = _forms(tuple(sorted(set(values))))
    if not every or not text:
        return text
    joined = flat(text)
    spans = _found(joined, every) + (_edges(joined, every) if edges else [])
    if not spans:
        return text
    starts, flat_starts, lengths = [], [], []  # each piece of text between breaks: where it begins, in both
    pos = size = 0
    for m in [*_BREAK.finditer(text), None]:
        end = m.start() if m else len(text)
        starts.append(pos)
        flat_starts.append(size)
        lengths.append(end - pos)
        size += end - pos
        pos = m.end() if m else pos
    return _masked(text, spans, starts, flat_starts, lengths)


def _found(joined: str, every) -> list[tuple[int, int]]:
    """Every (start, end) in `joined` where a form is, in any case, overlapping ones too (two
    secrets that share characters, printed run together): `str.find` in the lower-cased text
    (fast), a pattern for forms (or a text) whose length lower-casing changes."""
    low = joined.lower()
    simple, odd = _by_case(every) if len(low) == len(joined) else ((), every)
    spans = [(i, i + len(f)) for f in simple for i in _at(low, f.lower())]
    pos = 0
    while odd and (m := _pattern(odd).search(joined, pos)) is not None:
        spans.append(m.span())
        pos = m.start() + 1
    return spans


@functools.lru_cache(maxsize=16)
def _by_case(every: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the forms `str.lower` keeps the length of, the others)."""
    same = tuple(f for f in every if len(f.lower()) == len(f))
    return same, tuple(f for f in every if f not in same)


def _edges(joined: str, every) -> list[tuple[int, int]]:
    """The start of `joined` that ends a form, and its end that starts one (4+ characters each)."""
    spans = []
    lead = _LEAD.match(joined).end()
    head, tail = joined[lead:lead + 1].lower(), joined[-1:].lower()
    if not head:
        return spans
    for f in every:
        low = f.lower()
        if len(low) != len(f):
            continue
        # a piece of k characters: low[:k] ends with the last character, low[-k:] starts with the first
        ends = [i + 1 for i in _at(low, tail) if MIN_MASKED <= i + 1 < len(f)
                and joined[-(i + 1):].lower() == low[:i + 1]]
        if ends:
            spans.append((len(joined) - max(ends), len(joined)))
        begins = [len(f) - i for i in _at(low, head) if MIN_MASKED <= len(f) - i < len(f)
                  and joined[lead:lead + len(f) - i].lower() == low[i:]]
        if begins:
            spans.append((lead, lead + max(begins)))
    return spans


def _at(text: str, part: str):
    """Every index where `part` is in `text`."""
    i = text.find(part)
    while i >= 0:
        yield i
        i = text.find(part, i + 1)


def _masked(text, spans, starts, flat_starts, lengths) -> str:
    """`text` with the characters of the joined text's `spans` replaced: a *** for each piece
    of text between line breaks that holds any."""
    import bisect

    cut = []  # (start, end) in text
    for a, b in spans:
        i = bisect.bisect_right(flat_starts, a) - 1
        while i < len(starts) and flat_starts[i] < b:
            lo, hi = max(a, flat_starts[i]), min(b, flat_starts[i] + lengths[i])
            if lo < hi:
                cut.append((starts[i] + lo - flat_starts[i], starts[i] + hi - flat_starts[i]))
            i += 1
    if not cut:
        return text
    out, pos = [], 0
    for a, b in sorted(cut):
        if b <= pos:
            continue
        out.append(text[pos:a] + MASK if a >= pos else "")
        pos = b
    return "".join(out) + text[pos:]


def masked(name: str, text: str) -> str:
    """`text` (an error, a line of a log) of job `name` with its secret values masked, pieces at
    its edges too (a line of a secret split across lines)."""
    values = load(name).values()
    return mask(text, values, edges=True) if values else text
