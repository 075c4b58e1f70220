"""A run given in nanoGPT's keys or config file takes nanoGPT's defaults (train.dialect=nanogpt),
read against the vendored nanoGPT train.py itself; its config files are read, never run."""

import ast
import dataclasses
from pathlib import Path

import pytest

from gptrain.config_options import parse_train_args
from gptrain.errors import UserError

NANOGPT = Path(__file__).resolve().parents[1] / "third_party" / "nanogpt"
# train.py's settings that are this machine's or a source's, not a default gptrain can take: its
# dataset and wandb project (names), device 'cuda' and compile (gptrain: auto, on where it pays)
NOT_DEFAULTS = {("data", "path"), ("metrics", "wandb_project"), ("train", "device"), ("train", "compile")}
SHAPE = ("n_layer", "n_head", "n_embd", "block_size")


def train_py_defaults(tmp_path) -> Path:
    """nanoGPT train.py's literal defaults (its config keys), written out as a config file."""
    text = (NANOGPT / "train.py").read_text()
    lines = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "config_keys":
                break
            if isinstance(node.value, (ast.Constant, ast.BinOp)):  # (dtype is the machine's expression)
                lines.append(ast.get_source_segment(text, node))
    path = tmp_path / "train_py_defaults.py"
    path.write_text("\n".join(lines) + "\n")
    return path


def settings(cfg) -> dict:
    """Every setting of a config, the model's shape as its preset and overrides make it."""
    from gptrain.models.registry import PRESETS

    flat = {(s, k): v for s, values in dataclasses.asdict(cfg).items() for k, v in values.items()}
    for k in SHAPE:
        flat["model", k] = flat["model", k] or PRESETS[cfg.model.preset][k]
    return {key: value for key, value in flat.items() if key not in NOT_DEFAULTS}


def test_nanogpts_keys_take_the_defaults_of_nanogpts_train_py(tmp_path):
    stated = parse_train_args([str(train_py_defaults(tmp_path))])  # every default said, as train.py has it
    filled = parse_train_args(["--max_iters=600000"])  # one nanoGPT key: the dialect fills the rest
    assert filled.train.dialect == stated.train.dialect == "nanogpt"
    assert settings(filled) == settings(stated)
    assert (filled.train.warmup_steps, filled.train.grad_accum_steps, filled.checkpoint.every) == (2000, 40, 2000)
    # gptrain's own flags keep gptrain's defaults; --train.dialect says whose, whatever the keys
    assert parse_train_args(["--train.max_steps=5"]).train.warmup_steps == 0
    assert parse_train_args(["--max_iters=5", "--train.dialect=gptrain"]).train.grad_accum_steps == 1
    # saving follows eval_interval as nanoGPT's does, unless the save cadence is given
    assert parse_train_args(["--eval_interval=250"]).checkpoint.every == 250
    assert parse_train_args(["--eval_interval=250", "--save_steps=100"]).checkpoint.every == 100


def test_the_readme_line_with_its_config_file_reads_the_file_then_the_flags():
    cfg = parse_train_args([str(NANOGPT / "config" / "train_shakespeare_char.py"), "--device=cpu", "--compile=False",
                            "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12",
                            "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
                            "--lr_decay_iters=2000", "--dropout=0.0"])
    t, m = cfg.train, cfg.model
    # the file's: lr 1e-3, warmup 100, beta2 0.99, no accumulation, eval and save every 250, the best kept
    assert (t.lr, t.warmup_steps, t.beta2, t.grad_accum_steps, t.min_lr) == (1e-3, 100, 0.99, 1, 1e-4)
    assert (t.eval_every, cfg.checkpoint.every, cfg.checkpoint.keep_best, t.output_dir) == \
        (250, 250, True, "out-shakespeare-char")
    # the flags after it win, as nanoGPT's configurator applies them
    assert (t.eval_iters, cfg.metrics.log_every, m.block_size, t.batch_size, m.n_layer, t.max_steps, m.dropout) == \
        (20, 1, 64, 12, 4, 2000, 0.0)


@pytest.mark.parametrize("line, says", [
    ("import os\nos.system('touch {marker}')", "line 1: only NAME = value lines are read"),
    ("out_dir = __import__('os').system('touch {marker}')", "line 1: the value must be a number"),
    ("batch_size = 12\nout_dir = open('{marker}', 'w').name", "line 2: the value must be a number"),
    ("exec(\"open('{marker}', 'w')\")", "line 1: only NAME = value lines are read"),
    ("if True:\n    batch_size = 1", "line 1: only NAME = value lines are read"),
    ("batch_size, n_layer = 1, 2", "line 1: only NAME = value lines are read"),
    ("batch_sise = 12", "batch_sise is not one of nanoGPT's config keys (did you mean 'batch_size'?)"),
    ("max_iters = 10 ** 10 ** 10", "line 1: the value must be a number"),
    ("max_iters = 1 / 0", "line 1: the value must be a number"),
    ("max_iters = " + "-" * 100000 + "1", "is not Python gptrain can read"),
    ("max_iters = (", "is not Python gptrain can read"),
], ids=lambda v: str(v)[:30])
def test_a_config_file_is_read_never_run(tmp_path, line, says):
    marker = tmp_path / "ran"
    path = tmp_path / "config.py"
    path.write_text(line.replace("{marker}", str(marker)) + "\n")
    with pytest.raises(UserError) as e:
        parse_train_args([str(path)])
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not marker.exists()


def test_flags_of_both_tools_say_whose_defaults_in_one_line():
    with pytest.raises(UserError, match="--per_device_train_batch_size is the HF Trainer's flag and --max_iters "
                                        "nanoGPT's: .* --train.dialect=hf, nanogpt or gptrain"):
        parse_train_args(["--max_iters=5", "--per_device_train_batch_size=2"])
    assert parse_train_args(["--max_iters=5", "--per_device_train_batch_size=2",
                             "--train.dialect=hf"]).train.lr == 5e-5


def test_the_dataset_key_names_nanogpts_data_folder(tmp_path, monkeypatch):
    from tests.helpers import shakespeare_char, write_corpus

    monkeypatch.chdir(tmp_path)
    shakespeare_char(tmp_path / "data" / "shakespeare_char", write_corpus(tmp_path / "in.txt", 3000).read_text())
    assert parse_train_args(["--dataset=shakespeare_char"]).data.path == "data/shakespeare_char"
    assert parse_train_args(["--dataset=tiny"]).data.path == "tiny"  # no such folder: a pushed name, a path
    assert parse_train_args([f"--dataset={tmp_path}"]).data.path == str(tmp_path)
