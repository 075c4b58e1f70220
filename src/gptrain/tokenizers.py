"""Tokenizers: GPT-2 BPE (tiktoken, offline), character-level, byte-level, or any HF tokenizer.

Each tokenizer describes itself with a small JSON-able `spec` that is stored in a dataset's
meta.json and a checkpoint, and `from_spec` rebuilds the same tokenizer from it.

The GPT-2 vocabulary ships inside this package (`assets/`: OpenAI's vocab.bpe, byte-identical,
and encoder.json), so `gpt2` works on a machine without network.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from gptrain.errors import UserError

ASSETS = Path(__file__).parent / "assets"
GPT2_EOT = "<|endoftext|>"
# The GPT-2 pre-tokenizer regex, as tiktoken writes it (same splits as the 2019 release).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class Tokenizer:
    """Common interface: name, vocab_size, eos_id (or None), encode, decode, spec."""

    name: str
    vocab_size: int
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_arrays(self, texts: list[str]) -> list:
        """encode_batch(texts) as numpy integer arrays (a tokenizer that can skips the Python lists)."""
        import numpy as np

        return [np.asarray(ids, dtype=np.int64) for ids in self.encode_batch(texts)]

    def spec(self) -> dict:
        return {"name": self.name}

    def save_hf(self, out_dir: Path) -> bool:
        """Write HF tokenizer files into out_dir if this tokenizer has an HF form."""
        return False


@lru_cache(maxsize=1)
def _gpt2_encoding():
    import tiktoken

    # encoder.json maps the "byte-level unicode" spelling of each token to its id; undo that
    # spelling to get the token's bytes (the same table GPT-2's encoder.py builds).
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    char_to_byte = {chr(b): b for b in printable}
    n = 0
    for b in range(256):
        if b not in printable:
            char_to_byte[chr(256 + n)] = b
            n += 1
    encoder = json.loads((ASSETS / "gpt2_vocab.json").read_text(encoding="utf-8"))
    ranks = {bytes(char_to_byte[c] for c in tok): i for tok, i in encoder.items() if tok != GPT2_EOT}
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={GPT2_EOT: encoder[GPT2_EOT]}, explicit_n_vocab=50257)


class GPT2Tokenizer(Tokenizer):
    name = "gpt2"
    vocab_size = 50257
    eos_id = 50256

    def __init__(self):
        self.enc = _gpt2_encoding()

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts):
        return self.enc.encode_ordinary_batch(texts, num_threads=1)

    def encode_arrays(self, texts):
        # encode_ordinary's ids (special-token text is plain text), straight into uint32 arrays
        return [self.enc.encode_to_numpy(t, allowed_special=set(), disallowed_special=()) for t in texts]

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids if int(i) < self.vocab_size])

    def save_hf(self, out_dir):
        import shutil

        shutil.copy(ASSETS / "gpt2_vocab.json", out_dir / "vocab.json")
        shutil.copy(ASSETS / "gpt2_merges.txt", out_dir / "merges.txt")
        (out_dir / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "add_prefix_space": False,
            "bos_token": GPT2_EOT, "eos_token": GPT2_EOT, "unk_token": GPT2_EOT}, indent=2))
        (out_dir / "special_tokens_map.json").write_text(json.dumps(
            {"bos_token": GPT2_EOT, "eos_token": GPT2_EOT, "unk_token": GPT2_EOT}, indent=2))
        return True


class CharTokenizer(Tokenizer):
    """nanoGPT/minGPT character tokenizer: one id per distinct character of the training text."""

    name = "char"

    def __init__(self, chars: str):
        if not chars:
            raise UserError("char tokenizer needs a non-empty vocabulary: the corpus has no text")
        self.chars = "".join(sorted(set(chars)))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text):
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise UserError(f"character {e.args[0]!r} is not in this char tokenizer's vocabulary "
                            "(it was built from the training text)") from None

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids if int(i) < self.vocab_size)

    def spec(self):
        return {"name": "char", "chars": self.chars}

    def save_hf(self, out_dir):
        """One token per character, ids as here: AutoTokenizer loads it and round-trips."""
        return _save_fast(out_dir, {c: i for i, c in enumerate(self.chars)}, self.chars[0], byte_level=False)


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes 0..255, plus 256 as end-of-text."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def save_hf(self, out_dir):
        """One token per UTF-8 byte (GPT-2's byte-to-character spelling), 256 end-of-text."""
        vocab = {c: b for b, c in _byte_spelling().items()}
        return _save_fast(out_dir, {**vocab, GPT2_EOT: self.eos_id}, GPT2_EOT, byte_level=True, eos=GPT2_EOT)


def _byte_spelling() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (what HF's ByteLevel pre-tokenizer maps bytes to)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = (b for b in range(256) if b not in keep)
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


def _save_fast(out_dir, vocab: dict, unk: str, byte_level: bool, eos: str | None = None) -> bool:
    """A Hugging Face fast tokenizer of one token per character (per byte when `byte_level`),
    written into out_dir for AutoTokenizer."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as FastTokenizer
    from transformers import PreTrainedTokenizerFast

    tok = FastTokenizer(models.WordLevel(vocab, unk_token=unk))
    each = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False), each]) if byte_level else each
    tok.decoder = decoders.ByteLevel() if byte_level else decoders.Fuse()
    if eos:
        tok.add_special_tokens([AddedToken(eos, special=True)])
    PreTrainedTokenizerFast(tokenizer_object=tok, **({"eos_token": eos} if eos else {})).save_pretrained(out_dir)
    return True


class HFTokenizer(Tokenizer):
    """Any tokenizer directory that transformers' AutoTokenizer can load with the classes it
    ships: a folder's own Python code (an `auto_map` in its config) is never run, nor asked about
    (trust_remote_code=False, so transformers neither imports it nor prompts)."""

    def __init__(self, path: str):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UserError("HF tokenizers need transformers: pip install 'gptrain[hf]'") from None
        self.path = str(Path(path).resolve()) if Path(path).exists() else path
        try:
            self.tok = AutoTokenizer.from_pretrained(self.path, trust_remote_code=False)
        except (OSError, ValueError) as e:
            if "custom code" in str(e) or "trust_remote_code" in str(e):
                raise UserError(f"the tokenizer in {path} needs its own Python code (an auto_map in "
                                "its config), which gptrain never runs; use a tokenizer whose class "
                                "transformers ships (tokenizer.json or a known tokenizer_class)") from None
            raise UserError(f"cannot load a tokenizer from {path}: {str(e).splitlines()[0]}") from None
        self.name = f"hf:{self.path}"
        self.vocab_size = len(self.tok)
        if self.vocab_size < 2:
            raise UserError(f"the tokenizer in {path} has an empty vocabulary; check its files")
        self.eos_id = self.tok.eos_token_id

    def encode(self, text):
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def encode_batch(self, texts):
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def spec(self):
        return {"name": "hf", "path": self.path}

    def save_hf(self, out_dir):
        self.tok.save_pretrained(out_dir)
        return True


PROBES = ("Hello world", "  two  spaces\nand\ttabs", "naïve café, 東京 😀", "12345 !? (x) [y] {z}")


def same(tok: Tokenizer, spec: dict) -> bool:
    """Whether `tok` and the tokenizer `spec` describes give the same ids: by what they do (the
    vocabulary, the ids of probe texts), not by where they were loaded from, so a checkpoint's
    tokenizer and a dataset made with its copy (or GPT-2's own files) agree."""
    if tok.spec() == spec:
        return True
    try:
        other = from_spec(spec)
    except UserError:
        return False
    if tok.vocab_size != other.vocab_size:
        return False
    if isinstance(tok, HFTokenizer) and isinstance(other, HFTokenizer) and tok.tok.get_vocab() != other.tok.get_vocab():
        return False
    try:
        return all(tok.encode(t) == other.encode(t) for t in PROBES)
    except UserError:  # a char vocabulary without the probe's characters: compare the vocabularies
        return isinstance(other, CharTokenizer) and getattr(tok, "chars", None) == other.chars


def name_of(tok: Tokenizer) -> str:
    """What `by_name` and `data prepare --tokenizer` take to make `tok` again (char: the corpus's)."""
    spec = tok.spec()
    return spec["path"] if spec["name"] == "hf" else spec["name"]


MAX_CHARS = 1 << 20  # a char vocabulary larger than this is not one a corpus gave


def check_spec(spec, where: str = "the tokenizer spec") -> dict:
    """The one check of a stored tokenizer spec (a dataset's meta.json, a checkpoint), on every
    read and before a dataset is pushed: a known name with the fields that name needs, of the
    right types. One UserError naming `where` otherwise, never a TypeError deep inside."""
    def bad(what):
        raise UserError(f"{where} {what}; it is corrupt or was not written by gptrain: "
                        "prepare the dataset (or save the model) again")

    if not isinstance(spec, dict) or spec.get("name") not in ("gpt2", "byte", "char", "hf"):
        bad("names no known tokenizer (gpt2, byte, char or hf)")
    chars = spec.get("chars")
    if spec["name"] == "char" and not (isinstance(chars, str) and 0 < len(chars) <= MAX_CHARS):
        bad(f"has a char tokenizer whose chars are not a string of 1 to {MAX_CHARS} characters")
    path = spec.get("path")
    if spec["name"] == "hf" and not (isinstance(path, str) and path and "\0" not in path):
        bad("has a Hugging Face tokenizer without a path")
    return spec


def from_spec(spec: dict) -> Tokenizer:
    """Rebuild a tokenizer from the spec stored in meta.json or a checkpoint (checked first)."""
    name = check_spec(spec)["name"]
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == "byte":
        return ByteTokenizer()
    if name == "char":
        return CharTokenizer(spec["chars"])
    return HFTokenizer(spec["path"])


def by_name(name: str, corpus_chars: str | None = None) -> Tokenizer:
    """The tokenizer a user names: gpt2, byte, char (needs the corpus' characters), or a path."""
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == "byte":
        return ByteTokenizer()
    if name == "char":
        return CharTokenizer(corpus_chars or "")
    if Path(name).is_dir():
        return HFTokenizer(name)
    raise UserError(f"unknown tokenizer {name!r}: use gpt2, char, byte, or a Hugging Face "
                    "tokenizer directory")
