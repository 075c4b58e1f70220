"""Dataset mixtures: `--data.mix web:0.7,code:0.3` trains on several prepared datasets at once.

    --data.mix web:0.7,code:0.3             # pushed dataset names
    --data.mix /data/web:7,./code-tok:3     # or directories; weights are normalized
    [data]                                  # in a TOML config: the same string, or a table
    mix = "web:0.7,code:0.3"                #   [data.mix]
                                            #   web = 0.7
                                            #   code = 0.3

Parsing: entries are split on ',', and each entry on its LAST ':' (so a path may hold ':',
never ','); a weight is a positive finite number. data.path and data.mix are exclusive. Every
dataset of a mix must have the same tokenizer (meta.json's tokenizer and vocab_size).

Which source each block comes from: a deterministic, seed-free interleave. The mixture is one
global stream of positions, like a single dataset's (data/loader.py); position p (counting from
1) goes to the source i with the largest deficit p * w_i - c_i, c_i being the blocks source i
has given so far (ties: the first). So after any p blocks every source has given about p * w_i
(under 1.2 blocks apart for random weightings of up to 10 sources, as tests/unit/test_mixture.py
measures): the ratio holds in every global batch, not only on average, and no random
draw can drift. Within a source, blocks come in that source's own stream of seeded per-epoch
permutations (a BlockLoader with seed train.seed + i, so the first source's order is the one it
has alone). The c_i are those streams' positions, so the mixture's state is nothing but its
sources' states: a resumed run continues every source exactly and keeps the ratio, and, the
positions being global, on any number of data-parallel ranks with the same global batch.

An epoch of a mix (train.epochs, eval_strategy=epoch) is as many blocks as all its sources hold
together. Evaluation: each source's validation split is evaluated alone, reported as
eval/<name>/loss, and eval/loss is the mean over the sources weighted by the mix's weights.
(No torch at module level: config_check runs check_config in the CLI.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gptrain.errors import UserError, refuse_credentials
from gptrain.locations import is_url

FORM = "NAME:WEIGHT,NAME:WEIGHT (e.g. web:0.7,code:0.3)"


def parse_mix(text: str) -> list[tuple[str, float]]:
    """[(name, weight normalized to sum 1)] of a --data.mix string; one UserError line if malformed."""
    entries = []
    for raw in text.split(","):
        entry = raw.strip()
        name, colon, weight = entry.rpartition(":")
        name = name.strip()
        if not colon or not name:
            raise UserError(f"--data.mix entry {entry!r} is not NAME:WEIGHT; write {FORM}")
        try:
            w = float(weight)
        except ValueError:
            raise UserError(f"--data.mix weight {weight.strip()!r} of {name} is not a number; write {FORM}") from None
        if not math.isfinite(w) or w <= 0:
            raise UserError(f"--data.mix weight of {name} must be a number > 0, got {weight.strip()!r}")
        if any(name == n for n, _ in entries):
            raise UserError(f"--data.mix names {name} twice; give each dataset once, with its weight")
        entries.append((name, w))
    top = max(w for _, w in entries)  # scaled first: weights near the float maximum sum to inf
    total = sum(w / top for _, w in entries)
    out = [(n, w / top / total) for n, w in entries]
    for n, w in out:
        if w == 0.0:
            raise UserError(f"--data.mix weight of {n} is too small next to the others to draw anything; "
                            "give weights of similar sizes")
    return out


def tokenizer_of(meta: dict) -> str:
    return json.dumps([meta.get("tokenizer"), meta.get("vocab_size")], sort_keys=True)


def check_tokenizers(sources) -> None:
    """sources: [(name, meta)]; all with the first's tokenizer, else one line naming the odd one."""
    first_name, first = sources[0]
    for name, meta in sources[1:]:
        if tokenizer_of(meta) != tokenizer_of(first):
            raise UserError(f"--data.mix: {name} has another tokenizer than {first_name} (vocab_size "
                            f"{meta.get('vocab_size')} vs {first.get('vocab_size')}); prepare both with "
                            "the same --tokenizer")


def check_config(data_cfg) -> None:
    """The submit/CLI-time check of data.mix (config_check.check): exclusive with data.path,
    well formed, every name known, and the tokenizers of the prepared ones the same (a raw file
    is tokenized when the run starts, where the trainer checks again)."""
    if not data_cfg.mix:
        return
    if data_cfg.path:
        raise UserError("set either --data.path or --data.mix, not both (a mix names each of its datasets)")
    from gptrain.data.formats import is_prepared_dir, read_meta
    from gptrain.data.store import is_path, resolve

    prepared, seen = [], {}
    for name, _ in parse_mix(data_cfg.mix):
        if is_url(name):
            refuse_credentials(name, "--data.mix")
            continue
        from gptrain.data.object_store import url_of

        if not is_path(name) and url_of(name):
            continue  # a pushed dataset in object storage: read from its URL, as a URL
        p = resolve(name)  # an unknown name or missing path: one line
        where = p.resolve()
        if where in seen:
            raise UserError(f"--data.mix names one dataset twice, as {seen[where]} and as {name}; "
                            "give each dataset once, with its weight")
        seen[where] = name
        if is_prepared_dir(p):
            prepared.append((name, read_meta(p)))
    if len(prepared) > 1:
        check_tokenizers(prepared)


