#!/usr/bin/env bash
# The GPU path, measured: one prepared script, under 8 minutes on one H200.
#
#   benchmarks/gpu_check.sh [--write]     # on a CUDA machine; --write stores the measured
#                                         # FLOP/s in sweep/throughput.json for `sweep plan`
#   benchmarks/gpu_check.sh --cpu-smoke   # anywhere: the same pieces, tiny, on CPU (plumbing only)
#
# Runs the CUDA-marked tests, the MFU of a ~136M-parameter trial (bf16 + torch.compile, every
# metric on), rotated_adam vs adam step time at d_model 768 and 1280, and four quarter-GPU
# trials through `sweep run` on one GPU, and where there are two GPUs a two-worker data-parallel
# trial (Ray Train, DDP over NCCL) against one GPU; prints one table (benchmarks/gpu_check.py).
# Exit 2 without CUDA (unless --cpu-smoke), 1 if a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"

if [[ " $* " != *" --cpu-smoke "* ]]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device visible to torch (torch.cuda.is_available() is False)." >&2
    echo "gpu_check: run it on a GPU machine, or pass --cpu-smoke to check the plumbing on CPU." >&2
    exit 2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
if [[ " $* " == *" --cpu-smoke "* ]]; then
  exec "$PY" benchmarks/gpu_check.py "$@"        # a busy CPU box may take longer than the GPU budget
fi
exec timeout 470 "$PY" benchmarks/gpu_check.py "$@"
