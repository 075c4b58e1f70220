"""Training straight from a prepared dataset at a URL, through a bounded local cache.

    --data.path https://host/data/web      # any fsspec URL (http(s)://, s3://, file://, ...) of a
                                           # folder that `gptrain data prepare` wrote: URL/meta.json

`open_remote` reads URL/meta.json (checked by formats.check_meta: its shard names are plain
names) into a folder on this host's own disk, <cache root>/shards-<hash of URL>/ (`cache_root`:
data.cache_dir, else $GPTRAIN_CACHE_DIR, else $TMPDIR or /tmp in gptrain-cache-<uid>; never
$GPTRAIN_HOME, which a multi-host job shares over the network), beside `remote.json`
(the URL and data.cache_bytes); formats.open_split of that folder gives a `ShardTokens`, a
token array (len() and tokens[a:b] across shards) that reads whole shard files from
shards/. A shard is downloaded to a temporary name, its size and sha256 checked against
meta.json (a mismatch: one line, nothing kept), and renamed into place; cached files are named
by their sha256, so a dataset changed at the URL never reads a stale file; a cached file is hashed
again before a process first reads it (a copy changed on disk since, same size or not, is fetched
again, with a note). Before a download
the least recently used shards that are not in use are removed until the cache, with the new
shard, fits in data.cache_bytes. Downloads are serialized per host (a lock file), so the ranks
of one host share the cache and never fetch one shard twice at once.

The order (`ShardOrder`): a global permutation of all blocks would touch every shard all the
time, so a remote dataset is read shard by shard: each epoch a seeded permutation of the
shards, and within each a seeded permutation of the blocks that start in it. It is one global
stream like data/loader.py's, so state = epoch + offset and resume on any world size hold.
`ShardedLoader` holds the shards of the batch it reads and has a thread fetch the next
shard of the stream meanwhile, so steps do not wait on the network in steady state.

Every remote read (meta.json, a shard) runs in a thread of its own that the caller watches
(`data/remote_read.py`): a read that receives nothing for data.fetch_timeout seconds (a server that sent
its headers and went silent, a connection dropped mid-body, any network error) is abandoned and
tried again, TRIES times in all with a backoff between; then the attempt fails with FetchFailed,
an infrastructure error (not a user's: a restart may well succeed, so --max-restarts covers it)
naming the URL with its credentials masked. A stop request (SIGTERM) cuts the wait short at once
(gptrain/stop.py), so the trainer can save its last step within a scheduler's grace period.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import stat
import sys
import threading
from pathlib import Path

import numpy as np

from gptrain import stop
from gptrain.data.remote_read import (  # noqa: F401 (FetchFailed, _read_url: readers of this module's names)
    DEFAULT_FETCH_TIMEOUT_S, TRIES, FetchFailed, _cannot_read, _open_whole, _patiently, _read_url)
from gptrain.errors import UserError, redact, scrub_credentials
from gptrain.locations import is_url

TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".json", ".parquet")
MARK = "remote.json"
def is_prepared_url(location: str) -> bool:
    """A URL that should be a prepared folder (not a text/JSONL/parquet file to tokenize)."""
    return is_url(location) and not location.rstrip("/").lower().endswith(TEXT_SUFFIXES)


def cache_root(cache_dir: str = "") -> Path:
    """This host's shard cache folder, made private to this user (0700): data.cache_dir, else
    $GPTRAIN_CACHE_DIR, else gptrain-cache-<uid> in $TMPDIR or /tmp. Cached shards are trusted
    once checked, so a folder another user owns or may write to is refused, never used; where
    the default in a shared /tmp is such a folder (made there first by another user), the cache
    is in $XDG_CACHE_HOME/gptrain (~/.cache/gptrain) instead, with a note."""
    import tempfile

    chosen = cache_dir or os.environ.get("GPTRAIN_CACHE_DIR")
    where = chosen or os.path.join(tempfile.gettempdir(), f"gptrain-cache-{os.geteuid()}")
    problem = _private_folder(Path(where).expanduser())
    if problem is None:
        return Path(where).expanduser()
    if not chosen and problem.startswith("not yours"):
        fallback = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "gptrain"
        if _private_folder(fallback) is None:
            print(f"note: the shard cache {where} is not a folder of your own that only you can write "
                  f"(another user made it): using {fallback}", file=sys.stderr, flush=True)
            return fallback
    if problem.startswith("not yours"):
        raise UserError(f"the shard cache {where} is not a folder of your own that only you can write "
                        "(another user could plant shards there); set --data.cache_dir to one")
    raise UserError(f"cannot use {where} as the shard cache ({problem}); set --data.cache_dir "
                    "to a folder on this host's local disk")


def _private_folder(root: Path) -> str | None:
    """None when `root` is (now) a folder of this user's that only they can write; else why not."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = root.stat(follow_symlinks=False)
    except OSError as e:
        return str(e.strerror or e)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return "not yours alone"
    return None


