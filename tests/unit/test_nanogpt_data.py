"""nanoGPT's data folders (train.bin, val.bin of uint16 ids, meta.pkl for character-level data, no
meta.json) as a data kind: `data push` stores one as a prepared dataset with its tokenizer, and
train and eval read it by the same reader (data/nanogpt_dir.py); a save_to_disk folder of token ids
has its tokenizer named at push, or push asks for it."""

import json
import os
import pickle

import numpy as np
import pytest

from tests.conftest import run_cli
from tests.helpers import TINY, make_dataset, save_as_hf_blocks, shakespeare_char, train, write_corpus


def shakespeare_gpt2(folder, text):
    """What nanoGPT's data/shakespeare/prepare.py writes: GPT-2 ids (tiktoken's encode_ordinary,
    here gptrain's offline copy of the same encoding), no meta.pkl."""
    from gptrain.tokenizers import GPT2Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    enc, n = GPT2Tokenizer(), len(text)
    np.array(enc.encode(text[:int(n * 0.9)]), dtype=np.uint16).tofile(folder / "train.bin")
    np.array(enc.encode(text[int(n * 0.9):]), dtype=np.uint16).tofile(folder / "val.bin")
    return folder


def ok(*args):
    r = run_cli(*args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def refused(r, *needles):
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(n in r.stderr for n in needles), r.stderr


def test_a_char_nanogpt_folder_is_pushed_trained_on_and_evaluated(tmp_path, isolated_home):
    text = write_corpus(tmp_path / "corpus.txt", n_chars=6000).read_text()
    folder = shakespeare_char(tmp_path / "shakespeare_char", text)
    r = run_cli("data", "push", "chars", folder)
    assert r.returncode == 0 and "(prepared," in r.stdout, r.stderr
    assert "kept meta.pkl, train.bin, val.bin; left out input.txt, prepare.py" in r.stderr, r.stderr
    info = json.loads(ok("data", "inspect", "chars", "--verify", "--json"))
    assert info["meta"]["tokenizer"] == {"name": "char", "chars": "".join(sorted(set(text)))}
    assert info["sample"] == text[:64]  # the ids decode to the text they came from
    stored = isolated_home / "datasets" / "chars"
    assert sorted(p.name for p in stored.iterdir()) == ["meta.json", "meta.pkl", "train.bin", "val.bin"]
    assert (stored / "meta.pkl").read_bytes() == (folder / "meta.pkl").read_bytes()  # for nanoGPT's sample.py
    out = tmp_path / "run"
    train("--data.path", "chars", "--train.output_dir", out, *TINY, "--train.max_steps=2",
          "--train.batch_size=2", "--checkpoint.every=2")
    # eval of the unpushed folder: the same reading, the same char tokenizer as the model's
    r = run_cli("eval", out, "--dataset", folder, "--json", "--max-blocks", "4")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] > 0


def test_a_gpt2_nanogpt_folder_is_read_as_gpt2_ids(tmp_path, isolated_home):
    from gptrain.train.model_init import resolve_data

    text = write_corpus(tmp_path / "corpus.txt", n_chars=3000).read_text()
    folder = shakespeare_gpt2(tmp_path / "shakespeare", text)
    ok("data", "push", "words", folder)
    listing = ok("data", "list").splitlines()[1].split()
    assert listing[:4] == ["words", "prepared", "available", "gpt2"], listing
    from gptrain.data.formats import read_meta

    for ref in ("words", str(folder)):  # pushed, and read from the folder (cached once)
        meta = read_meta(resolve_data(ref))
        assert meta["tokenizer"] == {"name": "gpt2"} and meta["vocab_size"] == 50257
    assert resolve_data(str(folder)) == resolve_data(str(folder))
    sample = json.loads(ok("data", "inspect", folder, "--json"))["sample"]  # inspect reads it the same way
    assert len(sample) > 64 and text.startswith(sample)


def test_a_meta_pkl_naming_code_or_ids_outside_it_are_refused_at_push(tmp_path, isolated_home):
    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    folder = shakespeare_char(tmp_path / "evil", "abcabcabc" * 50)
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 3, "itos": Boom()}, f)
    refused(run_cli("data", "push", "evil", folder, "--tokenizer", "gpt2"), "meta.pkl", "drop --tokenizer")
    refused(run_cli("data", "push", "evil", folder), "meta.pkl", "only plain data")
    assert not (tmp_path / "ran").exists()
    small = shakespeare_char(tmp_path / "small", "abcabcabc" * 50)
    np.array([0, 1, 7], dtype=np.uint16).tofile(small / "val.bin")  # id 7 of a 3-character vocabulary
    refused(run_cli("data", "push", "small", small), "val.bin", "token id 7")
    (small / "val.bin").write_bytes(b"\0\0\0")
    refused(run_cli("data", "push", "small", small), "odd number of bytes")
    assert not (isolated_home / "datasets").exists() or not list((isolated_home / "datasets").iterdir())


def test_a_save_to_disk_folder_of_ids_has_its_tokenizer_named_at_push_or_by_the_job(tmp_path, isolated_home,
                                                                                       tiny_hf_gpt2):
    from gptrain.data.formats import read_meta
    from gptrain.errors import UserError
    from gptrain.train.model_init import resolve_data

    saved = save_as_hf_blocks(make_dataset(tmp_path, tokenizer="byte"), tmp_path / "tokenized")
    # the hosted tutorial's line as typed: its ids are kept; a job names their tokenizer (issue 38)
    assert "(save_to_disk," in ok("dataset", "push", "plain", "--file", saved)
    with pytest.raises(UserError, match="holds token ids and no tokenizer was named for them: give --model_name_or_path"):
        resolve_data("plain")  # not assumed GPT-2 ids
    assert read_meta(resolve_data("plain", tokenizer="byte"))["vocab_size"] == 257
    assert read_meta(resolve_data("plain", init_from=str(tiny_hf_gpt2)))["vocab_size"] == 50257  # the model's
    assert "(save_to_disk," in ok("dataset", "push", "saved", "--file", saved, "--tokenizer", "byte")
    assert [line.split()[:4] for line in ok("data", "list").splitlines()[1:]] == [
        ["plain", "save_to_disk", "available", "-"], ["saved", "save_to_disk", "available", "byte"]]
    meta = read_meta(resolve_data("saved", tokenizer="gpt2"))  # the recorded one, whatever else is named
    assert meta["tokenizer"] == {"name": "byte"} and meta["vocab_size"] == 257


def test_a_tokenizer_saved_in_the_save_to_disk_folder_is_its_own(tmp_path, isolated_home):
    from gptrain.data.formats import read_meta
    from gptrain.tokenizers import ByteTokenizer
    from gptrain.train.model_init import resolve_data

    saved = save_as_hf_blocks(make_dataset(tmp_path, tokenizer="byte"), tmp_path / "tokenized")
    ByteTokenizer().save_hf(saved)  # tokenizer.save_pretrained(out) beside ds.save_to_disk(out)
    ok("data", "push", "own", saved)
    stored = isolated_home / "datasets" / "own"
    meta = read_meta(resolve_data("own"))
    assert meta["tokenizer"] == {"name": "hf", "path": str(stored.resolve())} and meta["vocab_size"] == 257
