#!/usr/bin/env bash
# The device session's one call (issue 37): the CUDA tests, then GPT-2 124M throughput side by side
# (gptrain, nanoGPT's own train.py, the HF Trainer). Run from the repo root on a GPU machine whose
# python3 holds torch; OUT (default ./gpu-out) receives the logs. Wheels in .whl are installed first
# (crc32c is not in the device image); the bench data is read from $GPTRAIN_BENCH_CACHE.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD/src:$PWD:/tmp/site" PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } 2>&1 | tee "$OUT/env.txt"
timeout "${TESTS_S:-220}" python3 -m pytest -q -p no:cacheprovider --timeout 150 -rs tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
timeout "${BENCH_S:-260}" python3 bench/train_throughput.py --device cuda --repeat 1 --steps 20 --warmup 5 \
  --sides "${SIDES:-gptrain,nanogpt,hf-trainer}" 2>&1 | tee "$OUT/bench.log" | tail -30
