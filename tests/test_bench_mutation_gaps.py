"""The verdicts of tritonrnn.bench pinned where mutation testing found them unchecked (34
mutants of bench/'s correctness and failure paths, 17 let through by the suite; each fails
here): which tolerance each tensor is judged at, which tensors are compared, the baseline
bound, the report's failures, the check and tune verdicts and exit codes. Tiny shapes,
float64 oracle tensors perturbed by hand or runners replaced by stubs; nothing is timed."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch

from tritonrnn.bench import check, harness, oracle, presets, roofline, runners, tune
from tritonrnn.bench.cli import main
from tritonrnn.bench.timing import Timing, TimingConfig

NAMES = ("y", "hT", "cT", "dx", "dh0", "dc0", "dparams")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path / "cache"))
    # `--device cpu` sets TRITON_INTERPRET for the process; restore it after each test.
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "0"))


def _case(mode="lstm", batch=16, time=4, lengths=None):
    shape = presets.BenchShape(mode=mode, hidden=8, input_size=4, batch=batch, time=time,
                               dtype="float32")
    return runners.build_case(shape, torch.device("cpu"), lengths=lengths)


def _oracle_tensors(case) -> dict:
    ref = runners.compute_oracle(case)
    return {n: getattr(ref, n).clone() for n in NAMES if getattr(ref, n) is not None}


# ----------------------------------------------------------------------------- compare


def test_compare_judges_each_tensor_at_its_own_tolerance():
    """An error just above a tensor's tolerance fails, just below passes; outputs are judged
    at the output tolerance, which (tokens > K) is tighter than the gradients'."""
    case = _case()
    tols = runners.tolerances(case)
    assert tols["gradient"] > 1.5 * tols["output"]  # so that the two cannot be swapped
    ref = runners.compute_oracle(case)
    for name in NAMES:
        kind = "gradient" if name.startswith("d") else "output"
        expected = getattr(ref, name)
        scale = max(1.0, expected.abs().max().item())
        for factor, ok in ((1.2, False), (0.8, True)):
            got = _oracle_tensors(case)
            got[name].view(-1)[0] += factor * tols[kind] * scale
            verdict = runners.compare(case, got)
            assert verdict["ok"] is ok, (name, factor, verdict)
            assert verdict["scaled_error"][name] == pytest.approx(factor * tols[kind])


def test_compare_fails_when_the_oracle_itself_is_not_finite():
    """A non-finite reference (overflow in the oracle) against a finite result gives a NaN
    scaled error (inf / inf): no verdict of ok."""
    case = _case(batch=2, time=3)
    got = _oracle_tensors(case)
    case.ref.y.view(-1)[0] = math.inf
    assert math.isnan(oracle.scaled_error(got["y"], case.ref.y))
    assert not runners.compare(case, got)["ok"]


def test_tolerances_follow_the_documented_formula():
    """tol = 8 * (u_s * sqrt(1 + steps) + u_c * sqrt(K * steps)), u_c = fp32's 2^-24 for
    16-bit data; gradients use dot products of length max(K, tokens)."""
    for dtype, u_s in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        want = 8 * (u_s * math.sqrt(1 + 16) + 2.0**-24 * math.sqrt(64 * 16))
        assert oracle.tolerance(dtype, K=64, steps=16) == pytest.approx(want)
    case = _case()
    s = case.shape
    K = max(s.input, s.num_dirs * s.out_size) + s.out_size
    assert case.tokens > K
    tols = runners.tolerances(case)
    assert tols["output"] == pytest.approx(oracle.tolerance(torch.float32, K=K, steps=s.time))
    assert tols["gradient"] == pytest.approx(
        oracle.tolerance(torch.float32, K=case.tokens, steps=s.time))


@pytest.mark.parametrize(("mode", "names"), [("lstm", NAMES),
                                             ("gru", ("y", "hT", "dx", "dh0", "dparams"))])
def test_tritonrnn_runner_compares_every_tensor_the_oracle_has(mode, names):
    case = _case(mode=mode, batch=2, time=3)
    c = runners.tritonrnn_runner(case, "reference").correctness
    assert set(c["scaled_error"]) == set(names)
    assert c["ok"] and not c["missing"]


# ----------------------------------------------------------------------------- vs baseline


def _baseline_record(errors: dict, base: dict, lengths=None, packed: dict | None = None):
    shape = presets.BenchShape(mode="lstm", hidden=8, input_size=4, batch=2, time=3,
                               dtype="float32")
    case = SimpleNamespace(shape=shape, lengths=lengths, device=torch.device("cpu"))
    def correctness(errs: dict) -> dict:  # as runners.compare gives it, every tensor within
        return {"ok": True, "within_tolerance": True, "missing": [], "scaled_error": dict(errs)}

    impls = {"tritonrnn": {"correctness": correctness(errors)},
             "torch": {"correctness": correctness(base)}}
    if packed is not None:
        impls["torch-packed"] = {"correctness": correctness(packed)}
    record = {"implementations": impls}
    harness._compare_with_baseline(record, case)
    s = shape
    K = max(s.input, s.num_dirs * s.out_size) + s.out_size
    return record["implementations"]["tritonrnn"]["correctness"], oracle.tolerance(
        torch.float32, K=K, steps=1)


