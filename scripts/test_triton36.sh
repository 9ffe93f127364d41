#!/usr/bin/env bash
# The lent GPU machines run Triton 3.6; this project's environment has a newer one. This runs,
# against Triton 3.6 (PyPI, no dependencies, into .triton36/, put first on the path of the
# project's .venv), the tests that depend on the Triton version: the sm_90 ahead-of-time
# compiles (tests/test_aot.py: the spill and fit assertions with the GPU machine's compiler)
# and the kernels under 3.6's interpreter (its frontend: an API the GPU's Triton lacks fails
# here, not on the lent machine). Every kernel runs here: the CTA, cell and dropout tests
# whole, the grid kernels and the pair launches in their LSTM cases (the other cells share
# the kernels' code), and the op end to end through each family once (varlen with zero
# lengths); the end-to-end matrix over cells and layers is the main suite's.
# Needs .venv (scripts/setup.sh, as scripts/test.sh runs it). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
dir=.triton36
if ! PYTHONPATH=$PWD/$dir .venv/bin/python -c \
    "import triton, sys; sys.exit(triton.__version__ != '3.6.0')" 2>/dev/null; then
  rm -rf "$dir"
  .venv/bin/python -m pip install -q --no-deps --target "$dir" triton==3.6.0
fi
export PYTHONPATH=$PWD/$dir TRITON_INTERPRET=1
.venv/bin/python -c "import triton; print('Triton', triton.__version__, 'from', triton.__file__)"
.venv/bin/python -m pytest -q -n 2 -p no:cacheprovider \
  tests/test_aot.py tests/test_kernels_cta.py tests/test_cells.py tests/test_kernels_dropout.py \
  tests/test_kernels_grid.py tests/test_bidir_launch.py tests/test_triton_backend.py \
  -k "not (test_kernels_grid or test_bidir_launch or test_triton_backend) or (lstm and \
(test_kernels_grid or pair_launch or engine_pair or unidirectional_varlen_zero_lengths))" "$@"
