#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs ruff and the test suite on the Triton interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -n 2 --dist worksteal "$@"