def test_baseline_bound_is_four_times_the_baselines_error_or_one_steps_rounding():
    c, floor = _baseline_record({"y": 4.4e-3}, {"y": 1e-3})
    assert c["vs_baseline"]["floor"] == pytest.approx(floor)
    assert c["vs_baseline"]["factor"] == 4.0
    assert not c["vs_baseline"]["ok"] and not c["ok"] and c["within_tolerance"]
    assert _baseline_record({"y": 3.6e-3}, {"y": 1e-3})[0]["ok"]
    # A baseline with no error: the one-step rounding bound decides.
    assert not _baseline_record({"y": 1.2 * floor}, {"y": 0.0})[0]["ok"]
    assert _baseline_record({"y": 0.8 * floor}, {"y": 0.0})[0]["ok"]


def test_one_tensor_beyond_the_baseline_bound_fails_the_implementation():
    c, _ = _baseline_record({"y": 0.0, "hT": 0.0, "dx": 1e-2}, {"y": 1e-3, "hT": 1e-3,
                                                                 "dx": 1e-3})
    assert [k for k, v in c["vs_baseline"]["tensors"].items() if not v["ok"]] == ["dx"]
    assert not c["vs_baseline"]["ok"] and not c["ok"] and c["within_tolerance"]


def test_a_varlen_shape_is_judged_against_the_packed_baseline():
    c, _ = _baseline_record({"y": 2e-3}, {"y": 1.0}, lengths=[3, 1], packed={"y": 1e-4})
    assert c["vs_baseline"]["baseline"] == "torch-packed"
    assert not c["ok"]


# ----------------------------------------------------------------------------- report


def _report(results: list[dict]) -> dict:
    opts = harness.BenchOptions(device=torch.device("cpu"))
    ceilings = roofline.Ceilings("cpu", 1e9, {"float32": 1e9})
    return harness._report(results, opts, ceilings, {}, [torch.float32], "custom", [],
                           "2026-01-01T00:00:00+00:00")


def _result(label: str, tritonrnn: dict, runs=()) -> dict:
    return {"label": label, "implementations": {"tritonrnn": tritonrnn}, "runs": list(runs)}


def test_report_fails_every_kind_of_tritonrnn_failure():
    ok = {"ok": True, "missing": [], "within_tolerance": True}
    results = [
        _result("errored", {"status": "error", "reason": "ValueError: boom"}),
        _result("baseline", {"status": "ok", "correctness": {
            "ok": False, "missing": [], "within_tolerance": True,
            "vs_baseline": {"ok": False}}}),
        _result("timed", {"status": "ok", "correctness": ok},
                runs=[{"impl": "tritonrnn", "pass": "bwd", "status": "error",
                       "reason": "RuntimeError: launch"},
                      {"impl": "tritonrnn", "pass": "fwd", "status": "ok"}]),
        _result("fine", {"status": "ok", "correctness": ok},
                runs=[{"impl": "tritonrnn", "pass": "fwd", "status": "ok"}]),
        _result("both", {"status": "ok", "correctness": {
            "ok": False, "missing": ["dc0"], "within_tolerance": False}}),
        _result("absent", {"status": "ok", "correctness": {
            "ok": False, "missing": ["dh0", "dc0"], "within_tolerance": True}}),
    ]
    failures = _report(results)["failures"]
    assert failures == [
        "errored: tritonrnn error: ValueError: boom",
        "baseline: tritonrnn more than 4x the baseline's error",
        "timed: tritonrnn bwd RuntimeError: launch",
        # A missing tensor and one outside its tolerance: the message names both.
        "both: tritonrnn without dc0 and outside the dtype tolerance",
        "absent: tritonrnn without dh0, dc0",
    ]


# ----------------------------------------------------------------------------- check


def _check_rows(monkeypatch, correctness: dict) -> list[dict]:
    runner = runners.Runner("tritonrnn", correctness=correctness)
    monkeypatch.setattr(runners, "build_case", lambda *a, **k: object())
    monkeypatch.setattr(runners, "tritonrnn_runner", lambda data, backend: runner)
    base = presets.BenchShape(mode="gru", hidden=8, batch=2, time=3, dtype="float32")
    return check.run_check(check.check_cases(base, ("gru",))[:1], torch.device("cpu"),
                           "reference", progress=False)


