"""How the CLI shows things: tables, sizes, times, ages and numbers, in one place. The rules are
the console's (ui/static/common.js: gp.bytes, gp.age, gp.num), so a job reads the same in both."""

from __future__ import annotations

import time


def table(rows) -> None:
    """Rows (the first is the header) printed in left-aligned columns two spaces apart."""
    rows = [tuple("-" if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def size(n: float | None) -> str:
    """1536 -> '1.5 KiB' (binary units, as the console shows them)."""
    if n is None:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def when(t: float | None) -> str:
    """A time as local 'YYYY-MM-DD HH:MM:SS' ('-' when unknown)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def age(t: float | None) -> str:
    """How long ago: '3d', '5h', '12m', '40s' ('-' when unknown)."""
    if not t:
        return "-"
    s = max(time.time() - t, 0)
    for unit, scale in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= scale:
            return f"{int(s // scale)}{unit}"
    return f"{int(s)}s"


def loss(v: float | None) -> str:
    """A loss to 4 decimals ('-' when there is none)."""
    return "-" if v is None else f"{v:.4f}"


def count(n: int | None) -> str:
    """A count with thousands separators ('-' when there is none)."""
    return "-" if n is None else f"{n:,}"


def nodes(job: dict) -> str:
    """A job's node count as typed: N, or MIN:MAX for an elastic job."""
    return f"{job['min_nodes']}:{job['nodes']}" if job.get("min_nodes") else str(job["nodes"])
