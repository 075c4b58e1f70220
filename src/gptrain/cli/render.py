"""How the CLI shows things: tables, sizes, times, ages and numbers, in one place. The rules are
one spec both faces read (gptrain/assets/render.json; the console's common.js: gp.loss, gp.bytes,
gp.age, gp.time), so a job reads the same in both (tests/browser/test_ui_render.py)."""

from __future__ import annotations

import json
import time
from importlib import resources

SPEC = json.loads((resources.files("gptrain") / "assets" / "render.json").read_text())
MISSING = SPEC["missing"]


def json_switch(parser) -> None:
    """The one --json of every command that shows a table or a report."""
    parser.add_argument("--json", action="store_true",
                        help="print it as one JSON document (indented), for scripts")


def as_json(args, data) -> bool:
    """Where --json was given: `data` printed as one indented JSON document, and True (the
    command prints nothing else)."""
    if not args.json:
        return False
    print(json.dumps(data, indent=2))
    return True


def header(name: str) -> tuple[str, ...]:
    """The titles of the table `name` (jobs, checkpoints), as the console heads it, in capitals."""
    return tuple(title.upper() for title in SPEC["columns"][name])


def table(rows) -> None:
    """Rows (the first is the header) printed in left-aligned columns two spaces apart."""
    rows = [tuple(MISSING if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def size(n: float | None) -> str:
    """1536 -> '1.5 KiB' (binary units, as the console shows them)."""
    if n is None:
        return MISSING
    for unit, scale in SPEC["size_units"]:
        if n >= scale:
            return f"{n / scale:.{SPEC['size_decimals']}f} {unit}"
    return f"{int(n)} {SPEC['size_bytes_unit']}"


def when(t: float | None) -> str:
    """A time as local 'YYYY-MM-DD HH:MM:SS' ('-' when unknown)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else MISSING


def age(t: float | None) -> str:
    """How long ago: '3d', '5h', '12m', '40s' ('-' when unknown)."""
    return duration(max(time.time() - t, 0)) if t else MISSING


def duration(s: float | None) -> str:
    """Seconds as '3d', '5h', '12m', '40s', the largest unit whole ('-' when unknown)."""
    if s is None:
        return MISSING
    for unit, scale in SPEC["age_units"]:
        if s >= scale:
            return f"{int(s // scale)}{unit}"
    return f"{int(s)}{SPEC['age_seconds_unit']}"


def record(m: dict) -> str:
    """A train or eval record as the training log writes it: step, loss, lr, grad, tokens/s, MFU."""
    parts = [f"step {m['step']}"]
    for key, label, form in (("loss", "loss", lambda v: f"{v:.4f}"), ("lr", "lr", lambda v: f"{v:.2e}"),
                             ("grad_norm", "grad", lambda v: f"{v:.2f}"), ("perplexity", "ppl", lambda v: f"{v:.2f}"),
                             ("accuracy", "acc", lambda v: f"{v:.4f}"),
                             ("tokens_per_s", "tok/s", lambda v: f"{v:,.0f}"), ("mfu", "mfu", lambda v: f"{v:.1%}"),
                             ("tokens", "tokens", lambda v: f"{v:,.0f}")):
        if isinstance(m.get(key), (int, float)):
            parts.append(f"{label} {form(m[key])}")
    return " | ".join(parts)


def run_summary(s: dict) -> str:
    """inspect's run line: wall time, tokens seen, average rate, mean MFU, the kept best."""
    parts = []
    if s.get("wall_s") is not None:
        parts.append(f"wall {duration(s['wall_s'])}")
    if s.get("tokens_seen") is not None:
        parts.append(f"{count(s['tokens_seen'])} tokens")
    if s.get("avg_tokens_per_s"):
        parts.append(f"{s['avg_tokens_per_s']:,.0f} tok/s on average")
    if s.get("mean_mfu") is not None:
        parts.append(f"mfu {s['mean_mfu']:.1%} on average")
    if s.get("best_checkpoint"):
        parts.append(f"best checkpoint {s['best_checkpoint']} (keep_best)")
    return " | ".join(parts)


def eta(left: float | None, stalled: float | None) -> str:
    """The jobs table's ETA: the time left, or how long a running job has made no step."""
    return f"stalled {duration(stalled)}" if stalled is not None else duration(left)


def steps(step: int | None, total: int | None) -> str:
    """'120/3000' (or '120' when the total is unknown; '-' when there is no step)."""
    if step is None:
        return MISSING
    return f"{step}/{total}" if total is not None else str(step)


def loss(v: float | None) -> str:
    """A loss to 4 decimals ('-' when there is none)."""
    return MISSING if v is None else f"{v:.{SPEC['loss_decimals']}f}"


def count(n: int | None) -> str:
    """A count with thousands separators ('-' when there is none)."""
    return MISSING if n is None else f"{n:,}"


def nodes(job: dict) -> str:
    """A job's node count as typed: N, or MIN:MAX for an elastic job."""
    return f"{job['min_nodes']}:{job['nodes']}" if job.get("min_nodes") else str(job["nodes"])
