#!/usr/bin/env bash
# Builds .venv-floor/ for scripts/test_floor.sh: the oldest torch and Triton that
# pyproject.toml admits, together (torch 2.8.0 and the Triton it pins, 3.4.0), with the
# project installed editable. Does nothing where .venv-floor/ already has them. PyPI's torch
# 2.8 for Linux is a CUDA build (about 4.5 GB with the CUDA libraries it needs to import, GPU
# or not): mostly download time, so .ci/run starts this before the main suite and waits for
# it before the floor job.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version=2.8.0 triton_version=3.4.0 venv=.venv-floor
versions_ok() {
  "$venv/bin/python" -c "import sys, torch, triton; sys.exit(not (
    torch.__version__.split('+')[0] == '$torch_version' and triton.__version__ == '$triton_version'))" \
    2>/dev/null
}
if ! versions_ok || ! "$venv/bin/python" -c "import tritonrnn.rnn" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==$torch_version" "triton==$triton_version"
  # The editable install writes tritonrnn.egg-info/ into the tree; .ci/run runs
  # scripts/setup.sh and scripts/setup_floor.sh at once, so each takes this lock for it.
  mkdir -p build
  flock build/.editable-install.lock "$venv/bin/python" -m pip install -q -e ".[test,bench]"
  versions_ok || { echo "setup_floor.sh: installing the project changed torch or Triton" >&2; exit 1; }
fi
"$venv/bin/python" -c "import torch, triton; print('torch', torch.__version__, '/ Triton', triton.__version__)"
