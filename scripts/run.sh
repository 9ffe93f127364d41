#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the main job: `tritonrnn bench` on the default
# device (the GPU if present; else the smoke preset through the Triton interpreter on the CPU,
# which checks correctness and says that CPU timings say nothing about GPU speed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export TRITON_INTERPRET=1
fi
.venv/bin/tritonrnn bench "$@"
