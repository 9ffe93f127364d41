#!/usr/bin/env bash
# The oldest Triton that pyproject.toml admits (3.4, torch 2.8's), installed into
# .triton-floor/: the tests that depend on the Triton version (scripts/triton_version_tests.sh)
# but the `compiler_specific` ones, which assert what 3.6 and newer compile the kernels to
# (3.4 spills elsewhere, and its persistent-CTA backward takes more shared memory than the
# planner estimates; a launch it refuses falls back, rnn/triton_backend.py). So on 3.4 every
# kernel runs in the interpreter, and every kind of kernel the planner launches compiles for
# sm_90 and fits an H100. Extra arguments go to pytest.
set -euo pipefail
exec bash "$(dirname "$0")/triton_version_tests.sh" 3.4.0 .triton-floor \
  -m "not compiler_specific" "$@"
