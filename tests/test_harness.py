"""The test harness's own settings of Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="settings of Triton's interpreter")


@triton.jit
def _scale_kernel(x_ptr, out_ptr, k):
    tl.store(out_ptr, tl.load(x_ptr) * k)


def _builder():
    from triton.runtime import interpreter

    return interpreter.interpreter_builder


def test_overflow_checks_are_not_built_without_debug():
    options = _builder().options
    assert not options.debug
    assert not options.sanitize_overflow


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_int32_overflow_is_checked_only_in_debug(monkeypatch, debug):
    """The premise of conftest._drop_discarded_overflow_checks: with the overflow checks
    built, an int32 overflow raises in debug mode only."""
    builder = _builder()
    monkeypatch.setattr(builder, "options", dataclasses.replace(
        builder.options, sanitize_overflow=True, debug=debug))
    x = torch.tensor([1 << 16], dtype=torch.int32)
    out = torch.zeros_like(x)
    if debug:
        with pytest.raises(Exception, match="int32 overflow"):
            _scale_kernel[(1,)](x, out, 1 << 16)
    else:
        _scale_kernel[(1,)](x, out, 1 << 16)
        assert out.item() == 0  # 2**32, wrapped to 32 bits
    _scale_kernel[(1,)](x, out, 3)  # a product that fits passes either way
    assert out.item() == 3 << 16


def test_every_version_probe_is_a_test():
    """tests/version_probes.txt (scripts/version_probes.py) names tests that exist: a renamed
    test or case would otherwise fail the version jobs only (pytest: "not found")."""
    import subprocess
    import sys

    from helpers import ROOT

    probes = [line for line in (ROOT / "tests" / "version_probes.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert len(probes) >= 20 and len(set(probes)) == len(probes)
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *probes], cwd=ROOT, capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    collected = [line for line in res.stdout.splitlines() if "::" in line]
    assert sorted(collected) == sorted(probes)


def test_version_probes_know_every_kernel_function():
    """tests/version_probes.txt lists the functions kernels/ had when its probes were chosen:
    a function added or renamed since runs under the older releases' interpreters only if a
    probe happens to reach it, so the list must be chosen again (the message says how)."""
    from helpers import ROOT, load_script

    probes = load_script("version_probes")
    recorded = probes.recorded_functions((ROOT / "tests" / "version_probes.txt").read_text())
    current = probes.kernel_functions(ROOT)
    assert len(current) > 100
    added, gone = sorted(current.keys() - recorded), sorted(recorded.keys() - current)
    assert not added and not gone, (
        f"kernels/ has functions the probe list does not know ({added}) or lacks listed ones "
        f"({gone}): choose the probes again with `PYTHONPATH=.triton36 TRITON_INTERPRET=1 "
        f"python scripts/version_probes.py` (after `pip install -e .[probes]`)")


def test_compile_costs_are_asserted_under_the_release_the_version_job_installs():
    """The `compiler_specific` tests run under the calibration release only (tests/conftest.py
    skips them elsewhere), so the job meant to run them must install that release."""
    import re

    from helpers import ROOT, compile_costs_apply

    assert compile_costs_apply("3.6.0") and compile_costs_apply("3.6.1+git4a2b")
    assert not any(compile_costs_apply(v) for v in ("3.4.0", "3.9.0", "3.60.0", "4.6.0", "3"))
    job = (ROOT / "scripts" / "test_triton36.sh").read_text()
    (installed,) = re.findall(r"triton_version_tests\.sh\" ([\d.]+) ", job)
    assert compile_costs_apply(installed), installed
