"""Datasets kept in object storage: `gptrain data push NAME DIR --to URL` and `--from URL`.

A pushed prepared dataset can live at any fsspec URL (s3://, gs://, file://, ...) instead of
$GPTRAIN_HOME: the cluster's nodes stream it from there through their shard cache
(data/remote_shards.py), which hashes every shard against meta.json before it is read.

The registry row (gptrain.db's datasets: its path is the URL) has a state:
  uploading   a push under way, or one that stopped (killed, the store failed): not usable;
              the same `data push NAME DIR --to URL` again resumes it
  available   every token file at the URL has the size and sha256 meta.json gives, and meta.json
              itself is there: jobs may read it
  error       the last push or sync failed; the row says why (`data list`, `data inspect`)
The order makes a crash harmless: the token files go first, each checked at the URL; meta.json,
which makes the URL a dataset, goes last; the row turns available only after. A file already at
the URL with the right size and sha256 (a resumed push) is not sent again. A URL is immutable once
it holds a dataset: one whose meta.json differs is refused, never overwritten.

`--from URL` registers a prepared dataset already in a bucket without a local copy: its meta.json
is read and every token file checked (size, sha256) where it is before it is available.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from gptrain import db
from gptrain.data.formats import check_meta, read_meta, verify
from gptrain.data.remote_read import DEFAULT_FETCH_TIMEOUT_S, FetchFailed, _read_url
from gptrain.errors import InfraError, UserError, redact, refuse_credentials, scrub_credentials
from gptrain.locations import is_url

PINS_ENV = "GPTRAIN_DATASET_PINS"  # a job's {URL: meta.json sha256} of its datasets in object storage (jobs/launch.py)


class ChangedInStore(UserError):
    """A dataset's meta.json in object storage is not the one pushed."""

STATES = ("uploading", "available", "error")


def _fs(url: str):
    """(filesystem, root path) of an fsspec URL; a scheme fsspec cannot open is one line."""
    import fsspec

    from gptrain.data.remote_read import timeouts

    try:  # (an HTTP(S) store that never answers is an error after the fetch timeout, not a hang)
        return fsspec.core.url_to_fs(url.rstrip("/"), **timeouts(url))
    except (ImportError, ValueError) as e:
        raise UserError(f"cannot open {redact(url)}: {str(e).splitlines()[0][:200]} (install the fsspec "
                        "backend of its scheme: s3fs, gcsfs, ...)") from None


def check_url(url: str, flag: str) -> None:
    if not isinstance(url, str) or not is_url(url):
        raise UserError(f"{flag} takes a URL of an object store or folder (s3://bucket/path, gs://bucket/path, "
                        "file:///path), got " + repr(redact(str(url))))
    refuse_credentials(url, flag)


