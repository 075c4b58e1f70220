"""Verified checkpoints: a checksum of every file a checkpoint holds, written as part of its
commit and checked by every load.

    step-000100/checksums.json   {"format": 1, "algorithm": "crc32c",
                                  "files": {NAME: [SIZE, CRC], ...}, "self": CRC}

CRC-32C (the `crc32c` package: SSE4.2/ARMv8 instructions, ~9.6 GB/s on one core here, and it
releases the GIL, so the background save hashes beside training and a load hashes files in
parallel threads) rather than SHA-256 (1.25 GB/s, holds the GIL): the threat is a disk, a copy or
a network that flips or drops bytes, which a CRC catches (every burst up to 32 bits, any other
error with probability 1 - 2^-32), not a forger, who could rewrite this file as well. It is the
checksum object stores keep (GCS, S3's CRC32C), so a remote copy can be compared with theirs.
"self" covers the file list itself, so a flip anywhere in this file is caught too.

Writers hash what they write as they write it (`Hashing`, `hash_bytes`); `seal` writes this file
fsync'd; `verify` checks a folder against it (a training checkpoint also for a file its list does
not name). A folder without it is `UNVERIFIED`. A gptrain checkpoint whose trainer_state.json (or
an export whose config.json) says it was sealed (`"checksums": "crc32c"`, `"gptrain_checksums"`)
and whose list is gone, or a list that is a link or a folder, is refused as damaged. One without
either (written before gptrain verified checkpoints, or with both removed) is loaded only when the
user says so (`admit`: --allow-unverified, or GPTRAIN_ALLOW_UNVERIFIED=1), loudly, once a process
per folder. A Hugging Face directory from elsewhere has no list and is loaded as it is.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gptrain.errors import UserError

FILE = "checksums.json"
ALGORITHM = "crc32c"
CHUNK = 8 << 20
VERIFIED, UNVERIFIED = "verified", "unverified"
ALLOW_ENV = "GPTRAIN_ALLOW_UNVERIFIED"  # "1": what --allow-unverified sets, for this process and its children
EXPORT_KEY = "gptrain_checksums"  # in an export's config.json: sealed with FILE


class VerificationError(UserError):
    """A checkpoint's bytes are not the bytes it was committed with (flipped, truncated, missing)."""

    def __init__(self, folder, why: str, what: str = "checkpoint"):
        self.folder, self.why = Path(folder), why
        super().__init__(f"{what} {folder} fails verification: {why}; it was damaged after it "
                         f"was written: use another checkpoint (after a change made on purpose, "
                         f"delete its {FILE}, and the \"{SEALED_KEY}\" entry of its trainer_state.json "
                         "where it has one)")


class Unverified(UserError):
    """A gptrain checkpoint without a checksum list, which the user did not allow to load."""


_admitted: dict[str, str] = {}  # folder -> what: loaded unverified in this process (said once)


def allow_unverified() -> None:
    """--allow-unverified: checkpoints without a checksum list load in this process (and the
    processes it starts), each with a warning."""
    os.environ[ALLOW_ENV] = "1"


def admit(folder, what: str = "checkpoint", say=None) -> None:
    """The one rule for a gptrain checkpoint that has no checksum list (`read` gave None): refused
    (Unverified) unless allowed; when allowed, a warning the first time in this process, through
    `say` (stderr by default), and the folder is kept in `admitted()` for the run's records."""
    folder = str(folder)
    if os.environ.get(ALLOW_ENV) != "1":
        raise Unverified(f"{what} {folder} has no {FILE}, so its bytes cannot be verified (written before "
                         "gptrain verified checkpoints, or its list was removed): use a verified checkpoint, "
                         "or load this one anyway with --allow-unverified (a trainer flag, and one of generate, "
                         "eval, export and resume)")
    if folder not in _admitted:
        _admitted[folder] = what
        line = f"warning: {what} {folder} has no {FILE}: loaded WITHOUT verifying its bytes (--allow-unverified)"
        if say is None:
            import sys

            print(line, file=sys.stderr, flush=True)
        else:
            say(line)


def admitted() -> list[str]:
    """The folders loaded unverified in this process, in order."""
    return list(_admitted)


