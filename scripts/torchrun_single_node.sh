#!/usr/bin/env bash
# Train on every GPU of one machine, one process per GPU, launched by torchrun.
#   scripts/torchrun_single_node.sh [train overrides...]
# (python -m project.train --config configs/trainer/ddp.yaml does the same: Lightning launches the processes.)
# Run it from the folder that holds data/ and logs/ (the repository root). Environment: GPUS (default: the
# GPUs torch sees, so CUDA_VISIBLE_DEVICES applies), PYTHON (default: python).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python}"
gpus="${GPUS:-$("$python" -c 'import torch; print(torch.cuda.device_count())')}"
if [ "$gpus" -lt 1 ]; then
  echo "error: no GPU visible; set GPUS=N (with --trainer.accelerator cpu for CPU processes)" >&2
  exit 2
fi
exec "$python" -m torch.distributed.run --standalone --nproc_per_node "$gpus" \
  -m project.train --config "$here/configs/trainer/ddp.yaml" --trainer.devices "$gpus" "$@"
