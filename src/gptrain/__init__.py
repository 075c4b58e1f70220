"""gptrain: train GPT-style language models from one process to many machines."""

__version__ = "0.1.0"
