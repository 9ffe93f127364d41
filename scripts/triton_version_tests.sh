#!/usr/bin/env bash
# Runs the tests that depend on the Triton version against one Triton release:
#   bash scripts/triton_version_tests.sh VERSION DIR [pytest args...]
# installs Triton VERSION (PyPI, no dependencies) into DIR, puts it first on the path of the
# project's .venv, and runs the sm_90 ahead-of-time compiles (tests/test_aot.py) and the
# kernels under that release's interpreter (its frontend: an API that release lacks fails
# here). Every kernel runs: the CTA, cell and dropout tests whole, the grid kernels and the
# pair launches in their LSTM cases (the other cells share the kernels' code), and the op end
# to end through each family once (varlen with zero lengths); the end-to-end matrix over
# cells and layers is the main suite's. Used by scripts/test_triton36.sh (the GPU machines'
# release) and scripts/test_triton_floor.sh (the oldest supported). Needs .venv
# (scripts/setup.sh, as scripts/test.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$1 dir=$2
shift 2
[ -x .venv/bin/python ] || bash scripts/setup.sh
if ! PYTHONPATH=$PWD/$dir .venv/bin/python -c \
    "import triton, sys; sys.exit(triton.__version__ != '$version')" 2>/dev/null; then
  rm -rf "$dir"
  .venv/bin/python -m pip install -q --no-deps --target "$dir" "triton==$version"
fi
export PYTHONPATH=$PWD/$dir TRITON_INTERPRET=1
.venv/bin/python -c "import triton; print('Triton', triton.__version__, 'from', triton.__file__)"
.venv/bin/python -m pytest -q -n 2 -p no:cacheprovider \
  tests/test_aot.py tests/test_kernels_cta.py tests/test_cells.py tests/test_kernels_dropout.py \
  tests/test_kernels_grid.py tests/test_bidir_launch.py tests/test_triton_backend.py \
  -k "not (test_kernels_grid or test_bidir_launch or test_triton_backend) or (lstm and \
(test_kernels_grid or pair_launch or engine_pair or unidirectional_varlen_zero_lengths))" "$@"