def open_remote(url: str, cache_bytes: int, fetch_timeout: float = DEFAULT_FETCH_TIMEOUT_S,
                cache_dir: str = "") -> Path:
    """The local folder that stands for the prepared dataset at `url` (module doc)."""
    from gptrain.atomic import write_text_atomic
    from gptrain.data.formats import check_meta

    url = url.rstrip("/")
    try:
        raw = _read_url(f"{url}/meta.json", 64 << 20, fetch_timeout)
    except FileNotFoundError as e:  # the store's reason, where it says more than the path (no such bucket)
        why = str(e).splitlines()[0].strip() if str(e).strip() else ""
        why = f": {why}" if why and "meta.json" not in why else ""
        raise UserError(f"{url} is not a prepared dataset (no meta.json there{why}); give the folder `gptrain "
                        f"data prepare` wrote, or a file URL ending in {'/'.join(TEXT_SUFFIXES)}") from None
    from gptrain.data.object_store import check_pin, pin_for

    check_pin(url, raw, pin_for(url))  # a pushed dataset's meta.json is the one pushed (data/object_store.py)
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):  # (nested past Python's limit: a hostile file, one line too)
        raise UserError(f"{url}/meta.json is not a dataset's JSON (unreadable, or nested past any "
                        "meta.json); it is corrupt or was not written by gptrain") from None
    check_meta(meta, f"{url}/meta.json")
    if meta.get("sft") is not None:
        raise UserError(f"{url} is instruction data, which is not read from a URL yet; copy the folder "
                        "and give its local path")
    itemsize = np.dtype(meta["dtype"]).itemsize
    largest = max((f["tokens"] * itemsize for info in meta["splits"].values() for f in info["files"]), default=0)
    if cache_bytes < 2 * largest:
        raise UserError(f"data.cache_bytes {cache_bytes} is smaller than two shards of {url} "
                        f"({2 * largest} bytes), what must be held at once; raise --data.cache_bytes")
    folder = cache_root(cache_dir) / f"shards-{hashlib.sha256(url.encode()).hexdigest()[:16]}"
    (folder / "shards").mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "meta.json", json.dumps(meta, indent=2))
    # on disk, the URL without what can carry a credential (user part, query string); the URL
    # itself stays in this process's memory, for the downloads
    write_text_atomic(folder / MARK, json.dumps({"url": scrub_credentials(url), "cache_bytes": cache_bytes,
                                                 "fetch_timeout": fetch_timeout}))
    _URLS[str(folder)] = url
    return folder


_URLS: dict[str, str] = {}  # folder -> the URL it stands for, as given (credentials included)


def is_remote(location) -> bool:
    """Read from elsewhere: a URL (gptrain/locations.py), or a local folder that stands for one
    (this cache's mark in it)."""
    return is_url(location) or (Path(location) / MARK).is_file()


def open_tokens(path, split: str):
    """One split's tokens of a prepared dataset folder: formats.open_split's array, or, for the
    folder that stands for a URL, a ShardTokens."""
    from gptrain.data.formats import open_split

    return open_remote_split(path, split) if is_remote(path) else open_split(path, split)


def cached_bytes(where) -> int:
    """The bytes held by the shard caches under `where` (one cache folder, or a cache root):
    what data.cache_bytes bounds, downloads under way included; a file evicted or renamed while
    it is counted is skipped. (For tests and benchmarks watching the bound from outside.)"""
    where = Path(where)
    folders = [where / "shards"] if (where / "shards").is_dir() else list(where.glob("shards-*/shards"))
    total = 0
    for folder in folders:
        for entry in os.scandir(folder):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
    return total


def open_remote_split(folder, split: str) -> "ShardTokens":
    """A split of the dataset `folder` stands for, as a token array."""
    from gptrain.data.formats import read_meta
    from gptrain.files import read_json

    folder = Path(folder)
    meta, mark = read_meta(folder), read_json(folder / MARK, "remote dataset record")
    if split not in meta["splits"] or meta["splits"][split]["tokens"] == 0:
        raise UserError(f"dataset {mark['url']} has no {split!r} split")
    cache = ShardCache(folder / "shards", _URLS.get(str(folder), mark["url"]), int(mark["cache_bytes"]),
                       float(mark.get("fetch_timeout") or DEFAULT_FETCH_TIMEOUT_S))
    return ShardTokens(cache, meta["splits"][split]["files"], meta["dtype"])


_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
_VERIFIED: dict[Path, set] = {}  # per cache: the files whose sha256 this process checked


