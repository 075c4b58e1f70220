import json
import os

import pytest

from gptrain import config, config_options
from gptrain.config_aliases import ALIASES
from gptrain.config_options import parse_train_args
from gptrain.errors import UserError
from gptrain.distributed.mesh import apply_global_batch
from tests.conftest import run_cli


def test_defaults_and_overrides(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[model]\npreset = "gpt2-mini"\n[train]\nlr = 1e-3\nmax_steps = 5\n')
    cfg = config_options.parse_train_args([str(toml), "--train.max_steps=7", "--model.dropout", "0.1",
                                   "--train.compile"])
    assert cfg.model.preset == "gpt2-mini" and cfg.train.lr == 1e-3
    assert cfg.train.max_steps == 7 and cfg.model.dropout == 0.1 and cfg.train.compile is True


def test_hf_trainer_flags_map_onto_canonical_keys():
    cfg = config_options.parse_train_args(
        "--do_train --do_eval --dataset_name wikitext --tokenized_dataset_load_dir /d "
        "--model_name_or_path openai-community/gpt2 --output_dir /o --per_device_train_batch_size 8 "
        "--per_device_eval_batch_size 4 --logging_steps 50 --save_steps 500 --eval_steps 250 "
        "--eval_strategy steps --torch_dtype float16 --attn_implementation flash_attention_2 "
        "--gradient_checkpointing --lr_scheduler_type constant_with_warmup --save_total_limit 2 "
        "--report_to none --max_train_samples 100".split())
    assert cfg.data.path == "/d" and cfg.model.init_from == "openai-community/gpt2"
    assert cfg.train.output_dir == "/o" and cfg.train.batch_size == 8 and cfg.train.eval_batch_size == 4
    assert cfg.metrics.log_every == 50 and cfg.checkpoint.every == 500 and cfg.train.eval_every == 250
    assert cfg.train.precision == "fp16" and cfg.model.attn_implementation == "flash_attention_2"
    assert cfg.train.activation_checkpointing == "full" and cfg.train.lr_schedule == "constant"
    assert cfg.checkpoint.keep_last == 2 and cfg.metrics.report_to == ["none"]
    assert cfg.data.max_train_samples == 100 and cfg.data.dataset_name == "wikitext"


def test_bool_flags_take_optional_values():
    cfg = config_options.parse_train_args(["--do_eval", "false", "--bf16", "--do_train", "True"])
    assert cfg.train.do_eval is False and cfg.train.do_train is True and cfg.train.precision == "bf16"


@pytest.mark.parametrize("argv, message", [
    (["--train.lrr=1"], "did you mean 'train.lr'"),
    (["--train.max_steps=abc"], "expected int"),
    (["--train.precision=fp8"], "choose one of"),
    (["--learning_rat", "1"], "did you mean 'learning_rate'"),
    (["--train.lr"], "needs a value"),
    (["--use_peft", "--lora_r", "4"], "unknown option --use_peft"),  # TRL's flags gptrain lacks: unknown,
    (["--load_in_8bit"], "unknown option --load_in_8bit .*did you mean 'load_in_4bit'"),  # not "needs a value"
    (["stray.toml"], "does not exist"),
])
def test_errors_are_one_clear_line(argv, message):
    with pytest.raises(UserError, match=message):
        config_options.parse_train_args(argv)


def test_bad_toml_and_unknown_section(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = 1")
    with pytest.raises(UserError, match="not valid TOML"):
        config.load_toml(bad)
    bad.write_text("[trian]\nlr = 1\n")
    with pytest.raises(UserError, match="did you mean 'train'"):
        config.load_toml(bad)
    bad.write_text("[train]\nlr = 'fast'\n")
    with pytest.raises(UserError, match="train.lr"):
        config.load_toml(bad)


def test_dump_roundtrip(tmp_path):
    cfg = config_options.parse_train_args(["--train.lr=0.01", "--report_to", "tensorboard,wandb"])
    path = tmp_path / "out.toml"
    path.write_text(config.dump_toml(cfg))
    assert config.load_toml(path) == cfg


def test_cli_config_errors_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    for args in (["train", "--nope.x=1"], ["train", "--train.lr=x"], ["train", str(bad)]):
        r = run_cli(*args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_train_help_lists_every_field():
    r = run_cli("train", "--help")
    assert r.returncode == 0
    for key in config.all_keys():
        assert f"--{key} " in r.stdout
    for alias in ALIASES:
        assert f"--{alias}" in r.stdout


def test_help_version_and_refusals_answer_before_torch_is_imported(tmp_path):
    """`--help`, `--version` and a refused `train` or `run` (a typo, a value out of bounds, a bad
    TOML, a job layout that cannot run) answer without loading torch: a typo took 12 s when the
    trainer was imported before the flags were read (issue 45; bench/cli_latency.py)."""
    import subprocess
    import sys

    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    refusals = [["train", "--nope.x=1"], ["train", "--train.batch_size=0"], ["train", str(bad)],
                ["run", "x", "--", "--nope=1"], ["run", "x", "--nodes", "1:2", "--", "--parallel.tp=3"],
                ["run", "x", "--", "--model.n_embd=32", "--model.n_head=3"]]
    code = ("import sys; from gptrain.cli import main\n"
            "for a in (['--help'], ['--version']):\n"
            "    try: main(a)\n"
            "    except SystemExit: pass\n"
            f"for a in {refusals!r}:\n"
            "    assert main(a) == 2, a\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "GPTRAIN_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("gptrain: error:") == len(refusals), r.stderr


def test_fmengine_flags_and_deepspeed_config(tmp_path, capsys):
    """FMEngine's pipeline-training command line, DeepSpeed JSON included."""
    ds = tmp_path / "llama.json"
    ds.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "train_batch_size": 32, "steps_per_print": 100,
        "gradient_clipping": 0.5, "bf16": {"enabled": True}, "fp16": {"enabled": False},
        "optimizer": {"type": "Adam", "params": {"lr": 5e-6, "betas": [0.9, 0.99], "eps": 1e-8}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
        "zero_optimization": {"stage": 1}, "wall_clock_breakdown": True}))
    cfg = parse_train_args([
        "--output_dir", "o", "--init_ckpt", "/pretrained/tinyllama", "--data_path", "d.jsonl",
        "--max_seq_len", "128", "--train_steps", "1000", "--eval_steps", "10", "--save_steps", "1000",
        "--log_steps", "10", "--pipe_parallel_size", "2", "--model_parallel_size", "1",
        "--use_flash_attn", "true", "--use_fused_ops", "false", "--deepspeed_config", str(ds)])
    assert (cfg.model.init_from, cfg.data.path, cfg.model.block_size) == ("/pretrained/tinyllama", "d.jsonl", 128)
    assert (cfg.train.max_steps, cfg.train.eval_every, cfg.checkpoint.every, cfg.metrics.log_every) == \
        (1000, 10, 1000, 10)
    assert (cfg.parallel.pp, cfg.parallel.tp) == (2, 1)
    assert cfg.model.attn_implementation == "flash_attention_2" and cfg.train.fused_loss is False
    assert (cfg.train.batch_size, cfg.train.grad_clip, cfg.train.precision) == (2, 0.5, "bf16")
    assert (cfg.train.lr, cfg.train.beta1, cfg.train.beta2) == (5e-6, 0.9, 0.99)
    assert cfg.train.warmup_steps == 0  # "auto" leaves gptrain's own value
    note = capsys.readouterr().err
    assert "steps_per_print" in note and "wall_clock_breakdown" in note and "train_batch_size" not in note
    assert cfg.train.global_batch_size == 32
    apply_global_batch(cfg, dp=2, pp=2)  # 16 per replica: one pipeline batch of 8 micro
    assert (cfg.train.batch_size, cfg.parallel.pp_microbatches, cfg.train.grad_accum_steps) == (16, 8, 1)
    apply_global_batch(cfg, dp=2, pp=2)  # again, as from the resolved config.toml: no change
    assert (cfg.train.batch_size, cfg.parallel.pp_microbatches) == (16, 8)
    # a flag after the file overrides it
    assert parse_train_args(["--deepspeed", str(ds), "--train.batch_size=4"]).train.batch_size == 4


def test_deepspeed_fp16_loss_scaling(tmp_path, capsys):
    ds = tmp_path / "fp16.json"
    ds.write_text(json.dumps({"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12,
                                       "loss_scale_window": 500, "hysteresis": 2,
                                       "min_loss_scale": 1, "auto_cast": False}}))
    tc = parse_train_args(["--deepspeed_config", str(ds)]).train
    assert (tc.precision, tc.loss_scale, tc.loss_scale_initial) == ("fp16", 0, 4096.0)
    assert (tc.loss_scale_window, tc.loss_scale_hysteresis, tc.loss_scale_min) == (500, 2, 1)
    assert "fp16.auto_cast" in capsys.readouterr().err  # named, not silently dropped
    ds.write_text(json.dumps({"fp16": {"enabled": "auto", "loss_scale": 256}}))
    tc = parse_train_args(["--deepspeed", str(ds)]).train
    assert (tc.precision, tc.loss_scale) == ("auto", 256)


@pytest.mark.parametrize("scheduler, expected", [
    ({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 50}},
     dict(lr_schedule="constant", lr=3e-4, warmup_steps=50)),
    ({"type": "WarmupDecayLR", "params": {"warmup_min_lr": 3e-5, "warmup_max_lr": 3e-4,
                                          "warmup_num_steps": 20, "total_num_steps": 400}},
     dict(lr_schedule="linear", lr=3e-4, warmup_steps=20, min_lr_ratio=0.1, max_steps=400)),
    ({"type": "WarmupCosineLR", "params": {"total_num_steps": 300, "warmup_num_steps": 10,
                                           "cos_min_ratio": 0.05}},
     dict(lr_schedule="cosine", lr=1e-3, warmup_steps=10, min_lr_ratio=0.05, max_steps=300)),
])
def test_deepspeed_schedulers_and_weight_decay_are_read(tmp_path, capsys, scheduler, expected):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0,
                                                                        "eps": 1e-6}},
                              "scheduler": scheduler}))
    tc = parse_train_args(["--deepspeed_config", str(ds)]).train
    assert {k: getattr(tc, k) for k in expected} == pytest.approx(expected)
    assert tc.weight_decay == 0.0
    note = capsys.readouterr().err
    assert "optimizer.params.eps" in note and "scheduler" not in note and "weight_decay" not in note


