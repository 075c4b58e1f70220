"""What a user does with training, for both faces: run the trainer in this process (`gptrain
train`, and every worker of a job), and evaluate a model on a dataset (`gptrain eval`). Model
names are resolved before (jobs/api.model_source): this layer sees paths and hub ids only.
"""

from __future__ import annotations

from gptrain import stop
from gptrain.stop import install as install_stop  # noqa: F401 (`gptrain train` calls it first)

__all__ = [  # what the faces (cli/, ui/) may use: tests/unit/test_api_surface.py
    "evaluate", "help_text", "install_stop", "train",
]


def train(argv: list[str], resolve=None) -> int:
    """Train as `gptrain train ARGV` says; the exit code: 0 completed, 128 + the signal when a stop
    (`gptrain stop`, a preemption: 143; Ctrl-C: 130) ended it before its last step, after its checkpoint.
    `resolve(ref, resume=False) -> path` turns model.init_from and checkpoint.resume_from names
    into paths (a job's checkpoint to resume from is its newest, never its kept best)."""
    from gptrain.config_options import parse_train_args

    cfg = parse_train_args(argv)  # a mistyped flag or a bad value is answered before torch loads
    if resolve is not None:
        if cfg.model.init_from:
            cfg.model.init_from = resolve(cfg.model.init_from)
        if cfg.checkpoint.resume_from not in ("auto", "none"):
            cfg.checkpoint.resume_from = resolve(cfg.checkpoint.resume_from, resume=True)
    from gptrain.train.trainer import train as run

    result = run(cfg)
    return stop.exit_code() if result["status"] == "stopped" else 0


def help_text() -> str:
    """Every config field with its default and doc, then the alias table (`gptrain train --help`)."""
    import dataclasses
    import typing

    from gptrain import config, config_check
    from gptrain.config_aliases import ALIASES, DEEPSPEED_FLAGS

    out = ["usage: gptrain train [CONFIG.toml | NANOGPT_CONFIG.py] [--section.key=value ...] "
           "[HF Trainer flags | nanoGPT --key=value]",
           "", "Train a GPT model in the foreground (alone or under torchrun). A nanoGPT config file "
           "(config/train_shakespeare_char.py) is read as its NAME = value lines, never run; a command in "
           "the HF Trainer's flags or nanoGPT's keys takes that tool's defaults for what it leaves out "
           "(train.dialect).", ""]
    for section, cls in config.SECTIONS.items():
        out.append(f"[{section}]")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            tp = config.base_type(hints[f.name])[0]
            kind = getattr(tp, "__name__", str(tp))
            choices = f.metadata.get("choices")
            kind = "|".join(choices) if choices else kind
            if any(f.metadata[k] is not None for k in ("ge", "gt", "lt", "le")):
                kind += f" {config_check.bounds(f.metadata)}"
            out.append(f"  --{section}.{f.name} ({kind}, default {default!r})")
            out.append(f"      {f.metadata['doc']}")
        out.append("")
    out.append("HF Trainer, FMEngine/DeepSpeed and nanoGPT flags accepted as aliases:")
    for name, (key, _) in ALIASES.items():
        out.append(f"  --{name:<30} -> {key}")
    for name in DEEPSPEED_FLAGS:
        out.append(f"  --{name + ' FILE':<30} -> batch sizes, precision, optimizer, clipping, lr schedule "
                   "of a DeepSpeed JSON")
    return "\n".join(out)


def evaluate(source: str, dataset: str, split: str | None = None, batch_size: int = 8,
             max_blocks: int | None = None, device: str = "auto",
             fetch_timeout: float | None = None) -> tuple[dict, list[str]]:
    """Loss, perplexity, accuracy and tokens of the model at `source` on `dataset`'s `split` (val
    by default: train when the data has only that), read as training reads it; and notes. A URL
    that sends nothing for `fetch_timeout` seconds (default data.fetch_timeout's) is an error."""
    from gptrain.data.formats import open_examples, read_meta
    from gptrain.data.loader import eval_batches
    from gptrain.data.remote_read import DEFAULT_FETCH_TIMEOUT_S, checked_timeout
    from gptrain.data.remote_shards import open_tokens
    from gptrain.errors import UserError
    from gptrain.models.load import load_model, pick_device
    from gptrain.tokenizers import name_of, same
    from gptrain.train.evaluate import evaluate as run
    from gptrain.train.model_init import resolve_data

    if not 1 <= batch_size <= 1 << 20:
        raise UserError(f"--batch-size must be 1 to {1 << 20}, got {batch_size}")
    if max_blocks is not None and not 1 <= max_blocks <= 1 << 40:
        raise UserError(f"--max-blocks must be at least 1, got {max_blocks}")
    fetch_timeout = checked_timeout(fetch_timeout) or DEFAULT_FETCH_TIMEOUT_S
    device = pick_device(device)
    model, tokenizer = load_model(source, device=device)
    # what training takes, read the same way: a prepared or pushed dataset, a save_to_disk
    # folder, a text/JSONL/parquet file or URL (tokenized once, with the model's own tokenizer)
    data_dir = resolve_data(dataset, tokenizer=name_of(tokenizer) if tokenizer is not None else "",
                            fetch_timeout=fetch_timeout)
    meta = read_meta(data_dir)
    if tokenizer is not None and not same(tokenizer, meta["tokenizer"]):
        raise UserError(f"dataset {dataset} was tokenized with {meta['tokenizer_name']}, "
                        f"not with the model's tokenizer ({tokenizer.name})")
    notes, chosen = [], split or "val"
    if chosen not in meta["splits"] and split is None and "train" in meta["splits"]:
        chosen = "train"  # a save_to_disk folder or a pushed file set with one split only
        notes.append(f"{dataset} has no val split; evaluating on its train split")
    tokens = open_tokens(data_dir, chosen)
    batches = eval_batches(tokens, model.config.block_size, batch_size, max_blocks=max_blocks,
                           vocab_size=meta["vocab_size"], source=f"dataset {data_dir}",
                           examples=open_examples(data_dir, chosen, len(tokens)))
    result = run(lambda x, y: model(x), batches, device)
    if not result:
        raise UserError(f"the {chosen} split has fewer than {model.config.block_size + 1} tokens")
    return result, notes