def _remote_sha256(fs, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _token_files(meta: dict) -> list[dict]:
    return [f for split in meta["splits"].values() for f in split["files"]]


def _has(fs, path: str, size: int, sha: str) -> bool:
    """Whether the object at `path` is the file of that size and sha256 (read back to be sure)."""
    try:
        return fs.exists(path) and fs.size(path) == size and _remote_sha256(fs, path) == sha
    except (OSError, ValueError):
        return False


def _record(name: str, url: str, meta: dict, size: int, state: str, meta_bytes: bytes) -> None:
    """The dataset's row, with the sha256 of its meta.json as pushed (or found by --from): what
    every later read of the store is checked against (pin_of), so a meta.json rewritten in the
    store to match changed shards is refused, not trusted."""
    with db.transaction() as conn:
        conn.execute("INSERT OR REPLACE INTO datasets (name, path, tokenizer, tokens, bytes, created, kind, state, "
                     "error, meta_sha256) VALUES (?, ?, ?, ?, ?, ?, 'prepared', ?, '', ?)",
                     (name, url, meta["tokenizer_name"], sum(s["tokens"] for s in meta["splits"].values()), size,
                      time.time(), state, hashlib.sha256(meta_bytes).hexdigest()))


def pins() -> dict:
    """{URL: sha256 of its meta.json as pushed} of every dataset kept in object storage."""
    if not db.db_path().is_file():
        return {}
    return {r["path"]: r["meta_sha256"] for r in db.fetch_all("SELECT path, meta_sha256 FROM datasets")
            if r["meta_sha256"] and is_url(r["path"])}


def pin_for(url: str) -> str | None:
    """The sha256 meta.json at `url` had when it was pushed: from the job's environment (a worker
    on a host without gptrain.db), else from the database; None for a URL never pushed."""
    import os

    try:
        given = json.loads(os.environ.get(PINS_ENV) or "{}")
    except ValueError:
        given = {}
    url = url.rstrip("/")
    if isinstance(given, dict) and given.get(url):
        return given[url]
    try:
        return pins().get(url)
    except Exception:  # (a database this process cannot read: a worker's; its job's environment pinned it)
        return None


def check_pin(url: str, raw: bytes, pin: str | None) -> None:
    """meta.json's bytes read at `url` against the sha256 recorded when it was pushed."""
    if pin and hashlib.sha256(raw).hexdigest() != pin:
        raise ChangedInStore(f"{redact(url)}/meta.json is not the one pushed (its sha256 differs): the dataset was changed "
                        "in the store after the push; nothing is trained on it (push it again under a new name)")


def _set_state(name: str, state: str, error: str = "") -> None:
    with db.transaction() as conn:
        conn.execute("UPDATE datasets SET state = ?, error = ? WHERE name = ?", (state, error, name))


def _claim(name: str, url: str) -> None:
    """Refuse a name another dataset has; an unfinished push of this name resumes only to its URL."""
    row = db.fetch_one("SELECT path, state FROM datasets WHERE name = ?", (name,))
    if row is None:
        return
    if row["state"] in ("uploading", "error") and row["path"] == url:
        return
    if row["state"] in ("uploading", "error"):
        raise UserError(f"dataset {name!r} has an unfinished push to {redact(row['path'])}: run it again to that "
                        f"URL to finish it, or `gptrain data rm {name}`")
    raise UserError(f"dataset {name!r} already exists; choose another name or `gptrain data rm {name}` first")


def push_to(name: str, src: str, url: str, progress=None) -> dict:
    """Upload the prepared dataset folder `src` to `url` and register it as `name`; resumes a
    push of the same name to the same URL. Returns {url, files, sent, kept, bytes}."""
    from gptrain.data import nanogpt_dir
    from gptrain.data.formats import is_prepared_dir
    from gptrain.home import check_name

    check_name(name, "dataset")
    check_url(url, "--to")
    url = url.rstrip("/")
    folder = Path(src).expanduser()
    if nanogpt_dir.is_nanogpt_dir(folder):
        folder = nanogpt_dir.cached(folder)  # the prepared copy push and train read
    if not is_prepared_dir(folder):
        raise UserError(f"{src} is not a prepared dataset (no meta.json): only prepared datasets (or nanoGPT's "
                        "folders) go to object storage, where jobs stream them; `gptrain data prepare` it first")
    meta = read_meta(folder)
    verify(folder, checksums=True)  # what is sent is what meta.json says
    _claim(name, url)
    files = _token_files(meta)
    size = sum(_size_of(meta, f) for f in files)
    _record(name, url, meta, size, "uploading", (folder / "meta.json").read_bytes())
    try:
        done = _upload(folder, url, meta, progress)
    except UserError as e:
        _set_state(name, "error", scrub_credentials(str(e)))
        raise
    except Exception as e:  # the store failed: the row says so; the same command resumes
        why = scrub_credentials(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        _set_state(name, "error", why)
        raise InfraError(f"push of {name} to {redact(url)} stopped: {why}; run the same command again to "
                         "resume it (files already there are checked, not sent again)") from None
    _set_state(name, "available")
    return {"url": url, **done}


def _upload(folder: Path, url: str, meta: dict, progress) -> dict:
    fs, root = _fs(url)
    meta_bytes = (folder / "meta.json").read_bytes()
    there = f"{root}/meta.json"
    if fs.exists(there):
        with fs.open(there, "rb") as f:
            if f.read(len(meta_bytes) + 1) != meta_bytes:
                raise UserError(f"{redact(url)} already holds another dataset (its meta.json differs): a dataset "
                                "in object storage is never overwritten; push to a new URL")
    fs.makedirs(root, exist_ok=True)
    sent = kept = nbytes = 0
    for f in _token_files(meta):
        local, remote = folder / f["name"], f"{root}/{f['name']}"
        want = local.stat().st_size
        if _has(fs, remote, want, f["sha256"]):
            kept += 1
            continue
        fs.put_file(str(local), remote)
        if not _has(fs, remote, want, f["sha256"]):
            raise InfraError(f"{redact(remote)} does not read back as it was sent (size or sha256)")
        sent, nbytes = sent + 1, nbytes + want
        if progress:
            progress(f["name"], want)
    fs.pipe_file(there, meta_bytes)  # last: the URL is a dataset from here on
    return {"files": sent + kept, "sent": sent, "kept": kept, "bytes": nbytes}


def sync_from(name: str, url: str, fetch_timeout: float | None = None) -> dict:
    """Register the prepared dataset at `url` (no local copy) once every token file there has
    the size and sha256 its meta.json gives; a store that sends nothing for `fetch_timeout`
    seconds (default data.fetch_timeout's) is one line."""
    from gptrain.home import check_name

    check_name(name, "dataset")
    check_url(url, "--from")
    url = url.rstrip("/")
    try:
        raw = _read_url(f"{url}/meta.json", 64 << 20, fetch_timeout or DEFAULT_FETCH_TIMEOUT_S)  # (watched)
        meta = check_meta(json.loads(raw), f"{redact(url)}/meta.json")
    except FileNotFoundError:
        raise UserError(f"{redact(url)} is not a prepared dataset (no meta.json there)") from None
    except (ValueError, RecursionError):
        raise UserError(f"{redact(url)}/meta.json is not a dataset's JSON") from None
    except FetchFailed as e:
        raise UserError(str(e)) from None
    _claim(name, url)  # (after the read: a store that cannot be read records nothing)
    fs, root = _fs(url)
    files = _token_files(meta)
    _record(name, url, meta, sum(_size_of(meta, f) for f in files), "uploading", raw)
    bad = [f["name"] for f in files if not _has(fs, f"{root}/{f['name']}", _size_of(meta, f), f["sha256"])]
    if bad:
        why = f"{len(bad)} token file(s) at the URL do not match meta.json's size and sha256 (first: {bad[0]})"
        _set_state(name, "error", why)
        raise UserError(f"{redact(url)}: {why}; nothing is trained on them")
    _set_state(name, "available")
    return {"url": url, "files": len(files)}


def _size_of(meta: dict, f: dict) -> int:
    import numpy as np

    return int(f["tokens"]) * np.dtype(meta["dtype"]).itemsize


def url_of(name: str) -> str | None:
    """The URL of the object-storage dataset `name` when it is available; None for a dataset on
    this machine's disk or no dataset of that name; one line when it is not available (yet)."""
    from gptrain.home import NAME_RE

    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or not db.db_path().is_file():
        return None
    row = db.fetch_one("SELECT path, state, error FROM datasets WHERE name = ?", (name,))
    if row is None or not is_url(row["path"]):
        return None
    if (row["state"] or "available") != "available":
        raise UserError(f"dataset {name!r} is {row['state']} in object storage ({redact(row['path'])})"
                        + (f": {row['error']}" if row["error"] else "")
                        + "; run its `gptrain data push` again to finish it")
    return row["path"]


def describe(name: str, check: bool = False) -> dict | None:
    """The object-storage dataset `name` as `data inspect` shows it: {path (its URL), kind, state,
    error, meta (read from the URL), verified}; `check`: every token file at the URL read back
    against meta.json's size and sha256 (a mismatch is one line). None for any other dataset."""
    from gptrain.home import NAME_RE

    if not NAME_RE.fullmatch(name) or not db.db_path().is_file():
        return None
    row = db.fetch_one("SELECT path, state, error, meta_sha256 FROM datasets WHERE name = ?", (name,))
    if row is None or not is_url(row["path"]):
        return None
    info = {"path": row["path"], "kind": "prepared", "state": row["state"] or "available", "error": row["error"] or "",
            "meta": None, "verified": False}
    fs, root = _fs(row["path"])
    try:
        with fs.open(f"{root}/meta.json", "rb") as f:
            raw = f.read((64 << 20) + 1)
        if (row["state"] or "available") == "available":
            check_pin(row["path"], raw, row["meta_sha256"])
        info["meta"] = check_meta(json.loads(raw), f"{redact(row['path'])}/meta.json")
    except ChangedInStore:
        raise
    except UserError:
        if info["state"] == "available":
            raise UserError(f"dataset {name!r}: {redact(row['path'])}/meta.json cannot be read any more") from None
        return info
    except (OSError, ValueError, RecursionError):
        if info["state"] == "available":
            raise UserError(f"dataset {name!r}: {redact(row['path'])}/meta.json cannot be read any more") from None
        return info  # (an unfinished push: meta.json goes last)
    if check:
        for f in _token_files(info["meta"]):
            if not _has(fs, f"{root}/{f['name']}", _size_of(info["meta"], f), f["sha256"]):
                raise UserError(f"dataset {name!r}: {redact(root)}/{f['name']} does not match meta.json's size and "
                                "sha256 (changed in the store); jobs refuse it too")
        info["verified"] = True
    return info
