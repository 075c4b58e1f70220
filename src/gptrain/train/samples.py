"""Samples during training (metrics.sample_every), as minGPT's chargpt and nanoGPT's sample.py
show them: every N steps the model writes metrics.sample_tokens tokens after
metrics.sample_prompt, and rank 0 logs them as one line.

Every rank runs the same generation (an FSDP-sharded model needs all of them; a DDP replica is
called as its plain module), from a generator of its own seeded by the step, in eval mode: the
training's random state, and so its losses, are those of a run without samples. Tensor and
pipeline parallel runs are refused samples (config_check.py).
"""

from __future__ import annotations

import json

import torch

from gptrain.errors import UserError
from gptrain.models.generate import generate
from gptrain.tokenizers import from_spec

TEMPERATURE, TOP_K = 0.8, 200  # nanoGPT's sample.py


class Sampler:
    """Writes the samples of one run: its tokenizer and encoded prompt, checked at start."""

    def __init__(self, metrics_cfg, tokenizer_spec: dict, seed: int):
        self.cfg, self.seed = metrics_cfg, seed
        self.tokenizer = from_spec(tokenizer_spec)
        try:
            self.prompt = self.tokenizer.encode(metrics_cfg.sample_prompt)
        except UserError as e:
            raise UserError(f"--metrics.sample_prompt {metrics_cfg.sample_prompt!r} cannot be written with "
                            f"this dataset's tokenizer ({e}); give another") from None
        if not self.prompt:
            raise UserError("--metrics.sample_prompt is empty once tokenized: give at least one character")

    def due(self, step: int) -> bool:
        return bool(self.cfg.sample_every) and step % self.cfg.sample_every == 0

    def line(self, part, step: int, device, autocast) -> str:
        """The sample at `step` as one log line (its newlines escaped as JSON does)."""
        model = getattr(part, "module", part)  # DDP's replica: its module, no gradient sync
        prompt = torch.tensor([self.prompt], dtype=torch.long, device=device)
        with torch.no_grad(), autocast():
            ids = generate(model, prompt, self.cfg.sample_tokens, TEMPERATURE, TOP_K, seed=self.seed + step)
        model.train()
        text = self.tokenizer.decode(ids[0, len(self.prompt):].tolist())
        return f"sample step {step}: {json.dumps(self.cfg.sample_prompt + text, ensure_ascii=False)}"
