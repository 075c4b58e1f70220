"""Does training from a URL wait on the network? (issue 24, data/remote_shards.py)

    python bench/remote_prefetch.py [--delay 0.2] [--shards-held 4] [--step 0.01]

Prepares a char dataset of 21 train shards (20,000 tokens each) in a temporary folder, serves it
over HTTP on 127.0.0.1 with every shard request delayed by --delay seconds (a slow network),
and reads one epoch through a ShardedLoader (block 64, batch 8) with a cache of --shards-held
shards, sleeping --step seconds per batch (the step's compute). It prints how many shards the
reader downloaded itself, how many the prefetch thread did, and how many batches waited longer
than delay/2 for their data.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=0.2)
    ap.add_argument("--shards-held", type=int, default=4)
    ap.add_argument("--step", type=float, default=0.01)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    os.environ["GPTRAIN_HOME"] = str(tmp / "home")
    from gptrain.data import remote_shards as rs
    from gptrain.data.loader import ShardedLoader
    from gptrain.data.prepare import prepare
    from tests.helpers import write_corpus

    prepare([str(write_corpus(tmp / "c.txt", 400000))], str(tmp / "ds"), tokenizer="char",
            val_fraction=0.01, shard_tokens=20000, quiet=True)

    class Slow(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.endswith(".bin"):
                time.sleep(args.delay)
            super().do_GET()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Slow, directory=str(tmp)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    folder = rs.open_remote(f"http://127.0.0.1:{srv.server_address[1]}/ds", args.shards_held * 40000)
    counts = {"reader": 0, "prefetch": 0}
    download = rs.ShardCache._download

    def counted(self, f, size, path):
        counts["reader" if threading.current_thread() is threading.main_thread() else "prefetch"] += 1
        return download(self, f, size, path)

    rs.ShardCache._download = counted
    tokens = rs.open_remote_split(folder, "train")
    loader = ShardedLoader(tokens, 64, 8, seed=1)
    batches, waits, t = int(loader.n_blocks / 8), 0, time.time()
    for _ in range(batches):
        t0 = time.time()
        loader.next_batch()
        waits += time.time() - t0 > args.delay / 2
        time.sleep(args.step)
    print(f"shards {len(tokens.files)}, batches {batches}, cache {args.shards_held} shards: downloads by the "
          f"reader {counts['reader']}, by prefetch {counts['prefetch']}, batches that waited {waits}, "
          f"wall {time.time() - t:.1f}s")
    srv.shutdown()


if __name__ == "__main__":
    main()
