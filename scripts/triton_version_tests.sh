#!/usr/bin/env bash
# Runs the tests that depend on the Triton version (scripts/version_test_selection.sh) against
# one Triton release:
#   bash scripts/triton_version_tests.sh VERSION DIR [pytest args...]
# installs Triton VERSION (PyPI, no dependencies) into DIR and puts it first on the path of the
# project's .venv (scripts/setup.sh, as scripts/test.sh runs it). Used by
# scripts/test_triton36.sh (the GPU machines' release); scripts/test_floor.sh runs the same
# selection in an environment of its own (the oldest torch and Triton).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$1 dir=$2
shift 2
source scripts/version_test_selection.sh
[ -x .venv/bin/python ] || bash scripts/setup.sh
if ! PYTHONPATH=$PWD/$dir .venv/bin/python -c \
    "import triton, sys; sys.exit(triton.__version__ != '$version')" 2>/dev/null; then
  rm -rf "$dir"
  .venv/bin/python -m pip install -q --no-deps --target "$dir" "triton==$version"
fi
export PYTHONPATH=$PWD/$dir TRITON_INTERPRET=1
.venv/bin/python -c "import triton; print('Triton', triton.__version__, 'from', triton.__file__)"
.venv/bin/python -m pytest -q -n 2 --dist worksteal -p no:cacheprovider "${VERSION_TEST_FILES[@]}" \
  "${VERSION_TEST_PROBES[@]}" "$@"
