"""Every field of transformers' `TrainingArguments`, as `gptrain train` and a job's trainer flags
take it. A field is one of:

- mapped (config_aliases.ALIASES): the gptrain setting with the same meaning;
- by value (BY_VALUE): some values mean what gptrain does (accepted, or a setting), the others
  are refused with the reason;
- accepted (ACCEPTED): it changes nothing a run computes or keeps here (a loader knob where the
  loader reads memory-mapped files in the training process, a hub or logger option for a sink
  gptrain does not have); taken, and the reason is in the table;
- refused (REFUSED): one line says why it does not apply and what to use instead.

docs/hf-trainer-flags.md is `table()` of the installed transformers, and a test fails when
transformers has a field that is none of these (so the table cannot go stale). The same table
holds FMEngine's flags (FMENGINE_FIELDS: its cli/train.py's argument dataclasses, listed from its
source since FMEngine needs DeepSpeed and CUDA to install).
"""

from __future__ import annotations

_HUB = "gptrain does not push to the Hugging Face Hub: `gptrain export NAME --format hf --out DIR`, then `hf upload`"
_TRACKIO = "gptrain logs to metrics.jsonl, TensorBoard and W&B (--report_to), not Trackio"
_LOADER = ("gptrain's loader reads memory-mapped token files in the training process (no DataLoader "
           "workers), so this changes nothing here")
_DDP = "gptrain sets up DDP/FSDP itself (--parallel.*: docs/multi-host.md); this knob is not exposed"
_EVAL_ONLY = "gptrain's evaluation computes loss, perplexity and accuracy only; there are no predictions to gather"

ACCEPTED: dict[str, str] = {
    "backend": "gptrain uses gloo on a CPU and NCCL on GPUs (nanoGPT's backend)",
    "wandb_run_name": "the W&B run is named after the job or the output folder (nanoGPT's wandb_run_name)",
    "dataloader_num_workers": _LOADER,
    "dataloader_pin_memory": "batches are pinned on a GPU already; on a CPU there is nothing to pin",
    "dataloader_persistent_workers": _LOADER,
    "dataloader_prefetch_factor": "the next batches are read ahead by the trainer's own reader; " + _LOADER,
    "dataloader_multiprocessing_context": _LOADER,
    "dataloader_in_order": "batches are always in the order of the data's seeded permutation",
    "remove_unused_columns": "a prepared dataset holds token ids only; there are no other columns",
    "disable_tqdm": "progress is one line per log step (metrics.log_every), not a tqdm bar",
    "log_level": "gptrain's output is its own lines; the transformers logger is kept quiet",
    "log_level_replica": "only rank 0 prints progress; the other ranks' logs hold errors",
    "log_on_each_node": "only rank 0 prints progress; every rank's log is kept (gptrain logs NAME --rank R)",
    "logging_nan_inf_filter": "a non-finite loss is handled by --train.nan_policy, never logged as a value",
    "logging_first_step": "the first step is always logged",
    "skip_memory_metrics": "gptrain does not profile memory per phase",
    "use_cache": "the KV cache is used by generation only, never in training",
    "eval_do_concat_batches": _EVAL_ONLY,
    "eval_use_gather_object": _EVAL_ONLY,
    "eval_accumulation_steps": _EVAL_ONLY,
    "batch_eval_metrics": "evaluation sums loss and accuracy batch by batch already",
    "prediction_loss_only": "evaluation computes the loss (and perplexity, accuracy) only",
    "include_num_input_tokens_seen": "metrics.jsonl logs the tokens seen at every logged step",
    "average_tokens_across_devices": "the loss is the mean over every target token of all ranks already",
    "do_predict": "recorded as in run_clm.py; gptrain has no predict step (gptrain generate samples text)",
    "local_rank": "set by torch.distributed.launch for old scripts; gptrain reads LOCAL_RANK from torchrun",
    "run_name": "a run is named after its job (or output folder) in every sink",
    "project": _TRACKIO,
    "ddp_timeout": "gptrain's process groups use torch's default timeout and its own stall detection",
    "ddp_backend": "gptrain picks nccl on GPUs and gloo on CPUs",
    "overwrite_output_dir": "a run in a used output folder resumes from its checkpoint (--checkpoint.resume_from)",
    "save_on_each_node": "checkpoints are written once, sharded, to the job's folder that every node shares",
    "hub_token": _HUB,
    "hub_private_repo": _HUB,
    "hub_strategy": _HUB,
    "hub_always_push": _HUB,
    "hub_revision": _HUB,
    "trackio_space_id": _TRACKIO,
    "trackio_bucket_id": _TRACKIO,
    "trackio_static_space_id": _TRACKIO,
    "restore_callback_states_from_checkpoint": "gptrain has no callbacks; a resume restores its whole state",
    # FMEngine's own (cli/train.py)
    "use_deepspeed": "gptrain's own engine does what DeepSpeed did for FMEngine: pipeline stages "
                     "(--pipe_parallel_size), tensor parallelism, ZeRO-style sharding (--parallel.dp_shard)",
    "rank": "set by the launcher; gptrain reads RANK from torchrun",
    "world_size": "set by the launcher; gptrain reads WORLD_SIZE from torchrun",
    "num_workers": _LOADER,
}

