#!/usr/bin/env bash
# The lent GPU machines run Triton 3.6; this project's environment has a newer one. This runs
# the tests that depend on the Triton version (scripts/triton_version_tests.sh) against 3.6,
# installed into .triton36/: the compile tests whole, with what the compiles cost (spills,
# instruction and MMA counts, shared memory against the planner's estimates: the
# `compiler_specific` tests, which skip themselves under every other release: see
# tests/helpers.py), since the planner's rules are calibrated on 3.6's compiles.
# Extra arguments go to pytest.
set -euo pipefail
exec bash "$(dirname "$0")/triton_version_tests.sh" 3.6.0 .triton36 "$@"