@pytest.mark.parametrize("errors, missing", [
    ({"y": 2e-5, "dx": 0.0}, []),  # above the output tolerance, below the gradients'
    ({"y": 0.0, "dx": 0.0}, ["dh0"]),  # a gradient not given
], ids=["output-tolerance", "missing"])
def test_check_row_verdict_is_the_comparisons(monkeypatch, errors, missing):
    """A row's status is the comparison's verdict (`ok` False here, for the reason the id
    names), not one check re-derives from the errors: the errors alone are within the
    gradient tolerance, and a missing tensor has no error to weigh (runners.compare's rules
    themselves: test_compare_fails_an_output_the_implementation_did_not_give and the
    tolerance tests above)."""
    (row,) = _check_rows(monkeypatch, {
        "ok": False, "missing": missing, "scaled_error": errors,
        "max_scaled_error": max(errors.values()),
        "tolerance": {"output": 1e-5, "gradient": 1e-4}})
    assert row["status"] == "FAIL"


def test_check_lengths_have_a_zero_a_one_and_a_full_sequence_unsorted():
    for batch, time in ((5, 4), (8, 6), (16, 3)):
        lens = check.check_lengths(batch, time)
        assert len(lens) == batch and {0, 1, time} <= set(lens)
        assert lens != sorted(lens, reverse=True)


def test_format_check_counts_error_rows_as_failed():
    base = presets.BenchShape(mode="gru", hidden=8, batch=2, time=3, dtype="float32")
    (case,) = check.check_cases(base, ("gru",))[:1]
    rows = [{"case": case.label, "status": "ERROR", "reason": "RuntimeError: boom"}]
    assert check.format_check(rows, "CPU", "reference", "float32").endswith(
        "0/1 combinations pass; 1 FAILED")


# ----------------------------------------------------------------------------- tune


def test_tune_key_never_keeps_a_choice_without_a_finite_time(tmp_path):
    choices = [{"family": "stepwise", "num_warps": w} for w in (1, 2, 4)]
    ms = {1: math.nan, 2: 2.0, 4: math.inf}
    summary = tune.tune_key("k9", choices, lambda c, b: ms[c["num_warps"]], "dev")
    assert summary["status"] == "tuned" and summary["best"] == {**choices[1], "ms": 2.0}
    # Each alone, and first: nothing kept (an inf after a finite time cannot win anyway).
    for bad in (math.inf, math.nan):
        summary = tune.tune_key(f"k9-{bad}", choices[:1], lambda c, b, bad=bad: bad, "dev")
        assert summary["status"] != "tuned" and "best" not in summary, summary


def _stub_measurer(monkeypatch, correctness: dict, one_ms: float = 1.0):
    runner = runners.Runner("tritonrnn", passes={"fwdbwd": lambda: None},
                            correctness=correctness)
    monkeypatch.setattr(runners, "build_case", lambda *a, **k: object())
    monkeypatch.setattr(runners, "compute_oracle", lambda case: None)
    monkeypatch.setattr(runners, "tritonrnn_runner", lambda case, backend: runner)
    monkeypatch.setattr(tune, "measure", lambda fn, device_type, cfg: Timing(3.0, 3.0, 3.0))
    monkeypatch.setattr(tune, "one_run_ms", lambda fn, device_type: one_ms)
    shape = presets.BenchShape(mode="lstm", hidden=8, batch=2, time=3, dtype="float32")
    return tune.shape_measurer(shape, torch.device("cpu"), TimingConfig())


def test_tune_rejects_a_choice_outside_tolerance(monkeypatch):
    measure_choice = _stub_measurer(monkeypatch, {"ok": False, "missing": [],
                                                  "max_scaled_error": 0.5})
    with pytest.raises(ValueError, match="outside tolerance"):
        measure_choice({}, None)


def test_tune_screens_out_only_a_choice_slower_than_its_bound(monkeypatch):
    measure_choice = _stub_measurer(monkeypatch, {"ok": True, "missing": [],
                                                  "max_scaled_error": 0.0}, one_ms=10.0)
    assert measure_choice({}, 5.0) == tune.Screened(10.0)
    assert measure_choice({}, 20.0) == 3.0
    assert measure_choice({}, None) == 3.0


def test_tune_exits_1_when_a_key_failed(monkeypatch, capsys):
    summaries = [
        {"label": "a", "key": "ka", "status": "tuned", "candidates": 1,
         "measured": {"x": {"ms": 1.0}}, "best": {"family": "stepwise", "ms": 1.0}},
        {"label": "b", "key": "kb", "status": "failed", "candidates": 1,
         "measured": {"y": {"ms": None, "error": "ValueError: outside tolerance"}}},
    ]
    monkeypatch.setattr(tune, "tune_shapes", lambda *a, **k: summaries)
    assert main(["tune", "--allow-cpu", "--device", "cpu", "--no-progress"]) == 1
    assert "FAILED, no candidate ran" in capsys.readouterr().out