REFUSED: dict[str, str] = {
    "push_to_hub": _HUB,
    "hub_model_id": _HUB,
    "optim_args": "gptrain trains with AdamW; optimizer arguments beyond its betas are not offered",
    "optim_target_modules": "GaLore and APOLLO are not offered (for fewer trained parameters: --lora_r)",
    "adam_epsilon": "AdamW's epsilon is fixed at 1e-8 (as HF's default)",
    "label_smoothing_factor": "the loss is plain cross-entropy; label smoothing is not offered",
    "bf16_full_eval": "evaluation runs in the training precision (--train.precision)",
    "fp16_full_eval": "evaluation runs in the training precision (--train.precision)",
    "tf32": "TF32 is on for what bf16/fp16 autocast leaves in fp32 on a GPU, off in fp32 runs (exact); not a setting",
    "activation_checkpointing_kwargs": "--train.activation_checkpointing takes full or selective, nothing more",
    "gradient_checkpointing_kwargs": "--train.activation_checkpointing takes full or selective, nothing more",
    "torch_compile_backend": "--torch_compile uses inductor; another backend is not offered",
    "torch_compile_mode": "--torch_compile compiles each block with the default mode; modes are not offered",
    "use_liger_kernel": "Liger kernels are not used; gptrain has its own fused loss (--train.fused_loss)",
    "liger_kernel_config": "Liger kernels are not used; gptrain has its own fused loss (--train.fused_loss)",
    "neftune_noise_alpha": "NEFTune embedding noise is not offered",
    "torch_empty_cache_steps": "gptrain does not empty the CUDA cache during training",
    "auto_find_batch_size": "give --per_device_train_batch_size; a size that cannot fit is refused before the run",
    "eval_delay": "evaluation runs every --eval_steps from the first; a delay is not offered",
    "eval_on_start": "the first evaluation comes after --eval_steps steps; use `gptrain eval` on the initial model",
    "include_for_metrics": "there is no compute_metrics in gptrain",
    "save_only_model": "every checkpoint holds the optimizer state, so any of them resumes exactly",
    "enable_jit_checkpoint": "a SIGTERM always saves a checkpoint at the end of the step (docs/reliability.md)",
    "ignore_data_skip": "a resume restores the data position exactly, without reading skipped batches",
    "full_determinism": "runs are deterministic on a CPU with --train.seed; not a setting",
    "data_seed": "the data order comes from --seed (train.seed); a separate data seed is not kept",
    "use_cpu": "use --parallel.device=cpu",
    "accelerator_config": "gptrain does not run through Accelerate",
    "parallelism_config": "use --parallel.dp_replicate, dp_shard, tp and pp (docs/multi-host.md)",
    "dataloader_drop_last": "every training batch is full: the blocks of a split are dealt in whole batches",
    "label_names": "the labels are the next tokens of the input, always",
    "train_sampling_strategy": "training blocks are read in a seeded random permutation; other samplers are not offered",
    "length_column_name": "training blocks are read in a seeded random permutation; other samplers are not offered",
    "ddp_find_unused_parameters": _DDP,
    "ddp_bucket_cap_mb": _DDP,
    "ddp_broadcast_buffers": _DDP,
    "ddp_static_graph": _DDP,
    "fsdp": "use --parallel.dp_shard=N (FSDP2 over N ranks)",
    "fsdp_config": "use --parallel.dp_shard=N (FSDP2 over N ranks); its options are not offered",
    "debug": "debug features are not offered; --train.nan_policy=stop stops at a non-finite loss",
    "cache_dir": "where Hugging Face downloads go is HF's own setting: set HF_HOME (a local --init_ckpt "
                 "folder is read in place); for the shard cache of a dataset at a URL: --data.cache_dir",
}

