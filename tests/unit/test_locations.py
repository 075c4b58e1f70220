"""One test of "is this remote" (gptrain/locations.py, and data/remote_shards.is_remote for a
folder standing for a URL): the behaviour, and a guard that no other module asks it its own way
(a `"://"` test), shown failing on a violation planted in a copy of a real source."""

import re
from pathlib import Path

from gptrain.data.remote_shards import MARK, is_prepared_url, is_remote
from gptrain.locations import is_url

SRC = Path(__file__).resolve().parents[2] / "src" / "gptrain"
OWNER = SRC / "locations.py"
# a "://" test written inline: `"://" in x`, `"://" not in x`, `x.find("://")` (a check of one
# scheme's form, as train/remote.py's file:// one, is not the question)
ASKED = re.compile(r"""["']://["']\s+(not\s+)?in\b|\.(find|index)\(\s*["']://["']""")


def askers(files: dict[str, str]) -> list[str]:
    """The files (other than locations.py) that test for a URL themselves."""
    return sorted(name for name, text in files.items() if name != str(OWNER) and ASKED.search(text))


def sources() -> dict[str, str]:
    return {str(p): p.read_text() for p in SRC.rglob("*.py")}


def test_is_url_and_is_remote(tmp_path):
    assert is_url("s3://b/k") and is_url("https://h/x") and is_url(b"gs://b") and is_url("file:///tmp/x")
    assert not is_url("/tmp/x") and not is_url("name") and not is_url(tmp_path) and not is_url(None)
    assert not is_url(Path("s3:/b"))  # a path object is local, whatever it is named
    assert is_prepared_url("s3://b/ds/") and not is_prepared_url("s3://b/a.jsonl") and not is_prepared_url("/x")
    folder = tmp_path / "stands-for-a-url"
    folder.mkdir()
    assert not is_remote(folder)
    (folder / MARK).write_text("{}")
    assert is_remote(folder) and is_remote("s3://b/k")


def test_only_locations_asks_whether_a_location_is_remote():
    assert askers(sources()) == []


def test_the_guard_finds_a_planted_asker():
    files = sources()
    victim = str(SRC / "data" / "sources.py")
    for planted in ('    if "://" in s:\n', "    ok = '://' not in s\n", '    at = s.find("://")\n'):
        assert askers({**files, victim: files[victim] + planted}) == [victim], planted
