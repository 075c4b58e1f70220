"""Curves cut down to what a chart can show: per bucket of consecutive points, the lowest and the
highest (in their order), plus the first and last point. Spikes and the envelope of a noisy
loss survive, which an average would hide; 10^6 rows become a few thousand points in
milliseconds (numpy), so the browser draws them at once."""

from __future__ import annotations

import numpy as np

MAX_POINTS = 4000


def minmax(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) unchanged when it has at most max_points points, else at most max_points + 2 of them."""
    n = len(y)
    if n <= max_points or max_points < 4:
        return x, y
    buckets = max_points // 2
    size = -(-n // buckets)  # ceil
    padded = np.pad(y, (0, buckets * size - n), mode="edge").reshape(buckets, size)
    base = np.arange(buckets) * size
    keep = np.concatenate(([0, n - 1], base + padded.argmin(axis=1), base + padded.argmax(axis=1)))
    keep = np.unique(np.minimum(keep, n - 1))  # sorted: the points stay in x order
    return x[keep], y[keep]