def test_deepspeed_scheduler_settings_gptrain_lacks_are_named(tmp_path, capsys):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"scheduler": {"type": "WarmupLR", "params": {
        "warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_type": "log", "last_batch_iteration": -1}}}))
    parse_train_args(["--deepspeed", str(ds)])
    note = capsys.readouterr().err
    for key in ("warmup_min_lr", "warmup_type", "last_batch_iteration"):
        assert f"scheduler.params.{key}" in note
    assert "warmup_max_lr" not in note


@pytest.mark.parametrize("content, message", [
    (None, "DeepSpeed config .* does not exist"),
    ('{"scheduler": {"type": "OneCycle"}}', "scheduler 'OneCycle' is not supported"),
    ("{not json", "is not valid JSON"),
    ('{"optimizer": {"type": "Lamb"}}', "optimizer 'Lamb' is not supported"),
])
def test_bad_deepspeed_configs(tmp_path, content, message):
    ds = tmp_path / "ds.json"
    if content is not None:
        ds.write_text(content)
    with pytest.raises(UserError, match=message):
        parse_train_args(["--deepspeed_config", str(ds)])


def test_global_batch_size_sets_accumulation():
    cfg = parse_train_args(["--train.batch_size=4", "--train.global_batch_size=32"])
    apply_global_batch(cfg, dp=2, pp=1)
    assert cfg.train.grad_accum_steps == 4
    for argv, dp, message in [(["--train.global_batch_size=30"], 2, "is not train.batch_size"),
                              (["--train.global_batch_size=32", "--train.grad_accum_steps=3"], 1,
                               "contradicts")]:
        with pytest.raises(UserError, match=message):
            apply_global_batch(parse_train_args(["--train.batch_size=4", *argv]), dp=dp, pp=1)


def test_a_key_in_the_wrong_section_is_pointed_to_its_section():
    """--train.block_size suggested 'train.batch_size'; the key is model.block_size (issue 39)."""
    from gptrain.config_options import parse_train_args
    from gptrain.errors import UserError

    with pytest.raises(UserError, match=r"unknown config key 'train.block_size' \(did you mean 'model.block_size'\?\)"):
        parse_train_args(["--train.block_size=64"])
    with pytest.raises(UserError, match=r"did you mean 'train.batch_size'"):
        parse_train_args(["--train.batchsize=4"])


def test_words_users_type_are_pointed_to_what_they_mean():
    from gptrain.config_options import parse_train_args
    from gptrain.errors import UserError

    with pytest.raises(UserError, match=r"unknown option --data \(did you mean '--data.path'\?\)"):
        parse_train_args(["--data", "shakespeare"])
    # --dataset suggested 'dataset_name' (issue 39); it is nanoGPT's key for the data now
    assert parse_train_args(["--dataset", "shakespeare"]).data.path == "shakespeare"
