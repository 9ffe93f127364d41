#!/usr/bin/env bash
# One batched run on a lent GPU machine (torch and Triton preinstalled, no package registry):
# install the project, run the GPU-marked tests, the benchmark presets against cuDNN and the
# barrier measurement; logs and JSON/PNG go to $OUT (the device tool brings them back), else
# to bench/results. Usage: bash scripts/gpu_session.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$out/gpu.txt"
python -m pytest -q -m gpu -x tests 2>&1 | tee "$out/gpu-tests.log" | tail -30
if [ "${1:-}" = quick ]; then
  tritonrnn bench --preset anchor --out "$out" 2>&1 | tee "$out/bench.log" | tail -40
else
  tritonrnn bench --preset targets --out "$out" 2>&1 | tee "$out/bench.log" | tail -60
  tritonrnn barrier --out "$out" 2>&1 | tee "$out/barrier.log" | tail -25
fi
