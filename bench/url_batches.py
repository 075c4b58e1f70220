"""The data side of a step from a URL against the same from local files, in one process (issue #36).

    python bench/url_batches.py [--shard-tokens 262144] [--batch 128] [--block 128] [--batches 200]

Prepares a char dataset of 4.4M tokens (tests/helpers.streaming_dataset) in a temporary folder,
serves it over HTTP on 127.0.0.1, and times next_batch() of rank 0 of 2 hosts (one rank each) of
a URL loader (ShardedLoader: the shards cached on this disk first, so what is timed is the read
of cached shards, not the network) and of rank 0 of 2 of the local files' loader (BlockLoader on
the shards' memmaps). Prints ms per batch of each and their ratio (URL / local).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from gptrain.data.formats import open_split  # noqa: E402
from gptrain.data.loader import BlockLoader, ShardedLoader  # noqa: E402
from gptrain.data.remote_shards import open_remote, open_remote_split  # noqa: E402
from tests.byte_counting import ByteCountingServer  # noqa: E402
from tests.helpers import streaming_dataset  # noqa: E402


def per_batch(loader, n: int) -> float:
    for _ in range(20):  # (the first shards fetched, the permutations made)
        loader.next_batch()
    t = time.perf_counter()
    for _ in range(n):
        loader.next_batch()
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shard-tokens", type=int, default=262144)
    ap.add_argument("--batch", type=int, default=128, help="blocks a rank's batch")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batches", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        streaming_dataset(work / "ds", args.shard_tokens)
        server = ByteCountingServer(work)
        try:
            folder = open_remote(f"{server.url}/ds", 1 << 30, cache_dir=str(work / "cache"))
            url = ShardedLoader(open_remote_split(folder, "train"), args.block, args.batch, 0, 2, seed=1, hosts=2)
            local = BlockLoader(open_split(work / "ds", "train"), args.block, args.batch, 0, 2, seed=1)
            u, lo = per_batch(url, args.batches), per_batch(local, args.batches)
        finally:
            server.close()
    print(f"a batch of {args.batch} blocks of {args.block} tokens: URL (cached shards) {u * 1e3:.2f} ms, "
          f"local files {lo * 1e3:.2f} ms, URL / local {u / lo:.2f}")


if __name__ == "__main__":
    main()
