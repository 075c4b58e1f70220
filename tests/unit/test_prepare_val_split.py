"""One text file gets a validation split to evaluate on, the same from `data prepare` and from
--data.path FILE (issue 39: prepare gave 148 val tokens where the job's own prepare gave 65,533)."""

import json

from gptrain.data.prepare import default_val_fraction, prepare
from gptrain.data.prepared_cache import cached_prepare
from tests.helpers import write_corpus


def test_one_text_file_gets_the_same_useful_validation_split_both_ways(tmp_path):
    corpus = write_corpus(tmp_path / "input.txt", 1_000_000)
    meta = prepare([str(corpus)], str(tmp_path / "ds"), tokenizer="char", quiet=True)
    val, total = meta["splits"]["val"]["tokens"], sum(s["tokens"] for s in meta["splits"].values())
    size = corpus.stat().st_size
    assert meta["val_fraction"] == default_val_fraction(size) == round(64 * 1024 / size, 4)  # ~6.5%
    assert abs(val - total * meta["val_fraction"]) <= 2  # its last tokens, about 64 KiB of text
    direct = json.loads((cached_prepare(str(corpus), "char") / "meta.json").read_text())
    assert direct["splits"]["val"]["tokens"] == val


def test_the_fraction_stays_between_one_and_ten_percent():
    assert default_val_fraction(10_000) == 0.1 and default_val_fraction(10 << 30) == 0.01
    assert default_val_fraction(None) == 0.01
