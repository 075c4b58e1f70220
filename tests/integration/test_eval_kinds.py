"""`gptrain eval` takes every data kind training takes, read the same way (train/model_init.py's
resolve_data): a prepared dataset, a pushed one, a save_to_disk folder, a text file, a JSONL file,
an fsspec URL; and a dataset made with the model's tokenizer agrees with it however the tokenizer
was named (tokenizers compared by what they do)."""

import json
import shutil

import pytest

from tests.conftest import run_cli

LINE = "the king rode out at dawn with his men while the river ran high and the bells rang.\n"


@pytest.fixture(scope="module")
def kinds(tmp_path_factory, tiny_hf_llama):
    root = tmp_path_factory.mktemp("kinds")
    (root / "corpus.txt").write_text(LINE * 400)
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": LINE * 3}) + "\n" for _ in range(150)))
    return root


def ok_eval(model, data, env=None):
    r = run_cli("eval", model, "--dataset", data, "--json", "--max-blocks", "4", env=env)
    assert r.returncode == 0, (data, r.stderr)
    result = json.loads(r.stdout)
    assert result["tokens"] > 0 and result["loss"] > 0, result
    return result


@pytest.mark.parametrize("kind", ["text", "jsonl", "url", "prepared", "pushed", "save_to_disk"])
def test_eval_takes_what_train_takes(kind, kinds, tiny_hf_llama, tmp_path, isolated_home):
    text = kinds / "corpus.txt"
    if kind == "text":
        data = text
    elif kind == "jsonl":
        data = kinds / "docs.jsonl"
    elif kind == "url":
        data = f"file://{text}"
    elif kind == "prepared":  # made with a copy of the model's tokenizer: the same by content
        copy = tmp_path / "tok-copy"
        shutil.copytree(tiny_hf_llama, copy)
        data = tmp_path / "prep"
        r = run_cli("data", "prepare", text, "--tokenizer", copy, "--out", data, "--val-fraction", "0.2")
        assert r.returncode == 0, r.stderr
    elif kind == "pushed":
        folder = tmp_path / "raw"
        folder.mkdir()
        shutil.copy(text, folder / "corpus.txt")
        assert run_cli("data", "push", "rawtext", folder).returncode == 0
        data = "rawtext"
    else:
        from datasets import Dataset
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tiny_hf_llama)
        ids = tok([LINE * 3] * 40)["input_ids"]
        data = tmp_path / "saved"
        Dataset.from_dict({"input_ids": ids}).save_to_disk(str(data))
    ok_eval(tiny_hf_llama, data)
