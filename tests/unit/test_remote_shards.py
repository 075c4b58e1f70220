"""Training from a prepared dataset at a URL (data/remote_shards.py): a real HTTP server on
127.0.0.1 serving a prepared folder of several shards, read through real fsspec."""

import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from gptrain import run_layout
from gptrain.data.formats import open_split, read_meta
from gptrain.data.loader import BlockLoader, ShardedLoader, ShardOrder
from gptrain.data.remote_shards import cached_bytes, open_remote, open_remote_split
from gptrain.errors import UserError
from tests.byte_counting import ByteCountingServer
from tests.helpers import TINY, losses, train, write_corpus

T, B = 32, 4


@pytest.fixture(scope="module")
def served(serve):
    """(root folder served, base URL); root/ds is a char dataset of 7 train shards, 3 val ones."""
    from gptrain.data.prepare import prepare

    def make(root):
        texts = [str(write_corpus(root / f"corpus-{i}.txt", 6000, seed=i)) for i in range(10)]
        prepare(texts, str(root / "ds"), tokenizer="char", val_fraction=0.2, shard_tokens=7000, quiet=True)

    root, server = serve(make)
    return root, server.url


def shard_bytes(root: Path) -> int:
    return max(f["tokens"] * 2 for info in read_meta(root / "ds")["splits"].values() for f in info["files"])


def reference(root: Path, world: int = 1, rank: int = 0) -> BlockLoader:
    """A loader over the same files, local, in the same shard-grouped order."""
    tokens = open_split(root / "ds", "train")
    loader = BlockLoader(tokens, T, B, rank, world, seed=7)
    starts = np.concatenate([[0], np.cumsum([f["tokens"] for f in read_meta(root / "ds")["splits"]["train"]["files"]])])
    loader.order = ShardOrder(starts, T, loader.n_blocks)
    loader.n_blocks = loader.order.count  # (no block across two shards)
    return loader


def remote(folder, world: int = 1, rank: int = 0) -> ShardedLoader:
    return ShardedLoader(open_remote_split(folder, "train"), T, B, rank, world, seed=7)


def test_a_credential_in_the_url_is_never_written_to_the_cache(served):
    """An http URL with user:secret@ (basic auth) works, and the cache's record of it keeps
    neither the secret nor a query string (a presigned signature)."""
    root, base = served
    url = base.replace("http://", "http://reader:s3cr3t-pw@") + "/ds"
    folder = open_remote(url, 10 * shard_bytes(root))
    loader = remote(folder)
    assert torch_equal(loader.next_batch(), reference(root).next_batch())
    on_disk = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.suffix == ".json")
    assert b"s3cr3t-pw" not in on_disk and b"reader:" not in on_disk


def torch_equal(a, b) -> bool:
    return all((x == y).all() for x, y in zip(a, b))


def test_the_order_is_grouped_by_shard_and_a_permutation_of_all_blocks(served):
    root, _ = served
    loader = reference(root)
    perm, order = loader.order(7, 0), loader.order
    whole = [b for s in range(order.n_shards) for b in range(order.lo[s], order.hi[s])]
    assert sorted(perm) == whole and len(perm) == loader.n_blocks and not np.array_equal(perm, loader.order(7, 1))
    shard = np.searchsorted(order.lo, perm, "right") - 1
    assert (np.diff(shard) != 0).sum() == order.n_shards - 1  # each shard's blocks in one run
    # every block lies whole in its shard (one across two would fetch a shard for a token); only
    # those few are left out of a URL's order
    starts = open_split(root / "ds", "train").starts if hasattr(open_split(root / "ds", "train"), "starts") else \
        np.concatenate([[0], np.cumsum([f["tokens"] for f in read_meta(root / "ds")["splits"]["train"]["files"]])])
    assert all(b * T + T + 1 <= starts[s + 1] for b, s in zip(perm, shard))
    assert (len(open_split(root / "ds", "train")) - 1) // T - len(perm) <= order.n_shards - 1


