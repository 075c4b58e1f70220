"""gptrain: train GPT-style language models from one process to many machines."""

import logging as _logging

__version__ = "0.1.0"

# torchao (imported by transformers and by torch.compile's inductor when it is installed) logs
# every CUDA-only kernel library it cannot load on a CPU, and torch a deprecation about enums it
# registers: noise in every command's output (make demo, export), not news to a user.
for _noisy in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_noisy).setLevel(_logging.ERROR)
