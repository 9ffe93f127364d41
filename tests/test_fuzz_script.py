"""scripts/fuzz_configs.py (random configurations against the float64 oracle): its draws are
reproducible and reach every cell, family and switch; a few cases run clean, and a case that
fails is reported as one (exit status 1)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import load_script

FZ = load_script("fuzz_configs")


def test_draws_are_reproducible_and_varied():
    assert FZ.draw(5) == FZ.draw(5) and FZ.draw(5) != FZ.draw(6)
    cases = [FZ.draw(i) for i in range(300)]
    assert {c["shape"]["mode"] for c in cases} == {"lstm", "gru", "rnn_tanh", "rnn_relu"}
    assert {c["constraints"].get("family") for c in cases} == {
        None, "persistent_cta", "persistent_grid", "stepwise"}
    assert len({c["env"].get("TRITONRNN_HOIST_WEIGHTS") for c in cases}) == 5
    assert any(0 in c["shape"]["lengths"] for c in cases)
    assert {c["kernel"].get("_MAX_CHUNK") for c in cases} == {None, 16, 32}
    assert {c["kernel"].get("_XJOIN_TILE") for c in cases} == {None, 16 * 64}
    assert {c["kernel"].get("_LATE_TILE") for c in cases} == {None, 16 * 64}
    assert {c["kernel"].get("_HOIST_8WARP_THREAD_BYTES") for c in cases} == {None, 8}
    assert 64 in {c["constraints"].get("block_b") for c in cases}
    assert {c["split_k"] for c in cases} == {False, True}
    assert {c["split_k1"] for c in cases} == {False, True}
    assert {c["constraints"].get("split_k_bwd") for c in cases} == {None, 0, 1, 2}
    assert all(c["shape"]["proj"] < c["shape"]["H"] or c["shape"]["proj"] == 0 for c in cases)


def test_cases_run_clean(tmp_path):
    from tritonrnn.kernels import grid_tiles as gt

    before = {k: os.environ.get(k) for k in FZ.SWITCHES}
    knobs = ("_MAX_CHUNK", "_XJOIN_TILE", "_LATE_TILE", "_HOIST_8WARP_THREAD_BYTES")
    constants = {k: getattr(gt, k) for k in knobs}
    # One case that sets the chunk width and two more of the kernel module's constants.
    start = next(i for i in range(100) if len(FZ.draw(i)["kernel"]) >= 3
                 and "_MAX_CHUNK" in FZ.draw(i)["kernel"])
    out = tmp_path / "fuzz.jsonl"
    for first in (0, start):
        assert FZ.main(["--cases", "2" if first == 0 else "1", "--start", str(first),
                        "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["case"] for r in recs] == [0, 1, start]
    assert {r["status"] for r in recs} <= {"ok", "refused"}
    assert any(r["status"] == "ok" for r in recs)
    assert recs[-1]["kernel"] == FZ.draw(start)["kernel"]
    assert {k: os.environ.get(k) for k in FZ.SWITCHES} == before  # switches restored
    assert {k: getattr(gt, k) for k in knobs} == constants  # and the kernel constants
    from tritonrnn.kernels import split_k

    assert split_k._BWD_SPLIT_K is False  # and the split-K switches
    assert split_k._BWD_SPLIT_K1 is False


def test_a_failing_case_is_reported(tmp_path, monkeypatch, capsys):
    import helpers

    def wrong(*_a, **_k):
        raise AssertionError("output: mismatch")

    monkeypatch.setattr(helpers, "compare_with_torch", wrong)
    assert FZ.main(["--cases", "1", "--start", "1"]) == 1
    assert "case 1 FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("error, status", [
    (ValueError("plan_constraints: block_h = 8 needs vector tiles"), "refused"),
    (ValueError("R: expected [4*H, Hout] for cell 'lstm', got [8, 3]"), "failed"),
])
def test_only_the_planners_refusals_count_as_refused(error, status, monkeypatch):
    """A ValueError from a launcher's own checks (a wiring bug between the engine and the
    kernels) is a failure, not a refusal of the drawn constraints."""
    import helpers

    def raising(*_a, **_k):
        raise error

    monkeypatch.setattr(helpers, "compare_with_torch", raising)
    assert FZ.run_case(FZ.draw(1))["status"] == status


@pytest.mark.parametrize("two, one, want", [(True, True, {"one": 1, "two": 0}),
                                            (True, False, {"one": 0, "two": 1}),
                                            (False, False, {"one": 0, "two": 0})])
def test_a_case_records_the_split_k_launches_its_backward_made(two, one, want):
    """A grid-family LSTM layer without a projection at B = 3: the one-barrier form where its
    switch is on (ahead of the two-barrier form), else the two-barrier form, else neither;
    the launcher is put back after the case."""
    from tritonrnn.kernels import split_k

    run = split_k.split_k_backward
    case = {"shape": {"mode": "lstm", "L": 1, "bidirectional": False, "lengths": [3, 1, 2],
                      "time_major": True, "proj": 0, "I": 4, "H": 32, "T": 3, "seed": 0},
            "constraints": {"family": "persistent_grid", "block_h": 16}, "env": {},
            "kernel": {}, "split_k": two, "split_k1": one}
    rec = FZ.run_case(case)
    assert rec["status"] == "ok", rec
    assert rec["split_k_launches"] == want
    assert split_k.split_k_backward is run


def test_split_k_focus_draws_cases_the_split_k_backward_can_run_on(tmp_path):
    """--split-k: every case a grid family without a projection at H a multiple of 16 with
    one split-K switch or both on, each setting drawn, the rest of the case as drawn; the
    flag reaches the cases main runs."""
    cases = [FZ.focus_split_k(FZ.draw(i), i) for i in range(60)]
    assert all(c["shape"]["H"] in (16, 32, 48, 64) and c["shape"]["proj"] == 0
               and c["constraints"]["family"] in ("persistent_grid", "stepwise")
               for c in cases)
    assert {(c["split_k"], c["split_k1"]) for c in cases} == {(True, False), (False, True),
                                                             (True, True)}
    forced = [c["constraints"].get("split_k_bwd") for c in cases]
    assert {1, 2} <= set(forced) and None in forced
    plain = FZ.draw(7)
    focused = FZ.focus_split_k(plain, 7)
    assert focused["shape"]["lengths"] == plain["shape"]["lengths"]
    assert focused["kernel"] == plain["kernel"] and focused["env"] == plain["env"]
    out = tmp_path / "fuzz.jsonl"
    assert FZ.main(["--split-k", "--cases", "1", "--start", "7", "--out", str(out)]) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["shape"] == focused["shape"] and rec["split_k1"] == focused["split_k1"]


def test_run_case_counts_hoisted_launches():
    # GRU H=33 (resident chunks 32 + 16) on 16 x 16 tiles and 8 warps, the 8-warp budget
    # drawn down to 8 B: the grid launches hold only their first chunk (`Hoist.FIRST`), and
    # the record says so; the launchers' helper is restored after.
    from tritonrnn.kernels import grid_tiles as gt

    helper = gt._hoist_constexprs
    case = {"shape": dict(mode="gru", L=1, bidirectional=False, time_major=False, proj=0, I=5,
                          H=33, T=3, lengths=[3, 1, 2], seed=1),
            "constraints": {"family": "persistent_grid", "block_h": 16, "block_b": 16,
                            "num_warps": 8},
            "env": {}, "kernel": {"_HOIST_8WARP_THREAD_BYTES": 8}}
    rec = FZ.run_case(case)
    assert rec["status"] == "ok", rec
    assert rec["hoist_launches"].get("FIRST", 0) > 0 and set(rec["hoist_launches"]) == {"FIRST"}
    assert gt._hoist_constexprs is helper
    rec = FZ.run_case({**case, "kernel": {}})  # the budget as it is: the whole slice fits
    assert rec["status"] == "ok" and set(rec["hoist_launches"]) == {"ALL"}, rec


def test_a_case_plans_afresh_and_leaves_no_plan_made_under_its_overrides():
    """The planner's caches are keyed by the switches, not by the launch rules' constants a
    case overrides: a case starts and ends with them empty, so no case plans from another's
    cached plan."""
    from tritonrnn.rnn import planner

    planner.recurrence_choice("lstm", 64, 64, 0, torch.float32, 4, planner.PRESETS["h100"])
    seen = []
    real = planner._heuristic_cached

    def spy(*args):
        seen.append(real.cache_info().currsize)
        return real(*args)

    spy.cache_clear = real.cache_clear
    spy.cache_info = real.cache_info
    case = {"shape": dict(mode="rnn_tanh", L=1, bidirectional=False, time_major=False, proj=0,
                          I=3, H=16, T=2, lengths=[2, 1], seed=1),
            "constraints": {}, "env": {}, "kernel": {"_HOIST_8WARP_THREAD_BYTES": 8}}
    planner._heuristic_cached = spy
    try:
        rec = FZ.run_case(case)
    finally:
        planner._heuristic_cached = real
    assert rec["status"] == "ok", rec
    assert seen and seen[0] == 0  # the first plan of the case: nothing cached before it
    assert real.cache_info().currsize == 0 and planner._plan_cached.cache_info().currsize == 0


def test_hoist_first_focus_draws_cases_that_hold_the_first_chunk(tmp_path):
    """--hoist-first: every case a persistent grid of 16-wide resident tiles on 8 warps, H
    with two resident chunks, no projection, the lowered 8-warp budget and the default
    hoisting rule; the rest as drawn; the case main runs holds only its first chunk in
    every grid launch. --split-k and --hoist-first exclude each other."""
    cases = [FZ.focus_hoist_first(FZ.draw(i), i) for i in range(40)]
    assert all(c["shape"]["H"] in (33, 40, 65) and c["shape"]["proj"] == 0
               and c["constraints"]["num_warps"] == 8 and c["constraints"]["block_b"] == 16
               and c["kernel"]["_HOIST_8WARP_THREAD_BYTES"] == 8
               and "_MAX_CHUNK" not in c["kernel"] and c["env"] == {} for c in cases)
    assert {c["constraints"]["block_h"] for c in cases} == {16, 32}
    plain = FZ.draw(5)
    assert FZ.focus_hoist_first(plain, 5)["shape"]["lengths"] == plain["shape"]["lengths"]
    out = tmp_path / "fuzz.jsonl"
    assert FZ.main(["--hoist-first", "--cases", "1", "--start", "1", "--out", str(out)]) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["status"] == "ok" and set(rec["hoist_launches"]) == {"FIRST"}, rec
    with pytest.raises(SystemExit):
        FZ.main(["--hoist-first", "--split-k", "--cases", "1"])


def test_extras_focus_draws_dropout_and_skip_input(tmp_path):
    """--extras: every case with dropout between 2 or 3 layers, skip_input (input size =
    hidden size) or both, the rest as drawn; the case main runs is compared with the float64
    reference backend and passes."""
    cases = [FZ.focus_extras(FZ.draw(i), i) for i in range(60)]
    kinds = {("dropout" in c["shape"], bool(c["shape"].get("skip_input"))) for c in cases}
    assert kinds == {(True, False), (False, True), (True, True)}
    assert all(c["shape"]["L"] in (2, 3) and 0 < c["shape"]["dropout"] < 1
               for c in cases if "dropout" in c["shape"])
    assert all(c["shape"]["I"] == c["shape"]["H"] for c in cases if c["shape"].get("skip_input"))
    plain = FZ.draw(9)
    focused = FZ.focus_extras(plain, 9)
    assert focused["shape"]["lengths"] == plain["shape"]["lengths"]
    assert focused["constraints"] == plain["constraints"]
    out = tmp_path / "fuzz.jsonl"
    start = next(i for i in range(60) if "dropout" in cases[i]["shape"]
                 and cases[i]["shape"].get("skip_input"))
    assert FZ.main(["--extras", "--cases", "1", "--start", str(start), "--out", str(out)]) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["shape"] == cases[start]["shape"] and rec["status"] == "ok", rec


@pytest.mark.parametrize("dropout, skip", [(0.5, False), (0.0, True)])
def test_the_reference_comparison_fails_on_a_wrong_result(monkeypatch, dropout, skip):
    """compare_with_reference is a check: a Triton backend whose output is off by 1e-3 in
    one element fails it (and the unchanged one passes)."""
    from tritonrnn.rnn import triton_backend as tb

    s = dict(mode="gru", L=2, bidirectional=False, time_major=True, proj=0, I=6, H=6, T=3,
             lengths=[3, 0, 2], seed=2, dropout=dropout, seeds=[4, 5], skip_input=skip)
    errors = FZ.compare_with_reference(s, "cpu")
    assert set(errors) == {"output", "output_h", "dx", "dh0", "dparams"}
    assert max(errors.values()) < 2e-5
    forward = tb.TritonRecurrence.forward

    def off(self, cell, xg, R, bR, Pw, h0, c0, info, reverse, y, *rest):
        forward(self, cell, xg, R, bR, Pw, h0, c0, info, reverse, y, *rest)
        y[0, 0] += 1e-3  # a packed row's first element, in every layer

    monkeypatch.setattr(tb.TritonRecurrence, "forward", off)
    with pytest.raises(AssertionError, match="output"):
        FZ.compare_with_reference(s, "cpu")