def test_remote_batches_match_local_ones_and_the_cache_stays_under_its_bound(served):
    root, url = served
    files = read_meta(root / "ds")["splits"]["train"]["files"]
    assert len(files) >= 6
    bound = 3 * shard_bytes(root)
    assert bound < sum(f["tokens"] * 2 for f in files)  # smaller than the dataset
    folder = open_remote(f"{url}/ds", bound)
    ref, got = reference(root), remote(folder)
    peak = 0
    for _ in range(int(1.3 * ref.n_blocks / B)):  # past the end of the first epoch
        (x, y), (rx, ry) = got.next_batch(), ref.next_batch()
        assert (x == rx).all() and (y == ry).all()
        peak = max(peak, cached_bytes(folder))
        assert peak <= bound
    assert peak > shard_bytes(root)


def test_a_cached_shard_changed_on_disk_is_fetched_again_never_read(served, capfd):
    """#47 row 5: a cached `*-train-*.bin` overwritten with other bytes of the same size was
    trained on by the next run (loss 2.14 vs 3.09, rc 0). A process hashes a cached file before
    it first reads it: the changed copy is fetched again, with a note, and the batches are the
    dataset's."""
    from gptrain.data import remote_shards

    root, url = served
    files = read_meta(root / "ds")["splits"]["train"]["files"]
    folder = open_remote(f"{url}/ds", 100 * shard_bytes(root))
    ref, got = reference(root), remote(folder)
    n = int(1.2 * ref.n_blocks / B)  # every shard read once
    for _ in range(n):
        got.next_batch()
    cached = sorted((folder / "shards").glob("*-train-*.bin"))
    assert len(cached) == len(files)
    for path in cached:  # another process (or the disk) changes them: same size, other tokens
        data = np.fromfile(path, dtype=np.uint16)
        np.flip(data).tofile(path)
    remote_shards._VERIFIED.clear()  # (a new process: the next run)
    got = remote(folder)
    for _ in range(n):
        (x, y), (rx, ry) = got.next_batch(), ref.next_batch()
        assert (x == rx).all() and (y == ry).all()
    assert "no longer matches its sha256" in capfd.readouterr().err


@pytest.mark.parametrize("world_after", [1, 2])
def test_resume_continues_with_the_same_batches_on_any_world_size(served, world_after):
    root, url = served
    folder = open_remote(f"{url}/ds", 2 * shard_bytes(root) + 100)  # two shards: little room to prefetch
    straight = [remote(folder, 2, r) for r in range(2)]

    def global_batch(loaders):  # rank r holds every world-th row of the global batch
        rows = [loader.next_batch()[0].numpy() for loader in loaders]
        return np.stack(rows, 1).reshape(-1, T)

    for _ in range(30):
        global_batch(straight)
    state = straight[0].state_dict()
    expect = [global_batch(straight) for _ in range(12)]
    resumed = [remote(folder, world_after, r) for r in range(world_after)]
    for r in resumed:
        r.B = 2 * B // world_after  # the same global batch
        r.load_state_dict(state)
    for k in range(12):
        assert (global_batch(resumed) == expect[k]).all(), k


def test_a_mix_of_urls_reads_each_source_through_the_cache(served):
    from gptrain.data.mixture import MixtureLoader

    root, url = served
    folder = open_remote(f"{url}/ds", 3 * shard_bytes(root))
    mix = MixtureLoader.open([("a", 0.6, folder), ("b", 0.4, folder)], T, B, seed=7)
    local = [reference(root) for _ in range(2)]
    local[1].seed = 8  # each source's stream: seed + its index
    ref = MixtureLoader(local, ["a", "b"], [0.6, 0.4], B)
    assert all(isinstance(s, ShardedLoader) for s in mix.sources)
    for _ in range(40):
        assert (mix.next_batch()[0] == ref.next_batch()[0]).all()
        assert cached_bytes(folder) <= 3 * shard_bytes(root)


def tampered(root: Path) -> Path:
    """root/bad: ds with its first train shard changed and its second cut short."""
    bad = root / "bad"
    if not bad.exists():
        shutil.copytree(root / "ds", bad)
        files = json.loads((bad / "meta.json").read_text())["splits"]["train"]["files"]
        data = bytearray((bad / files[0]["name"]).read_bytes())
        data[10] ^= 1
        (bad / files[0]["name"]).write_bytes(bytes(data))
        (bad / files[1]["name"]).write_bytes((bad / files[1]["name"]).read_bytes()[:-4])
    return bad


