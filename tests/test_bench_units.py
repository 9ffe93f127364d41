"""Pieces of tritonrnn.bench: the torch.nn <-> params mapping, the oracle, FLOP/byte formulas,
presets and length distributions, the cuDNN reserve probe, timing quantiles and the resumable
tuner."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

from tritonrnn.bench import oracle, presets, roofline, runners, timing, tune
from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop, params_size

# ----------------------------------------------------------------------------- oracle

CONFIGS = [
    ("lstm", False, 1, 0),
    ("lstm", True, 2, 0),
    ("lstm", True, 1, 5),
    ("gru", True, 2, 0),
    ("rnn_tanh", False, 2, 0),
    ("rnn_relu", True, 1, 0),
]


def _cfg_id(c):
    mode, bi, L, P = c
    return f"{mode}-{'bi' if bi else 'uni'}-L{L}-P{P}"


@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_params_from_torch_layout_and_roundtrip(cfg):
    mode, bi, L, P = cfg
    m = oracle.make_torch_rnn(mode, 6, 9, num_layers=L, bidirectional=bi, num_proj=P)
    flat = oracle.params_from_torch(m)
    attrs = oracle.params_attributes(m)
    assert flat.shape == (params_size(**attrs),)
    # Canonical order: the first tensor is W_0 of layer 0 = the first H rows of weight_ih_l0,
    # the first bias is bW_0 = the first H entries of bias_ih_l0 (after all weights).
    H = 9
    assert torch.equal(flat[: H * 6], m.weight_ih_l0[:H].reshape(-1))
    n_bias = 2 * {"lstm": 4, "gru": 3}.get(mode, 1) * H * L * (2 if bi else 1)
    assert torch.equal(flat[-n_bias:][:H], m.bias_ih_l0[:H])
    m2 = oracle.make_torch_rnn(mode, 6, 9, num_layers=L, bidirectional=bi, num_proj=P)
    oracle.load_params_into_torch(m2, flat)
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), m2.named_parameters(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2), n1


@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_oracle_matches_reference_backend_in_float64(cfg):
    """torch.nn float64 (with length-0 and unsorted lengths) and tritonrnn's float64 reference
    engine are independent implementations of the spec: they agree to fp64 rounding."""
    mode, bi, L, P = cfg
    torch.manual_seed(0)
    m = oracle.make_torch_rnn(mode, 6, 9, num_layers=L, bidirectional=bi, num_proj=P)
    T, B, D, Hout = 5, 4, 2 if bi else 1, P or 9
    f64 = dict(dtype=torch.float64)
    x = torch.randn(T, B, 6, **f64)
    h0 = torch.randn(L * D, B, Hout, **f64)
    c0 = torch.randn(L * D, B, 9, **f64) if mode == "lstm" else None
    lengths = [5, 0, 3, 1]
    dy = torch.randn(T, B, D * Hout, **f64)
    dh = torch.randn_like(h0)
    dc = torch.randn_like(c0) if c0 is not None else None
    ref = oracle.oracle(m, x, h0, c0, lengths, (dy, dh, dc))
    params = oracle.params_from_torch(m)
    sl = torch.tensor(lengths)
    kw = dict(backend="reference", **oracle.op_attributes(m))
    out = cudnn_rnn(x, h0, c0, params, sl, **kw)
    g = cudnn_rnn_backprop(x, h0, c0, params, sl, out.output, out.output_h, out.output_c, dy,
                           dh, dc, out.reserve_space, out.host_reserved, **kw)
    pairs = [(out.output, ref.y), (out.output_h, ref.hT), (g.input_backprop, ref.dx),
             (g.input_h_backprop, ref.dh0), (g.params_backprop, ref.dparams)]
    if c0 is not None:
        pairs += [(out.output_c, ref.cT), (g.input_c_backprop, ref.dc0)]
    tol = oracle.tolerance(torch.float64, K=6 + 2 * 9 + 20, steps=T * L)
    for got, want in pairs:
        assert oracle.scaled_error(got, want) <= tol
    # Length 0: state passes through, output zero, input gradient zero.
    assert torch.equal(ref.hT[:, 1], h0[:, 1])
    assert torch.count_nonzero(ref.y[:, 1]) == 0
    assert torch.count_nonzero(ref.dx[:, 1]) == 0


def test_tolerance_orders_dtypes_and_grows_with_work():
    args = dict(K=64, steps=16)
    t = {d: oracle.tolerance(d, **args) for d in (torch.float64, torch.float32,
                                                   torch.float16, torch.bfloat16)}
    assert t[torch.float64] < t[torch.float32] < t[torch.float16] < t[torch.bfloat16]
    assert oracle.tolerance(torch.float32, K=64, steps=64) > t[torch.float32]
    assert oracle.tolerance(torch.float32, K=64, steps=16, tf32=True) > t[torch.float32]
    assert not oracle.uses_tf32(torch.device("cpu"))
    assert not oracle.cudnn_uses_tf32(torch.device("cpu"))
    # fp32 on the CPU: 8 * (2^-24 * sqrt(17) + 2^-24 * sqrt(1024))
    assert t[torch.float32] == pytest.approx(8 * 2.0**-24 * (math.sqrt(17) + 32))


def test_scaled_error_flags_nan_and_scales_large_references():
    ref = torch.tensor([4.0, -8.0], dtype=torch.float64)
    assert oracle.scaled_error(torch.tensor([4.0, -7.0]), ref) == pytest.approx(1 / 8)
    assert oracle.scaled_error(torch.tensor([4.0, float("nan")]), ref) == math.inf
    assert oracle.scaled_error(torch.tensor([0.5]), torch.tensor([0.25], dtype=torch.float64)) \
        == pytest.approx(0.25)


# ----------------------------------------------------------------------------- formulas


def test_flops_anchor_by_hand():
    s = presets.PRESETS["anchor"][0]
    N = 1024 * 16
    fwd = 2 * N * 4 * 768 * (768 + 768)
    assert roofline.flops(s, N, "fwd") == fwd
    assert roofline.flops(s, N, "bwd") == 2 * fwd
    assert roofline.flops(s, N, "fwdbwd") == 3 * fwd


def test_flops_bidirectional_stack_with_projection():
    s = presets.BenchShape(mode="lstm", hidden=8, input_size=5, proj=3, layers=2,
                           bidirectional=True, batch=2, time=3, dtype="float32")
    N = 6
    layer0 = 2 * N * 4 * 8 * (5 + 3) + 2 * N * 3 * 8
    layer1 = 2 * N * 4 * 8 * (2 * 3 + 3) + 2 * N * 3 * 8
    assert roofline.flops(s, N, "fwd") == 2 * (layer0 + layer1)


def test_param_count_matches_params_size():
    for s in (presets.BenchShape(mode="gru", hidden=7, input_size=5, layers=3,
                                 bidirectional=True),
              presets.BenchShape(mode="lstm", hidden=8, input_size=5, proj=3, layers=2)):
        assert roofline.param_count(s) == params_size(
            rnn_mode=s.mode, num_layers=s.layers, num_units=s.hidden, input_size=s.input,
            direction=s.direction, num_proj=s.proj)


def test_min_bytes_gru_by_hand():
    s = presets.BenchShape(mode="gru", hidden=4, input_size=3, batch=2, time=5,
                           dtype="float32")
    N, Pn, S = 7, 3 * 4 * (3 + 4) + 2 * 3 * 4, 2 * 4
    assert roofline.min_bytes(s, N, "fwd") == 4 * (N * (3 + 4) + Pn + 2 * S)
    assert roofline.min_bytes(s, N, "bwd") == 4 * (N * (2 * 3 + 2 * 4) + 2 * Pn + 3 * S)


def test_roofline_picks_the_binding_ceiling():
    c = roofline.Ceilings("cuda", 1e12, {"bfloat16": 1e15})
    assert c.roofline(1e12, 1e9, "bfloat16") == (pytest.approx(1.0), "compute")
    assert c.roofline(1e9, 1e10, "bfloat16") == (pytest.approx(10.0), "memory")


# ----------------------------------------------------------------------------- presets


def test_presets_are_valid_and_anchor_is_the_design_point():
    for name, shapes in presets.PRESETS.items():
        assert shapes, name
        for s in shapes:
            assert s.validated() == s, (name, s)
    (anchor,) = presets.PRESETS["anchor"]
    assert (anchor.mode, anchor.hidden, anchor.batch, anchor.time, anchor.dtype) == (
        "lstm", 768, 16, 1024, "bfloat16")
    for name in ("small-batch", "large-batch", "varlen", "gru", "smoke"):
        assert name in presets.PRESETS
    assert all(s.varlen == "uniform" for s in presets.PRESETS["varlen"])
    targets = presets.PRESETS["targets"]
    assert len(set(targets)) == len(targets)
    for name in ("anchor", "small-batch", "large-batch", "varlen", "gru"):
        assert set(presets.PRESETS[name]) <= set(targets)
    assert all(s.batch >= 256 for s in presets.PRESETS["large-batch"])


@pytest.mark.parametrize("dist", ["uniform", "uniform:0", "uniform:0.5", "uniform:1"])
def test_lengths_distributions(dist):
    T, B = 40, 64
    a = presets.make_lengths(dist, B, T, seed=3)
    assert a == presets.make_lengths(dist, B, T, seed=3)
    frac = 1 / 8 if dist == "uniform" else float(dist.split(":")[1])
    assert max(a) == T and min(a) >= math.ceil(frac * T)
    assert len(a) == B
    if dist != "uniform:1":
        assert len(set(a)) > 1


@pytest.mark.parametrize("bad", ["zipf", "uniform:", "uniform:-1", "uniform:x"])
def test_parse_varlen_rejects(bad):
    with pytest.raises(ValueError, match="--varlen"):
        presets.parse_varlen(bad)


def test_shape_validation_names_the_option():
    with pytest.raises(ValueError, match="--proj"):
        presets.BenchShape(mode="rnn_relu", proj=3).validated()
    with pytest.raises(ValueError, match="--batch"):
        presets.BenchShape(batch=0).validated()
    s = presets.BenchShape(dtype="bf16", varlen="uniform:0.50").validated()
    assert (s.dtype, s.varlen) == ("bfloat16", "uniform:0.5")


# ----------------------------------------------------------------------------- probes


class _Node:
    def __init__(self, name, children=(), reserve=None):
        self.__class__ = type(name, (_Node,), {})
        self.next_functions = tuple((c, 0) for c in children)
        if reserve is not None:
            self._saved_result3 = reserve


def test_cudnn_reserve_probe_walks_the_graph():
    reserve = torch.empty(1000, dtype=torch.uint8)
    leaf = _Node("AccumulateGrad")
    cudnn = _Node("CudnnRnnBackward0", [leaf, None], reserve)
    top = _Node("IndexCopyBackward0", [_Node("TransposeBackward0", [cudnn]), cudnn])
    out = torch.zeros(1)

    class _Out:
        grad_fn = top
        device = out.device

    nbytes, note = runners.cudnn_reserve_bytes([_Out()])
    assert nbytes == 1000 and "CudnnRnnBackward0" in note
    plain = torch.zeros(2, requires_grad=True) * 2
    nbytes, note = runners.cudnn_reserve_bytes([plain])
    assert nbytes is None and note.startswith("n/a")


def test_cpu_timing_quantiles_are_ordered():
    t = timing.measure(lambda: sum(range(1000)), "cpu", timing.TimingConfig(cpu_rep=7))
    assert 0 < t.ms_p20 <= t.ms <= t.ms_p80
    assert timing._quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.2) == pytest.approx(1.8)


class _Clock:
    """A fake time.perf_counter, advanced by each call of `call` by the next of `ms`."""

    def __init__(self, ms: list[float]):
        self.now, self.ms, self.calls = 0.0, list(ms), 0

    def perf_counter(self) -> float:
        return self.now

    def call(self) -> None:
        self.now += self.ms[min(self.calls, len(self.ms) - 1)] / 1e3
        self.calls += 1


def test_cpu_warmup_runs_until_the_calls_settle(monkeypatch):
    """torch's first CPU calls (a bare nn.LSTM forward + backward, measured: 818, 356, 228,
    220, 307, 77 ms, then ~1 ms): the warm-up goes on until three calls agree within 1.25x,
    so the timed calls are the ~1 ms ones (one warm-up call timed 228 ms)."""
    clock = _Clock([818, 356, 228, 220, 307, 77, 1.0, 1.1, 0.9, 1.0, 1.0, 1.0])
    monkeypatch.setattr(timing, "time", clock)
    t = timing.measure(clock.call, "cpu", timing.TimingConfig(cpu_rep=3))
    assert t.ms == pytest.approx(1.0) and t.ms_p80 <= 1.0 + 1e-9
    assert (t.warmup_calls, t.warmup_settled) == (9, True)
    assert t.as_dict()["warmup_calls"] == 9 and clock.calls == 12


@pytest.mark.parametrize("ms, calls", [([1.0, 2.0], 100), ([400.0, 900.0], 8)],
                         ids=["call-cap", "time-cap"])
def test_cpu_warmup_that_never_settles_stops_at_its_cap(monkeypatch, ms, calls):
    clock = _Clock(ms * 200)
    monkeypatch.setattr(timing, "time", clock)
    t = timing.measure(clock.call, "cpu", timing.TimingConfig(cpu_rep=1))
    assert (t.warmup_calls, t.warmup_settled) == (calls, False)
    described = timing.TimingConfig().describe("cpu")
    assert described["warmup"].startswith("until the last 3 calls agree within 1.25x")


# ----------------------------------------------------------------------------- tuner


class _Stop(KeyboardInterrupt):
    pass


def test_tune_key_is_resumable_and_keeps_the_best(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    from tritonrnn.rnn.planner import load_tuning_cache

    choices = [{"family": "persistent_cta", "block_b": 16, "num_warps": w} for w in (1, 2, 4)]
    choices.append({"family": "stepwise", "block_b": 16, "num_warps": 8, "block_h": 16})
    ms = {1: 3.0, 2: 1.5, 4: 2.0}
    calls = []

    def measure(choice, bound, stop_after=None):
        calls.append(choice["num_warps"])
        if stop_after is not None and len(calls) > stop_after:
            raise _Stop
        if choice["family"] == "stepwise":
            raise RuntimeError("out of resources")
        return ms[choice["num_warps"]]

    with pytest.raises(_Stop):
        tune.tune_key("k", choices, lambda c, b: measure(c, b, stop_after=2), "dev")
    assert calls == [1, 2, 4]
    partial = json.loads(tune.partial_path().read_text())[tune._partial_key("k")]
    assert len(partial) == 2  # the two finished measurements survived the interrupt
    assert "k" not in load_tuning_cache()

    calls.clear()
    summary = tune.tune_key("k", choices, measure, "dev")
    assert calls == [4, 8]  # only the unfinished choices ran
    assert summary["status"] == "tuned"
    assert summary["best"] == {**choices[1], "ms": 1.5}
    failed = summary["measured"][tune.choice_id(choices[3])]
    assert failed["ms"] is None and "out of resources" in failed["error"]
    entry = load_tuning_cache()["k"]
    assert entry["num_warps"] == 2 and entry["ms"] == 1.5 and entry["device"] == "dev"
    assert tune._partial_key("k") not in json.loads(tune.partial_path().read_text())

    calls.clear()
    assert tune.tune_key("k", choices, measure, "dev")["status"] == "cached"
    assert calls == []
    tune.tune_key("k", choices, measure, "dev", force=True)
    assert calls == [1, 2, 4, 8]


@pytest.mark.parametrize("changed", ["triton", "kernels"])
def test_tune_key_times_again_what_other_code_timed(tmp_path, monkeypatch, changed):
    """A cache entry and unfinished measurements from another Triton release, or from other
    kernel sources (an upgrade since), are not this code's timings: the key is timed again,
    and its new entry names the running release and kernels."""
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    import triton

    from tritonrnn.rnn import planner
    from tritonrnn.rnn.planner import load_tuning_cache, store_tuning_entry, tuning_entry

    choices = [{"family": "persistent_grid", "block_b": 16, "num_warps": w} for w in (4, 8)]
    calls = []

    def measure(choice, bound):
        calls.append(choice["num_warps"])
        return {4: 2.0, 8: 1.0}[choice["num_warps"]]

    def run_as(old: bool) -> None:
        if changed == "triton":
            monkeypatch.setattr(triton, "__version__", "3.4.0" if old else "3.6.0")
        else:
            fp = "00000000000000aa" if old else "00000000000000bb"
            monkeypatch.setattr(planner, "kernels_fingerprint", lambda: fp)

    run_as(old=True)
    store_tuning_entry("k4", choices[0], 9.0, "dev")
    tune._write_partial(tune.partial_path(), {tune._partial_key("k5"): {
        tune.choice_id(choices[0]): {"ms": 9.0}}})
    assert tuning_entry("k4")["ms"] == 9.0
    run_as(old=False)
    assert tuning_entry("k4") is None and load_tuning_cache()["k4"]["ms"] == 9.0
    summary = tune.tune_key("k4", choices, measure, "dev")
    assert summary["status"] == "tuned" and calls == [4, 8]
    assert tuning_entry("k4") == {**choices[1], "ms": 1.0, "device": "dev",
                                  "triton": triton.__version__,
                                  "kernels": planner.kernels_fingerprint()}
    calls.clear()
    tune.tune_key("k5", choices, measure, "dev")  # the old code's partial record is not resumed
    assert calls == [4, 8]


def test_tune_key_screens_out_slow_choices(tmp_path, monkeypatch):
    """Each choice gets SCREEN_FACTOR x the best median so far as its bound; a measurer that
    returns Screened is recorded with its one-run time, never becomes the best, and does not
    count as failed."""
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    choices = [{"family": "persistent_grid", "block_b": 16, "num_warps": w} for w in (4, 8, 2)]
    full = {4: 2.0, 8: 5.0, 2: 1.0}
    bounds = []

    def measure(choice, bound):
        bounds.append(bound)
        one = full[choice["num_warps"]] * 1.05  # one run is a little above the median
        return tune.Screened(one) if bound is not None and one > bound else full[
            choice["num_warps"]]

    summary = tune.tune_key("k3", choices, measure, "dev")
    assert bounds == [None, 4.0, 4.0]  # 2 x 2.0 ms, the first (and best-so-far) choice
    slow = summary["measured"][tune.choice_id(choices[1])]
    assert slow == {"ms": None, "screened_ms": 5.25}
    assert summary["best"] == {**choices[2], "ms": 1.0}
    text = tune.format_tune([{**summary, "label": "x"}], tmp_path)
    assert "1 screened out after one run" in text and "failed" not in text


@pytest.mark.parametrize("H, B", [(768, 16), (1024, 64)])
def test_tune_times_the_plans_choice_and_its_neighbours_first(H, B):
    """The plan's own choice first, then the choices one change away (a tile or the warps),
    then two, ...; another family counts as three changes. Every candidate, once. (LSTM
    H=1024 B=64: the plan's backward is the split-K kernel's, `planner._split_k_rule`.)"""
    from tritonrnn.rnn.planner import candidates, plan_for

    plan = plan_for(rnn_mode="lstm", input_size=H, num_units=H, batch=B, max_time=1024,
                    dtype=torch.bfloat16, device_properties="h100")
    ordered = tune.by_promise(plan, candidates(plan))
    lp = plan.layer(0)
    own = {"family": lp.family, "block_b": lp.block_b, "num_warps": lp.num_warps,
           "block_h": lp.block_h, "block_k": lp.block_k, "num_warps_bwd": lp.backward_warps,
           "split_k_bwd": 2 if H == 1024 else 0}
    assert ordered[0] == own == tune.own_choice(plan)
    assert sorted(map(tune.choice_id, ordered)) == sorted(map(tune.choice_id,
                                                              candidates(plan)))
    dist = [tune.choice_distance(c, own) for c in ordered]
    assert dist == sorted(dist) and dist[0] == 0 and dist[1] == 1
    for c, d in zip(ordered, dist, strict=True):
        changed = {k for k in set(c) | set(own) if c.get(k) != own.get(k)}
        assert d == len(changed) + 2 * ("family" in changed), (c, d)
    # the first few are the planner's tiles with other warps or chunking, not other families
    assert all(c["family"] == own["family"] for c in ordered[:4])


def test_max_candidates_caches_a_partial_best_that_later_runs_carry_on(tmp_path, monkeypatch):
    """limit N: the first N choices are measured and their best is cached, marked partial
    (the planner uses it: `tuning_entry`); the measurements are kept, and a run with a larger
    limit, or none, measures only the rest; complete, the entry loses its mark and the key
    is skipped as cached."""
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    from tritonrnn.rnn.planner import tuning_complete, tuning_entry

    choices = [{"family": "persistent_grid", "block_b": 16, "num_warps": w} for w in (4, 8, 2, 1)]
    ms = {4: 2.0, 8: 3.0, 2: 1.5, 1: 1.0}
    calls = []

    def measure(choice, bound):
        calls.append(choice["num_warps"])
        return ms[choice["num_warps"]]

    summary = tune.tune_key("k6", choices, measure, "dev", limit=2)
    assert calls == [4, 8] and summary["status"] == "tuned" and summary["partial"] == 2
    entry = tuning_entry("k6")
    assert entry["num_warps"] == 4 and (entry["measured"], entry["candidates"]) == (2, 4)
    assert not tuning_complete(entry)
    assert "the first 2 of 4 candidates (partial" in tune.format_tune(
        [{**summary, "label": "x"}], tmp_path)
    assert tune._cached_keys() == set()  # a partial key is carried on, not skipped

    calls.clear()
    summary = tune.tune_key("k6", choices, measure, "dev", limit=3)
    assert calls == [2] and summary["partial"] == 3
    assert tuning_entry("k6")["num_warps"] == 2

    calls.clear()
    summary = tune.tune_key("k6", choices, measure, "dev")
    assert calls == [1] and "partial" not in summary
    entry = tuning_entry("k6")
    assert tuning_complete(entry) and entry == {**choices[3], "ms": 1.0, "device": "dev",
                                                 "triton": entry["triton"],
                                                 "kernels": entry["kernels"]}
    assert tune._partial_key("k6") not in json.loads(tune.partial_path().read_text())
    assert tune._cached_keys() == {"k6"}
    calls.clear()
    assert tune.tune_key("k6", choices, measure, "dev", limit=1)["status"] == "cached"
    assert calls == []


def test_two_runs_of_one_key_keep_each_others_measurements_and_the_fuller_entry(
        tmp_path, monkeypatch):
    """Run A (cut at --max-candidates 2) and run B (complete) of one key, interleaved as
    two GPUs' runs may be: B's complete entry is not replaced by A's later partial one, and
    A's measurements join B's record in the partial file instead of replacing it."""
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    from tritonrnn.rnn.planner import tuning_complete, tuning_entry

    choices = [{"family": "persistent_grid", "block_b": 16, "num_warps": w} for w in (4, 8, 2)]
    ms = {4: 2.0, 8: 3.0, 2: 1.0}
    pkey = tune._partial_key("k7")

    def measure_a(choice, _bound):
        if choice["num_warps"] == 8:  # B runs its whole key meanwhile
            tune.tune_key("k7", choices, lambda c, _b: ms[c["num_warps"]], "dev", force=True)
            assert tuning_complete(tuning_entry("k7"))
        return ms[choice["num_warps"]]

    summary = tune.tune_key("k7", choices, measure_a, "dev", limit=2, force=True)
    assert summary["kept"] and summary["partial"] == 2
    assert "not stored: the cache's entry, from another run, covers more" in tune.format_tune(
        [{**summary, "label": "x"}], tmp_path)
    entry = tuning_entry("k7")
    assert tuning_complete(entry) and (entry["num_warps"], entry["ms"]) == (2, 1.0)
    # B's completion removed the key's record; A's two measurements are kept, B's the
    # union's where A had none (none here: B's record was removed before A's second write).
    record = json.loads(tune.partial_path().read_text())[pkey]
    assert sorted(json.loads(c)["num_warps"] for c in record) == [4, 8]
    tune._set_partial(tune.partial_path(), pkey, {tune.choice_id(choices[2]): {"ms": 1.0}})
    record = json.loads(tune.partial_path().read_text())[pkey]
    assert sorted(json.loads(c)["num_warps"] for c in record) == [2, 4, 8]


@pytest.mark.parametrize("content", ['{"k": ', "[1, 2]", b"\xff{}"],
                         ids=["truncated", "list", "not-utf8"])
def test_a_damaged_partial_file_is_refused_before_anything_is_timed(tmp_path, monkeypatch,
                                                                     content):
    """The partial file is written back whole: a damaged one is refused (ValueError naming
    it) before the first candidate runs, and left as it is, rather than replaced by one
    key's record (every other key's resumable measurements lost)."""
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    path = tune.partial_path()
    content = content.encode() if isinstance(content, str) else content
    path.write_bytes(content)
    shape = presets.BenchShape(mode="rnn_relu", hidden=8, input_size=4, batch=2, time=2,
                               dtype="fp32")
    monkeypatch.setattr(tune, "shape_measurer", lambda *_a, **_k: pytest.fail("timed first"))
    with pytest.raises(ValueError, match=rf"tune's partial file {re.escape(str(path))}: "
                                         r"expected a JSON object, got .*move it aside"):
        tune.tune_shapes([shape], torch.device("cpu"), timing.TimingConfig())
    assert path.read_bytes() == content


def test_tune_key_with_no_working_candidate_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    from tritonrnn.rnn.planner import load_tuning_cache

    def measure(_choice, _bound):
        raise ValueError("outside tolerance")

    summary = tune.tune_key("k2", [{"family": "stepwise"}], measure, "dev")
    assert summary["status"] == "failed"
    assert "k2" not in load_tuning_cache()
    # A later run measures the failed choice again (its cause may be gone), without --force.
    summary = tune.tune_key("k2", [{"family": "stepwise"}], lambda _c, _b: 2.5, "dev")
    assert summary["status"] == "tuned" and load_tuning_cache()["k2"]["ms"] == 2.5


def test_plan_summary_records_the_layer_pipeline():
    """The results JSON's plan summary carries the pipeline decision: off with its reason, or
    forced chunks with the extra workspace bytes the plan counts in peak."""
    from tritonrnn.bench.harness import _plan_summary
    from tritonrnn.rnn.planner import plan_constraints

    shape = presets.BenchShape(mode="lstm", hidden=16, batch=2, time=8, layers=2,
                               dtype="float32")
    off = _plan_summary(shape)["pipeline"]
    assert off["chunks"] == 1 and off["source"] == "off" and off["reason"]
    assert off["extra_bytes"] == 0
    with plan_constraints(pipeline_chunks=2):
        forced = _plan_summary(shape)
    assert forced["pipeline"]["chunks"] == 2 and forced["pipeline"]["source"] == "forced"
    assert forced["pipeline"]["extra_bytes"] > 0
    assert forced["peak_bytes"] > _plan_summary(shape)["peak_bytes"]
    # ... and the recurrence's kernel choice (what was timed: family, tiles, warps per pass).
    with plan_constraints(family="stepwise", block_h=16, num_warps=2, num_warps_bwd=8):
        rec = _plan_summary(shape)["recurrence"]
    assert {k: rec[k] for k in ("family", "block_h", "num_warps", "num_warps_bwd")} == {
        "family": "stepwise", "block_h": 16, "num_warps": 2, "num_warps_bwd": 8}


def test_table_rows_from_bench_reports_only(tmp_path, capsys):
    """The README table: one row per tritonrnn run of a bench report, with the CUDA-graph
    baseline where the report has it (- in reports from before it); barrier / ablation JSON
    files (other schemas) are skipped, not misread."""
    from tritonrnn.bench import table

    def report(label, graph):
        run = {"impl": "tritonrnn", "pass": "fwdbwd", "status": "ok", "ms": 2.0,
               "speedup_vs_torch": 3.0}
        runs = [run, {"impl": "torch", "pass": "fwdbwd", "status": "ok", "ms": 6.0}]
        if graph:
            run["speedup_vs_torch_graph"] = 1.5
            runs.append({"impl": "torch-graph", "pass": "fwdbwd", "status": "ok", "ms": 3.0})
        return {"schema": "tritonrnn.bench/1", "environment": {"device": "GPU X"},
                "results": [{"label": label, "runs": runs,
                             "plan": {"families": ["persistent_grid"]},
                             "reserve_ratio": {"torch": 0.25}}]}

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(report("lstm H8", graph=False)))
    new.write_text(json.dumps(report("gru H8", graph=True)))
    other = tmp_path / "barrier.json"
    other.write_text(json.dumps({"device": "GPU X", "rows": [{"step_us": 1.0}]}))
    # A plan whose backward is the split-K kernel's says so in its passes with a backward.
    split = report("lstm H1024", graph=False)
    split["results"][0]["plan"]["recurrence"] = {"split_k_bwd": 1}
    fwd = dict(split["results"][0]["runs"][0], **{"pass": "fwd"})
    split["results"][0]["runs"].append(fwd)
    split_path = tmp_path / "split.json"
    split_path.write_text(json.dumps(split))
    # (a backward the device refused on the split-K kernel: the grid's ran)
    refused = json.loads(json.dumps(split))
    refused["results"][0]["label"] = "lstm H1024 refused"
    refused["results"][0]["plan"]["replaced"] = [
        {"pass": "backward", "refused": {"split_k_bwd": 1}, "ran": {"split_k_bwd": 0},
         "summary": "x"}]
    refused_path = tmp_path / "refused.json"
    refused_path.write_text(json.dumps(refused))
    table.main([str(old), str(other), str(new), str(split_path), str(refused_path)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert lines[2:] == [
        "| GPU X | lstm H8 | fwdbwd | persistent_grid | 2.00 | 6.00 | 3.00x | - | - | 0.25 |",
        "| GPU X | gru H8 | fwdbwd | persistent_grid | 2.00 | 6.00 | 3.00x | 3.00 | 1.50x "
        "| 0.25 |",
        "| GPU X | lstm H1024 | fwd | persistent_grid | 2.00 | - | 3.00x | - | - | 0.25 |",
        "| GPU X | lstm H1024 | fwdbwd | persistent_grid + split-K bwd | 2.00 | 6.00 | 3.00x "
        "| - | - | 0.25 |",
        "| GPU X | lstm H1024 refused | fwd | persistent_grid | 2.00 | - | 3.00x | - | - | "
        "0.25 |",
        "| GPU X | lstm H1024 refused | fwdbwd | persistent_grid | 2.00 | 6.00 | 3.00x | - | - "
        "| 0.25 |"]


def test_source_hash_names_the_python_sources(tmp_path):
    """The results JSON's source_sha256: the package's .py files (path and bytes), nothing
    else; it is in the environment record of every report."""
    from tritonrnn.bench.harness import environment, source_hash

    for sub in ("kernels", "rnn", "tensorarray", "bench"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "m.py").write_text(f"X = '{sub}'\n")
    first = source_hash(tmp_path)
    assert len(first) == 16 and int(first, 16) >= 0
    (tmp_path / "bench" / "notes.md").write_text("not code")
    assert source_hash(tmp_path) == first
    (tmp_path / "kernels" / "m.py").write_text("X = 'changed'\n")
    assert source_hash(tmp_path) != first
    (tmp_path / "kernels" / "m.py").write_text("X = 'kernels'\n")
    (tmp_path / "kernels" / "m.py").rename(tmp_path / "kernels" / "n.py")
    assert source_hash(tmp_path) != first  # a renamed file is another tree
    assert environment(torch.device("cpu"))["source_sha256"] == source_hash()


def test_cudnn_runners_are_judged_at_cudnns_fp32_math(monkeypatch):
    """fp32 cuDNN RNNs run in tf32 under torch's default cudnn.allow_tf32 (an H200 measured
    the fp32 graph baseline at 3.4e-4 scaled error against an IEEE tolerance of 2.0e-5): its
    runners' verdicts use that switch, tritonrnn's the GEMM one."""
    case = runners.build_case(presets.BenchShape(mode="lstm", hidden=8, batch=2, time=3,
                                                 dtype="float32"), torch.device("cpu"))
    ieee = runners.tolerances(case)
    assert runners.tolerances(case, tf32=False) == ieee
    assert runners.tolerances(case, tf32=True)["output"] > 10 * ieee["output"]
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert oracle.cudnn_uses_tf32(torch.device("cuda"))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert not oracle.cudnn_uses_tf32(torch.device("cuda"))


def test_graph_baseline_is_skipped_without_a_gpu():
    case = runners.build_case(presets.BenchShape(mode="gru", hidden=8, batch=2, time=3,
                                                 dtype="float32"), torch.device("cpu"))
    assert runners.graph_unsupported(case) == "CUDA graphs need a GPU"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    presets.BenchShape(mode="lstm", hidden=64, batch=8, time=12, dtype="float32"),
    presets.BenchShape(mode="gru", hidden=128, batch=16, time=20, dtype="bfloat16",
                       layers=2, bidirectional=True),
    presets.BenchShape(mode="lstm", hidden=64, batch=8, time=12, dtype="float16", proj=32),
], ids=["lstm-fp32", "gru-bf16-2l-bi", "lstm-fp16-proj"])
def test_graph_baseline_replays_what_torch_computes(shape):
    """The CUDA-graph cuDNN baseline: every pass's replay gives what the eager torch.nn pass
    gives on the same data (same cuDNN kernels), within the oracle's tolerances, and reports
    the memory its capture took. Their module's weights are one flat buffer (else torch
    copies them into one on every cuDNN call)."""
    dev = torch.device("cuda")
    case = runners.build_case(shape, dev, seed=3)
    module = runners._torch_setup(case).module
    assert len({p.untyped_storage().data_ptr() for p in module.parameters()}) == 1
    graph = runners.torch_graph_runner(case)
    eager = runners.torch_runner(case, packed=False)
    assert graph.correctness["ok"], graph.correctness
    assert set(graph.correctness["scaled_error"]) == set(eager.correctness["scaled_error"])
    for name in ("fwd", "bwd", "fwdbwd"):
        got = [t.clone() for t in graph.passes[name]() if t is not None]
        want = [t for t in eager.passes[name]() if t is not None]
        torch.cuda.synchronize()
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, equal_nan=False)
        assert graph.peak_bytes[name] > 0


H100, A100, A40 = (9, 0, 132), (8, 0, 108), (8, 6, 84)


@pytest.mark.parametrize(("shape", "packed", "device", "fwd", "bwd"), [
    (dict(mode="lstm", hidden=768, batch=16), False, H100, "standard", "standard"),
    (dict(mode="lstm", hidden=768, batch=16, dtype="float16"), False, H100,
     "persist_static", "persist_static"),
    (dict(mode="lstm", hidden=768, batch=16, dtype="float16"), True, H100,
     "standard", "standard"),
    (dict(mode="lstm", hidden=768, batch=16, dtype="float16", proj=256), False, H100,
     "standard", "standard"),
    (dict(mode="lstm", hidden=768, batch=16, dtype="float16", layers=2), False, H100,
     "standard", "standard"),
    (dict(mode="lstm", hidden=768, batch=256, dtype="float16"), False, H100,
     "standard", "standard"),
    (dict(mode="lstm", hidden=768, batch=16, dtype="float16"), False, A40,
     "standard", "standard"),
    (dict(mode="lstm", hidden=1024, batch=64, dtype="float16"), False, A100,
     "persist_static", "persist_static"),
    (dict(mode="gru", hidden=768, batch=16, dtype="float16"), False, H100,
     "standard", "standard"),
    (dict(mode="rnn_tanh", hidden=1024, batch=96, dtype="float16"), False, H100,
     "standard", "standard"),
    (dict(mode="rnn_relu", hidden=768, batch=96, dtype="float16"), False, H100,
     "persist_static", "persist_static"),
    (dict(mode="lstm", hidden=192, batch=16), False, H100,
     "persist_static_small_h", "standard"),
    (dict(mode="gru", hidden=128, batch=4, dtype="float32"), False, H100,
     "persist_static_small_h", "persist_static_small_h"),
    (dict(mode="rnn_tanh", hidden=384, batch=16), False, H100,
     "persist_static_small_h", "standard"),
    (dict(mode="gru", hidden=128, batch=4, dtype="float64"), False, H100,
     "standard", "standard"),
], ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(map(str, v.values())))
def test_expected_cudnn_algo_follows_torch_rules(shape, packed, device, fwd, bwd):
    """The report's cuDNN algorithm is torch's get_algo rule: persistent kernels only for
    small H or for fp16 within the persistent rules; the bf16 anchor runs the standard one."""
    s = presets.BenchShape(**{"time": 1024, **shape})
    assert runners.expected_cudnn_algo(s, packed, *device) == {"fwd": fwd, "bwd": bwd}


def test_summary_table_shows_the_graph_baseline_and_cudnn_algorithm():
    """The printed summary: tritonrnn's speedup over eager cuDNN and over its graph replay,
    the capture's memory as the graph's peak, and the cuDNN algorithm torch asks for."""
    from tritonrnn.bench.harness import format_table

    def run(impl, ms, **extra):
        return {"impl": impl, "pass": "fwdbwd", "status": "ok", "ms": ms, "ms_p20": ms,
                "ms_p80": ms, "tflops": 1.0, "pct_roofline": 5.0, "peak_bytes": 2048, **extra}

    algo = {"fwd": "standard", "bwd": "standard"}
    report = {
        "environment": {"device_type": "cuda", "device": "GPU X"},
        "roofline": {"memory_bytes_per_s": 3e12, "matrix_flops_per_s": {"bfloat16": 9e14}},
        "results": [{
            "label": "lstm H768 B16 T1024 bf16", "tokens": 16384,
            "runs": [run("tritonrnn", 2.0, speedup_vs_torch=4.0, speedup_vs_torch_graph=1.5),
                     run("torch", 8.0), run("torch-graph", 3.0)],
            "implementations": {
                "tritonrnn": {"status": "ok", "correctness": None, "reserve_bytes": 10},
                "torch": {"status": "ok", "correctness": None, "reserve_bytes": 50,
                          "cudnn_algo": algo},
                "torch-graph": {"status": "ok", "correctness": None, "reserve_bytes": None,
                                "cudnn_algo": algo},
            },
            "reserve_ratio": {"torch": 0.2},
            "plan": {"families": ["persistent_grid"], "source": "heuristic",
                     "reserve_bytes": 10},
        }],
    }
    lines = format_table(report).splitlines()
    assert "vs graph" in lines[2]
    mine = next(line for line in lines if line.startswith("fwdbwd tritonrnn"))
    assert mine.split()[-4:] == ["4.00x", "1.50x", "2.0", "KiB"]
    graph = next(line for line in lines if line.startswith("fwdbwd cuDNN-graph"))
    assert graph.split()[-4:] == ["-", "-", "2.0", "KiB"]
    assert "  cuDNN-graph: reserve n/a; not compared; cuDNN algorithm fwd standard, bwd " \
        "standard" in lines
    assert "  plan: persistent_grid (heuristic), planned reserve 10 B" in lines
    # A plan whose backward is the split-K kernel's names its form, unless the device
    # refused that backward and the grid's ran it.
    plan = report["results"][0]["plan"]
    plan["recurrence"] = {"split_k_bwd": 2}
    assert ("  plan: persistent_grid, backward split-K (two barriers) (heuristic), planned "
            "reserve 10 B") in format_table(report).splitlines()
    plan["replaced"] = [{"pass": "backward", "refused": {"split_k_bwd": 2},
                         "ran": {"split_k_bwd": 0}, "summary": "split-K refused"}]
    assert "  plan: persistent_grid (heuristic), planned reserve 10 B" in format_table(
        report).splitlines()


def test_summary_table_names_the_timings_whose_cpu_warmup_did_not_settle():
    from tritonrnn.bench.harness import format_table

    def run(impl, p, settled):
        return {"impl": impl, "pass": p, "status": "ok", "ms": 1.0, "ms_p20": 1.0,
                "ms_p80": 1.0, "tflops": 1.0, "pct_roofline": 5.0, "peak_bytes": None,
                "warmup_calls": 3 if settled else 100, "warmup_settled": settled}

    report = {
        "environment": {"device_type": "cpu", "device": "CPU x86_64"},
        "roofline": {"memory_bytes_per_s": 1e9, "matrix_flops_per_s": {"float32": 1e9}},
        "results": [{"label": "lstm H8", "tokens": 8, "implementations": {},
                     "runs": [run("tritonrnn", "fwd", True), run("torch", "fwd", True),
                              run("torch", "bwd", False)],
                     "plan": {"error": "x"}}],
    }
    lines = format_table(report).splitlines()
    assert ("  warm-up did not settle (timing.measure's cap): torch-cpu bwd; their times may "
            "include warm-up") in lines
    report["results"][0]["runs"][2]["warmup_settled"] = True
    assert not any("warm-up" in line for line in format_table(report).splitlines())


# ----------------------------------------------------------------------------- barrier


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_barrier_step_inputs_follow_the_recurrence_contracts(mode):
    """`tritonrnn barrier` (and scripts/step_ablation.py, whose decide set times rnn_tanh)
    times grid_forward and grid_backward on inputs it builds itself; those must be what the
    kernels' contracts ask for, for every cell: the kernels (one step per launch in the
    interpreter) agree with the reference recurrences on them."""
    import os

    from tritonrnn.bench import barrier
    from tritonrnn.kernels.persistent_grid import grid_backward, grid_forward
    from tritonrnn.rnn import reference

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernels run on CPU tensors in the interpreter only")
    H, B, T, dt, cpu = 16, 3, 4, torch.float32, torch.device("cpu")
    tiles = dict(persistent=False, block_h=16, block_b=16)
    fwd = barrier._recurrence_inputs(mode, H, B, T, dt, cpu)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in fwd.items()}
    grid_forward(*fwd.values(), **tiles)
    reference.recurrence_forward(*ref.values())
    for name in ("y", "hT", "c_seq", "cT"):
        if fwd[name] is not None:
            torch.testing.assert_close(fwd[name], ref[name], rtol=1e-5, atol=1e-5)
    bwd = barrier._backward_inputs(mode, H, B, T, dt, cpu)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in bwd.items()}
    grid_backward(**bwd, **tiles)
    reference.recurrence_backward(**ref)
    for name in ("dpre_x", "dpre_h", "dh0", "dc0"):
        if bwd[name] is not None:
            assert torch.count_nonzero(bwd[name]) > 0, name
            torch.testing.assert_close(bwd[name], ref[name], rtol=1e-5, atol=1e-5)


def test_barrier_rows_format_with_and_without_the_backward_step():
    from tritonrnn.bench import barrier

    base = {"mode": "lstm", "H": 768, "B": 16, "family": "persistent_grid", "programs": 48,
            "step_us": 5.0, "barrier_us": 1.0, "ratio": 5.0}
    old = dict(base)
    new = dict(base, bwd_step_us=7.5, bwd_ratio=7.5)
    cta = {"mode": "lstm", "H": 64, "B": 1, "family": "persistent_cta", "programs": 1,
           "note": "planner picks persistent_cta for this shape: no barrier in the loop"}
    lines = barrier.format_rows([old, new, cta]).splitlines()
    assert lines[0].split()[-4:] == ["ratio", "bwd", "us", "ratio"]
    assert lines[1].split()[-3:] == ["5.00", "1.00", "5.00"]
    assert lines[2].split()[-5:] == ["5.00", "1.00", "5.00", "7.50", "7.50"]
    assert lines[3].endswith(f"({cta['note']})")


# ----------------------------------------------------------------------------- audit fixes


_GOOD = tune.choice_id({"family": "stepwise", "block_h": 16})
_OTHER = tune.choice_id({"family": "persistent_cta"})


@pytest.mark.parametrize("record", [
    {"a": 1}, [1, 2], "str", {_GOOD: {"ms": "fast"}}, {_GOOD: {"ms": True}},
    {_GOOD: {"ms": None, "screened_ms": "x"}}, {_GOOD: {"ms": None, "error": 3}},
    {_GOOD: {"screened_ms": 1.0}},
], ids=["int-measurement", "list", "str", "ms-str", "ms-bool", "screened-str", "error-int",
        "no-ms"])
def test_tune_key_measures_again_what_a_damaged_partial_record_holds(tmp_path, monkeypatch,
                                                                     record):
    # The partial file's record for a key, edited or damaged: what is not a measurement is
    # dropped (the choice is measured again), and what is one is kept.
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    key = "k3"
    partial = {tune._partial_key(key): record}
    if isinstance(record, dict):
        record[_OTHER] = {"ms": 5.0}  # a valid measurement beside it: resumed, not rerun
    tune.partial_path().write_text(json.dumps(partial))
    calls = []

    def measure(choice, _bound):
        calls.append(choice["family"])
        return 2.0

    choices = [json.loads(_GOOD), json.loads(_OTHER)]
    summary = tune.tune_key(key, choices, measure, "dev")
    assert summary["status"] == "tuned" and summary["best"]["ms"] == 2.0
    resumed = isinstance(record, dict)  # the valid measurement beside the damaged one
    assert calls == (["stepwise"] if resumed else ["stepwise", "persistent_cta"])


@pytest.mark.parametrize("content, message", [
    (None, "missing.json: expected a readable JSON file (No such file or directory)"),
    ("{", "bad.json: expected a JSON file, got invalid JSON (Expecting property name"),
    (b"\xff\xfe", "bad.json: expected a JSON file, got invalid JSON ("),
], ids=["missing", "truncated", "not-utf8"])
def test_table_refuses_unreadable_files_in_one_line(tmp_path, capsys, content, message):
    from tritonrnn.bench import table

    path = tmp_path / ("missing.json" if content is None else "bad.json")
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert table.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # checked before the table starts
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    assert lines[0].startswith(f"python -m tritonrnn.bench.table: error: {tmp_path}/{message}")


_RUN = {"impl": "tritonrnn", "pass": "fwd", "status": "ok", "ms": 1.0}


@pytest.mark.parametrize("report, message", [
    ({"schema": "tritonrnn.bench/1"},
     "expected a complete tritonrnn.bench/1 report, got one without the field 'environment'"),
    ({"schema": "tritonrnn.bench/1", "environment": {"device": "CPU"}},
     "expected a complete tritonrnn.bench/1 report, got one without the field 'results'"),
    ({"schema": "tritonrnn.bench/1", "environment": {"device": "CPU"},
      "results": [{"label": "s", "runs": [{k: v for k, v in _RUN.items() if k != "ms"}]}]},
     "expected a complete tritonrnn.bench/1 report, got one without the field 'ms'"),
    ({"schema": "tritonrnn.bench/1", "environment": {"device": "CPU"}, "results": 3},
     "expected a tritonrnn.bench/1 report, got a field of another type (TypeError: "),
], ids=["no-environment", "no-results", "no-ms", "results-not-a-list"])
def test_table_refuses_a_bench_report_without_a_field_in_one_line(tmp_path, capsys, report,
                                                                   message):
    from tritonrnn.bench import table

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"schema": "tritonrnn.bench/1",
                                "environment": {"device": "CPU"},
                                "results": [{"label": "s", "runs": [_RUN]}]}))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(report))
    assert table.main([str(good), str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # checked before the table starts
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"python -m tritonrnn.bench.table: error: {path}: {message}")


def test_table_refuses_files_none_of_which_is_a_bench_report(tmp_path, capsys):
    # A barrier report and a JSON list: nothing to tabulate is an error, not an empty table.
    from tritonrnn.bench import table

    other, listed = tmp_path / "barrier.json", tmp_path / "list.json"
    other.write_text(json.dumps({"device": "GPU X", "rows": []}))
    listed.write_text("[]")
    assert table.main([str(other), str(listed)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "python -m tritonrnn.bench.table: error: expected at least one tritonrnn.bench/1 "
        "report (`tritonrnn bench` JSON), got none among 2 file(s)\n")


def test_table_plot_renders_each_bench_reports_plot_again(tmp_path, capsys, monkeypatch):
    """--plot DIR: the sweep plot of every bench report given (a committed GPU report here)
    as DIR/<stem>.png, barrier reports skipped; a folder that is not there is refused before
    the table (2), matplotlib missing is a failure after it (1)."""
    from helpers import ROOT  # (matplotlib: the `bench` extra, which the test setups install)

    from tritonrnn.bench import table

    results = ROOT / "bench" / "results"
    report = results / "nvidia-h200-2026-11-27-grid.json"
    barrier = results / "barrier-NVIDIA-H200-2026-11-27.json"
    out = tmp_path / "plots"
    out.mkdir()
    assert table.main(["--plot", str(out), str(report), str(barrier)]) == 0
    png = out / "nvidia-h200-2026-11-27-grid.png"
    assert [p.name for p in out.iterdir()] == [png.name]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert capsys.readouterr().err == f"wrote {png}\n"

    assert table.main(["--plot", str(tmp_path / "absent"), str(report)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "python -m tritonrnn.bench.table: error: --plot: expected an existing directory, got "
        f"{tmp_path / 'absent'}\n")

    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    png.unlink()
    assert table.main(["--plot", str(out), str(report)]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("| device |") and not png.exists()
    assert captured.err.startswith("python -m tritonrnn.bench.table: error: --plot needs "
                                   "matplotlib")


def test_table_labels_the_rows_of_a_shape_the_planner_refused(tmp_path, capsys):
    # harness._plan_summary records {"error": ...} where plan_for raised.
    from tritonrnn.bench import table

    run = {"impl": "tritonrnn", "pass": "fwd", "status": "ok", "ms": 1.0}
    report = {"schema": "tritonrnn.bench/1", "environment": {"device": "CPU"},
              "results": [{"label": "lstm H8", "runs": [run],
                           "plan": {"error": "ValueError: x"}}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert table.main([str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == (
        "| CPU | lstm H8 | fwd | plan error | 1.00 | - | - | - | - | - |")


def test_input_size_zero_is_no_size():
    # None (the default) means the same as hidden; 0 is refused as -1 is.
    assert presets.BenchShape(hidden=12).validated().input == 12
    assert presets.BenchShape(hidden=12, input_size=5).validated().input == 5
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"--input-size: expected an int >= 1, got {bad}"):
            presets.BenchShape(input_size=bad).validated()


def _tune_keys(cache_dir: str, worker: int, keys: int) -> None:
    """One concurrent `tune` run: its own keys, each over three choices."""
    os.environ["TRITONRNN_CACHE_DIR"] = cache_dir
    choices = [{"family": "persistent_grid", "block_b": 16, "num_warps": w} for w in (4, 8, 2)]
    for k in range(keys):
        tune.tune_key(f"w{worker}-k{k}", choices, lambda c, _b: float(c["num_warps"]), "dev")


def test_concurrent_tune_runs_keep_each_others_entries(tmp_path, monkeypatch):
    """Four processes tuning their own keys at once (one run per GPU) write the same cache
    and partial files: each read-modify-write holds the cache's lock, so every key's best is
    stored and no unfinished record is left (unlocked, the replaces drop each other's)."""
    import multiprocessing

    from tritonrnn.rnn.planner import load_tuning_cache

    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    workers, keys = 4, 25
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_tune_keys, args=(str(tmp_path), w, keys))
             for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    entries = load_tuning_cache()
    want = {f"w{w}-k{k}" for w in range(workers) for k in range(keys)}
    assert set(entries) == want, sorted(want - set(entries))[:5]
    assert all(e["num_warps"] == 2 for e in entries.values())
    assert json.loads(tune.partial_path().read_text()) == {}


