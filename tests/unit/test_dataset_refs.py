"""One rule for dataset references: a path has a '/' (or starts with . or ~); a bare word is a
pushed dataset's name first, and a local file or directory only when no dataset has that name."""

import pytest

from gptrain.data.prepare import prepare
from gptrain.data.store import push, resolve
from gptrain.errors import UserError
from tests.conftest import run_cli
from tests.helpers import write_corpus


@pytest.fixture
def pushed(tmp_path):
    prepared = tmp_path / "prepared"
    prepare([str(write_corpus(tmp_path / "c.txt", 5000))], str(prepared), tokenizer="char",
            val_fraction=0.1, quiet=True)
    return push("gpt2-tokenized-wikitext", str(prepared))


def test_a_pushed_name_is_not_shadowed_by_a_folder_beside_you(pushed, tmp_path, monkeypatch, capsys):
    """The hosted tutorial's layout: the downloaded folder sits where you type the name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2-tokenized-wikitext").mkdir()  # the tutorial's save_to_disk folder
    assert resolve("gpt2-tokenized-wikitext") == pushed
    assert "write ./gpt2-tokenized-wikitext" in capsys.readouterr().err
    assert resolve("./gpt2-tokenized-wikitext").resolve() == tmp_path / "gpt2-tokenized-wikitext"
    r = run_cli("data", "inspect", "gpt2-tokenized-wikitext", cwd=tmp_path)
    assert r.returncode == 0 and str(pushed) in r.stdout, r.stderr


def test_bare_words_fall_back_to_local_files_and_paths_never_mean_names(pushed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.jsonl").write_text('{"text": "hello"}\n')
    assert resolve("input.jsonl").resolve() == tmp_path / "input.jsonl"  # FMEngine's --data_path d.jsonl
    with pytest.raises(UserError, match="dataset path ./missing does not exist"):
        resolve("./missing")
    with pytest.raises(UserError, match="no dataset named 'missing' and no file or directory ./missing"):
        resolve("missing")
