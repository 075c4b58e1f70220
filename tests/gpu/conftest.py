"""tests/gpu: the CUDA paths, run by `make test-gpu` on a machine with an NVIDIA GPU.

Without CUDA every test here is skipped with one line saying so, so `make test` stays green on
CPU-only CI. On a GPU they use the GPU's own torch (gptrain allows torch >= 2.5).
"""

import pytest
import torch

CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
