#!/usr/bin/env bash
# Creates .venv with the CPU torch wheel, Triton from PyPI and tritonrnn (editable, with its
# test and bench extras).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Pin the local CPU wheel first: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
# The editable install writes tritonrnn.egg-info/ into the tree; .ci/run runs
# scripts/setup.sh and scripts/setup_floor.sh at once, so each takes this lock for it.
mkdir -p build
flock build/.editable-install.lock .venv/bin/python -m pip install -q -e ".[test,bench]"
