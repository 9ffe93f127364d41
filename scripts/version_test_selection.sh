# Sourced by scripts/triton_version_tests.sh and scripts/test_floor.sh: the tests that depend
# on the Triton version. The sm_90 ahead-of-time compiles (tests/test_aot.py, whole), the
# interpreter's premise the tests' own settings rest on (tests/test_harness.py; see
# tests/conftest.py), the names and signatures the sources use (tests/test_source_names.py),
# and the kernels under the release's interpreter, where an API or a
# behaviour that release lacks fails on the line that uses it: tests/version_probes.txt, the
# few tests that together run every line of kernels/ that the kernel tests' LSTM, forward-time
# cases run (scripts/version_probes.py chooses them from coverage; about a third of those
# cases' time). The numerics of every case are the main suite's, under the newest Triton.
# shellcheck shell=bash
VERSION_TEST_FILES=(tests/test_aot.py tests/test_harness.py tests/test_source_names.py)
_probes="$(dirname "${BASH_SOURCE[0]}")/../tests/version_probes.txt"
# (Checked here: the process substitution below loses grep's exit status, so a missing file
# would select no probes and pass.)
if [ ! -r "$_probes" ]; then
  echo "version_test_selection.sh: $_probes is missing; scripts/version_probes.py writes it" >&2
  return 1
fi
mapfile -t VERSION_TEST_PROBES < <(grep -v -e '^#' -e '^$' "$_probes")
if [ "${#VERSION_TEST_PROBES[@]}" -eq 0 ]; then
  echo "version_test_selection.sh: $_probes lists no tests" >&2
  return 1
fi
