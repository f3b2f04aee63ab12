#!/usr/bin/env bash
# Train on several machines: run this on every node with the same NNODES, MASTER_ADDR and MASTER_PORT,
# and NODE_RANK 0..NNODES-1. Lightning reads torchrun's environment; logs and checkpoints are written
# once, by global rank 0, so put logs/ on a filesystem the first node can write (shared or not).
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 scripts/torchrun_multi_node.sh [train overrides...]
# Environment: NNODES, NODE_RANK, MASTER_ADDR (required); MASTER_PORT (29500), GPUS_PER_NODE (the GPUs
# torch sees, so CUDA_VISIBLE_DEVICES applies; the same on every node), PYTHON (python).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
python="${PYTHON:-python}"
gpus="${GPUS_PER_NODE:-$("$python" -c 'import torch; print(torch.cuda.device_count())')}"
if [ "$gpus" -lt 1 ]; then
  echo "error: no GPU visible; set GPUS_PER_NODE=N (with --trainer.accelerator cpu for CPU processes)" >&2
  exit 2
fi
exec "$python" -m torch.distributed.run \
  --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$gpus" \
  --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" \
  -m project.train --config "$here/configs/trainer/ddp.yaml" \
  --trainer.num_nodes "$NNODES" --trainer.devices "$gpus" "$@"