# flag -> {value: None (what gptrain does: accepted) | (setting, value) | "*" -> the reason others are refused}
BY_VALUE: dict[str, dict] = {
    "optim": {"adamw_torch": None, "adamw_torch_fused": None, "adamw_hf": None,
              "*": "gptrain trains with AdamW (torch's, fused where it can); other optimizers are not offered"},
    "save_strategy": {"steps": None, "no": ("checkpoint.every", "0"),
                      "*": "checkpoints are saved every --save_steps steps (or never: no); per epoch or best not offered"},
    "logging_strategy": {"steps": None,
                         "*": "progress is logged every --logging_steps steps; per epoch or never is not offered"},
    "lr_scheduler_type": {"*": "each is transformers' own schedule, with --warmup_steps and --lr_scheduler_kwargs "
                               "(given as this flag, cosine and linear decay to 0 as transformers' do; "
                               "--train.min_lr_ratio after it sets a floor); reduce_lr_on_plateau follows an "
                               "evaluation metric and greedy an outside signal, not the step: not offered"},
    "metric_for_best_model": {"loss": None, "eval_loss": None,
                              "*": "the best checkpoint (--load_best_model_at_end) is the one with the lowest "
                                   "eval loss; another metric is not offered"},
    "greater_is_better": {"false": None,
                          "*": "the best checkpoint (--load_best_model_at_end) is the one with the lowest eval "
                               "loss: greater is not better"},
    # nanoGPT's (NANOGPT_KEYS)
    "init_from": {"scratch": None, "resume": ("checkpoint.resume_from", "auto"),
                  "*": "nanoGPT's init_from takes scratch, resume or gpt2, gpt2-medium, gpt2-large, gpt2-xl"},
    "eval_only": {"false": None, "true": ("train.do_train", "false"),
                  "*": "eval_only takes True or False"},
    "wandb_log": {"false": None, "true": ("metrics.report_to", "wandb"), "*": "wandb_log takes True or False"},
    "decay_lr": {"true": None, "false": ("train.lr_schedule", "constant"), "*": "decay_lr takes True or False"},
    # nanoGPT's False saves only a checkpoint that improves on the eval loss: gptrain keeps that best
    # one (through keep_last) besides its newest
    "always_save_checkpoint": {"true": None, "false": ("checkpoint.keep_best", "true"),
                               "*": "always_save_checkpoint takes True or False"},
    "pretrain": {"false": None,
                 "*": "--pretrain true (FMEngine: random weights, --init_ckpt's not loaded) is not a flag here: "
                      "give the model's shape (--model.preset, --model.n_layer, ...) and no --init_ckpt"},
}
SCHEDULES = ("cosine", "linear", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial",
             "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay")
NANOGPT_HUB = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")

