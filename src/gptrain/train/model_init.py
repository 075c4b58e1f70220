"""What a run starts from: its dataset directory and its plain (unparallelized) model."""

from __future__ import annotations

from pathlib import Path

import torch

from gptrain.config import Config
from gptrain.data.formats import read_meta
from gptrain.errors import UserError, refuse_credentials
from gptrain.locations import is_url


def resolve_data(path: str, tokenizer: str = "", init_from: str = "", cache_bytes: int = 8 << 30,
                 fetch_timeout: float = 60.0, cache_dir: str = "", text_field: str = "text") -> Path:
    """A prepared dataset dir from a path, a dataset name, a HF save_to_disk directory, a
    nanoGPT folder, a prepared folder's URL (read through a local cache of `cache_bytes`:
    data/remote_shards.py), or a text/JSONL/parquet file, URL or pushed folder of such files (tokenized
    once into the cache with `tokenizer`, or init_from's; records' text in `text_field`). The tokenizer of ids is the one the
    data names (meta.json, meta.pkl, the one recorded at push); `tokenizer` only where it names none."""
    from gptrain.data import nanogpt_dir
    from gptrain.data.hf_import import cached_import, is_hf_saved
    from gptrain.data.store import MANIFEST, recorded_tokenizer, resolve

    if not path:
        raise UserError("no training data: pass --data.path DIR|NAME|FILE (or --tokenized_dataset_load_dir)")
    refuse_credentials(path, "dataset")
    from gptrain.data.object_store import url_of
    from gptrain.data.store import is_path

    if not is_url(path) and not is_path(path) and (remote := url_of(path)):
        path = remote  # a pushed dataset kept in object storage: streamed from its URL
    if not is_url(path):
        p = resolve(path)  # a path, or a pushed dataset's name (data/store.py's one rule)
        if not p.is_file():
            if is_hf_saved(p) and not (p / "meta.json").is_file():
                return cached_import(p, recorded_tokenizer(p) or tokenizer or _ids_tokenizer(p, path, init_from))
            if nanogpt_dir.is_nanogpt_dir(p):  # read as `data push` stores one: one reader
                return nanogpt_dir.cached(p, tokenizer if tokenizer != "char" else "")
            if not (p / MANIFEST).is_file():  # a pushed dataset of any files: its text prepared once
                read_meta(p)
                return p
        path = str(p)
    else:
        from gptrain.data.remote_shards import is_prepared_url, open_remote

        if is_prepared_url(path):
            return open_remote(path, cache_bytes, fetch_timeout, cache_dir)
    from gptrain.data.prepared_cache import cached_prepare
    from gptrain.data.remote_read import reading_with

    with reading_with(fetch_timeout):  # a text URL waits data.fetch_timeout for a byte, as shards do
        return cached_prepare(path, tokenizer or _model_tokenizer(init_from), text_field)


def resolve_sources(cfg: Config) -> list[tuple[str, float, Path]]:
    """(name, weight, prepared dir) of each training dataset: data.path's alone, weight 1, or
    each of data.mix's (data/mixture.py), all of one tokenizer."""
    d = cfg.data
    if not d.mix:
        return [(d.path, 1.0, resolve_data(d.path, d.tokenizer, cfg.model.init_from, d.cache_bytes, d.fetch_timeout, d.cache_dir,
                                      d.text_field))]
    from gptrain.data.mixture import check_tokenizers, parse_mix

    sources = [(name, w, resolve_data(name, d.tokenizer, cfg.model.init_from, d.cache_bytes, d.fetch_timeout, d.cache_dir,
                                           d.text_field))
               for name, w in parse_mix(d.mix)]
    check_tokenizers([(name, read_meta(p)) for name, _, p in sources])
    return sources


def _ids_tokenizer(folder: Path, name: str, init_from: str) -> str:
    """The tokenizer of a save_to_disk folder that recorded none: the model's a run starts from;
    token ids with neither are refused (their vocabulary is not assumed), text is GPT-2's."""
    from gptrain.data.store import has_token_ids

    if not init_from and has_token_ids(folder):
        raise UserError(f"dataset {name} holds token ids and no tokenizer was named for them: give "
                        "--model_name_or_path (its tokenizer) or --data.tokenizer gpt2|byte|TOKENIZER_DIR")
    return _model_tokenizer(init_from)


def _model_tokenizer(init_from: str) -> str:
    """The tokenizer of the weights a run starts from: a HF directory's own, else gpt2."""
    from gptrain.weights.kinds import source_kind

    kind = source_kind(init_from) if init_from else None
    if kind == "nanogpt":
        return "gpt2"  # a nanoGPT ckpt.pt: GPT-2's vocabulary (models/nanogpt.py)
    if init_from:
        from gptrain.models.hub import resolve

        if kind == "gptrain" or (kind is None and Path(init_from).expanduser().is_dir()):
            raise UserError("data.path is a raw file and model.init_from a gptrain checkpoint: "
                            "set --data.tokenizer to the checkpoint's tokenizer (e.g. gpt2)")
        model_dir = resolve(init_from)
        if any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
            return str(model_dir)
    return "gpt2"


def build_model(cfg: Config, vocab_size: int, compute_dtype: torch.dtype | None = None):
    """The plain model on CPU: from scratch, or the weights model.init_from names (a LoRA
    checkpoint's merged into its base: models/load.load_base), with LoRA adapters when [lora]
    r is set. A LoRA model from weights carries `lora_base`, the reference its adapter-only
    checkpoints keep to those weights (models/lora.base_reference), and its frozen base is held
    in the run's `compute_dtype` (models/lora.hold_base_in: the same numbers under autocast)."""
    from gptrain.models.registry import build, build_model_config

    mc = cfg.model
    if mc.attn_implementation == "flash_attention_2":
        from gptrain.models.flash import check_available

        check_available()
    if not mc.init_from:
        torch.manual_seed(cfg.train.seed)  # identical init on every rank
        model = build(build_model_config(mc, vocab_size))
    else:
        from gptrain.models.load import load_base

        # dropout unset: 0, or the weights' own under the HF Trainer's flags (what its Trainer trains with)
        dropout = mc.dropout if mc.dropout is not None else None if cfg.train.dialect == "hf" else 0.0
        model = load_base(mc.init_from, mc.block_size, pad_vocab_multiple=mc.pad_vocab_multiple,
                          attn_implementation=mc.attn_implementation,
                          **({} if dropout is None else {"dropout": dropout}))
        if vocab_size > model.config.vocab_size:
            raise UserError(f"the dataset's vocabulary ({vocab_size}) is larger than the model's "
                            f"({model.config.vocab_size}); prepare the data with the model's tokenizer")
    if cfg.lora.r:
        from gptrain.models.lora import add_lora, base_reference, hold_base_in

        base = base_reference(model, mc.init_from) if mc.init_from else None
        torch.manual_seed(cfg.train.seed)  # the same adapters on every rank
        add_lora(model, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules,
                 "" if cfg.lora.quantize_base == "none" else cfg.lora.quantize_base)
        model.lora_base = base
        if base and compute_dtype and not model.config.lora_quant:
            hold_base_in(model, compute_dtype)
    return model
