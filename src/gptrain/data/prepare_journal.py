"""The work-in-progress folder of `gptrain data prepare`, which a rerun continues.

    OUT.partial/            beside --out OUT, until the prepare is done (then renamed to OUT)
        journal.json        what is written: how many tokenization tasks, each split's finished
                            shards (name, tokens, sha256, documents) and its current shard's
                            tokens and documents; the sources' version stamps and the options
        train-00000.bin ... the shards, as far as they go

The journal is replaced whole (os.replace) only after the shards it counts are flushed to the
disk, so after a kill at any moment it describes a prefix of the shards. A rerun of the same
command checks that the sources and options are the same, cuts each current shard back to its
journaled length, skips the tasks already written and goes on. The journal is read as hostile
input: shard names must be the writer's own plain names, counts non-negative ints.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from gptrain.data.formats import check_meta, verify
from gptrain.errors import UserError
from gptrain.files import is_plain_name, read_json

JOURNAL = "journal.json"
JOURNAL_VERSION = 1
SPLITS = ("train", "val")


def partial_dir(out: Path) -> Path:
    return out.parent / f"{out.name}.partial"


class Journal:
    """An open (locked) OUT.partial folder and its journal."""

    def __init__(self, out: Path, identity: dict):
        self.out, self.dir, self.identity = out, partial_dir(out), identity
        self.path = self.dir / JOURNAL
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            self.dir.mkdir()
            fresh = True
        except FileExistsError:
            fresh = False
        except OSError as e:  # read-only, not permitted, full
            raise UserError(f"cannot write the prepared dataset at {out}: {e.strerror}; give a --out "
                            "you may write to") from None
        if not self.dir.is_dir() or self.dir.is_symlink():
            raise UserError(f"{self.dir} is in the way of the prepare's work folder: remove it or give a new --out")
        self._fd = os.open(self.dir, os.O_RDONLY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise UserError(f"another prepare is writing {self.dir}; wait for it to end, "
                            "or give a new --out") from None
        try:
            self.state = None if fresh else self._load()
            if self.state is None:  # nothing written yet: the first journal comes before any shard
                empty = {"files": [], "tokens": 0, "documents": 0}
                self._write({"journal": JOURNAL_VERSION, **identity, "tasks": 0, "done": False,
                             "invalid_utf8_replaced": 0, "splits": {s: dict(empty) for s in SPLITS}})
        except BaseException:
            self.close()  # the folder is left as it was found, for the user to look at
            raise

    def _remove_hint(self) -> str:
        return f"remove {self.dir} to start over, or give a new --out"

    def _load(self) -> dict | None:
        """The journal of an interrupted prepare, checked; None when it had written nothing yet."""
        if not self.path.exists():
            if (self.dir / "meta.json").is_file():
                return {"complete": True}
            if any(p.name != f"{JOURNAL}.tmp" for p in self.dir.iterdir()):
                raise UserError(f"{self.dir} exists and holds no prepare journal; {self._remove_hint()}")
            return None
        data = read_json(self.path, "prepare journal")
        if data.get("journal") != JOURNAL_VERSION:
            self._damaged("unknown journal version")
        for key, now in self.identity.items():
            if data.get(key) != now:
                raise UserError(f"{self.dir} holds an interrupted prepare of {_differs(key, data.get(key), now)}; "
                                f"rerun the same command to continue it, or {self._remove_hint()}")
        if not _count(data.get("tasks")) or not isinstance(data.get("done"), bool) or \
                not _count(data.get("invalid_utf8_replaced")) or not isinstance(data.get("splits"), dict) or \
                sorted(data["splits"]) != sorted(SPLITS):
            self._damaged("malformed counts")
        for split in SPLITS:
            self._check_split(split, data["splits"][split], data["done"])
        return data

    def _check_split(self, split: str, st, done: bool) -> None:
        if not isinstance(st, dict) or not isinstance(st.get("files"), list) or \
                not _count(st.get("tokens")) or not _count(st.get("documents")) or \
                st["tokens"] > self.identity["shard_tokens"]:
            self._damaged(f"a malformed {split} split")
        for i, f in enumerate(st["files"]):
            if not isinstance(f, dict) or not _count(f.get("tokens")) or not _count(f.get("documents")) \
                    or not isinstance(f.get("sha256"), str) or len(f["sha256"]) != 64:
                self._damaged(f"a malformed {split} file entry")
            if not is_plain_name(f.get("name")) or f["name"] != f"{split}-{i:05d}.bin":
                self._damaged(f"a {split} file named {f.get('name')!r}, not its own shard name")
            if not done:  # (being finished, the single file of a split may have been renamed)
                self._check_file(f["name"], f["tokens"], exact=True)
        if not done and st["tokens"]:
            self._check_file(f"{split}-{len(st['files']):05d}.bin", st["tokens"], exact=False)

    def _check_file(self, name: str, tokens: int, exact: bool) -> None:
        """A shard the journal counts: a file (not a link) in the folder, at least as long."""
        path, size = self.dir / name, tokens * self.identity["itemsize"]
        if path.is_symlink() or not path.is_file() or path.stat().st_size < size or \
                (exact and path.stat().st_size != size):
            raise UserError(f"{path} is not the file of {tokens} tokens its journal says; {self._remove_hint()}")

    def _damaged(self, what: str):
        raise UserError(f"{self.path} is damaged or was edited ({what}); {self._remove_hint()}")

    def save(self, writers: dict, tasks: int, done: bool = False, replaced: int = 0) -> None:
        """Record `tasks` tasks written: the shards flushed to the disk first, then the journal
        replaced whole."""
        for w in writers.values():
            if not done:
                w.sync()
        state = {"journal": JOURNAL_VERSION, **self.identity, "tasks": tasks, "done": done,
                 "invalid_utf8_replaced": replaced, "splits": {s: w.state() for s, w in writers.items()}}
        if done:  # the writers are closed: their current shards are among the files
            for st in state["splits"].values():
                st.update(tokens=0, documents=0)
        self._write(state)

    def _write(self, state: dict) -> None:
        self.state = state
        tmp = self.dir / f"{JOURNAL}.tmp"
        tmp.unlink(missing_ok=True)
        with open(tmp, "x") as f:
            f.write(json.dumps(state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        os.fsync(self._fd)  # the rename itself

    def finish_complete(self, sources: list[str], tokenizer_spec: dict) -> dict:
        """A folder whose journal was removed just before its rename: the dataset is complete."""
        meta = check_meta(read_json(self.dir / "meta.json", "dataset description"), self.dir / "meta.json")
        ident = self.identity
        if meta.get("sources") != sources or meta["tokenizer"] != tokenizer_spec or \
                meta.get("seed") != ident["seed"] or meta.get("val_fraction") != ident["val_fraction"]:
            raise UserError(f"{self.dir} holds a finished prepare of other sources or options; {self._remove_hint()}")
        verify(self.dir, checksums=False)
        self.publish()
        return meta

    def publish(self) -> None:
        """Drop the journal and rename the folder to OUT, atomically."""
        self.path.unlink(missing_ok=True)
        (self.dir / f"{JOURNAL}.tmp").unlink(missing_ok=True)
        if self.out.exists():  # an empty directory when the prepare began
            if not self.out.is_dir() or any(self.out.iterdir()):
                raise UserError(f"output {self.out} appeared while preparing (another command wrote it); "
                                "choose a new --out directory")
            self.out.rmdir()
        os.replace(self.dir, self.out)
        self.close()

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _differs(key: str, then, now) -> str:
    """What differs between the journal and this command, in a few words."""
    if key == "sources":
        if not isinstance(then, list) or len(then) != len(now):
            return f"other sources ({len(then) if isinstance(then, list) else '?'} files then, {len(now)} now)"
        old, (location, _) = next((t, n) for t, n in zip(then, now) if t != n)
        was = old[0] if isinstance(old, list) and old else old
        if was != location:
            return f"other sources ({location} now, not {str(was)[:200]})"
        return f"other sources: {location} has changed since (its size or modification time)"
    if key == "tokenizer":
        return "another tokenizer"
    shown = {"task_chars": "task size", "piece_chars": "piece size", "itemsize": "token size"}.get(
        key, "--" + key.replace("_", "-"))
    return f"other options: {shown} was {json.dumps(then)[:60]}, now {json.dumps(now)[:60]}"