# nanoGPT's train.py (github.com/karpathy/nanoGPT, vendored in tests/third_party/nanogpt): the
# config keys its configurator takes as --key=value, as its README's lines pass them.
NANOGPT_KEYS = ("out_dir", "eval_interval", "log_interval", "eval_iters", "eval_only", "always_save_checkpoint",
                "init_from", "wandb_log", "wandb_project", "wandb_run_name", "dataset",
                "gradient_accumulation_steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd",
                "dropout", "bias", "learning_rate", "max_iters", "weight_decay", "beta1", "beta2", "grad_clip",
                "decay_lr", "warmup_iters", "lr_decay_iters", "min_lr", "backend", "device", "dtype", "compile")

# FMEngine's cli/train.py (github.com/eth-easl/fmengine): the fields of its ModelArguments,
# DeepspeedArguments, DataArguments and TrainerArguments, which HfArgumentParser makes its flags.
FMENGINE_FIELDS = ("init_ckpt", "use_flash_attn", "use_fused_ops",
                   "use_deepspeed", "rank", "local_rank", "pipe_parallel_size", "model_parallel_size",
                   "world_size", "seed", "deepspeed_config",
                   "data_path", "num_workers",
                   "cache_dir", "output_dir", "max_seq_len", "train_steps", "eval_steps", "save_steps",
                   "log_steps", "pretrain")


def kind_of(name: str, aliases: dict) -> str | None:
    """'mapped', 'by value', 'accepted', 'refused', or None for a flag none of these name."""
    if name in BY_VALUE:
        return "by value"
    if name in aliases:
        return "mapped"
    if name in ACCEPTED:
        return "accepted"
    if name in REFUSED:
        return "refused"
    return None


def by_value(name: str, value):
    """For a BY_VALUE flag: None (accepted as it is), (setting, value) or a list of them to apply,
    or the reason this value is refused (a str)."""
    rules = BY_VALUE[name]
    word = str(value).lower() if value is not None else ""
    if name == "lr_scheduler_type" and word in SCHEDULES:  # decaying to 0, as transformers' own schedulers
        return [("train.lr_schedule", "constant" if word == "constant_with_warmup" else word),
                ("train.min_lr_ratio", "0")]
    if name == "init_from" and word in NANOGPT_HUB:  # nanoGPT's init_from='gpt2-xl': the hub model
        return ("model.init_from", word)
    if word in rules:
        return rules[word]
    return rules["*"]


def training_arguments() -> list[str]:
    """The installed transformers' TrainingArguments fields a user can pass."""
    import dataclasses

    from transformers import TrainingArguments

    return [f.name for f in dataclasses.fields(TrainingArguments) if f.init]


def _rows(names, aliases: dict, deepspeed_flags) -> list[tuple[str, str, str]]:
    rows = []
    for name in names:
        if name in deepspeed_flags:
            rows.append((name, "mapped", "a DeepSpeed JSON config: the settings gptrain has are read from it"))
        elif name in BY_VALUE:
            ok = ", ".join(v for v, r in BY_VALUE[name].items() if v != "*") or ", ".join(SCHEDULES)
            rows.append((name, "by value", f"{ok}; others refused: {BY_VALUE[name]['*']}"))
        elif name in aliases:
            key, vmap = aliases[name]
            rows.append((name, "mapped", f"`{key}`" + (f" ({', '.join(f'{k}: {v}' for k, v in vmap.items())})"
                                                        if vmap else "")))
        elif name in ACCEPTED:
            rows.append((name, "accepted", ACCEPTED[name]))
        elif name in REFUSED:
            rows.append((name, "refused", REFUSED[name]))
        else:
            rows.append((name, "MISSING", "not in gptrain's table (src/gptrain/hf_flags.py)"))
    return rows


def _table(names, aliases: dict, deepspeed_flags) -> list[str]:
    """One markdown table of flags: a blank line, its header, a row per flag."""
    return ["", "| flag | gptrain | what it means here |", "| --- | --- | --- |",
            *(f"| `--{n}` | {k} | {why.replace('|', '/')} |" for n, k, why in _rows(names, aliases, deepspeed_flags))]


