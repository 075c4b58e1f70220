"""The one test of whether a location a user gives names a remote place (a URL: s3://, gs://,
https://, hf://, file://, ...) rather than a path on this machine. Everything that asks "is this
remote" asks it here, through `is_url`, or, for a local folder that stands for a URL (the
remote-shard cache's mark), through data/remote_shards.is_remote."""

from __future__ import annotations

import os


def is_url(location) -> bool:
    """`location` (a str, bytes or path) is written as SCHEME://...: fetched, never opened as a
    local path. A path object is always local."""
    if isinstance(location, os.PathLike):
        return False
    if isinstance(location, bytes):
        return b"://" in location
    return isinstance(location, str) and "://" in location
