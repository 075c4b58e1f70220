"""The flag names other tools use for gptrain's settings: the HF Trainer's and run_clm.py's,
FMEngine's and DeepSpeed pipeline scripts', each mapped onto a canonical `section.key`
(config.py applies them; `gptrain train --help` lists them)."""

from __future__ import annotations

# HF Trainer / run_clm.py flag -> (canonical key, value map or None). A value map turns the HF
# value into ours; for flags that take no value the map holds the implied value under None.
ALIASES: dict[str, tuple[str, dict | None]] = {
    "model_name_or_path": ("model.init_from", None),
    "hf_model": ("model.init_from", None),
    "output_dir": ("train.output_dir", None),
    "do_train": ("train.do_train", None),
    "do_eval": ("train.do_eval", None),
    "per_device_train_batch_size": ("train.batch_size", None),
    "per_device_eval_batch_size": ("train.eval_batch_size", None),
    "gradient_accumulation_steps": ("train.grad_accum_steps", None),
    "learning_rate": ("train.lr", None),
    "weight_decay": ("train.weight_decay", None),
    "num_train_epochs": ("train.epochs", None),
    "max_steps": ("train.max_steps", None),
    "warmup_steps": ("train.warmup_steps", None),
    "lr_scheduler_type": ("train.lr_schedule", {"constant_with_warmup": "constant"}),
    "lr_scheduler_kwargs": ("train.lr_schedule_kwargs", None),
    "logging_steps": ("metrics.log_every", None),
    "save_steps": ("checkpoint.every", None),
    "save_total_limit": ("checkpoint.keep_last", None),
    "load_best_model_at_end": ("checkpoint.keep_best", {None: "true"}),
    "allow_unverified": ("checkpoint.allow_unverified", {None: "true"}),
    "eval_steps": ("train.eval_every", None),
    "eval_strategy": ("train.eval_strategy", None),
    "eval_iters": ("train.eval_iters", None),  # nanoGPT's
    "evaluation_strategy": ("train.eval_strategy", None),
    "seed": ("train.seed", None),
    "max_grad_norm": ("train.grad_clip", None),
    "adam_beta1": ("train.beta1", None),
    "adam_beta2": ("train.beta2", None),
    "torch_compile": ("train.compile", {None: "true"}),
    "activation_checkpointing": ("train.activation_checkpointing", {None: "full", "true": "full", "false": "none"}),
    "warmup_ratio": ("train.warmup_ratio", None),
    "resume_from_checkpoint": ("checkpoint.resume_from", None),
    "torch_dtype": ("train.precision", {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                                        "auto": "auto"}),
    "attn_implementation": ("model.attn_implementation", None),
    "max_train_samples": ("data.max_train_samples", None),
    "max_eval_samples": ("data.max_eval_samples", None),
    "dataset_name": ("data.dataset_name", None),
    "dataset_text_field": ("data.text_field", None),
    "dataset_config_name": ("data.dataset_config_name", None),
    "tokenized_dataset_load_dir": ("data.path", None),
    "dataset_block_size": ("model.block_size", None),
    "block_size": ("model.block_size", None),
    "bf16": ("train.precision", {None: "bf16", "true": "bf16", "false": "auto"}),
    "fp16": ("train.precision", {None: "fp16", "true": "fp16", "false": "auto"}),
    "gradient_checkpointing": ("train.activation_checkpointing",
                               {None: "full", "true": "full", "false": "none"}),
    "report_to": ("metrics.report_to", None),
    # peft / TRL script flags (TRL's ModelConfig)
    "lora_r": ("lora.r", None),
    "lora_alpha": ("lora.alpha", None),
    "lora_dropout": ("lora.dropout", None),
    "lora_target_modules": ("lora.target_modules", None),
    "load_in_4bit": ("lora.quantize_base", {None: "nf4", "true": "nf4", "false": "none"}),  # (nf4, as bnb_4bit_quant_type)
    "packing": ("data.packing", {None: "true"}),  # TRL's SFTConfig (several examples a row)
    # FMEngine / DeepSpeed pipeline-training scripts
    "init_ckpt": ("model.init_from", None),
    "data_path": ("data.path", None),
    "max_seq_len": ("model.block_size", None),
    "train_steps": ("train.max_steps", None),
    "log_steps": ("metrics.log_every", None),
    "pipe_parallel_size": ("parallel.pp", None),
    "model_parallel_size": ("parallel.tp", None),
    "use_flash_attn": ("model.attn_implementation", {None: "flash_attention_2", "true": "flash_attention_2",
                                                     "false": "sdpa"}),
    "use_fused_ops": ("train.fused_loss", None),
    # nanoGPT's train.py config keys (its configurator's --key=value; hf_flags.NANOGPT_KEYS lists them all)
    "out_dir": ("train.output_dir", None),
    "eval_interval": ("train.eval_every", None),
    "log_interval": ("metrics.log_every", None),
    "dataset": ("data.path", None),
    "batch_size": ("train.batch_size", None),
    "n_layer": ("model.n_layer", None),
    "n_head": ("model.n_head", None),
    "n_embd": ("model.n_embd", None),
    "dropout": ("model.dropout", None),
    "bias": ("model.bias", None),
    "max_iters": ("train.max_steps", None),
    "beta1": ("train.beta1", None),
    "beta2": ("train.beta2", None),
    "grad_clip": ("train.grad_clip", None),
    "warmup_iters": ("train.warmup_steps", None),
    "lr_decay_iters": ("train.decay_steps", None),
    "min_lr": ("train.min_lr", None),
    "device": ("train.device", None),
    "dtype": ("train.precision", {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}),
    "compile": ("train.compile", None),
    "wandb_project": ("metrics.wandb_project", None),
}
# A run given in the HF Trainer's own flags (any of HF_MARKERS: TrainingArguments fields no other
# tool's flags spell) takes TrainingArguments' defaults for the settings its flags do not give
# (train.dialect = "hf"); gptrain's own flags and config keep gptrain's.
HF_MARKERS = frozenset({  # (not those gptrain's users type as short forms, --report_to, --bf16, nor
    # those FMEngine's scripts share: --output_dir, --save_steps)
    "per_device_train_batch_size", "per_device_eval_batch_size", "num_train_epochs", "lr_scheduler_type",
    "logging_steps", "save_total_limit", "overwrite_output_dir", "do_train",
    "warmup_ratio", "model_name_or_path", "max_grad_norm", "adam_beta1", "adam_beta2", "eval_strategy",
    "evaluation_strategy",
})
HF_DEFAULTS = {  # TrainingArguments' defaults, as gptrain settings
    "train.lr": 5e-5, "train.lr_schedule": "linear", "train.min_lr_ratio": 0.0, "train.weight_decay": 0.0,
    "train.beta1": 0.9, "train.beta2": 0.999, "train.precision": "fp32",
    # its cadence: log every 500 steps; evaluate only when asked (--do_eval: at the end; an
    # --eval_strategy: during training too, as TrainingArguments turns do_eval on for it)
    "metrics.log_every": 500, "train.do_eval": False, "train.eval_strategy": "no",
}
# A run given in nanoGPT's own config keys (any of NANOGPT_MARKERS, or a nanoGPT config file:
# nanogpt_config.py) takes the defaults of nanoGPT's train.py for what it does not give
# (train.dialect = "nanogpt"), and saves a checkpoint at each evaluation as nanoGPT does
# (checkpoint.every follows eval_interval unless given). Not among the markers: the keys gptrain's
# own users type as short forms too (--batch_size, --n_layer, --dropout, --device, --compile, ...).
NANOGPT_MARKERS = frozenset({
    "out_dir", "eval_interval", "log_interval", "eval_iters", "eval_only", "always_save_checkpoint", "init_from",
    "wandb_log", "wandb_run_name", "max_iters", "decay_lr", "warmup_iters", "lr_decay_iters", "min_lr", "backend",
    "dtype",
})
NANOGPT_DEFAULTS = {  # nanoGPT train.py's defaults, as gptrain settings (its model: GPT-2 124M, no biases)
    "model.preset": "gpt2", "model.bias": False, "model.dropout": 0.0, "train.lr": 6e-4, "train.min_lr": 6e-5,
    "train.max_steps": 600000, "train.warmup_steps": 2000, "train.decay_steps": 600000, "train.weight_decay": 0.1,
    "train.beta1": 0.9, "train.beta2": 0.95, "train.grad_clip": 1.0, "train.lr_schedule": "cosine",
    "train.eval_every": 2000, "train.eval_iters": 200, "train.batch_size": 12, "train.grad_accum_steps": 40,
    "train.seed": 1337, "metrics.log_every": 1,
}
DIALECTS = {"hf": (HF_MARKERS, HF_DEFAULTS), "nanogpt": (NANOGPT_MARKERS, NANOGPT_DEFAULTS)}
# the header's words when another tool's flags set the defaults (config_aliases.DIALECTS)
DIALECT_NOTES = {
    "hf": "\nthe HF Trainer's defaults fill what its flags leave out: lr 5e-5, linear decay to 0, no weight "
          "decay, AdamW betas (0.9, 0.999), fp32 unless --bf16/--fp16, the model's own dropout, logging every "
          "500 steps, evaluating only with --do_eval or an --eval_strategy (train.dialect=hf)",
    "nanogpt": "\nnanoGPT train.py's defaults fill what its keys leave out: GPT-2 124M, 600000 iterations, warmup "
               "2000, cosine to 6e-5 over 600000, batch 12 x 40 accumulated, eval and save every 2000 "
               "(train.dialect=nanogpt)"}

# Options that read a DeepSpeed JSON config into the settings gptrain has (deepspeed_config.py).
DEEPSPEED_FLAGS = ("deepspeed_config", "deepspeed")

# Words users type for a setting whose nearest spelling is another one ('dataset' is nearest to
# dataset_name, which only records a name): what they mean.
MEANT = {"data": "--data.path", "datasets": "--data.mix", "model": "--model.init_from",
         "steps": "--max_steps", "lr": "--learning_rate"}
