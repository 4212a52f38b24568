#!/usr/bin/env bash
# Every figure of issue 37's "Must show" on one GPU (an H200), in one command, from the repo root:
#   bash results/engine-gpu/run_h200.sh            # writes results/engine-gpu/h200-*.json
# Smoke test without a GPU (a tiny shape on the CPU, the Triton kernels under the interpreter):
#   DEVICE=cpu bash results/engine-gpu/run_h200.sh
# Needs torch with CUDA, triton, transformers and the project (PYTHONPATH=src if not installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-src}
OUT=${OUT:-results/engine-gpu}
if [ "$DEVICE" = cuda ]; then
  # Qwen3-4B shape, bf16: batch 1, 64, 256 against transformers, ms/step against the roofline,
  # launches per step, graph capture, teacher-forced logits triton vs sdpa (about 3 min)
  $PY -m venusrl bench engine --device cuda --model-shape qwen3-4b --json "$OUT/h200-4b.json"
  # the 0.6B shape's step (the train loop's model), batch 1 and 64
  $PY -m venusrl bench engine --device cuda --model-shape qwen3-0.6b --cases 1:256:128,64:512:256 \
      --json "$OUT/h200-0.6b.json"
  # `venusrl train` with the 0.6B shape: generated tokens/s of the whole loop
  $PY results/engine-gpu/train_loop.py "$OUT/h200-train-0.6b.json"
else
  $PY -m venusrl bench engine --device cpu --model-shape tiny --cases 1:32:8,4:32:8 --json "$OUT/cpu-smoke.json"
  $PY results/engine-gpu/train_loop.py "$OUT/cpu-smoke-train.json" --device cpu --layers 2 --hidden 64 \
      --heads 4 --kv-heads 2 --head-dim 16 --steps 1 --slots 8
fi
