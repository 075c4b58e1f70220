"""Training blocks for your own program: the trainer's data order, as a small API.

    from gptrain.data.api import TokenBlocks

    blocks = TokenBlocks("shakespeare-char", block_size=256, batch_size=8)   # or mix="web:0.7,code:0.3"
    for step, (x, y) in zip(range(1000), blocks):   # x, y: (batch_size, block_size) int64
        ...
    torch.save(blocks.state_dict(), "data_state.pt")  # the global position; load_state_dict resumes

A thin layer over the trainer's own loaders (data/loader.py, data/mixture.py): the same global
stream of seeded per-epoch permutations, the same batches for the same seed, block size and
global batch, and the same state_dict, so a position saved here (or by `gptrain train`) resumes
at the next unseen blocks, on any number of ranks with the same global batch. Each rank gets
every world-th block of each global batch: rank and world come from torch.distributed when it is
initialized, else from RANK and WORLD_SIZE (torchrun sets them), else 0 and 1.

Data: a prepared directory (`gptrain data prepare`) or a pushed dataset's name; a mix names
several (NAME:WEIGHT,..., docs/data.md). Iterating never ends (the epochs follow each other):
stop after the steps you want. `dataset()` is the same stream as a torch IterableDataset, for
`DataLoader(blocks.dataset(), batch_size=None)` (no worker processes: the position lives here).
"""

from __future__ import annotations

import os
from pathlib import Path

from gptrain.errors import UserError

__all__ = [  # what the faces (cli/, ui/) may use: tests/unit/test_api_surface.py
    "datasets", "fetch_corpus", "import_saved", "inspect", "prepare", "prepared_dir", "push",
    "rank_and_world", "remove", "sample", "TokenBlocks",
]


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): torch.distributed's when initialized, else RANK/WORLD_SIZE, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def prepared_dir(ref: str) -> Path:
    """A prepared dataset directory from a path or a pushed dataset's name (data/store.py's rule)."""
    from gptrain.data.formats import is_prepared_dir
    from gptrain.data.store import resolve

    p = resolve(ref)
    if not is_prepared_dir(p):
        raise UserError(f"{ref} is not a prepared dataset (no meta.json): prepare it with "
                        "`gptrain data prepare SOURCE --out DIR` and pass DIR or its pushed name")
    return p


