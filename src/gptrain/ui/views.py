"""What the console shows beyond jobs/api.py (which it calls for every job, as the CLI does):
the curves of a job's metrics.jsonl (one cached reader per file, ui/metrics.py) and the
datasets list with a sample of each.
"""

from __future__ import annotations

import time

from gptrain.errors import UserError
from gptrain.jobs import api
from gptrain.ui import metrics


def metrics_of(name: str) -> metrics.Chart:
    return metrics.of(api.metrics_path(name))


WARM_AFTER_S = 2.0
WARM_BYTES = 1 << 20


def warm() -> None:
    """Read the long runs' metrics once, newest first, in the background shortly after the
    console starts (after its first pages), so the first look at a long run does not wait for
    its file to be parsed; files under 1 MiB take milliseconds when asked."""
    time.sleep(WARM_AFTER_S)
    for j in reversed(api.rows()):
        path = api.metrics_path(j["name"])
        if path.is_file() and path.stat().st_size >= WARM_BYTES:
            metrics_of(j["name"])


def curves(name: str, x: str, max_points: int | None) -> dict:
    mf = metrics_of(name)
    return {key: mf.curve(key, x, max_points=max_points) for key in metrics.CURVES}


def forget(name: str) -> None:
    """Remove job `name` (as `gptrain rm` does) and drop the console's reader of its metrics."""
    path = api.metrics_path(name)
    api.remove(name)
    metrics.forget(path)


# ---- datasets ---------------------------------------------------------------------------------

_samples: dict[tuple, str] = {}


def datasets() -> list[dict]:
    from gptrain.data import store as data_store

    return [{**{k: d.get(k) for k in ("name", "kind", "tokenizer", "tokens", "bytes", "created")},
             "sample": sample(d["name"], d["path"]) if d.get("kind") in (None, "prepared") else None}
            for d in data_store.list_all()]


def sample(name: str, path: str, tokens: int = 160) -> str:
    """The first tokens of the dataset's train split, decoded (cached per dataset directory)."""
    key = (name, path)
    if key not in _samples:
        try:
            from gptrain.data.formats import open_split, read_meta
            from gptrain.tokenizers import from_spec

            split = "train" if "train" in read_meta(path)["splits"] else "val"
            ids = open_split(path, split)[:tokens].tolist()
            _samples[key] = from_spec(read_meta(path)["tokenizer"]).decode(ids)
        except (UserError, OSError, KeyError, ValueError) as e:
            return f"(no sample: {e})"
    return _samples[key]
