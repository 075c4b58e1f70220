"""A `gptrain data prepare` killed with SIGKILL at seeded points (mid-shard, around journal
writes, while finishing), and run again each time, finishes with the token files and meta.json
of a prepare that was never interrupted (issue 24)."""

import json
import random
import subprocess
import sys

from tests.helpers import write_corpus

# The real CLI in a subprocess, with small tasks and pieces and a journal after every task, so a
# small corpus makes hundreds of tasks (the defaults: 1 MiB, 2 s). It SIGKILLs itself at the point
# argv[1:3] names (a kill timed from outside can miss on a loaded machine; these cannot):
#   before-journal N / after-journal N: around its Nth journal write (shards written but not yet
#   journaled, or just journaled); done-journal: after the journal that says every task is
#   written; before-publish: with meta.json written; in-publish: journal removed, not yet renamed.
CLI = """
import os, signal, sys
from gptrain.data import prepare, prepare_journal, sources
prepare.TASK_CHARS, sources.PIECE_CHARS, prepare.JOURNAL_SECONDS = 1500, 400, 0.0
where, n = sys.argv[1], int(sys.argv[2])
J, writes = prepare_journal.Journal, [0]
write, publish = J._write, J.publish

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def _write(self, state):
    writes[0] += 1
    if where == "before-journal" and writes[0] == n:
        die()
    write(self, state)
    if (where == "after-journal" and writes[0] == n) or (where == "done-journal" and state.get("done")):
        die()

def _publish(self):
    if where == "before-publish":
        die()
    if where == "in-publish":
        self.path.unlink()
        die()
    publish(self)

J._write, J.publish = _write, _publish
from gptrain.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _prepare(corpus, out, num_proc: int, kill=("never", 0)) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLI, kill[0], str(kill[1]), "data", "prepare", str(corpus),
                             "--out", str(out), "--val-fraction", "0.2", "--shard-tokens", "4000",
                             "--num-proc", str(num_proc)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _journal(partial) -> dict:
    try:
        return json.loads((partial / "journal.json").read_text())
    except (OSError, ValueError):
        return {}


def _meta(d) -> dict:
    meta = json.loads((d / "meta.json").read_text())
    del meta["created"], meta["prepare_seconds"]
    return meta


def test_a_prepare_killed_at_random_moments_finishes_identical(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(30):
        write_corpus(corpus / f"doc{i:02d}.txt", n_chars=8000, seed=i)
    ref = tmp_path / "ref"
    r = _prepare(corpus, ref, 1)
    assert r.wait(timeout=300) == 0, r.stderr.read()
    total = json.loads((ref / "meta.json").read_text())
    assert len(total["splits"]["train"]["files"]) > 3 and len(total["splits"]["val"]["files"]) > 1

    rng = random.Random(24)
    out, partial = tmp_path / "out", tmp_path / "out.partial"
    kills = [("before-journal", rng.randint(2, 12))] + \
        [(rng.choice(["before-journal", "after-journal"]), rng.randint(1, 12)) for _ in range(4)] + \
        [("done-journal", 0), ("before-publish", 0), ("in-publish", 0)]
    for attempt, kill in enumerate(kills):
        proc = _prepare(corpus, out, 1 + attempt % 2, kill)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == -9, (kill, proc.returncode, stderr[-2000:])
        assert not out.exists() and partial.is_dir(), kill
        if attempt:  # every run after the first found the journal it left and went on from it
            assert "continuing an interrupted prepare:" in stdout or kill[0] == "before-publish" or \
                kill[0] == "in-publish", (kill, stdout)
    proc = _prepare(corpus, out, 2)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]

    assert not partial.exists()
    assert _meta(out) == _meta(ref)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref.iterdir())
    for f in ref.iterdir():
        if f.name != "meta.json":
            assert (out / f.name).read_bytes() == f.read_bytes(), f.name