def test_a_report_write_cut_short_keeps_the_last_complete_one(tmp_path):
    """write_report replaces the file whole (each checkpoint too): a write that fails part
    way (a full disk, here a 4 KiB file-size limit in a child process) leaves the previous
    report, valid, and no temporary file."""
    import subprocess
    import sys

    script = f"""
import json, pathlib, resource, signal
from tritonrnn.bench import harness
out = pathlib.Path({str(tmp_path)!r})
base = {{"created": "2026-11-29T10:00:00+00:00", "preset": "smoke",
        "environment": {{"device": "CPU x86_64"}}, "partial": True}}
harness.write_report({{**base, "results": [{{"label": "s1", "x": "a" * 2000}}]}}, out)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    harness.write_report({{**base, "results": [{{"label": f"s{{i}}", "x": "a" * 2000}}
                                             for i in range(3)]}}, out)
except OSError as e:
    print("failed:", e.errno)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "failed: 27" in done.stdout, done.stderr
    (report,) = tmp_path.glob("*.json")
    assert [r["label"] for r in json.loads(report.read_text())["results"]] == ["s1"]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_run_names_its_checkpoints_and_report_by_one_time(tmp_path, monkeypatch):
    """A run past midnight UTC: its checkpoint and its final report carry the time the run
    started and go to one file (the report over the checkpoint)."""
    import datetime as dt

    from tritonrnn.bench import harness

    times = iter(dt.datetime(2026, 11, 29, 23, 59, 50, tzinfo=dt.UTC) + dt.timedelta(minutes=m)
                 for m in range(100))

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return next(times)

    monkeypatch.setattr(harness, "_dt", type("M", (), {"datetime": Clock, "UTC": dt.UTC}))
    monkeypatch.setattr(harness, "measure_ceilings",
                        lambda *a: roofline.Ceilings("cpu", 1e9, {"float32": 1e9}))
    monkeypatch.setattr(harness, "environment",
                        lambda d: {"device": "CPU x86_64", "device_type": "cpu"})
    monkeypatch.setattr(harness, "run_shape", lambda s, o, c, t: {
        "label": s.label, "implementations": {}, "runs": []})
    shapes = presets.PRESETS["smoke"][:1] * 2
    checkpoints = []

    def checkpoint(partial):
        checkpoints.append(partial["created"])
        harness.write_report(partial, tmp_path)

    report = harness.run_benchmark(shapes, harness.BenchOptions(device=torch.device("cpu")),
                                   progress=False, preset="smoke", checkpoint=checkpoint)
    path = harness.write_report(report, tmp_path)
    assert checkpoints == [report["created"]] == ["2026-11-29T23:59:50+00:00"]
    assert [p.name for p in tmp_path.glob("*.json")] == [path.name]
    assert "partial" not in json.loads(path.read_text())


def test_compare_fails_an_output_the_implementation_did_not_give():
    """An implementation that returns None where the oracle has a tensor (a missing gradient)
    fails the check, naming it; it is not skipped as if there were nothing to compare."""
    case = runners.build_case(presets.BenchShape(mode="lstm", hidden=8, input_size=4, batch=2,
                                                 time=3, dtype="float32"), torch.device("cpu"))
    ref = runners.compute_oracle(case)
    got = {name: getattr(ref, name) for name in ("y", "hT", "cT", "dx", "dh0", "dparams")}
    assert runners.compare(case, {**got, "dc0": ref.dc0})["ok"]
    verdict = runners.compare(case, {**got, "dc0": None})
    assert not verdict["ok"] and verdict["missing"] == ["dc0"]
    assert verdict["within_tolerance"]  # what was given is within: the two apart
    # A tensor outside its tolerance beside the missing one: both recorded.
    verdict = runners.compare(case, {**got, "y": got["y"] + 1.0, "dc0": None})
    assert not verdict["ok"] and not verdict["within_tolerance"] and verdict["missing"] == ["dc0"]


def test_reports_name_the_cpu_model(monkeypatch, tmp_path):
    """The environment's `cpu` is the model name /proc/cpuinfo gives (CPU timings mean little
    without it); without that file, platform's answer."""
    from tritonrnn.bench import harness

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU 9000 @ 3 GHz\n"
                       "flags\t\t: fpu\n\nprocessor\t: 1\nmodel name\t: Some CPU 9000 @ 3 GHz\n")
    real_open = open

    def fake_open(path, *a, **k):
        if path == "/proc/cpuinfo":
            return real_open(cpuinfo if cpuinfo.exists() else tmp_path / "absent", *a, **k)
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    assert harness.cpu_model() == "Some CPU 9000 @ 3 GHz"
    assert harness.environment(torch.device("cpu"))["cpu"] == "Some CPU 9000 @ 3 GHz"
    cpuinfo.unlink()
    monkeypatch.setattr(harness.platform, "processor", lambda: "")
    assert harness.cpu_model() == harness.platform.machine()


