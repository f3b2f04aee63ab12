#!/usr/bin/env bash
# Train on every GPU of one machine, one process per GPU, launched by torchrun.
#   scripts/torchrun_single_node.sh [train overrides...]
# (python -m project.train --config configs/trainer/ddp.yaml does the same: Lightning launches the processes.)
# Environment: GPUS (default: all visible GPUs), PYTHON (default: python).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
gpus="${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
exec "${PYTHON:-python}" -m torch.distributed.run --standalone --nproc_per_node "$gpus" \
  -m project.train --config "$here/configs/trainer/ddp.yaml" --trainer.devices "$gpus" "$@"
