import pytest

from gptrain import tokenizers
from gptrain.errors import UserError


def test_gpt2_canonical_ids_offline():
    tok = tokenizers.GPT2Tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.eos_id == 50256 and tok.vocab_size == 50257
    text = "It's 2026:  naïve café — ümlauts, emoji 🤖, tabs\tand\n\nnewlines."
    assert tok.decode(tok.encode(text)) == text


def test_gpt2_matches_transformers_tokenizer(tmp_path):
    from transformers import GPT2TokenizerFast

    tok = tokenizers.GPT2Tokenizer()
    tok.save_hf(tmp_path)
    hf = GPT2TokenizerFast.from_pretrained(tmp_path)
    text = "The quick brown fox's 123 jumps   over\n\n the lazy dog!! ünïcödé"
    assert tok.encode(text) == hf(text)["input_ids"]


def test_char_tokenizer_roundtrip_and_spec():
    tok = tokenizers.CharTokenizer("hello world")
    assert tok.vocab_size == len(set("hello world"))
    assert tok.decode(tok.encode("hello")) == "hello"
    again = tokenizers.from_spec(tok.spec())
    assert again.encode("world") == tok.encode("world")
    with pytest.raises(UserError, match="not in this char tokenizer"):
        tok.encode("xyz")


def test_byte_tokenizer():
    tok = tokenizers.ByteTokenizer()
    assert tok.encode("aé") == [97, 195, 169]
    assert tok.decode([97, 195, 169, 256]) == "aé"


def test_hf_tokenizer_dir(tmp_path):
    tokenizers.GPT2Tokenizer().save_hf(tmp_path)
    tok = tokenizers.by_name(str(tmp_path))
    assert tok.encode("Hello world") == [15496, 995] and tok.eos_id == 50256


def test_unknown_tokenizer():
    with pytest.raises(UserError, match="unknown tokenizer"):
        tokenizers.by_name("sentencepiece-9000")


def test_gpt2_encode_arrays_are_encode_batch_ids():
    """prepare's workers take numpy arrays (encode_arrays): the same ids as encode_batch, special
    token text read as plain text (encode_ordinary)."""
    from gptrain.tokenizers import CharTokenizer, GPT2Tokenizer

    tok = GPT2Tokenizer()
    texts = ["Hello world\n\n  indented", "a <|endoftext|> b", "", "ünïcödé 123 ’quotes’"]
    arrays = tok.encode_arrays(texts)
    assert [a.tolist() for a in arrays] == tok.encode_batch(texts)
    assert 50256 not in arrays[1].tolist()
    char = CharTokenizer("ab")
    assert [a.tolist() for a in char.encode_arrays(["abba", ""])] == char.encode_batch(["abba", ""])
