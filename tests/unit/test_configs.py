"""Every recipe in configs/ parses and names a real preset."""

from pathlib import Path

import pytest

from gptrain import config
from gptrain.models.registry import PRESETS

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_recipe_parses(path):
    cfg = config.load_toml(path)
    assert cfg.model.preset in PRESETS
