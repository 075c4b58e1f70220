"""Reading a URL patiently: each read in a thread of its own that the caller watches, with a
deadline on receiving nothing (data.fetch_timeout), retried TRIES times with growing waits, cut
short by a stop request (gptrain/stop.py); a read that fails every try is a FetchFailed (an
infrastructure error: a job's restarts cover it). Used by data/remote_shards.py for meta.json
and the shards; credentials never appear in its errors."""

from __future__ import annotations

import threading
import time

from gptrain import stop
from gptrain.errors import InfraError, UserError, redact, scrub_credentials

TRIES = 4  # each remote read, in all; the waits between them grow: 1, 2, 4 s
DEFAULT_FETCH_TIMEOUT_S = 60.0  # data.fetch_timeout: seconds a read may receive nothing


class FetchFailed(InfraError):
    """A remote read that failed every try: an infrastructure error (restarts cover it)."""


def _patiently(url: str, work, timeout_s: float):
    """work(alive) run in a thread, watched: `alive()` is called by the work each time data
    arrives, and returns False once the try was abandoned (the work then stops and cleans up).
    Tries again (module doc) after a stall or an error that is not the user's; FetchFailed after
    TRIES; stop.Interrupted when a stop is requested meanwhile."""
    last = ""
    for attempt in range(TRIES):
        if attempt:
            stop.sleep(2 ** (attempt - 1), f"waiting to read {redact(url)} again")
        box, heard, abandoned = {}, [time.monotonic()], threading.Event()

        def alive() -> bool:
            heard[0] = time.monotonic()
            return not abandoned.is_set()

        def run():
            try:
                box["result"] = work(alive)
            except BaseException as e:  # handed to the watcher
                box["error"] = e

        t = threading.Thread(target=run, daemon=True, name=f"read {redact(url)}")
        t.start()
        try:
            stop.join(t, f"reading {redact(url)}", give_up=lambda: time.monotonic() - heard[0] > timeout_s)
        except stop.Interrupted:
            abandoned.set()
            raise
        if t.is_alive():
            abandoned.set()  # (its socket is left to fsspec's own timeout; this try is over)
            last = f"no data for {timeout_s:g} s (the server stalled)"
            continue
        error = box.get("error")
        if error is None:
            return box["result"]
        if isinstance(error, (UserError, FileNotFoundError, PermissionError, stop.Interrupted)):
            raise error
        last = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200] if str(error).strip() else ''}"
    raise FetchFailed(scrub_credentials(f"cannot read {redact(url)} after {TRIES} tries: {last}; "
                                        "the storage or the network failed (an attempt restarts on --max-restarts)"))


_TEXT_TIMEOUT = [None]  # data.fetch_timeout of the run reading text URLs (reading_with)


def checked_timeout(seconds: float | None, flag: str = "--fetch-timeout") -> float | None:
    """A fetch timeout a user typed, checked as data.fetch_timeout is: more than 0, at most 3600 s."""
    if seconds is not None and not 0 < seconds <= 3600:  # (nan fails both comparisons)
        raise UserError(f"{flag} must be more than 0 and at most 3600 seconds, got {seconds:g}")
    return seconds


class reading_with:
    """`with reading_with(seconds):` text URLs read inside wait that long (the trainer's
    data.fetch_timeout), not DEFAULT_FETCH_TIMEOUT_S."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds

    def __enter__(self):
        self.old, _TEXT_TIMEOUT[0] = _TEXT_TIMEOUT[0], self.seconds
        return self

    def __exit__(self, *exc):
        _TEXT_TIMEOUT[0] = self.old


def timeouts(url: str, timeout_s: float | None = None) -> dict:
    """fsspec options bounding how long an HTTP(S) connection or read may wait for nothing: a
    server that accepts and never answers is an error after `timeout_s`, not a hang (fsspec's
    HTTP client waits forever by default). Other schemes keep their backends' own timeouts."""
    if url.split("://", 1)[0].lower() not in ("http", "https"):
        return {}
    timeout_s = timeout_s or _TEXT_TIMEOUT[0] or DEFAULT_FETCH_TIMEOUT_S
    try:
        import aiohttp
    except ImportError:
        return {}
    return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=timeout_s,
                                                               sock_read=timeout_s)}}


def failure(e: BaseException, timeout_s: float | None = None) -> str:
    """What went wrong with a remote read, in words: a timeout anywhere in the chain of causes
    (fsspec's HTTP client reports one as FileNotFoundError) says so, not "not found"."""
    seen, cause = set(), e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TimeoutError) or type(cause).__name__ in ("ServerTimeoutError", "TimeoutError"):
            waited = timeout_s or _TEXT_TIMEOUT[0] or DEFAULT_FETCH_TIMEOUT_S
            return f"no answer within {waited:g} s (the server accepted the connection, then sent nothing)"
        cause = cause.__cause__ or cause.__context__
    return f"{type(e).__name__}: {e}"


def _open_whole(url: str):
    """`url` opened to be read once from start to end: over HTTP one streaming GET (fsspec's
    default reads blocks by Range requests, which a server without Range support, such as
    `python -m http.server`, answers with the whole file: past the first block, every try failed)."""
    import fsspec

    whole = {"block_size": 0} if url.split("://", 1)[0].lower() in ("http", "https") else {}
    return fsspec.open(url, "rb", **whole)


def _read_url(url: str, limit: int, timeout_s: float = DEFAULT_FETCH_TIMEOUT_S) -> bytes:
    def work(alive):
        """The whole body, up to limit + 1 bytes: a streamed read gives what has arrived so far,
        so it reads until the end (one read of a body that came in pieces was cut short)."""
        parts, got = [], 0
        with _open_whole(url) as f:
            while got <= limit and alive():
                block = f.read(limit + 1 - got)
                if not block:
                    break
                parts.append(block)
                got += len(block)
        return b"".join(parts)

    try:
        data = _patiently(url, work, timeout_s)
    except (FileNotFoundError, FetchFailed, stop.Interrupted):
        raise
    except Exception as e:  # a missing package, refused credentials
        raise _cannot_read(url, e) from None
    if len(data) > limit:
        raise UserError(f"{url} is larger than {limit} bytes; it is not a dataset description")
    return data


def _cannot_read(url: str, e: Exception) -> UserError:
    hint = "; the store refused the credentials (docs/object-storage.md)" if isinstance(e, PermissionError) else ""
    why = str(e) or ("no answer in time (the server stalled)" if "timeout" in type(e).__name__.lower() else "")
    return UserError(f"cannot read {url}: {type(e).__name__}: {why}".splitlines()[0] + hint)
