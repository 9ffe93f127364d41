#!/usr/bin/env bash
# The oldest torch and Triton that pyproject.toml admits, together: torch 2.8.0 and the Triton
# it pins (3.4.0), in an environment of their own, .venv-floor/ (scripts/setup_floor.sh builds
# it where it is missing). Runs, under the interpreter:
# - the tests that depend on the Triton version (scripts/version_test_selection.sh); the
#   `compiler_specific` ones skip themselves, as under every release but 3.6 (tests/helpers.py:
#   3.4 spills elsewhere, and its persistent-CTA backward takes more shared memory than the
#   planner estimates; a launch it refuses falls back, rnn/triton_backend.py);
# - the tests of the torch APIs the library is built on: the custom ops, their fake
#   implementations and autograd, torch.compile, the modules, DDP, the TensorArray ops, the
#   planner and the command line, and the fallbacks from a launch Triton refuses (but the
#   cases of the projection and the split-K backward, whose kernels the version selection's
#   probes run and whose fallback is the library's own, as in the other cases).
# Extra arguments go to both pytest runs; a `-k` among them replaces the second run's
# exclusions below (pytest keeps the last -k), so it may select the two tests excluded there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/version_test_selection.sh
bash scripts/setup_floor.sh
venv=.venv-floor
export TRITON_INTERPRET=1
"$venv/bin/python" -m pytest -q -n 2 --dist worksteal -p no:cacheprovider \
  "${VERSION_TEST_FILES[@]}" "${VERSION_TEST_PROBES[@]}" "$@"
"$venv/bin/python" -m pytest -q -n 2 --dist worksteal -p no:cacheprovider \
  tests/test_compile.py tests/test_ops_api.py tests/test_ops_reference.py tests/test_modules.py \
  tests/test_errors.py tests/test_errors_random.py tests/test_tensorarray.py \
  tests/test_tensorarray_grad.py \
  tests/test_tensorarray_autograd.py tests/test_tensorarray_model.py tests/test_rnn_tensorarray.py \
  tests/test_ddp.py \
  tests/test_cli.py tests/test_planner.py tests/test_plan_pipeline.py \
  tests/test_out_of_resources.py \
  -k "not test_a_refused_split_k_backward_runs_the_familys_own and not cta_is_refused[lstm-5]" \
  "$@"