def test_reports_record_the_switches_set(monkeypatch):
    """A report of an ablation (a switch of kernels/NOTES.md set) says so: the environment
    block lists the TRITONRNN_ variables."""
    from tritonrnn.bench.harness import environment

    monkeypatch.setenv("TRITONRNN_FWD_PAIRED_CHUNKS", "off")
    monkeypatch.delenv("TRITONRNN_PIPELINE", raising=False)
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", "/home/someone/.cache/elsewhere")
    switches = environment(torch.device("cpu"))["switches"]
    assert switches["TRITONRNN_FWD_PAIRED_CHUNKS"] == "off"
    assert "TRITONRNN_PIPELINE" not in switches
    assert "TRITONRNN_CACHE_DIR" not in switches  # a folder of the machine, not a switch


def test_progress_bars_only_on_a_terminal(monkeypatch):
    """stderr a file or a pipe (a CI log, gpu_session.sh's boxes): no bar, whose frames (one
    per update, the last without a newline) would fill the log."""
    import importlib.util
    import io
    import sys

    from tritonrnn.bench.progress import _Silent, progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(progress_bar(3, "x"), _Silent)
    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress_bar(3, "x")
    assert isinstance(bar, _Silent) == (importlib.util.find_spec("tqdm") is None)
    bar.close()
    assert isinstance(progress_bar(3, "x", enabled=False), _Silent)


