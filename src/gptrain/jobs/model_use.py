"""Using a model by the name a user gives it, whole, for every face (the CLI's generate, eval and
export; the console's "try it"; a Python caller): MODEL is a job name, a checkpoint ID or folder,
a Hugging Face directory or hub id (jobs/found.model_source picks the checkpoint), and a model
without a tokenizer of its own takes its job's dataset's."""

from __future__ import annotations

from dataclasses import replace

from gptrain.jobs.found import dataset_tokenizer, model_source


def generate(ref: str, sampling) -> list[str]:
    """The texts sampled from MODEL `ref` (models/api.py Sampling says how)."""
    from gptrain.models.api import generate as sample

    if sampling.fallback_tokenizer is None:
        sampling = replace(sampling, fallback_tokenizer=dataset_tokenizer(ref))
    return sample(model_source(ref), sampling, name=ref)


def evaluate(ref: str, dataset: str, split: str | None = None, batch_size: int = 8,
             max_blocks: int | None = None, device: str = "auto",
             fetch_timeout: float | None = None) -> tuple[dict, list[str]]:
    """MODEL `ref`'s loss, perplexity, accuracy and tokens on `dataset` (train/api.py evaluate),
    and notes."""
    from gptrain.train.api import evaluate as run

    return run(model_source(ref), dataset, split, batch_size, max_blocks, device, fetch_timeout)


def export(ref: str, out, fmt: str = "hf"):
    """MODEL `ref` written as a new directory `out` (models/api.py export: hf or peft)."""
    from gptrain.models.api import export as write

    return write(model_source(ref), out, fmt)
