import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own GPTRAIN_HOME, so tests never see each other's jobs or datasets."""
    monkeypatch.setenv("GPTRAIN_HOME", str(tmp_path / "gptrain-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    return tmp_path / "gptrain-home"


@pytest.fixture(scope="session")
def tiny_hf_gpt2(tmp_path_factory):
    """A tiny random GPT2LMHeadModel saved by transformers itself (safetensors)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=50256, eos_token_id=50256)
    model = GPT2LMHeadModel(cfg).eval()
    out = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    model.save_pretrained(out)
    return out


def run_cli(*args, env=None, cwd=None, timeout=600):
    """Run `python -m gptrain ARGS` in a subprocess; returns CompletedProcess."""
    import subprocess

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "gptrain", *map(str, args)], capture_output=True,
                          text=True, env=full_env, cwd=cwd, timeout=timeout)