def test_bad_input_is_one_line(served, tmp_path):
    root, url = served
    bad = tampered(root)
    meta = json.loads((bad / "meta.json").read_text())
    files = meta["splits"]["train"]["files"]
    folder = open_remote(f"{url}/bad", 1 << 30)
    tokens = open_remote_split(folder, "train")
    for s, what in ((0, "fails its sha256"), (1, "is truncated")):
        with pytest.raises(UserError, match=what) as e:
            tokens[int(tokens.starts[s]): int(tokens.starts[s]) + 5]
        assert "\n" not in str(e.value)
    assert not list((folder / "shards").iterdir())  # nothing kept
    with pytest.raises(UserError, match="no meta.json"):
        open_remote(f"{url}/nothing-here", 1 << 30)
    with pytest.raises(UserError, match="smaller than two shards"):
        open_remote(f"{url}/ds", shard_bytes(root))
    outside = root / "outside"
    shutil.copytree(root / "ds", outside, dirs_exist_ok=True)
    files[2]["name"] = "../x.bin"
    (outside / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="not a plain file name"):
        open_remote(f"{url}/outside", 1 << 30)
    deep = root / "deep"  # a hostile meta.json nested 100,000 deep: one line, not a RecursionError
    deep.mkdir(exist_ok=True)
    (deep / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="not a dataset's JSON"):
        open_remote(f"{url}/deep", 1 << 30, cache_dir=str(tmp_path / "deep-cache"))


def test_a_body_that_arrives_in_pieces_is_read_whole(served, tmp_path):
    """A slow network (a loaded host, CI's four podman hosts) delivers meta.json in pieces: it is
    read to its end, where one streamed read took the first piece and called the dataset corrupt."""
    root, _ = served
    slow = ByteCountingServer(root, pause_s=0.3)
    try:
        folder = open_remote(f"{slow.url}/ds", 1 << 30, cache_dir=str(tmp_path / "cache"))
        tokens = open_remote_split(folder, "train")
        assert np.array_equal(tokens[0:100], open_split(root / "ds", "train")[0:100])
    finally:
        slow.close()


def test_two_ranks_train_from_the_url_through_a_cache_smaller_than_the_data(served, tmp_path):
    """A 2-process torchrun run from the URL: the cache, watched while it runs, never holds more
    than its bound (smaller than the dataset), and the losses are those of the same run from
    the local copy of the folder (file://, the same shard-grouped order): the same blocks."""
    root, url = served
    bound = 3 * shard_bytes(root)
    assert bound < sum(p.stat().st_size for p in (root / "ds").glob("*.bin"))
    tampered(root)
    args = (f"--data.cache_bytes={bound}", "--train.batch_size=4", "--train.max_steps=6", "--train.eval_every=6",
            "--data.max_eval_samples=8", *TINY)
    done, peak = threading.Event(), [0]

    def watch():
        while not done.is_set():
            for folder in (tmp_path / "node-cache").glob("shards-*"):
                peak[0] = max(peak[0], cached_bytes(folder))
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = train(f"--data.path={url}/ds", *args, f"--train.output_dir={tmp_path / 'out'}", nproc=2)
    finally:
        done.set()
        watcher.join()
    assert "completed at step 6" in r.stdout
    assert shard_bytes(root) < peak[0] <= bound
    rows = [json.loads(line) for line in run_layout.metrics_file(tmp_path / "out").read_text().splitlines()]
    assert any("eval/loss" in row for row in rows)  # the validation split, read from the URL too
    [folder] = (tmp_path / "node-cache").glob("shards-*")
    assert 0 < cached_bytes(folder) <= bound
    train(f"--data.path=file://{root}/ds", *args, f"--train.output_dir={tmp_path / 'local'}", nproc=2)
    assert losses(tmp_path / "local") == losses(tmp_path / "out") and len(losses(tmp_path / "out")) == 6
    for where, what in (("nothing-here", "no meta.json"), ("bad", "sha256 check|truncated or corrupted")):
        bad = train(f"--data.path={url}/{where}", *TINY, f"--train.output_dir={tmp_path / where}", check=False)
        assert bad.returncode == 2 and re.search(what, bad.stderr), bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
