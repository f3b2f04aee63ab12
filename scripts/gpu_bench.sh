#!/usr/bin/env bash
# On a GPU machine: does the input pipeline keep the GPU busy? ResNet-50 (torchvision, weights=None) training
# images/s in bf16 with channels_last (what configs/trainer/bf16.yaml with --model.channels_last true runs),
# fed by the project's pipeline from shards (decoding in the workers, then with data.decode_on=device),
# against synthetic batches already on the GPU (the upper bound). Prints both and their ratio; about 2-3
# minutes, most of it writing the demo shards and cuDNN's first steps.
#   scripts/gpu_bench.sh [--workers N] [--batch_size 256] [--steps 60] [--json true]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the project, installed or not
if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: no CUDA GPU is visible to torch; this benchmark measures a GPU" >&2
    exit 2
fi
exec "$PYTHON" benchmarks/gpu_bench.py "$@"