def test_peak_of_a_pass_measured_on_its_own_call(monkeypatch):
    """`_peak_bytes` with a setup: setup() runs before the peak's window (what it allocates
    counts as held before), the measured call gets its result. torch's eager bwd is timed
    on one retained forward (cuDNN then clones its reserve every call) but its peak is taken
    on a fresh forward's backward without retain_graph, which holds no such copy."""
    from tritonrnn.bench import harness

    log, held = [], [0]

    def alloc(n):
        held[0] += n
        log.append(("alloc", n))

    monkeypatch.setattr(harness, "synchronize", lambda kind: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: log.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: held[0])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: held[0])
    peak = harness._peak_bytes(lambda state: alloc(state), torch.device("cuda"),
                               setup=lambda: (alloc(100), 7)[1])
    assert log == [("alloc", 100), "reset", ("alloc", 7)] and peak == 7
    assert harness._peak_bytes(lambda: alloc(5), torch.device("cpu")) is None

    case = runners.build_case(presets.BenchShape(mode="lstm", hidden=4, input_size=3, batch=2,
                                                 time=3, dtype="float32"),
                              torch.device("cpu"), seed=0)
    eager = runners.torch_runner(case, packed=False)
    setup, run = eager.peak_runs["bwd"]
    fresh = setup()
    got = run(fresh)
    want = eager.passes["bwd"]()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if w is not None:
            torch.testing.assert_close(g, w)
    with pytest.raises(RuntimeError, match="second time"):  # no graph kept (retain=False)
        run(fresh)


