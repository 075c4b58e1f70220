"""Every recipe in configs/ parses and names a real preset."""

from pathlib import Path

import pytest

from gptrain import config, config_options
from gptrain.models.registry import PRESETS

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_recipe_parses(path):
    cfg = config.load_toml(path)
    assert cfg.model.preset in PRESETS


def test_deepspeed_recipe_applies():
    cfg = config_options.parse_train_args(["--deepspeed_config", str(CONFIGS[0].parent / "deepspeed-llama.json")])
    assert (cfg.train.batch_size, cfg.train.precision, cfg.train.lr, cfg.train.warmup_steps) == (4, "bf16", 2e-5, 100)
