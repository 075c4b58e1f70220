"""No library noise in a command's output: torchao's 'Failed to load ..._C_mxfp8' lines and torch's
_pytree enum deprecations printed by make demo and export (issue 38)."""

import subprocess
import sys


def test_importing_transformers_under_gptrain_prints_nothing():
    code = "import gptrain, transformers; from transformers import GPT2LMHeadModel"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr[-2000:]