def test_varlen_reserve_ratio_is_also_given_per_row(tmp_path, capsys):
    """torch's padded run keeps T * B rows in its reserve, tritonrnn's the N = sum(lengths)
    rows that run: a varlen shape's ratio against it includes N / (T * B), so the report
    adds the per-row ratio and the table shows both (fixed-length shapes: the one ratio)."""
    from tritonrnn.bench import harness, table

    for varlen in ("none", "uniform"):
        shape = presets.BenchShape(mode="lstm", hidden=4, input_size=3, batch=4, time=5,
                                   dtype="float32", varlen=varlen)
        case = runners.build_case(shape, torch.device("cpu"), seed=1)
        record = {"implementations": {"tritonrnn": {"reserve_bytes": 300},
                                      "torch": {"reserve_bytes": 1000}}, "runs": []}
        harness._derive(record, case, roofline.Ceilings("cpu", 1e9))
        assert record["reserve_ratio"] == {"torch": 0.3}
        if varlen == "none":
            assert "reserve_ratio_per_row" not in record
            continue
        assert case.tokens < 20
        per_row = record["reserve_ratio_per_row"]["torch"]
        assert per_row == pytest.approx(0.3 * 20 / case.tokens)
        report = {"schema": "tritonrnn.bench/1", "environment": {"device": "GPU X"},
                  "results": [{**record, "label": "varlen",
                               "plan": {"families": ["persistent_cta"]},
                               "runs": [{"impl": "tritonrnn", "pass": "fwd", "status": "ok",
                                         "ms": 1.0}]}]}
        path = tmp_path / "varlen.json"
        path.write_text(json.dumps(report))
        table.main([str(path)])
        assert capsys.readouterr().out.strip().splitlines()[-1].endswith(
            f"| 0.30 ({per_row:.2f} per row) |")


def test_environment_records_each_sides_tf32():
    """fp32 shapes compare cuDNN (TF32 unless torch.backends.cudnn.allow_tf32 is off, torch's
    default on) with IEEE fp32 kernels: the report says which math each side ran."""
    from tritonrnn.bench.harness import environment

    env = environment(torch.device("cpu"))
    assert env["tf32"] == {"cudnn": torch.backends.cudnn.allow_tf32,
                           "matmul": torch.backends.cuda.matmul.allow_tf32}
