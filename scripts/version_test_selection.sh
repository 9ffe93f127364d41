# Sourced by scripts/triton_version_tests.sh and scripts/test_floor.sh: the tests that depend
# on the Triton version. The sm_90 ahead-of-time compiles (tests/test_aot.py) and the kernels
# under the release's interpreter (its frontend: an API that release lacks fails here). Every
# kernel runs: the CTA, cell, dropout and split-K tests whole, the grid kernels and the pair launches
# in their LSTM cases (the other cells share the kernels' code) in forward time order (the
# pair launches run direction 1 reversed), and the op end to end through each family once
# (varlen with zero lengths); the end-to-end matrix over cells, layers and directions is the
# main suite's. tests/test_harness.py checks the premise of the tests' own settings of the
# interpreter (tests/conftest.py) on that release.
# shellcheck shell=bash
VERSION_TEST_FILES=(
  tests/test_aot.py tests/test_kernels_cta.py tests/test_cells.py tests/test_kernels_dropout.py
  tests/test_kernels_grid.py tests/test_bidir_launch.py tests/test_triton_backend.py
  tests/test_harness.py tests/test_split_k.py
)
VERSION_TEST_K="not (test_kernels_grid or test_bidir_launch or test_triton_backend) or (lstm and \
not rev_dir and (test_kernels_grid or pair_launch or engine_pair or \
unidirectional_varlen_zero_lengths))"