class ShardCache:
    """Whole shard files under `root`, at most `bound` bytes in all (module doc)."""

    def __init__(self, root: Path, url: str, bound: int, fetch_timeout: float = DEFAULT_FETCH_TIMEOUT_S):
        self.root, self.url, self.bound, self.fetch_timeout = Path(root), url, bound, fetch_timeout
        with _LOCKS_GUARD:  # one lock per cache in this process (train, val, prefetch threads); the
            self.lock = _LOCKS.setdefault(self.root, threading.Lock())  # lock file: other processes
            self.verified = _VERIFIED.setdefault(self.root, set())  # (path, inode, size, mtime) hashed here

    def path(self, f: dict) -> Path:
        return self.root / f"{f['sha256'][:16]}-{f['name']}"

    def ensure(self, f: dict, itemsize: int, keep: set, prefetch: bool = False, held: set = frozenset()) -> Path | None:
        """The cached file of shard entry `f`, downloaded when missing. `keep`: paths never evicted
        for it; `held`: paths evicted last (a reader's) or, for a prefetch, never: a prefetch
        gives None where the shard does not fit beside them."""
        from gptrain.atomic import exclusive

        path = self.path(f)
        if self._trusted(path, f, itemsize):
            return path
        self.lock.acquire()
        try:
            with exclusive(self.root.parent / "lock"):
                if self._trusted(path, f, itemsize):  # another rank of this host fetched it meanwhile
                    return path
                path.unlink(missing_ok=True)  # (a damaged copy: fetched again)
                for p in self.root.glob(".tmp-*"):  # downloads are serialized: a dead one's leftover
                    p.unlink(missing_ok=True)
                size = f["tokens"] * itemsize
                keep = keep | {path} | (held if prefetch else set())
                if not self._make_room(size, keep, held):
                    if prefetch:
                        return None
                    raise UserError(f"data.cache_bytes {self.bound} cannot hold the shards one batch of "
                                    f"{self.url} reads at once; raise --data.cache_bytes")
                self._download(f, size, path)  # (hashed as it was written)
                st = path.stat()
                self.verified.add((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
                return path
        finally:
            self.lock.release()

    def _trusted(self, path: Path, f: dict, itemsize: int) -> bool:
        """Whether the cached file of shard `f` may be read: its size and sha256 those meta.json
        gives, hashed once per process for each file on disk (its inode, size and time), so a
        copy changed since it was fetched (same size included) is fetched again, never read."""
        try:
            st = path.stat(follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != f["tokens"] * itemsize:
            return False
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self.verified:
            return True
        h = hashlib.sha256()
        try:
            with open(path, "rb") as src:
                while block := src.read(1 << 22):
                    h.update(block)
        except OSError:
            return False
        if h.hexdigest() != f["sha256"]:
            print(f"note: the cached shard {path.name} no longer matches its sha256 in meta.json: "
                  "fetched again", file=sys.stderr, flush=True)
            return False
        self.verified.add(key)
        return True

    def _make_room(self, size: int, keep: set, held: set) -> bool:
        files = sorted((p.stat().st_mtime, p) for p in self.root.iterdir() if p.is_file())
        used = sum(p.stat().st_size for _, p in files)
        for last in (False, True):  # least recently used first; what is held only when needed
            for _, p in files:
                if used + size <= self.bound:
                    return True
                if p not in keep and (p in held) == last and p.exists():
                    used -= p.stat().st_size
                    p.unlink(missing_ok=True)
        return used + size <= self.bound

    def _download(self, f: dict, size: int, path: Path) -> None:
        """Shard `f` into `path`, checked against meta.json, each try watched by _patiently."""
        url = f"{self.url}/{f['name']}"
        tries = iter(range(TRIES))

        def work(alive):
            tmp = self.root / f".tmp-{f['name']}-{os.getpid()}-{threading.get_ident()}-{next(tries)}"
            h, got = hashlib.sha256(), 0
            try:
                with _open_whole(url) as src, open(tmp, "wb") as out:
                    while got <= size:
                        block = src.read(min(1 << 22, size + 1 - got))
                        if not block or not alive():
                            break
                        h.update(block)
                        out.write(block)
                        got += len(block)
                if not alive():
                    return None
                if got != size:  # (a connection dropped mid-body is an error of the read itself: tried again)
                    raise UserError(f"shard {redact(url)} has {got}{'+' if got > size else ''} bytes, meta.json "
                                    f"says {size}: it is truncated or corrupted; push or prepare the dataset again")
                if h.hexdigest() != f["sha256"]:
                    raise UserError(f"shard {redact(url)} fails its sha256 check against meta.json: it is "
                                    "corrupted; push or prepare the dataset again")
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)

        try:
            _patiently(url, work, self.fetch_timeout)
        except (UserError, FetchFailed, stop.Interrupted):
            raise
        except Exception as e:  # refused credentials, no such file
            raise _cannot_read(url, e) from None


class ShardTokens:
    """One split's tokens, read from cached shards: len() and tokens[a:b] (module doc)."""

    remote = True

    def __init__(self, cache: ShardCache, files: list[dict], dtype: str):
        self.cache, self.files, self.dtype = cache, files, np.dtype(dtype)
        counts = [f["tokens"] for f in files]
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])  # each shard's first token
        self.held: set[int] = set()
        self._queue: queue.Queue | None = None
        self._failed: set[int] = set()  # shards whose read-ahead failed: left to the reader
        self._maps: dict[int, np.ndarray] = {}  # shard -> its cached file mapped (ShardTokens._map)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shards_of(self, a: int, b: int) -> range:
        """The shards tokens[a:b] reads (b > a)."""
        return range(int(np.searchsorted(self.starts, a, "right")) - 1,
                     int(np.searchsorted(self.starts, b - 1, "right")))

    def _paths(self, shards) -> set:
        return {self.cache.path(self.files[s]) for s in shards}

    def _map(self, s: int, keep: set) -> np.ndarray:
        """Shard s's cached file as an array: a memmap, kept while s is held (an open mapping stays
        valid when another rank evicts the file meanwhile); fetched first when it is not cached."""
        if s in self._maps:
            return self._maps[s]
        for _ in range(3):  # another rank may evict it between ensure and open
            path = self.cache.ensure(self.files[s], self.dtype.itemsize, keep, held=self._paths(self.held))
            try:
                mapped = np.memmap(path, dtype=self.dtype, mode="r")
            except FileNotFoundError:
                continue
            self._maps = {k: m for k, m in self._maps.items() if k in self.held}
            self._maps[s] = mapped
            return mapped
        raise UserError(f"the shards of {self.cache.url} are evicted as soon as they are fetched: "
                        "the cache is shared by too many readers; raise --data.cache_bytes")

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ShardTokens supports tokens[a:b] only")
        a, b, _ = key.indices(len(self))
        if b <= a:
            return np.zeros(0, self.dtype)
        shards = self.shards_of(a, b)
        keep = self._paths(shards)
        parts = [np.array(self._map(s, keep)[max(a, self.starts[s]) - self.starts[s]:
                                             min(b, self.starts[s + 1]) - self.starts[s]]) for s in shards]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def rows(self, starts, length: int) -> np.ndarray:
        """tokens[a:a + length] for each a in `starts`, as one array: each shard mapped once for all
        the rows in it (a batch's hundreds of slices cost a few ms each way otherwise)."""
        starts = np.asarray(starts, dtype=np.int64)
        out = np.empty((len(starts), length), dtype=self.dtype)
        first = np.searchsorted(self.starts, starts, "right") - 1
        whole = first == np.searchsorted(self.starts, starts + length - 1, "right") - 1
        for s in np.unique(first[whole]):
            here = np.flatnonzero(whole & (first == s))
            out[here] = self._map(int(s), self._paths([s]))[(starts[here] - self.starts[s])[:, None] + np.arange(length)]
        for i in np.flatnonzero(~whole):  # a row across two shards (evaluation's; training's never are)
            out[i] = self[int(starts[i]): int(starts[i]) + length]
        return out

    def hold(self, shards) -> None:
        """Mark `shards` in use (evicted last by this reader, never by its prefetch) and recently used."""
        self.held = set(shards)
        for s in self.held:
            try:
                os.utime(self.cache.path(self.files[s]))
            except FileNotFoundError:
                pass

    def prefetch(self, shards) -> None:
        """Fetch `shards` in a background thread, as far as they fit beside the held ones."""
        if self._queue is None:
            self._queue = queue.Queue()
            threading.Thread(target=self._prefetcher, daemon=True).start()
        shards = tuple(s for s in shards if not self.cache.path(self.files[s]).is_file() and s not in self._failed)
        if shards:
            self._queue.put(shards)

    def _prefetcher(self) -> None:
        while True:
            shards = self._queue.get()
            try:
                for s in shards:  # in order; each keeps the held ones and the others of its group
                    try:
                        if self.cache.ensure(self.files[s], self.dtype.itemsize, self._paths(shards), prefetch=True,
                                             held=self._paths(self.held)) is None:
                            break
                    except Exception:  # once: the reader meets the error when it needs the shard, and reports it
                        self._failed.add(s)  # (asked again at every batch, a failing store saw TRIES reads a step)
                        break
            finally:
                self._queue.task_done()
