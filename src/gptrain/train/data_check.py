"""The token files a run reads, checked against the sha256 their meta.json records, beside
training: a thread hashes them (hashlib releases the GIL) from the first step on, the ranks of a
job sharing the files between them, and a checkpoint is committed only once they have passed
(`wait`, called by every rank before every save). Damaged data fails the run in one line naming
the file, before any checkpoint trained on it is written. A URL's shards are checked as they are
fetched (data/remote_shards.py), so its folder is left out here."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

from gptrain.data.formats import recorded_files, sha256_file
from gptrain.data.remote_shards import is_remote
from gptrain.errors import UserError


def _problem(path, sha256: str) -> str | None:
    try:
        if sha256_file(path) != sha256:
            return f"token file {path} fails its sha256 check against meta.json: it was damaged after it " \
                   "was prepared; prepare or push the dataset again"
    except OSError as e:
        return f"token file {path} cannot be read ({e.strerror or e})"
    return None


class DataCheck:
    def __init__(self, folders, rank: int = 0, world: int = 1):
        files = sorted({(f, sha) for folder in dict.fromkeys(folders) if not is_remote(folder)
                        for f, sha in recorded_files(folder)})
        mine = files[rank::world]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="data-check")
        self._future = self._pool.submit(lambda: [p for f, sha in mine if (p := _problem(f, sha))])
        self._passed = False

    def wait(self) -> None:
        """Block until this rank's share is hashed; UserError (on every rank) if any file failed."""
        if self._passed:
            return
        problems = self._future.result()
        self._pool.shutdown()
        if dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, problems)
            problems = [p for theirs in everyone for p in theirs]
        if problems:
            raise UserError(problems[0])
        self._passed = True
