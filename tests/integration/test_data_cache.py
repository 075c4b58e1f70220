"""Many processes filling the same data cache at once (the ranks of a job, the nodes of a job on
one shared disk, two jobs): one builds, the others wait and read the same directory."""

import json
import subprocess
import sys

from tests.helpers import env, write_corpus

N = 4
CHILD = """
import json, sys
from pathlib import Path
kind, src = sys.argv[1], sys.argv[2]
if kind == "text":
    from gptrain.data.prepared_cache import cached_prepare
    out = cached_prepare(src, "char")
else:
    from gptrain.data.hf_import import cached_import
    out = cached_import(Path(src))
meta = json.loads((out / "meta.json").read_text())
print(json.dumps({"out": str(out), "train": meta["splits"]["train"]["tokens"]}))
"""


def _all_at_once(kind: str, src) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, kind, str(src)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env()) for _ in range(N)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_text_file_is_tokenized_once_for_processes_that_start_together(tmp_path, isolated_home):
    results = _all_at_once("text", write_corpus(tmp_path / "input.txt", 200_000))
    assert len({r["out"] for r in results}) == 1 and len({r["train"] for r in results}) == 1
    leftovers = [p.name for p in (isolated_home / "cache").iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_save_to_disk_dataset_is_imported_once_on_a_cold_cache(tmp_path, isolated_home):
    import datasets

    blocks = [[i % 50000 for i in range(j, j + 64)] for j in range(0, 64 * 3000, 64)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": blocks[:2900]}),
                          "validation": datasets.Dataset.from_dict({"input_ids": blocks[2900:]})}
                         ).save_to_disk(tmp_path / "wikitext-tokenized")
    results = _all_at_once("hf", tmp_path / "wikitext-tokenized")
    assert len({r["out"] for r in results}) == 1 and {r["train"] for r in results} == {2900 * 64}

