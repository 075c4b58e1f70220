"""Every field of transformers' TrainingArguments is mapped, taken by value, accepted with a
reason or refused in one line with a reason (gptrain/hf_flags.py); docs/hf-trainer-flags.md is
generated from TrainingArguments itself, so a field transformers adds fails here first."""

import re
from pathlib import Path

import pytest

from gptrain import hf_flags
from gptrain.config_options import parse_train_args
from gptrain.config_aliases import ALIASES, DEEPSPEED_FLAGS
from gptrain.errors import UserError
from gptrain.train.optim import lr_at

DOC = Path(__file__).resolve().parents[2] / "docs" / "hf-trainer-flags.md"


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| `--")]


def test_every_training_arguments_field_has_a_meaning_here():
    missing = [n for n in hf_flags.training_arguments()
               if n not in DEEPSPEED_FLAGS and hf_flags.kind_of(n, ALIASES) is None]
    assert missing == [], f"add these to src/gptrain/hf_flags.py: {missing}"


def test_the_docs_table_is_the_generated_one_and_a_new_field_shows_as_missing(monkeypatch):
    assert _rows(DOC.read_text()) == _rows(hf_flags.table(ALIASES, DEEPSPEED_FLAGS)), \
        "regenerate: python -m gptrain.hf_flags > docs/hf-trainer-flags.md"
    fields = hf_flags.training_arguments()
    monkeypatch.setattr(hf_flags, "training_arguments", lambda: [*fields, "a_field_transformers_added"])
    assert "| `--a_field_transformers_added` | MISSING |" in hf_flags.table(ALIASES, DEEPSPEED_FLAGS)


def test_the_flags_a_new_user_met_work_or_say_why_not():
    cfg = parse_train_args(["--max_grad_norm", "0.5", "--warmup_ratio", "0.1", "--adam_beta2", "0.95",
                            "--dataloader_num_workers", "4", "--optim", "adamw_torch", "--save_strategy", "no",
                            "--torch_compile", "--lr_scheduler_type", "linear", "--disable_tqdm", "true"])
    tc = cfg.train
    assert (tc.grad_clip, tc.warmup_ratio, tc.beta2, tc.compile, tc.lr_schedule) == (0.5, 0.1, 0.95, True, "linear")
    assert cfg.checkpoint.every == 0
    best = parse_train_args(["--load_best_model_at_end", "--metric_for_best_model", "eval_loss", "--eval_strategy",
                             "steps", "--eval_steps", "50", "--save_steps", "100", "--save_total_limit", "2"]).checkpoint
    assert (best.keep_best, best.keep_last, best.every) == (True, 2, 100)
    with pytest.raises(UserError, match="set --do_eval and an --eval_strategy"):  # as the Trainer refuses it
        parse_train_args(["--load_best_model_at_end", "--eval_steps", "50", "--save_total_limit", "2"])
    assert lr_at(0, tc, 100) == pytest.approx(tc.lr / 10) and lr_at(9, tc, 100) == pytest.approx(tc.lr)
    for argv, says in ((["--lr_scheduler_type", "reduce_lr_on_plateau"], "follows an evaluation metric"),
                       (["--metric_for_best_model", "accuracy"], "lowest eval loss; another metric"),
                       (["--load_best_model_at_end", "--greater_is_better", "true"], "greater is not better"),
                       (["--load_best_model_at_end", "--eval_steps", "3", "--save_steps", "5"],
                        "checkpoint.every .5, --save_steps. must be a multiple of train.eval_every .3"),
                       (["--load_best_model_at_end", "--do_eval", "false"], "picks by eval loss: set --do_eval"),
                       (["--optim", "sgd"], "trains with AdamW"),
                       (["--push_to_hub"], "does not push to the Hugging Face Hub"),
                       (["--save_strategy", "epoch"], "every --save_steps steps")):
        with pytest.raises(UserError, match=says):
            parse_train_args(argv)


def test_every_fmengine_flag_has_a_meaning_here_and_the_seed_line_parses():
    missing = [n for n in hf_flags.FMENGINE_FIELDS if n not in DEEPSPEED_FLAGS and hf_flags.kind_of(n, ALIASES) is None]
    assert missing == [], f"add these to src/gptrain/hf_flags.py: {missing}"
    # the seed's line (tests/workflows run it as a job), with FMEngine's launcher-set and default flags spelled out
    cfg = parse_train_args(["--max_seq_len", "128", "--train_steps", "1000", "--eval_steps", "10", "--save_steps",
                            "1000", "--log_steps", "10", "--pipe_parallel_size", "2", "--model_parallel_size", "1",
                            "--use_fused_ops", "false", "--use_deepspeed", "true", "--local_rank", "0",
                            "--num_workers", "1", "--pretrain", "false", "--seed", "3407"])
    assert (cfg.model.block_size, cfg.train.max_steps, cfg.parallel.pp, cfg.train.seed) == (128, 1000, 2, 3407)
    for flags, words in ((["--pretrain", "true"], ["--pretrain", "random weights"]),
                         (["--cache_dir", "/x"], ["--cache_dir", "HF_HOME", "--data.cache_dir"])):
        with pytest.raises(UserError) as e:
            parse_train_args(flags)
        assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


NANOGPT = Path(__file__).resolve().parents[1] / "third_party" / "nanogpt" / "train.py"


def _nanogpt_keys() -> list[str]:
    """The config keys of the vendored nanoGPT train.py: its module-level names with a literal
    value, before `config_keys` (what its configurator lets --key=value override)."""
    import ast

    keys = []
    for node in ast.parse(NANOGPT.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "config_keys":
                break
            if isinstance(node.value, (ast.Constant, ast.BinOp, ast.IfExp)):
                keys.append(name)
    return keys


def test_every_nanogpt_config_key_has_a_meaning_here_and_its_readme_line_parses():
    assert list(hf_flags.NANOGPT_KEYS) == _nanogpt_keys()
    missing = [n for n in hf_flags.NANOGPT_KEYS if hf_flags.kind_of(n, ALIASES) is None]
    assert missing == [], f"add these to src/gptrain/hf_flags.py or config_aliases.py: {missing}"
    # nanoGPT's README, "I only have a macbook": its flags as typed
    cfg = parse_train_args(["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1",
                            "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
                            "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"])
    m, t = cfg.model, cfg.train
    assert (t.device, t.compile, t.eval_iters, cfg.metrics.log_every, m.block_size, t.batch_size) == \
        ("cpu", False, 20, 1, 64, 12)
    assert (m.n_layer, m.n_head, m.n_embd, t.max_steps, t.decay_steps, m.dropout) == (4, 4, 128, 2000, 2000, 0.0)
    by_value = parse_train_args(["--init_from=resume", "--dtype=bfloat16", "--decay_lr=False", "--eval_only=True",
                                 "--backend=gloo", "--wandb_run_name=mini"])
    assert (by_value.checkpoint.resume_from, by_value.train.precision, by_value.train.lr_schedule,
            by_value.train.do_train) == ("auto", "bf16", "constant", False)
    assert parse_train_args(["--init_from=gpt2-xl"]).model.init_from == "gpt2-xl"
    # nanoGPT's False saves a checkpoint only when the eval loss improves: gptrain keeps the best one
    assert parse_train_args(["--always_save_checkpoint=False"]).checkpoint.keep_best is True
    with pytest.raises(UserError, match="always_save_checkpoint takes True or False"):
        parse_train_args(["--always_save_checkpoint=sometimes"])


def test_nanogpts_learning_rate_schedule_past_its_warmup_is_its_own():
    """warmup_iters, lr_decay_iters, min_lr as nanoGPT's get_lr uses them (copied from the vendored
    train.py): the same rate at every step after the warmup, min_lr past lr_decay_iters."""
    import math

    lr, warmup, decay, floor, steps = 1e-3, 10, 100, 1e-4, 150

    def get_lr(it):  # nanoGPT's, verbatim but for its globals
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        if it > decay:
            return floor
        ratio = (it - warmup) / (decay - warmup)
        return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - floor)

    tc = parse_train_args([f"--learning_rate={lr}", f"--warmup_iters={warmup}", f"--lr_decay_iters={decay}",
                           f"--min_lr={floor}", f"--max_iters={steps}"]).train
    for it in range(warmup, steps):
        assert lr_at(it, tc, steps) == pytest.approx(get_lr(it), rel=1e-12, abs=1e-15), it
    assert lr_at(warmup - 1, tc, steps) == pytest.approx(lr)  # (nanoGPT's: lr * 10/11, one step later)


@pytest.mark.parametrize("kind, kwargs", [
    ("cosine", {}), ("linear", {}), ("constant_with_warmup", {}), ("cosine", {"num_cycles": 1.5}),
    ("cosine_with_restarts", {}), ("cosine_with_restarts", {"num_cycles": 3}), ("polynomial", {}),
    ("polynomial", {"lr_end": 1e-5, "power": 2.0}), ("inverse_sqrt", {}), ("inverse_sqrt", {"timescale": 20}),
    ("cosine_with_min_lr", {"min_lr": 1e-4}), ("cosine_with_min_lr", {"min_lr_rate": 0.2, "num_cycles": 1.0}),
    ("warmup_stable_decay", {"num_decay_steps": 15}),
    ("warmup_stable_decay", {"num_decay_steps": 10, "num_stable_steps": 20, "warmup_type": "cosine",
                             "decay_type": "1-sqrt", "min_lr_ratio": 0.1}),
])
def test_lr_scheduler_type_shapes_the_schedule_as_transformers_own_scheduler(kind, kwargs):
    """--lr_scheduler_type (and --lr_scheduler_kwargs, as transformers takes them) with
    --warmup_steps against transformers.get_scheduler driving a real optimizer: the same rate at
    every step past the warmup; in the warmup gptrain's step s takes the rate HF's scheduler gives
    step s + 1 (HF's first step runs at lr 0). #51: every SchedulerType a step-driven run can use
    (cosine_with_restarts and the rest were refused)."""
    import json

    import torch
    from transformers import get_scheduler

    lr, warmup, steps = 1e-3, 5, 50
    tc = parse_train_args(["--learning_rate", str(lr), "--warmup_steps", str(warmup), "--lr_scheduler_type", kind,
                           "--max_steps", str(steps), *(["--lr_scheduler_kwargs", json.dumps(kwargs)] if kwargs else [])]).train
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=steps,
                          scheduler_specific_kwargs=kwargs)
    hf = []
    for _ in range(steps + 1):
        hf.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for s in range(steps):
        assert lr_at(s, tc, steps) == pytest.approx(hf[s if s >= warmup else s + 1], rel=1e-12, abs=1e-18), (kind, s)
    assert len({round(lr_at(s, tc, steps), 15) for s in range(warmup, steps)}) > (1 if kind != "constant_with_warmup" else 0)


@pytest.mark.parametrize("argv, said", [
    (["--lr_scheduler_type", "reduce_lr_on_plateau"], "reduce_lr_on_plateau follows an evaluation metric"),
    (["--lr_scheduler_type", "warmup_stable_decay"], "needs --lr_scheduler_kwargs '{\"num_decay_steps\": N}'"),
    (["--lr_scheduler_type", "cosine_with_restarts", "--lr_scheduler_kwargs", '{"cycles": 3}'],
     "'cycles' is not an argument of the cosine_with_restarts schedule (it takes: num_cycles)"),
    (["--lr_scheduler_type", "cosine_with_restarts", "--lr_scheduler_kwargs", '{"num_cycles": 2.5}'],
     "num_cycles must be a number >= 0 (whole), got 2.5"),
    (["--lr_scheduler_type", "linear", "--lr_scheduler_kwargs", "num_cycles=3"], "must be a JSON object"),
    (["--lr_scheduler_type", "cosine_with_min_lr"], "needs one of min_lr and min_lr_rate"),
])
def test_a_schedule_that_cannot_run_is_one_line(argv, said):
    with pytest.raises(UserError, match=re.escape(said)):
        parse_train_args(argv)


def test_max_grad_norm_clips_the_global_norm_and_reports_it_before():
    import torch

    from gptrain.train.optim import clip_grads

    class Part(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))

    part = Part()
    part.a.grad, part.b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0, 0.0, 0.0])  # norm 5
    tc = parse_train_args(["--max_grad_norm", "1.0"]).train
    before = clip_grads([part], tc.grad_clip)
    after = torch.linalg.vector_norm(torch.cat([part.a.grad, part.b.grad]))
    assert float(before) == pytest.approx(5.0) and float(after) == pytest.approx(1.0, rel=1e-5)
    assert part.a.grad[0] / part.b.grad[1] == pytest.approx(3 / 4)  # the direction kept


def test_two_spellings_setting_the_precision_two_ways_are_refused():
    """HF's parser refuses `--bf16 --fp16`; gptrain ran fp16 unsaid (the last one won)."""
    for argv, said in ((["--bf16", "--fp16"], "--bf16 and --fp16 both set train.precision ('bf16', then 'fp16')"),
                       (["--fp16", "--torch_dtype", "bfloat16"], "--fp16 and --torch_dtype both set train.precision")):
        with pytest.raises(UserError, match=re.escape(said)):
            parse_train_args(argv)
    assert parse_train_args(["--bf16", "false", "--fp16"]).train.precision == "fp16"  # back to the default first
    assert parse_train_args(["--bf16", "--torch_dtype", "bfloat16"]).train.precision == "bf16"  # the same value
    # elsewhere a later spelling overrides, as a later flag does in argparse (a base list, then changes)
    assert parse_train_args(["--checkpoint.every=0", "--save_steps=1"]).checkpoint.every == 1


def test_hf_trainer_flags_take_the_trainers_defaults_for_what_they_leave_out(tmp_path):
    """#49 row 2: the tutorial's Trainer flags without --learning_rate or --lr_scheduler_type ran
    with gptrain's defaults (6e-4 cosine, weight decay 0.1, betas 0.9/0.95, precision auto). Now
    they take TrainingArguments' own (read from transformers here), the same rate every step as
    transformers' scheduler; gptrain's own flags keep gptrain's, and a given flag wins."""
    import torch
    from transformers import TrainingArguments, get_scheduler

    hf = TrainingArguments(output_dir=str(tmp_path / "hf"))
    steps = 20
    tc = parse_train_args(["--per_device_train_batch_size", "2", "--max_steps", str(steps)]).train
    assert tc.dialect == "hf"
    assert (tc.lr, tc.weight_decay, tc.beta1, tc.beta2) == (hf.learning_rate, hf.weight_decay, hf.adam_beta1,
                                                            hf.adam_beta2)
    assert tc.precision == "fp32" and not hf.bf16 and not hf.fp16 and tc.grad_clip == hf.max_grad_norm
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=hf.learning_rate)
    sched = get_scheduler(hf.lr_scheduler_type, opt, num_warmup_steps=hf.warmup_steps, num_training_steps=steps)
    for s in range(steps):
        assert lr_at(s, tc, steps) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-18), s
        opt.step()
        sched.step()
    # its cadence: logging every logging_steps, saving every save_steps, evaluating only when asked
    cfg = parse_train_args(["--per_device_train_batch_size", "2"])
    assert (cfg.metrics.log_every, cfg.checkpoint.every) == (hf.logging_steps, hf.save_steps)
    assert (cfg.train.do_eval, cfg.train.eval_strategy) == (hf.do_eval, str(hf.eval_strategy.value)) == (False, "no")
    asked = TrainingArguments(output_dir=str(tmp_path / "hf"), do_eval=True)  # run_clm's --do_eval: at the end
    cfg = parse_train_args(["--per_device_train_batch_size", "2", "--do_eval"])
    assert (cfg.train.do_eval, cfg.train.eval_strategy) == (asked.do_eval, str(asked.eval_strategy.value))
    during = TrainingArguments(output_dir=str(tmp_path / "hf"), eval_strategy="steps", eval_steps=7)
    cfg = parse_train_args(["--per_device_train_batch_size", "2", "--eval_strategy", "steps", "--eval_steps", "7"])
    assert (cfg.train.do_eval, cfg.train.eval_strategy, cfg.train.eval_every) == (during.do_eval, "steps", 7)
    assert parse_train_args(["--per_device_train_batch_size", "2", "--bf16", "--learning_rate", "1e-3"]).train.lr == 1e-3
    assert parse_train_args(["--per_device_train_batch_size", "2", "--bf16"]).train.precision == "bf16"
    ours = parse_train_args(["--train.batch_size=2", "--train.max_steps=20"]).train
    assert (ours.dialect, ours.lr, ours.lr_schedule, ours.precision) == ("gptrain", 6e-4, "cosine", "auto")
    mixed = parse_train_args(["--per_device_train_batch_size", "2", "--train.dialect=gptrain"]).train
    assert (mixed.dialect, mixed.lr) == ("gptrain", 6e-4)


def test_hf_trainer_flags_train_with_the_models_own_dropout_as_the_trainer_does(tiny_hf_gpt2):
    """#49 row 2: a GPT-2 the Trainer fine-tunes keeps its config's dropout (resid_pdrop 0.1 in
    transformers' GPT2Config); gptrain trained it at 0 under the same flags. gptrain's own flags
    keep 0, and --dropout (either dialect) wins."""
    from gptrain.train.model_init import build_model

    def dropout(*argv):
        model = build_model(parse_train_args(["--train.output_dir=/nonexistent", *argv]), 300)
        return model.config.dropout, model.transformer.drop.p

    assert dropout("--model_name_or_path", str(tiny_hf_gpt2)) == (0.1, 0.1)  # (the HF dialect: its marker)
    assert dropout(f"--model.init_from={tiny_hf_gpt2}") == (0.0, 0.0)
    assert dropout("--model_name_or_path", str(tiny_hf_gpt2), "--dropout", "0.05") == (0.05, 0.05)
