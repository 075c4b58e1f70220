"""What every seed workflow must end with, checked the same way for each (see test_seeds.py)."""

import json

import pytest
import torch

from gptrain import run_layout
from tests.job_helpers import ok, wait_for
@pytest.fixture
def jobs_home(isolated_home, monkeypatch):
    """Two CPU slots, one thread per rank; whatever is still running at the end is stopped."""
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield isolated_home
    from tests.job_helpers import stop_all
    stop_all()


def metrics(name: str) -> list[dict]:
    from gptrain.jobs.folder import job_dir

    return [json.loads(line) for line in run_layout.metrics_file(job_dir(name)).read_text().splitlines()]


def assert_workflow_outcome(name: str, tmp_path, dataset: str | None = None) -> None:
    """The job succeeds, its loss falls, eval ran, its checkpoints are listed with losses, the
    fetched checkpoint exported to HF loads in transformers with gptrain's logits, and text is
    generated from the job's name."""
    job = wait_for(name, timeout=900)
    if job["state"] != "succeeded":
        raise AssertionError(f"{name}: {job['state']} ({job['error']})\n{ok('logs', name)[-3000:]}")
    rows = metrics(name)
    train = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(train) >= 4 and sum(train[-2:]) / 2 < sum(train[:2]) / 2, train  # the loss falls
    assert any("eval/loss" in r for r in rows), "eval did not run"
    ckpts = json.loads(ok("checkpoints", name, "--json"))
    assert ckpts and all(c["train_loss"] is not None for c in ckpts), ckpts
    fetched = tmp_path / f"{name}-hf"
    ok("checkpoint", "fetch", ckpts[-1]["id"], "--destination", fetched)  # as the tutorial types it (#49)
    from transformers import AutoModelForCausalLM

    from gptrain.models.load import load_model

    theirs = AutoModelForCausalLM.from_pretrained(fetched).eval()
    ours, _ = load_model(ckpts[-1]["path"])
    ids = torch.randint(0, min(theirs.config.vocab_size, 60), (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), atol=1e-4, rtol=1e-4)
    out = ok("generate", name, "--prompt", "The", "--max-new-tokens", "8", "--seed", "1")
    assert out.startswith("The") and len(out) > 3, out
    if dataset:
        assert "perplexity" in ok("eval", name, "--dataset", dataset)