def label(name: str) -> str:
    """A source's name in metric keys: a pushed name as it is, a path's last part."""
    return Path(name.rstrip("/")).name or name


def weighted(results: dict) -> dict:
    """Evaluation of a mix: results {name: (weight, metrics)} of each source with a validation
    split; loss and accuracy are their means weighted by the mix's weights (renormalized over
    those evaluated), perplexity that loss's, and each source's own under <name>/."""
    total = sum(w for w, _ in results.values())
    loss = sum(w * r["loss"] for w, r in results.values()) / total
    out = {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
           "accuracy": sum(w * r["accuracy"] for w, r in results.values()) / total,
           "tokens": sum(r["tokens"] for _, r in results.values())}
    labels = [label(name) for name in results]
    for i, (key, (_, r)) in enumerate(zip(labels, results.values())):
        key = key if labels.count(key) == 1 else f"{key}-{i}"  # two paths of one last part
        out.update({f"{key}/{k}": v for k, v in r.items() if k != "tokens"})
    return out


class MixtureLoader:
    """Batches drawn from several BlockLoader streams by weight (module doc); the trainer's
    loader interface: next_batch, batches_per_epoch, state_dict, load_state_dict, left_out."""

    def __init__(self, sources: list, names: list[str], weights: list[float],
                 batch_size: int, rank: int = 0, world: int = 1):
        if len(sources) != len(weights) or not sources:
            raise ValueError("one weight per source")
        self.sources, self.names = sources, list(names)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.B, self.rank, self.world = batch_size, rank, world
        self.T = sources[0].T
        self.left_out = sum(s.left_out for s in sources)

    @classmethod
    def open(cls, sources, block_size: int, batch_size: int, rank: int = 0, world: int = 1, seed: int = 0,
             max_blocks: int | None = None, vocab_size: int | None = None) -> "MixtureLoader":
        """sources: [(name, weight, prepared dir)]; each source's train split, its own stream."""
        from gptrain.data.formats import open_examples
        from gptrain.data.loader import count_blocks, make_loader
        from gptrain.data.remote_shards import open_tokens

        loaders = []
        for i, (name, _, path) in enumerate(sources):
            tokens = open_tokens(path, "train")
            examples = open_examples(path, "train", len(tokens))
            if count_blocks(len(tokens), block_size, max_blocks, examples) < 1:
                raise UserError(f"--data.mix: {name} has no training block of {block_size} tokens; "
                                "use more data or a smaller model.block_size")
            loaders.append(make_loader(tokens, block_size, batch_size, seed=seed + i, max_blocks=max_blocks,
                                       vocab_size=vocab_size, source=f"dataset {path}", examples=examples))
        return cls(loaders, [n for n, _, _ in sources], [w for _, w, _ in sources], batch_size, rank, world)

    @property
    def global_batch(self) -> int:
        return self.B * self.world

    def batches_per_epoch(self) -> float:
        return sum(s.n_blocks for s in self.sources) / self.global_batch

    def counts(self) -> np.ndarray:
        """Blocks each source has given so far (all ranks)."""
        return np.array([s.position for s in self.sources], dtype=np.int64)

    def schedule(self, n: int) -> np.ndarray:
        """The sources of the next n positions of the stream (does not move it on)."""
        counts = self.counts().astype(np.float64)
        p = counts.sum()
        out = np.empty(n, dtype=np.int64)
        for k in range(n):
            p += 1
            i = int(np.argmax(p * self.weights - counts))
            counts[i] += 1
            out[k] = i
        return out

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, block) of the next n positions of the global stream (moves it on)."""
        which = self.schedule(n)
        blocks = np.empty(n, dtype=np.int64)
        for i, source in enumerate(self.sources):
            here = which == i
            blocks[here] = source.take(int(here.sum()))
        return which, blocks

    def next_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """(source, block) of this rank's next batch: every world-th of the next global batch."""
        which, blocks = self.take(self.global_batch)
        return which[self.rank:: self.world], blocks[self.rank:: self.world]

    def batch(self, which, blocks):
        """(inputs, targets), each (rows, block_size) int64, of the (source, block) pairs."""
        import torch

        x = torch.empty((len(which), self.T), dtype=torch.int64)
        y = torch.empty((len(which), self.T), dtype=torch.int64)
        for i, source in enumerate(self.sources):
            rows = np.flatnonzero(which == i)
            if len(rows):
                x[rows], y[rows] = source.batch(blocks[rows])
        return x, y

    def next_batch(self):
        return self.batch(*self.next_indices())

    def state_dict(self) -> dict:
        return {"mix": [{"name": n, "weight": float(w), **s.state_dict()}
                        for n, w, s in zip(self.names, self.weights, self.sources)]}

    def load_state_dict(self, state: dict) -> None:
        """Every source's position (a ValueError, as BlockLoader's, when the state is not of
        this mix: other datasets, names or block size). Changed weights are kept: the interleave
        goes on from the positions with the new ones."""
        saved = state.get("mix")
        if not isinstance(saved, list) or [s.get("name") for s in saved] != self.names:
            raise ValueError("loader state is for a different dataset mix")
        for source, s in zip(self.sources, saved):
            if s["n_blocks"] != source.n_blocks or s["block_size"] != source.T:
                raise ValueError("loader state is for a different dataset or block size")
        for source, s in zip(self.sources, saved):
            source.load_state_dict(s)