def crc(data, value: int = 0) -> int:
    import crc32c

    return crc32c.crc32c(data, value)


def hash_bytes(data: bytes) -> tuple[int, int]:
    return len(data), crc(data)


def hash_file(path) -> tuple[int, int]:
    """(size, crc) of a file, read in CHUNK pieces into one buffer."""
    value, size = 0, 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            value = crc(view[:n], value)
            size += n
    return size, value


class Hashing:
    """A file opened for writing whose bytes are hashed as they pass (DCP's writer streams);
    a seek makes the running hash void, and the file is then hashed from disk when closed."""

    def __init__(self, f, path, done):
        self._f, self._path, self._done = f, Path(path), done
        self.value, self.size, self.sequential = 0, 0, True

    def write(self, data):
        n = self._f.write(data)
        view = memoryview(data).cast("B")
        self.value = crc(view[:n] if n is not None else view, self.value)
        self.size += n if n is not None else view.nbytes
        return n

    def seek(self, *args):
        self.sequential = False
        return self._f.seek(*args)

    def close(self):
        if not self._f.closed:
            self._f.close()
            self._done(self._path.name, (self.size, self.value) if self.sequential else hash_file(self._path))

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path, data: bytes) -> tuple[int, int]:
    """Write `data` to `path`, fsync'd; its (size, crc)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hash_bytes(data)


def seal_folder(folder) -> None:
    """Hash and fsync every plain file directly in `folder` (one just written whole, such as an
    exported model), then `seal` it."""
    folder, files = Path(folder), {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False) and entry.name != FILE:
            with open(entry.path, "rb") as f:
                os.fsync(f.fileno())
            files[entry.name] = hash_file(entry.path)
    seal(folder, files)


def _body(files: dict) -> bytes:
    return json.dumps({k: list(files[k]) for k in sorted(files)}, separators=(",", ":")).encode()


def seal(folder, files: dict) -> None:
    """Write FILE in `folder` listing `files` ({name: (size, crc)}), then fsync the folder: after
    this returns, the folder and its list survive a power loss (once renamed and its parent synced)."""
    folder = Path(folder)
    doc = {"format": 1, "algorithm": ALGORITHM, "files": {k: list(files[k]) for k in sorted(files)},
           "self": crc(_body(files))}
    write_synced(folder / FILE, json.dumps(doc, indent=1).encode())
    fsync_dir(folder)


def read(folder, what: str = "checkpoint") -> dict | None:
    """The checksum list of `folder` ({name: (size, crc)}), None when it has none; a list that
    is not one this module wrote (a flipped byte included) is a VerificationError."""
    path = Path(folder) / FILE
    if path.is_symlink() or (os.path.lexists(path) and not path.is_file()):
        raise VerificationError(folder, f"its {FILE} is not a plain file", what)
    if not path.is_file():
        if _written_sealed(Path(folder)) or _written_sealed(Path(folder), "config.json", EXPORT_KEY):
            # a list that went missing: never a reason to trust less
            raise VerificationError(folder, f"its {FILE} is missing (the checkpoint was written with one)", what)
        return None
    try:
        doc = json.loads(path.read_bytes()[:1 << 24])
        files = {str(k): (int(v[0]), int(v[1])) for k, v in doc["files"].items()}
        ok = doc.get("algorithm") == ALGORITHM and doc.get("self") == crc(_body(files))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise VerificationError(folder, f"its {FILE} is damaged", what)
    for name in files:
        if not name or "/" in name or name in (".", ".."):
            raise VerificationError(folder, f"its {FILE} names {name!r}, not a file of it", what)
    return files


SEALED_KEY = "checksums"  # in a checkpoint's trainer_state.json (layout.STATE_FILE): sealed with FILE
UNLISTED_OK = (FILE, "damaged.txt")  # files a sealed folder may hold beside its list (layout.DAMAGED)


def _written_sealed(folder: Path, name: str = "trainer_state.json", key: str = SEALED_KEY) -> bool:
    """Whether the folder's trainer_state.json (or an export's config.json) says it was sealed
    with a checksum list."""
    state = folder / name
    try:
        if state.is_symlink() or not state.is_file() or state.stat().st_size > SMALL:
            return False
        return json.loads(state.read_bytes()).get(key) == ALGORITHM
    except (OSError, ValueError, AttributeError, RecursionError):
        return False  # unreadable: its own check says so


def _unlisted(folder: Path, files: dict) -> list[str]:
    """Files (or folders) in `folder` its list does not name: added after the seal."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [f"{n} is not in its {FILE}" for n in names if n not in files and n not in UNLISTED_OK]


