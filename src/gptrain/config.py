"""Typed training configuration: its sections and fields, their values checked and converted,
TOML read and written. The command line's options (`--section.key=value`, HF-style aliases) are
config_options.py's.

Every field has a doc string (its `doc` metadata) that `gptrain train --help` prints. This
module imports no torch, so the CLI stays fast.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

from gptrain.errors import UserError, closest
from gptrain.files import parse_user_text, read_user_text


def opt(default, doc: str, choices: tuple | None = None, *, ge=None, gt=None, lt=None, le=None,
        special=None):
    """A config field with its documentation, allowed values and bounds (checked by `check`):
    ge/gt/lt/le as in `value >= ge`; `special` is one more allowed value (e.g. -1: infer)."""
    meta = {"doc": doc, "choices": choices, "ge": ge, "gt": gt, "lt": lt, "le": le, "special": special}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    preset: str = opt("gpt2-tiny", "Architecture preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, "
                      "gpt2-mini (GPT-2); tinyllama-1.1b, llama2-7b (Llama); qwen2.5-0.5b, qwen3-0.6b, "
                      "mistral-7b, phi3-mini, olmo2-1b, gemma2-2b, gemma3-1b; and a tiny one of each "
                      "family (gpt2-tiny, llama-tiny, qwen2-tiny, ... gemma3-tiny). "
                      "Ignored when init_from gives weights with their own shape.")
    init_from: str = opt("", "Start from these weights: a Hugging Face directory (a Trainer checkpoint-N too) "
                         "or hub id of GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3, OLMo 2, Gemma 2, Gemma 3 or any "
                         "other causal LM transformers implements (GPT-NeoX, Falcon, ...: trained as transformers' "
                         "own module), a gptrain checkpoint directory, a nanoGPT ckpt.pt, a checkpoint ID or a job "
                         "name. Empty: random init.")
    n_layer: int | None = opt(None, "Override the preset's number of transformer blocks.", ge=1, le=4096)
    n_head: int | None = opt(None, "Override the preset's number of attention heads.", ge=1, le=4096)
    n_kv_head: int | None = opt(None, "Override the preset's key/value heads (Llama grouped-query "
                                "attention; must divide n_head).", ge=1, le=4096)
    n_embd: int | None = opt(None, "Override the preset's embedding width.", ge=1, le=1 << 17)
    block_size: int | None = opt(None, "Context length in tokens (default: the preset's, capped "
                                 "by what the weights support).", ge=1, le=1 << 21)
    vocab_size: int | None = opt(None, "Vocabulary size (default: the dataset's tokenizer).", ge=1, le=1 << 24)
    dropout: float | None = opt(None, "Dropout probability (0 for pre-training, 0.1 helps fine-tuning); unset: "
                                "0, or with the HF Trainer's flags (train.dialect=hf) the starting model's "
                                "own, as the Trainer trains it (GPT-2's resid_pdrop, 0.1).", ge=0, lt=1)
    bias: bool | None = opt(None, "Use biases in Linear and norm layers (default: the preset's; "
                            "GPT-2 has them, Llama does not).")
    attn_implementation: str = opt("sdpa", "Attention kernel: sdpa (PyTorch fused/flash), eager "
                                   "(reference), flash_attention_2 (the flash-attn package).",
                                   ("sdpa", "eager", "flash_attention_2"))
    pad_vocab_multiple: int = opt(64, "Pad the embedding rows to a multiple of this for faster "
                                  "matmuls (0: no padding). Padded logits are never used.", ge=0, le=1 << 16)


@dataclass
class DataConfig:
    path: str = opt("", "Training data: a `gptrain data prepare` directory, a named dataset, a "
                    "Hugging Face save_to_disk directory with an input_ids column, or a text/JSONL/"
                    "parquet file or URL (http, s3, ...; tokenized once into $GPTRAIN_HOME/cache).")
    mix: str = opt("", "Train on a mixture instead of data.path: NAME:WEIGHT,... (web:0.7,code:0.3; "
                   "in TOML also a [data.mix] table), each NAME a dataset name or directory (split at "
                   "its last ':'), one tokenizer for all; weights are normalized (docs/data.md).")
    cache_bytes: int = opt(8 << 30, "A data.path URL of a prepared folder (URL/meta.json) is read through a "
                           "local cache of at most this many bytes: >= 2 shards, 4 to prefetch (docs/data.md).", ge=1)
    cache_dir: str = opt("", "Where this host caches a data.path URL's shards: a folder on its local disk, "
                         "private to you (default: $GPTRAIN_CACHE_DIR, else gptrain-cache-UID in $TMPDIR "
                         "or /tmp; never $GPTRAIN_HOME, which a multi-host job shares).")
    fetch_timeout: float = opt(60.0, "Seconds a remote read may receive nothing before it is tried again (4 "
                               "tries in all); then the attempt fails, and --max-restarts applies.", gt=0, le=3600)
    tokenizer: str = opt("", "Tokenizer for a data.path file: gpt2, char, byte or a HF tokenizer "
                         "directory (default: model.init_from's tokenizer, else gpt2).")
    text_field: str = opt("text", "The field (JSONL, JSON) or column (parquet) holding each record's text in "
                          "a data.path file (TRL's --dataset_text_field; `data prepare --text-field`).")
    dataset_name: str = opt("", "Source dataset name, as in the HF scripts (recorded, not fetched).")
    dataset_config_name: str = opt("", "Source dataset config name (recorded, not fetched).")
    max_train_samples: int | None = opt(None, "Use at most this many training blocks per epoch.", ge=1)
    max_eval_samples: int | None = opt(None, "Evaluate on at most this many validation blocks.", ge=1)
    packing: bool | None = opt(None, "Instruction (SFT) data: several whole examples per training row, each "
                               "seeing only its own tokens (block-diagonal attention, positions restarting "
                               "at each example), so the loss is the padded form's without its padding; "
                               "default: packed when the examples average at most half a block (docs/sft.md).")


@dataclass
class TrainConfig:
    output_dir: str = opt("out", "Directory for checkpoints, metrics and the resolved config.")
    do_train: bool = opt(True, "Run training.")
    do_eval: bool = opt(True, "Evaluate on the validation split at the end, and during training as "
                        "eval_strategy says.")
    batch_size: int = opt(8, "Sequences per device per micro-step.", ge=1, le=1 << 20)
    eval_batch_size: int = opt(8, "Sequences per device per evaluation step.", ge=1, le=1 << 20)
    grad_accum_steps: int = opt(1, "Micro-steps accumulated into one optimizer step.", ge=1, le=1 << 20)
    global_batch_size: int | None = opt(None, "Sequences per optimizer step over all data-parallel "
                                        "ranks (DeepSpeed's train_batch_size): sets grad_accum_steps, "
                                        "or with pipeline parallel the microbatches, for the world size.",
                                        ge=1)
    lr: float = opt(6e-4, "Peak learning rate.", ge=0)
    min_lr_ratio: float = opt(0.1, "Final learning rate as a fraction of lr (cosine and linear).", ge=0, le=1)
    min_lr: float | None = opt(None, "Final learning rate itself (nanoGPT's min_lr); when set, min_lr_ratio "
                               "is not used.", ge=0)
    decay_steps: int | None = opt(None, "Steps the decay spans from the start (nanoGPT's lr_decay_iters); "
                                  "past them the learning rate stays at its final value. Default: to the "
                                  "last step.", ge=1)
    lr_schedule: str = opt("cosine", "Decay after warmup: gptrain's cosine, linear (to the floor) or constant, or "
                           "one of transformers' schedules with --lr_scheduler_kwargs (lr_schedules.py).",
                           ("cosine", "linear", "constant", "cosine_with_restarts", "polynomial", "inverse_sqrt",
                            "cosine_with_min_lr", "warmup_stable_decay"))
    lr_schedule_kwargs: str = opt("", "The schedule's own arguments as a JSON object, as transformers' "
                                  "--lr_scheduler_kwargs takes them: '{\"num_cycles\": 3}' (cosine_with_restarts), "
                                  "'{\"num_decay_steps\": 200}' (warmup_stable_decay), ...")
    warmup_steps: int = opt(0, "Linear warmup steps.", ge=0)
    warmup_ratio: float = opt(0.0, "Linear warmup over this fraction of the steps, where warmup_steps is 0 "
                              "(HF's warmup_ratio).", ge=0, le=1)
    weight_decay: float = opt(0.1, "AdamW weight decay (matrices only; biases and norms get none).", ge=0)
    beta1: float = opt(0.9, "AdamW beta1.", ge=0, lt=1)
    beta2: float = opt(0.95, "AdamW beta2.", ge=0, lt=1)
    grad_clip: float = opt(1.0, "Clip the global gradient norm to this (0: off).", ge=0)
    max_steps: int = opt(-1, "Optimizer steps to run; -1: as many as num epochs need.", ge=1, special=-1)
    epochs: float = opt(1.0, "Passes over the training data when max_steps is -1.", gt=0, le=1e6)
    seed: int = opt(42, "Seed for init, data order and dropout (0 to 2^32-1, as numpy takes it).", ge=0, le=2**32 - 1)
    dialect: str = opt("gptrain", "Whose defaults fill the settings no flag or config gives: gptrain's; the HF "
                       "Trainer's (lr 5e-5 linear to 0, no weight decay, AdamW betas 0.9/0.999, fp32 unless "
                       "--bf16/--fp16, the starting model's own dropout, logging every 500 steps, evaluating only "
                       "when asked), taken by a run given in the HF Trainer's flags; or nanoGPT train.py's (GPT-2 "
                       "124M, 600000 iterations, warmup 2000, batch 12 x 40 accumulated, eval and save every 2000), "
                       "taken by a run given in nanoGPT's keys or config file.",
                       ("gptrain", "hf", "nanogpt"))
    precision: str = opt("auto", "Compute precision; auto: bf16 on GPUs that support it; on a CPU the dtype its "
                         "matmuls run fastest in, measured once per CPU kind and kept with its numbers "
                         "(bf16 needs 1.3x fp32's rate); the choice and why are printed at start.",
                         ("auto", "fp32", "bf16", "fp16"))
    loss_scale: float = opt(0.0, "fp16 loss scale: 0 for dynamic loss scaling, or a fixed scale.", ge=0)
    loss_scale_initial: float = opt(65536.0, "fp16 dynamic loss scaling: the starting scale.", gt=0)
    loss_scale_window: int = opt(2000, "fp16 dynamic loss scaling: double the scale after this many "
                                 "steps in a row without overflow.", ge=1)
    loss_scale_hysteresis: int = opt(1, "fp16 dynamic loss scaling: overflows (each step skipped) "
                                     "before the scale is halved.", ge=1)
    loss_scale_min: float = opt(1.0, "fp16 dynamic loss scaling: the scale never drops below this.", gt=0)
    eval_strategy: str = opt("steps", "When to evaluate during training: every eval_every steps, each epoch, or "
                             "no (then only at the end, when do_eval, as run_clm.py's --do_eval does).",
                             ("steps", "epoch", "no"))
    eval_every: int = opt(500, "Evaluate every this many steps (eval_strategy=steps).", ge=1)
    eval_iters: int | None = opt(None, "Batches of eval_batch_size per evaluation, at most (nanoGPT's "
                                 "eval_iters): the first eval_iters x eval_batch_size validation blocks, "
                                 "the same at any world size. Default: 50, or data.max_eval_samples "
                                 "where that is set; 0: the whole split.", ge=0, le=1 << 30)
    activation_checkpointing: str = opt("none", "Recompute activations in backward to save memory.",
                                        ("none", "full", "selective"))
    compile: bool | None = opt(None, "torch.compile each transformer block and the loss; default: on "
                               "a GPU, off on a CPU (where compiling costs more than it saves).")
    fused_loss: bool | None = opt(None, "Compute the loss with the fused, chunked lm_head + cross-"
                                  "entropy (the logits never exist, less memory); false: the plain "
                                  "logits -> cross-entropy path; default: fused, except compiled on a "
                                  "GPU, where the compiled plain path is faster (BENCHMARKS.md).")
    nan_policy: str = opt("stop", "On a NaN/inf loss or gradient the step is skipped; stop: the run then ends "
                                  "by the next log step, before any checkpoint.",
                          ("stop", "skip"))
    device: str = opt("auto", "auto: cuda when present, else cpu.", ("auto", "cpu", "cuda"))


@dataclass
class ParallelConfig:
    dp_replicate: int = opt(1, "Data-parallel replicas (DDP); -1: infer from the world size.", ge=1,
                            special=-1)
    dp_shard: int = opt(-1, "Fully-sharded data-parallel degree (FSDP2); -1: infer.", ge=1, special=-1)
    tp: int = opt(1, "Tensor-parallel degree (with sequence parallel).", ge=1)
    pp: int = opt(1, "Pipeline-parallel stages.", ge=1)
    pp_schedule: str = opt("1f1b", "Pipeline schedule.", ("gpipe", "1f1b", "interleaved_1f1b"))
    pp_microbatches: int | None = opt(None, "Microbatches per pipeline step (default: 2 x pp).", ge=1)


@dataclass
class CheckpointConfig:
    every: int = opt(500, "Save a checkpoint every this many steps (0: only at the end).", ge=0)
    keep_last: int | None = opt(None, "Keep only the newest this many checkpoints.", ge=1)
    keep_best: bool = opt(False, "Keep the checkpoint evaluated lowest at its step through keep_last, and "
                          "let the run stand for it as a model (generate, eval, export NAME; `best` in "
                          "its checkpoints/); a resume still continues from the newest. Needs do_eval "
                          "and checkpoint.every a multiple of eval_every (HF's load_best_model_at_end).")
    async_save: bool = opt(False, "Write checkpoints in the background while training goes on.")
    remote: str = opt("", "Also copy each checkpoint to this fsspec URL (s3://bucket/run, oci://, "
                      "gs://, file://); resume_from=auto then fetches the newest from there "
                      "when the output directory lacks it.")
    resume_from: str = opt("auto", "auto: the latest checkpoint in output_dir if any; none: start "
                           "fresh; or a gptrain checkpoint directory, checkpoint ID or job name.")
    allow_unverified: bool = opt(False, "Load a gptrain checkpoint that has no checksums.json (written "
                                 "before gptrain verified checkpoints, or its list removed) without "
                                 "verifying its bytes, with a warning; refused otherwise (--allow-unverified).")


@dataclass
class MetricsConfig:
    log_every: int = opt(10, "Print and record training metrics every this many steps.", ge=1)
    report_to: list[str] = opt(["tensorboard"], "Metric sinks besides metrics.jsonl.",
                               ("tensorboard", "wandb", "none", "all"))
    wandb_project: str = opt("gptrain", "Weights & Biases project.")
    wandb_mode: str = opt("offline", "Weights & Biases mode.", ("online", "offline", "disabled"))
    peak_flops: float | None = opt(None, "Peak FLOP/s of one device for MFU (default: known GPU "
                                   "table, or a matmul peak measured on CPU in the run's precision, "
                                   "cached per CPU model).", gt=0)
    sample_every: int = opt(0, "Every this many steps, log a sample of metrics.sample_tokens tokens the model "
                            "writes after metrics.sample_prompt (temperature 0.8, top-k 200, as nanoGPT's "
                            "sample.py); 0: never. Training is unchanged by it.", ge=0)
    sample_prompt: str = opt("\n", "The text samples start from.")
    sample_tokens: int = opt(100, "Tokens per sample.", ge=1, le=1 << 16)


@dataclass
class LoraConfig:
    r: int | None = opt(None, "LoRA rank (peft's r): train low-rank adapters on lora.target_modules with "
                        "every base weight frozen; unset: full fine-tuning.", ge=1, le=1 << 16)
    alpha: float = opt(8.0, "LoRA scaling numerator (peft's lora_alpha): adapters scaled by alpha / r.", gt=0)
    dropout: float = opt(0.0, "Dropout on the adapters' input (peft's lora_dropout).", ge=0, lt=1)
    target_modules: list[str] = opt([], "Hugging Face module names to adapt: c_attn, c_proj, c_fc (GPT-2); "
                                    "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (Llama); "
                                    "or all-linear. Default: peft's (c_attn; q_proj,v_proj).")
    quantize_base: str = opt("none", "QLoRA: hold the frozen base's block Linears in 4-bit NF4 (torchao) "
                             "while the adapters train in full precision.", ("none", "nf4"))


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Config)}

def field_info(key: str) -> tuple[dataclasses.Field, type]:
    """The dataclass field and its resolved type for 'section.name'."""
    section, _, name = key.partition(".")
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {f.name: f for f in dataclasses.fields(cls)}[name], hints[name]


def all_keys() -> list[str]:
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def base_type(tp) -> tuple[type, bool]:
    """(inner type, optional?) for `X | None`."""
    args = typing.get_args(tp)
    if type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return tp, False


BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def convert(key: str, value):
    """Check and convert a value (a CLI string or a TOML value) for `key`."""
    f, tp = field_info(key)
    base, optional = base_type(tp)
    if optional and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    try:
        if base is bool:
            if isinstance(value, bool):
                out = value
            elif isinstance(value, str) and value.lower() in BOOL_WORDS:
                out = BOOL_WORDS[value.lower()]
            else:
                raise ValueError
        elif base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            out = int(value)
        elif base is float:
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
        elif typing.get_origin(base) is list:
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list):
                raise ValueError
            out = [str(v).strip() for v in items if str(v).strip()]
        else:
            if key == "data.mix" and isinstance(value, dict):  # a [data.mix] table: name = weight
                value = ",".join(f"{name}:{weight}" for name, weight in value.items())
            if not isinstance(value, str):
                raise ValueError
            out = value
    except (ValueError, TypeError):
        kind = getattr(base, "__name__", str(base))
        raise UserError(f"bad value {value!r} for {key}: expected {kind}"
                        + (" or none" if optional else "")) from None
    choices = f.metadata.get("choices")
    for item in (out if isinstance(out, list) else [out]):
        if choices and item not in choices:
            raise UserError(f"bad value {item!r} for {key}: choose one of {', '.join(choices)}"
                            + closest(str(item), choices))
    return out


def set_key(cfg: Config, key: str, value) -> None:
    """Set `section.key` to a value converted and checked for it; one line naming a key that is none."""
    if key.count(".") != 1 or key not in all_keys():
        same_name = [k for k in all_keys() if k.split(".")[1] == key.rpartition(".")[2]]
        hint = f" (did you mean {same_name[0]!r}?)" if len(same_name) == 1 else closest(key, all_keys())
        raise UserError(f"unknown config key {key!r}{hint}; see `gptrain train --help`")
    section, name = key.split(".")
    setattr(getattr(cfg, section), name, convert(key, value))


def load_toml(path: str | Path, cfg: Config | None = None, text: str | None = None) -> Config:
    """Read a TOML config file onto `cfg` (default: a fresh Config). With `text`, parse that
    (the file's content, kept elsewhere) and name `path` in errors."""
    cfg = cfg or Config()
    path = Path(path)
    text = read_user_text(path, "config file") if text is None else text  # bounded: /dev/zero is one line
    try:
        data = parse_user_text(tomllib.loads, text, f"config file {path}")
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {path} is not valid TOML: {e}") from None
    for section, values in data.items():
        if section not in SECTIONS:
            raise UserError(f"unknown section [{section}] in {path}{closest(section, SECTIONS)}")
        if not isinstance(values, dict):
            raise UserError(f"{section} in {path} must be a [{section}] table")
        for name, value in values.items():
            try:
                set_key(cfg, f"{section}.{name}", value)
            except UserError as e:
                raise UserError(f"{path}: {e}") from None
    return cfg


def dump_toml(cfg: Config) -> str:
    """The config as TOML (fields that are None are left out: None is their default)."""
    lines = []
    for section, values in cfg.to_dict().items():
        lines.append(f"[{section}]")
        for name, value in values.items():
            if value is not None:
                lines.append(f"{name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)
