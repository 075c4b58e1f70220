"""A text/JSONL/parquet file or URL trained on directly (`--data.path FILE`): prepared once into
$GPTRAIN_HOME/cache, keyed by its version stamp and tokenizer, with a validation split of its own."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gptrain.data.prepare import default_val_fraction, prepare
from gptrain.data.sources import version_stamp


def cached_prepare(src: str, tokenizer: str, text_field: str = "text") -> Path:
    """A prepared copy of one text/JSONL/parquet file or URL (http, s3, ... through fsspec)
    under $GPTRAIN_HOME/cache, made once per (version stamp, tokenizer, records' text field): when many processes
    (ranks, nodes, jobs) ask at once, one tokenizes and the others wait for it."""
    import sys

    from gptrain.atomic import build_once
    from gptrain.home import home

    version, size = version_stamp(src)
    val_fraction = default_val_fraction(size)  # some documents, or the last tokens
    field = "" if text_field == "text" else f":{text_field}"  # (the default keeps the keys made before it)
    key = hashlib.sha256(f"{version}:{tokenizer}:{val_fraction}{field}".encode()).hexdigest()[:16]

    def build(out: Path) -> None:
        print(f"tokenizing {src} ({tokenizer}) once into {out}", file=sys.stderr)
        prepare([src], str(out), tokenizer=tokenizer, val_fraction=val_fraction, quiet=True, text_field=text_field)
    return build_once(home() / "cache" / f"prepared-{key}", build)