def _check(folder: Path, name: str, want, hash_it: bool = True) -> str | None:
    """What is wrong with one listed file (its size; its checksum when `hash_it`), or None."""
    path = folder / name
    try:
        if path.is_symlink():
            return f"{name} is a link"
        size = path.stat().st_size
        if size != want[0]:
            return f"{name} has {size} bytes, it was written with {want[0]}"
        if hash_it and hash_file(path) != tuple(want):
            return f"{name} does not match its checksum"
    except FileNotFoundError:
        return f"{name} is missing"
    except OSError as e:
        return f"{name} cannot be read ({e.strerror or e})"
    return None


SMALL = 1 << 20  # files up to this size are hashed before a load starts (.metadata, the state)


class Check:
    """Verifying a folder while something else reads it: made, it has already checked every
    listed file's size and hashed the small ones (a truncated file or a damaged .metadata is
    refused before anything reads them); the large ones are hashed in background threads until
    `result()`, which raises the first problem as a VerificationError. `share=(rank, world)`
    hashes only every world-th large file (the ranks of a job split the work; the caller
    combines their `problems()`)."""

    def __init__(self, folder, what: str = "checkpoint", threads: int | None = None, share=(0, 1)):
        self.folder, self.what = Path(folder), what
        self.files = read(self.folder, what)
        self._pool, self._futures = None, []
        if self.files is None:
            return
        quick = [_check(self.folder, n, w, hash_it=w[0] <= SMALL) for n, w in sorted(self.files.items())]
        # a training checkpoint holds only what it was sealed with (an HF export may gain a README)
        extra = _unlisted(self.folder, self.files) if _written_sealed(self.folder) else []
        self._raise([p for p in quick if p] + extra)
        big = sorted((n for n, w in self.files.items() if w[0] > SMALL), key=lambda n: -self.files[n][0])
        mine = big[share[0]::share[1]]
        if threads is None:  # beside a load that needs a core of its own: the others, at most 4
            threads = max(1, min(4, (os.cpu_count() or 2) - 1))
        if mine:
            self._pool = ThreadPoolExecutor(max(1, min(threads, len(mine))))
            self._futures = [self._pool.submit(_check, self.folder, n, self.files[n]) for n in mine]

    @property
    def state(self) -> str:
        return UNVERIFIED if self.files is None else VERIFIED

    def problems(self) -> list[str]:
        """This share's problems (waits for the hashing)."""
        try:
            return sorted(p for f in self._futures if (p := f.result()))
        finally:
            if self._pool is not None:
                self._pool.shutdown()

    def result(self, problems: list[str] | None = None) -> str:
        self._raise(self.problems() if problems is None else problems)
        return self.state

    def _raise(self, problems: list[str]) -> None:
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise VerificationError(self.folder, problems[0] + more, self.what)


def verify(folder, what: str = "checkpoint", threads: int | None = None) -> str:
    """VERIFIED when every file in `folder`'s list has its size and checksum, UNVERIFIED when it
    has no list; else a VerificationError naming the file."""
    return Check(folder, what, threads or min(4, os.cpu_count() or 1)).result()


def verify_small(folder, name: str, what: str = "checkpoint") -> None:
    """Check one small listed file (trainer_state.json before it is parsed), when there is a list."""
    files = read(folder, what)
    if files is not None:
        if name not in files:
            raise VerificationError(folder, f"{name} is not in its {FILE}", what)
        if problem := _check(Path(folder), name, files[name]):
            raise VerificationError(folder, problem, what)


def listing(folder) -> dict:
    """What `gptrain checkpoints --verify` shows of a folder: {'verified': 'ok'|'no checksums'|
    'FAILED: why'}."""
    try:
        return {"verified": "ok" if verify(folder) == VERIFIED else "no checksums"}
    except VerificationError as e:
        return {"verified": f"FAILED: {e.why}"}