class TokenBlocks:
    """(inputs, targets) batches of this rank, each (batch_size, block_size) int64; see the module doc."""

    def __init__(self, data: str | None = None, block_size: int = 1024, batch_size: int = 8,
                 rank: int | None = None, world: int | None = None, seed: int = 0, mix: str | None = None,
                 max_blocks: int | None = None):
        from gptrain.data.formats import read_meta
        from gptrain.data.loader import open_train_loader
        from gptrain.data.mixture import MixtureLoader, check_tokenizers, parse_mix

        if (data is None) == (mix is None):
            raise UserError("TokenBlocks needs a dataset or a mix (one of the two)")
        if rank is None or world is None:
            found_rank, found_world = rank_and_world()
            rank, world = found_rank if rank is None else rank, found_world if world is None else world
        if not 0 <= rank < world:
            raise UserError(f"rank {rank} is not within world size {world}")
        self.rank, self.world = rank, world
        if mix is not None:
            sources = [(name, w, prepared_dir(name)) for name, w in parse_mix(mix)]
            metas = [(name, read_meta(path)) for name, _, path in sources]
            check_tokenizers(metas)
            self.vocab_size = metas[0][1]["vocab_size"]
            self.loader = MixtureLoader.open(sources, block_size, batch_size, rank, world, seed, max_blocks,
                                             self.vocab_size)
            return
        path = prepared_dir(data)
        self.vocab_size = read_meta(path)["vocab_size"]
        self.loader = open_train_loader(path, block_size, batch_size, rank, world, seed, max_blocks, self.vocab_size)

    def __iter__(self):
        while True:
            yield self.loader.next_batch()

    def batches_per_epoch(self) -> float:
        """Global batches in one pass over the data."""
        return self.loader.batches_per_epoch()

    def state_dict(self) -> dict:
        """The global position (the same on every rank; the trainer checkpoints the same)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        try:
            self.loader.load_state_dict(state)
        except (ValueError, KeyError, TypeError):
            raise UserError("this data state is of another dataset, mix or block size") from None

    def dataset(self):
        """The same stream as a torch.utils.data.IterableDataset of batches."""
        from torch.utils.data import IterableDataset

        blocks = self

        class Blocks(IterableDataset):
            def __iter__(self):
                return iter(blocks)

        return Blocks()


# ---- named datasets, for both faces (`gptrain data ...`, the console's datasets page) ---------

def prepare(sources: list[str], out: str, fetch_timeout: float | None = None, **options) -> dict:
    """Sources (files, folders, URLs, hub ids) tokenized into the prepared folder `out`
    (data/prepare.py; a rerun continues one cut short); its meta.json. A URL that sends nothing
    for `fetch_timeout` seconds (default data.fetch_timeout's) is an error, not a hang."""
    from gptrain.data.prepare import prepare as run
    from gptrain.data.remote_read import checked_timeout, reading_with

    with reading_with(checked_timeout(fetch_timeout)):
        return run(sources, out, **options)


def import_saved(source: str, out: str, tokenizer: str = "") -> dict:
    """A Hugging Face save_to_disk folder of input_ids as the prepared folder `out`; its meta.json."""
    from gptrain.data.hf_import import import_hf

    return import_hf(source, out, tokenizer)


def fetch_corpus(corpus: str, out: str | None = None) -> str:
    """A known corpus (data/fetch.py) downloaded into `out` ($GPTRAIN_HOME/corpora/NAME)."""
    from gptrain.data.fetch import fetch
    from gptrain.home import home

    return fetch(corpus, out or str(home() / "corpora" / corpus))


def push(name: str, folder: str | None, tokenizer: str = "", to: str | None = None,
         from_url: str | None = None, fetch_timeout: float | None = None) -> tuple[str, str]:
    """The folder stored as the named dataset `name`, in $GPTRAIN_HOME or (`to`, or the settings'
    [data] store URL) in object storage; or (`from_url`) a prepared dataset already in a bucket
    registered where it is. (its kind, where it is kept)."""
    from gptrain.data import object_store
    from gptrain.data.store import kind_of, push as store_push
    from gptrain.home import user_setting

    if from_url is not None:
        if folder is not None or to is not None:
            raise UserError("--from registers a dataset already in a bucket: give no DIR and no --to")
        from gptrain.data.remote_read import checked_timeout

        return "prepared", object_store.sync_from(name, from_url, checked_timeout(fetch_timeout))["url"]
    if folder is None:
        raise UserError("data push needs the folder to push: gptrain data push NAME DIR [--to URL]")
    store = user_setting("data", "store")
    if to is None and store is not None:  # the user's default store: $GPTRAIN_HOME/config.toml [data] store
        if not isinstance(store, str):
            raise UserError("[data] store in $GPTRAIN_HOME/config.toml must be a URL string")
        to = f"{store.rstrip('/')}/{name}"
    if to is not None and to != "home":
        return "prepared", object_store.push_to(name, folder, to)["url"]
    dest = store_push(name, folder, tokenizer)
    return kind_of(dest), str(dest)


def datasets() -> list[dict]:
    """The named datasets: name, kind, tokenizer, tokens, bytes, created, path, state (uploading,
    available, error: data/object_store.py), error, remote (kept at a URL)."""
    from gptrain.data.store import list_all

    from gptrain.locations import is_url

    return [{**d, "kind": d.get("kind") or "prepared", "state": d.get("state") or "available",
             "error": d.get("error") or "", "remote": is_url(d["path"])} for d in list_all()]


def remove(name: str) -> None:
    from gptrain.data.store import remove as store_remove

    store_remove(name)


def inspect(ref: str, verify: bool = False) -> dict:
    """What a dataset (a name or a folder) holds: {path, kind, verified} and, prepared, its
    meta and a decoded sample; else its files (name, bytes, sha256). `verify`: every file's
    sha256 checked (and token ids against vocab_size), else sizes only."""
    from gptrain.data import nanogpt_dir
    from gptrain.data.formats import is_prepared_dir, read_meta, verify as check
    from gptrain.data.store import MANIFEST, resolve, verify_any

    from gptrain.data.object_store import describe

    remote = describe(ref, check=verify)
    if remote is not None:
        return {**remote, "sample": None}
    path = resolve(ref)
    if nanogpt_dir.is_nanogpt_dir(path):  # read as push, train and eval read it (a prepared copy, cached)
        path = nanogpt_dir.cached(path)
    if is_prepared_dir(path):
        check(path, checksums=verify)
        return {"path": str(path), "kind": "prepared", "meta": read_meta(path), "sample": sample(path),
                "verified": verify}
    try:
        info = verify_any(path, checksums=verify)
    except UserError:
        if (path / MANIFEST).exists():
            raise
        raise UserError(f"{path} is not a pushed dataset nor a prepared one (no meta.json); "
                        f"push it first with `gptrain data push NAME {path}`") from None
    return {"path": str(path), **info, "verified": verify}


_samples: dict[tuple, str] = {}


def sample(path, tokens: int = 64) -> str:
    """The first `tokens` tokens of a prepared dataset's train split (its val split when train is
    empty), decoded; cached per folder and size (the console shows one per dataset)."""
    from gptrain import tokenizers
    from gptrain.data.formats import open_split, read_meta

    key = (str(path), tokens)
    if key not in _samples:
        meta = read_meta(path)
        split = "train" if meta["splits"].get("train", {}).get("tokens") else "val"
        _samples[key] = tokenizers.from_spec(meta["tokenizer"]).decode(open_split(path, split)[:tokens].tolist())
    return _samples[key]