def table(aliases: dict, deepspeed_flags=()) -> str:
    """docs/hf-trainer-flags.md: every TrainingArguments field and FMEngine flag, and what gptrain
    does with it."""
    import transformers

    lines = ["# The Hugging Face Trainer's flags in gptrain", "",
             f"Every field of `transformers.TrainingArguments` (transformers {transformers.__version__}), as "
             "`gptrain train` and a job's trainer flags take it: **mapped** to the gptrain setting with the same "
             "meaning; **by value** (the values listed mean what gptrain does, others are refused); "
             "**accepted** (it changes nothing a run computes or keeps here, for the reason given); "
             "**refused** in one line that gives the reason. Two flags that set the precision two ways "
             "(`--bf16 --fp16`, `--fp16 --torch_dtype bfloat16`) are refused, as HF's parser refuses "
             "`--bf16 --fp16`; elsewhere a later spelling overrides an earlier one. "
             "A command in the Trainer's own flags (`--per_device_train_batch_size`, `--num_train_epochs`, "
             "`--lr_scheduler_type`, `--logging_steps`, ...: config_aliases.HF_MARKERS) takes the Trainer's "
             "defaults for what it does not say (`train.dialect = \"hf\"`: lr 5e-5, linear decay to 0, no weight "
             "decay, AdamW betas 0.9/0.999, fp32 unless `--bf16`/`--fp16`, the starting model's own dropout; logging and saving every 500 steps; no evaluation unless "
             "`--do_eval` (once, at the end) or an `--eval_strategy` (during training too); the run's header "
             "says so); `--train.dialect=gptrain` "
             "keeps gptrain's defaults. A command in nanoGPT's own keys (`--max_iters`, `--eval_interval`, "
             "`--warmup_iters`, ...: config_aliases.NANOGPT_MARKERS) or with a nanoGPT config file first "
             "(`gptrain train config/train_shakespeare_char.py --device=cpu ...`: its `NAME = value` lines are "
             "read, never run) takes nanoGPT train.py's defaults (`train.dialect = \"nanogpt\"`: GPT-2 124M "
             "without biases, 600000 iterations, warmup 2000, decay to 6e-5 over 600000, batch 12 with 40 "
             "micro-steps accumulated per process, eval and save every 2000 over 200 batches, log every step, "
             "seed 1337), its `dataset` naming `data/DATASET` where that folder holds nanoGPT's `train.bin`, "
             "and `always_save_checkpoint=False` keeping the best checkpoint by eval loss. "
             "Generated from `TrainingArguments` itself by "
             "`python -m gptrain.hf_flags > docs/hf-trainer-flags.md`; tests/unit/test_hf_flags.py fails when "
             "a field is missing or this file is stale."]
    lines += _table(training_arguments(), aliases, deepspeed_flags)
    lines += ["", "## FMEngine's flags", "",
              "Every flag of FMEngine's `cli/train.py` (its ModelArguments, DeepspeedArguments, DataArguments "
              "and TrainerArguments), as the seed's `deepspeed ... cli/train.py` line passes them to "
              "`gptrain run NAME -- ...`; the same kinds as above."]
    lines += _table(FMENGINE_FIELDS, aliases, deepspeed_flags)
    lines += ["", "## nanoGPT's config keys", "",
              "Every config key of nanoGPT's `train.py`, as its README's lines pass them (`--key=value`) to "
              "`gptrain train` or a job's trainer flags; the same kinds as above. nanoGPT's warmup reaches the "
              "learning rate at warmup_iters + 1 steps, gptrain's (as HF's) at warmup_iters."]
    lines += _table(NANOGPT_KEYS, aliases, deepspeed_flags)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from gptrain.config_aliases import ALIASES, DEEPSPEED_FLAGS

    print(table(ALIASES, DEEPSPEED_FLAGS), end="")
