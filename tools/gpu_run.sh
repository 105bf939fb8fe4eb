#!/usr/bin/env bash
# Issue 33's long CPU work on a GPU lent for 15 minutes (an H200 with 16 cores, torch but no Ray,
# polars or pydantic, and another Python, so another stdlib): tools/one_gpu.py runs the
# specs below as 14 processes sharing the GPU, full fp32, following each lr ladder (sweep next),
# into stores under /tmp/r, and sends back what it wrote. In the repo root there:
#
#   bash tools/gpu_run.sh        # $OUT: run.log, cuda_tests.log, new.tar.xz.part-*
#
# .devcarry/ (git-ignored, carried): the polars runtime (tar.xz: its wheel is over the carry
# limit), the wheels of polars, pydantic, pydantic_core, annotated_types, typing_inspection and
# typing_extensions for CPython 3.12; this machine's stdlib corpus cache (train/val .npy.xz, meta,
# fingerprint 29047cfb62f1a3d8: the bytes every CPU trial trained on); the prepared English corpus
# (shakespeare.tar.xz, data/shakespeare_bytes). The specs beside this script (gpu_specs/):
# gpucheck.yaml (six d128 trials the CPU ran, to set the devices side by side), families_d192.yaml
# and families_d128.yaml (specs/families/families_ladders.yaml at one width each, the same trial ids).
# Back here: cat new.tar.xz.part-* | xz -d | tar x -C ROOT, then `sweep keep`.
# 2026-12-04 it ran three times on one H200 (device time 12.5 of 15 min): as written, then with
# SPECS="tools/gpu_specs/families_d128.yaml specs/attention/attention.yaml" LAUNCH_FOR=150 STOP_AFTER=225,
# then the same with LAUNCH_FOR=95 STOP_AFTER=160 (the first runs had .devcarry/specs/, now gpu_specs/).
# Local plumbing check (CPU, tiny windows): DEVICE=cpu SKIP_INSTALL=1 LAUNCH_FOR=20 STOP_AFTER=40 OUT=/tmp/o bash tools/gpu_run.sh
# (CARRY=DIR reads the carry from DIR, SCRATCH=DIR unpacks into DIR instead of /tmp, SPECS and PROCS
# replace the specs and the 14 processes: tests/test_tools.py runs it so on a tiny spec.)
set -uo pipefail
cd "$(dirname "$0")/.."
C=${CARRY:-.devcarry}; T=${SCRATCH:-/tmp}; OUT=${OUT:-$T/out}; R=${RESULTS:-$T/r}; DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$R"
if [[ -z "${SKIP_INSTALL:-}" ]]; then
  mkdir -p $T/site && tar xJf $C/prt.tar.xz -C $T/site || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $T/site $C/*.whl || exit 3
  export PYTHONPATH=$T/site:$PWD
fi
export PYTHONUNBUFFERED=1
mkdir -p $T/stdlib && xz -dc $C/train.npy.xz > $T/stdlib/train.npy && xz -dc $C/val.npy.xz > $T/stdlib/val.npy \
  && cp $C/meta.json $T/stdlib/ && tar xJf $C/shakespeare.tar.xz || exit 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; nproc
python3 -c "import torch, polars, pydantic, pyarrow, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
  'polars', polars.__version__, 'pydantic', pydantic.__version__, 'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__)" || exit 3
if [[ $DEVICE == cuda ]] && command -v nvidia-cuda-mps-control >/dev/null; then  # kernels of many processes at once
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  if nvidia-cuda-mps-control -d && timeout 60 python3 -c "import torch; print('mps check', torch.ones(2, device='cuda').sum().item())"; then
    echo "MPS on"
  else
    echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; echo "MPS off"
  fi
fi
for kept in families attention; do  # the CPU's trials: reused, and the ladders read them
  [[ -d $R/$kept ]] || cp -r docs/stores/$kept $R/$kept
done
touch $T/gpu_run.marker
if [[ $DEVICE == cuda ]]; then
  (timeout 240 python3 -m pytest -m cuda -q -o addopts="" -p no:cacheprovider tests/test_device.py tests/test_model.py \
     > $OUT/cuda_tests.log 2>&1; echo "pytest exit $?" >> $OUT/cuda_tests.log) &
fi
G=tools/gpu_specs
SPECS=${SPECS:-"$G/gpucheck.yaml $G/families_d192.yaml specs/english/english.yaml specs/sharing/sharing.yaml $G/families_d128.yaml"}
python3 tools/one_gpu.py $SPECS --results $R --procs ${PROCS:-14} --device $DEVICE --follow \
  --launch-for $((${LAUNCH_FOR:-370} - SECONDS)) --stop-after $((${STOP_AFTER:-490} - SECONDS)) --stdlib-corpus $T/stdlib \
  2>&1 | tee $OUT/run.log
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
wait
(cd $R && find . -type f -newer $T/gpu_run.marker ! -name '*.pt' ! -name 'run.lock' | tar cf - -T - | xz -T8 -3 \
  | split -b 15M -a 1 - $OUT/new.tar.xz.part-)
ls -la $OUT; echo "total ${SECONDS}s"
