"""backend="triton" end to end (Triton interpreter on the CPU, or a GPU) against torch.nn in
float64, with each kernel family forced through plan_constraints."""

from __future__ import annotations

import contextlib
import copy
import math
import warnings

import pytest
import torch
from helpers import compare_with_torch, params_from_module, stepwise_runs, torch_oracle

from tritonrnn.rnn import cudnn_rnn, params_size
from tritonrnn.rnn.planner import plan_constraints

MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
FAMILIES = ["persistent_cta", "persistent_grid", "stepwise"]
# fp32 kernels vs the float64 oracle on fp32-rounded inputs: a few ulps per operation over
# T <= 7 steps and sums of <= 40 products; the reference engine in fp32 stays below 1e-5.
# On a GPU the same suite runs on CUDA tensors (fp32 dots use input_precision="ieee").
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32 = dict(dtype=torch.float32, rtol=2e-5, atol=2e-5, device=DEVICE)


def _family(family):
    # block_h=16 splits H=33 over three programs, so the grid families really exchange h.
    extra = {} if family == "persistent_cta" else {"block_h": 16}
    return plan_constraints(family=family, **extra)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_unidirectional_varlen_zero_lengths(family, mode):
    with _family(family):
        compare_with_torch(mode, L=1, lengths="zero", I=4, H=33, T=5, backend="triton", **FP32)


# Each family with two of the four cells, every cell at least once: the batch-major layout is
# the op's (one transpose before and after the engine, whatever the family), and the
# families' two-layer bidirectional launches meet every gated cell and tanh in
# tests/test_bidir_launch.py::test_end_to_end_matches_torch_with_shared_launches too.
@pytest.mark.parametrize("family, mode", [
    ("persistent_cta", "lstm"), ("persistent_cta", "rnn_relu"), ("persistent_grid", "lstm"),
    ("persistent_grid", "rnn_relu"), ("stepwise", "gru"), ("stepwise", "rnn_tanh")])
def test_bidirectional_two_layers_batch_major(family, mode):
    with _family(family):
        compare_with_torch(mode, L=2, bidirectional=True, lengths="varlen", time_major=False,
                           I=3, H=17, T=6, backend="triton", **FP32)


# A projection rules out hoisted weights: stepwise where helpers.stepwise_runs says.
@pytest.mark.parametrize("family", [f for f in FAMILIES
                                    if f != "stepwise" or stepwise_runs(hoistable=False)])
@pytest.mark.parametrize("lengths", ["batch1", "full"])
def test_lstm_projection(family, lengths):
    with _family(family):
        compare_with_torch("lstm", L=2, bidirectional=True, lengths=lengths, proj=5, I=4, H=18,
                           T=5, backend="triton", **FP32)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_vector_tiles_end_to_end(mode):
    # Vector tiles (the planner's choice at B = 1 on a GPU) through cudnn_rnn: two
    # bidirectional layers of one row, H = 17 in three slices of 8.
    with plan_constraints(family="persistent_grid", block_b=1, block_h=8):
        compare_with_torch(mode, L=2, bidirectional=True, lengths="batch1", I=4, H=17, T=5,
                           backend="triton", **FP32)


def test_vector_tiles_two_row_tiles_end_to_end():
    # Four unsorted lengths in two tiles of 2 rows, both directions.
    with plan_constraints(family="persistent_grid", block_b=2, block_h=8):
        compare_with_torch("lstm", L=1, bidirectional=True, lengths="varlen", I=4, H=17, T=5,
                           backend="triton", **FP32)


def _run(mode, backend, dropout=0.0, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(3)
    T, B, I, H, L = 5, 3, 4, 16, 3
    n = params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=I,
                    direction="bidirectional")
    x = torch.randn(T, B, I, generator=g).to(device, dtype).requires_grad_(True)
    h = torch.randn(2 * L, B, H, generator=g).to(device, dtype).requires_grad_(True)
    lstm = mode == "lstm"
    c = torch.randn(2 * L, B, H, generator=g).to(device, dtype).requires_grad_(True) if lstm \
        else None
    p = (torch.randn(n, generator=g) * 0.3).to(device, dtype).requires_grad_(True)
    lens = torch.tensor([5, 0, 3])
    out = cudnn_rnn(x, h, c, p, lens, rnn_mode=mode, direction="bidirectional",
                    dropout=dropout, seed=11, seed2=12, backend=backend)
    loss = out.output.square().sum() + out.output_h.sum()
    if lstm:  # the cell state and its gradient too
        loss = loss + (out.output_c * 0.5).sum()
    grads = torch.autograd.grad(loss, [x, h, p, *([c] if lstm else [])])
    return (out.output, out.output_h, *([out.output_c] if lstm else []), *grads)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_dropout_matches_reference_backend(mode):
    """The same counter-based mask in both backends: the results agree to fp32 rounding."""
    got = _run(mode, "triton", dropout=0.4)
    want = _run(mode, "reference", dropout=0.4)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fwd,bwd", [(4, 8), (8, 2)])
def test_backward_warps_apart_from_forward(fwd, bwd, monkeypatch):
    # The backward launch gets the plan's backward warps (and with them its own split-K
    # factor), the forward its own; both still match the oracle.
    from tritonrnn.kernels import persistent_grid as pg

    seen = {}

    def spy(name, fn):
        def launch(*args, **kw):
            seen.setdefault(name, set()).add(kw["num_warps"])
            return fn(*args, **kw)
        monkeypatch.setattr(pg, name, launch)

    spy("grid_forward", pg.grid_forward)
    spy("grid_backward", pg.grid_backward)
    with plan_constraints(family="persistent_grid", block_h=16, num_warps=fwd,
                          num_warps_bwd=bwd):
        compare_with_torch("lstm", L=1, lengths="varlen", I=4, H=33, T=5, backend="triton",
                           **FP32)
    assert seen == {"grid_forward": {fwd}, "grid_backward": {bwd}}


@pytest.mark.parametrize("family", FAMILIES)
def test_bit_identical_runs(family):
    with _family(family):
        a = _run("lstm", "triton")
        b = _run("lstm", "triton")
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_float64_routes_to_reference_family():
    a = _run("gru", "triton", dtype=torch.float64)
    b = _run("gru", "reference", dtype=torch.float64)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


# (input scale, weight scale): every gate saturated (pre-activations of 1e4 and more: the
# gates' derivatives underflow, so the gradients that flow through a gate are ~1e-194, while
# dc0 flows through the forget gates' 0 / 1 and the output's tanh'(c)), and large
# pre-activations (up to a few hundred) with many gates saturated but gradients that do not
# vanish.
@pytest.mark.parametrize("x_scale, p_scale", [(1e3, 50.0), (30.0, 5.0)],
                         ids=["saturated", "large"])
@pytest.mark.parametrize("family", FAMILIES)
def test_extreme_inputs_stay_finite(family, x_scale, p_scale):
    """Every output and every gradient (x, h0, c0, params) finite and equal to the float64
    reference's at the fp32 tolerance (an all-zero backward fails: the large case's dparams
    reach ~1.7, the saturated case's dc0 ~1)."""
    g = torch.Generator().manual_seed(0)
    T, B, I, H = 4, 2, 3, 16
    n = params_size(rnn_mode="lstm", num_layers=1, num_units=H, input_size=I)
    x = torch.randn(T, B, I, generator=g) * x_scale
    p = torch.randn(n, generator=g) * p_scale
    h0, c0 = torch.randn(1, B, H, generator=g), torch.randn(1, B, H, generator=g)
    w = [torch.randn(T, B, H, generator=g), torch.randn(1, B, H, generator=g),
         torch.randn(1, B, H, generator=g)]  # loss weights of output, output_h, output_c

    def run(backend, dtype, device):
        leaves = [t.to(device, dtype).requires_grad_(True) for t in (x, h0, c0, p)]
        with _family(family) if backend == "triton" else contextlib.nullcontext():
            out = cudnn_rnn(leaves[0], leaves[1], leaves[2], leaves[3], rnn_mode="lstm",
                            backend=backend)
            got = (out.output, out.output_h, out.output_c)
            loss = sum((o * wi.to(device, dtype)).sum() for o, wi in zip(got, w, strict=True))
            grads = torch.autograd.grad(loss, leaves)
        return [t.detach().cpu().double() for t in (*got, *grads)]

    got = run("triton", torch.float32, DEVICE)
    want = run("reference", torch.float64, "cpu")
    names = ("output", "output_h", "output_c", "dx", "dh0", "dc0", "dparams")
    for name, a, b in zip(names, got, want, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=lambda m, k=name: f"{k}: {m}")
    assert got[0].abs().max() <= 1.0
    grads = dict(zip(names[3:], want[3:], strict=True))
    if x_scale < 1e3:
        assert grads["dparams"].abs().max() > 1.0
    else:
        assert grads["dc0"].abs().max() > 0.1 and grads["dx"].abs().max() < 1e-100


def _scaled(got, exp):
    got, exp = got.detach().cpu().double(), exp.cpu().double()
    return (got - exp).abs().max().item() / max(1.0, exp.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_half_precision_on_gpu(mode, dtype):
    """Half precision has no fixed absolute tolerance worth having (gradients of params sum
    N products of rounded values), so the bar is the library being replaced: tritonrnn's
    error against float64 must be within 2x cuDNN's error in the same dtype on the same data
    (scaled by max(1, |ref|)), or within 4 unit roundoffs of the dtype."""
    errs, (module, x, h0, c0, lens, grads, want, _) = compare_with_torch(
        mode, L=2, bidirectional=True, lengths="zero", I=32, H=64, T=16, backend="triton",
        dtype=dtype, device="cuda", check=False)
    cudnn = copy.deepcopy(module).to("cuda", dtype)
    dev = lambda t: None if t is None else t.to("cuda", dtype)  # noqa: E731
    got = torch_oracle(cudnn, dev(x), dev(h0), dev(c0), lens, True,
                       tuple(dev(g) for g in grads))
    ref_params = params_from_module(module, tensors=want["dparams"])
    cudnn_params = params_from_module(module, tensors=got["dparams"])
    base = {
        "output": _scaled(got["output"], want["output"]),
        "output_h": _scaled(got["output_h"], want["output_h"]),
        "dx": _scaled(got["dx"], want["dx"]),
        "dh0": _scaled(got["dh0"], want["dh0"]),
        "dparams": _scaled(cudnn_params, ref_params),
    }
    if mode == "lstm":
        base["output_c"] = _scaled(got["output_c"], want["output_c"])
        base["dc0"] = _scaled(got["dc0"], want["dc0"])
    unit = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    for name, err in errs.items():
        assert err <= max(2 * base[name], 4 * unit), (name, err, base[name])


# A persistent-grid launch that fails is rerun stepwise (its inputs are intact, every output
# is rewritten), but not when what it reports is an earlier launch's barrier timeout (the
# deferred check, kernels/grid_barrier.py): that launch's outputs are invalid and may have
# been read since, so the error propagates instead of becoming a warning.
@pytest.mark.parametrize("earlier", [False, True], ids=["this-launch", "earlier-launch"])
def test_stepwise_fallback_reruns_only_a_launch_that_itself_failed(earlier):
    from tritonrnn.kernels.grid_barrier import BarrierTimeoutError
    from tritonrnn.rnn.planner import LayerPlan
    from tritonrnn.rnn.triton_backend import _with_stepwise_fallback

    calls = []

    def launch(*args, persistent, **tiles):
        calls.append(persistent)
        if persistent:
            raise BarrierTimeoutError("a launch of _grid_bwd: timed out", earlier=earlier)

    lp = LayerPlan("persistent_grid", block_b=16, block_h=16, num_warps=4, block_k=0,
                   num_warps_bwd=8, pair_gates=True)
    if earlier:
        with pytest.raises(BarrierTimeoutError, match="timed out"):
            _with_stepwise_fallback(launch, (), lp, backward=True)
        assert calls == [True]
    else:
        with pytest.warns(RuntimeWarning, match="rerunning stepwise"):
            _with_stepwise_fallback(launch, (), lp, backward=True)
        assert calls == [True, False]


@pytest.mark.parametrize("earlier", [False, True])
def test_barrier_timeouts_say_whether_another_launch_failed(earlier):
    # What the fallback above reads: the deferred check's report of an earlier launch is
    # marked so, a launch's own (sync mode) is not.
    from tritonrnn.kernels import grid_barrier

    flags = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(grid_barrier.BarrierTimeoutError) as info:
        grid_barrier._raise_if_failed(flags, "grid_backward", earlier=earlier)
    assert info.value.earlier is earlier
    assert ("an earlier launch of grid_backward" in str(info.value)) is earlier


def _spy_grid_launchers(monkeypatch, keys: tuple[str, ...]) -> dict:
    """{launcher name: {the values of `keys` in each call}} of the grid families' launchers
    (forward, backward, and their pair launches), filled as the backend calls them."""
    from tritonrnn.kernels import persistent_grid as pg

    seen = {}

    def spy(name):
        fn = getattr(pg, name)

        def launch(*args, **kw):
            seen.setdefault(name, set()).add(tuple(kw[k] for k in keys))
            return fn(*args, **kw)
        monkeypatch.setattr(pg, name, launch)

    for name in ("grid_forward", "grid_backward", "grid_forward_pair", "grid_backward_pair"):
        spy(name)
    return seen


# The streamed loops' stages (plan_constraints num_stages / num_stages_bwd; the planner's
# `_stream_stages` pipelines a streamed persistent grid as deep as its shared memory allows):
# each launch gets its pass's stages, streamed in chunks of 16 over H = 40 (the last chunk
# masked), and the results match the oracle. The interpreter runs no software pipeline, so
# this checks what reaches the launchers; tests/test_aot.py checks what a GPU compile makes
# of it.
@pytest.mark.parametrize("family, mode, bidirectional, stages, want", [
    ("persistent_grid", "lstm", False, dict(num_stages=5, num_stages_bwd=7), (5, 7)),
    ("persistent_grid", "gru", True, dict(num_stages=4), (4, 4)),  # both passes
    ("stepwise", "rnn_tanh", False, dict(num_stages_bwd=2), (3, 2)),  # the forward's default
    ("persistent_grid", "rnn_relu", False, {}, (8, 8)),  # `_stream_stages`: 8 fit
])
def test_streamed_loops_launch_on_their_stages(family, mode, bidirectional, stages, want,
                                               monkeypatch):
    seen = _spy_grid_launchers(monkeypatch, ("block_k", "num_stages"))
    with plan_constraints(family=family, block_h=16, block_b=16, block_k=16, **stages):
        compare_with_torch(mode, L=1, bidirectional=bidirectional, lengths="varlen", I=4,
                           H=40, T=4, backend="triton", **FP32)
    pair = "_pair" if bidirectional else ""
    assert seen == {f"grid_forward{pair}": {(16, want[0])},
                    f"grid_backward{pair}": {(16, want[1])}}


# The backward on its own tiles (plan_constraints block_h_bwd / block_b_bwd; the planner's
# `_taller_backward` gives LSTM / GRU at B = 64 a 32 x 16 backward under a 16 x 32 forward):
# each launch gets its pass's tiles, and a backward whose hidden slices and batch tiles both
# differ from the forward's (70 rows: 3 batch tiles forward, 5 backward; H = 40: 3 hidden
# slices forward, 2 backward) matches the oracle, one direction and a pair launch.
@pytest.mark.parametrize("family, mode, bidirectional, proj", [
    ("persistent_grid", "lstm", False, 0), ("persistent_grid", "gru", True, 0),
    ("stepwise", "rnn_tanh", False, 0),
    ("persistent_grid", "lstm", False, 24)])  # the projection's slices follow the tiles too
def test_backward_on_its_own_tiles(family, mode, bidirectional, proj, monkeypatch):
    seen = _spy_grid_launchers(monkeypatch, ("block_h", "block_b"))
    with plan_constraints(family=family, block_h=16, block_b=32, block_h_bwd=32,
                          block_b_bwd=16):
        compare_with_torch(mode, L=1, bidirectional=bidirectional, lengths="batch70", I=4,
                           H=40, T=4, proj=proj, backend="triton", **FP32)
    pair = "_pair" if bidirectional else ""
    assert seen == {f"grid_forward{pair}": {(16, 32)}, f"grid_backward{pair}": {(32, 16)}}


# TRITONRNN_BWD_SPLIT_K=on / TRITONRNN_BWD_SPLIT_K1=on (kernels/split_k.py, both off by
# default): a grid-family plan's backward without a projection runs the split-K kernel, its
# one-barrier form where that switch is on and `split_k1_tiles` has tiles (B <= 32), else its
# two-barrier form where that switch is on, per direction of a bidirectional layer
# (persistent for persistent_grid, stepwise launches for stepwise), and matches the oracle.
# Seen: (units, kblock, btile, one_barrier, persistent).
@pytest.mark.parametrize("family, mode, bidirectional, lengths, two, one, want", [
    ("persistent_grid", "lstm", False, "varlen", True, False, (16, 64, 16, False, True)),
    ("persistent_grid", "lstm", False, "varlen", False, True, (16, 64, 16, True, True)),
    ("persistent_grid", "gru", True, "varlen", True, False, (16, 64, 16, False, True)),
    ("persistent_grid", "gru", True, "varlen", True, True, (16, 48, 16, True, True)),
    ("stepwise", "rnn_tanh", False, "varlen", True, False, (16, 64, 16, False, False)),
    ("stepwise", "rnn_relu", False, "zero", False, True, (16, 16, 16, True, False)),
    ("persistent_grid", "lstm", False, "batch70", True, True, (16, 64, 128, False, True)),
])
def test_split_k_backward_switch(family, mode, bidirectional, lengths, two, one, want,
                                 monkeypatch):
    from tritonrnn.kernels import split_k

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", two)
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", one)
    seen, run = set(), split_k.split_k_backward

    def spy(*args, **kw):
        seen.add((kw["units"], kw["kblock"], kw["btile"], kw["one_barrier"], kw["persistent"]))
        return run(*args, **kw)

    monkeypatch.setattr(split_k, "split_k_backward", spy)
    with plan_constraints(family=family, block_h=16):
        compare_with_torch(mode, L=1, bidirectional=bidirectional, lengths=lengths, I=4,
                           H=64, T=4, backend="triton", **FP32)
    assert seen == {want}


# ... and with a projection, past the one-barrier form's batch with only its switch on, or
# with both off, the plan names no split-K form, so the plan's own backward runs (the backend
# runs a plan's split_k_bwd alone: test_split_k_backward_forced_by_the_plan).
@pytest.mark.parametrize("mode, proj, batch, two, one", [
    ("lstm", 0, 70, False, True), ("lstm", 8, 4, True, True), ("rnn_relu", 0, 4, False, False)])
def test_split_k_switches_leave_these_backwards_alone(mode, proj, batch, two, one,
                                                     monkeypatch):
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import device_properties, recurrence_choice

    props = device_properties(torch.device("cpu"))
    with plan_constraints(family="persistent_grid", block_h=16):
        # (both switches on, without a projection: the layer's backward would be split-K)
        monkeypatch.setattr(split_k, "_BWD_SPLIT_K", True)
        monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", True)
        assert recurrence_choice(mode, 64, 64, 0, torch.float32, batch, props)[0].split_k_bwd
        monkeypatch.setattr(split_k, "_BWD_SPLIT_K", two)
        monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", one)
        lp = recurrence_choice(mode, 64, proj or 64, proj, torch.float32, batch, props)[0]
    assert (lp.family, lp.split_k_bwd) == ("persistent_grid", 0)


# plan_constraints(split_k_bwd=...) names the backward whatever the switches say: a form forced
# with both switches off runs (on its rule's tiles, with the kernel's 8 warps or num_warps_bwd),
# 0 forced with both on runs the plan's own; every gradient against the oracle. Seen: (units,
# kblock, btile, one_barrier, persistent, num_warps).
@pytest.mark.parametrize("family, mode, bidirectional, form, switched, warps, want", [
    ("persistent_grid", "lstm", False, 2, False, None, {(16, 64, 16, False, True, 8)}),
    ("persistent_grid", "gru", True, 1, False, 4, {(16, 48, 16, True, True, 4)}),
    ("stepwise", "rnn_tanh", False, 1, False, None, {(16, 16, 16, True, False, 8)}),
    ("persistent_grid", "rnn_relu", False, 2, False, 4, {(16, 64, 16, False, True, 4)}),
    ("persistent_grid", "lstm", False, 0, True, None, set()),
])
def test_split_k_backward_forced_by_the_plan(family, mode, bidirectional, form, switched,
                                             warps, want, monkeypatch):
    from tritonrnn.kernels import split_k

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", switched)
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", switched)
    seen, run = set(), split_k.split_k_backward

    def spy(*args, **kw):
        seen.add((kw["units"], kw["kblock"], kw["btile"], kw["one_barrier"], kw["persistent"],
                  kw["num_warps"]))
        return run(*args, **kw)

    monkeypatch.setattr(split_k, "split_k_backward", spy)
    bwd = {} if warps is None else {"num_warps_bwd": warps}
    with plan_constraints(family=family, block_h=16, split_k_bwd=form, **bwd):
        compare_with_torch(mode, L=1, bidirectional=bidirectional, lengths="varlen", I=4,
                           H=64, T=4, backend="triton", **FP32)
    assert seen == want


@pytest.mark.parametrize("form", [1, 2])
def test_a_bidirectional_layer_runs_its_pair_plans_split_k_backward(form, tmp_path,
                                                                    monkeypatch):
    """A tuning entry of the pair key (|D2) naming a split-K form: both directions' backward
    run it (one launch each, reversed for direction 1), although the one-direction key's
    plan (here the heuristic's persistent CTA at H=64) names none; the layer matches the
    oracle."""
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import device_properties, recurrence_key, store_tuning_entry

    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    props = device_properties(torch.device("cpu"))
    key = recurrence_key("lstm", 64, 0, torch.float32, 4, props, num_dirs=2)
    store_tuning_entry(key, {"family": "persistent_grid", "block_h": 16, "split_k_bwd": form},
                       1.0, props.name)
    seen, run = [], split_k.split_k_backward

    def spy(*args, **kw):
        seen.append((args[12], kw["one_barrier"]))  # (reverse, form)
        return run(*args, **kw)

    monkeypatch.setattr(split_k, "split_k_backward", spy)
    compare_with_torch("lstm", L=1, bidirectional=True, lengths="varlen", I=4, H=64, T=4,
                       backend="triton", **FP32)
    assert sorted(seen) == [(False, form == 1), (True, form == 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("two, one", [(True, False), (False, True)],
                         ids=["two-barriers", "one-barrier"])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_gpu_split_k_backward_in_the_layer(mode, two, one, monkeypatch):
    """On CUDA each split-K form runs a bidirectional layer's backward as one persistent
    launch per direction (its grid barriers; each form writing the gradients over the
    pre-activations) and the layer matches the float64 oracle in fp32 (IEEE dots)."""
    from tritonrnn.kernels import split_k

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", two)
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", one)
    seen, run = [], split_k.split_k_backward

    def spy(*args, **kw):
        seen.append((kw["one_barrier"], kw["persistent"]))
        return run(*args, **kw)

    monkeypatch.setattr(split_k, "split_k_backward", spy)
    with plan_constraints(family="persistent_grid", block_h=16):
        compare_with_torch(mode, L=1, bidirectional=True, lengths="zero", I=8, H=64, T=16,
                           backend="triton", dtype=torch.float32, rtol=2e-5, atol=2e-5,
                           device="cuda")
    assert seen == [(one, True)] * 2


def test_split_k_backward_switch_shows_in_explain(monkeypatch):
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import plan_for

    def explain():
        with plan_constraints(family="persistent_grid"):
            return plan_for(rnn_mode="lstm", num_units=64, input_size=64, batch=16,
                            max_time=8, dtype=torch.bfloat16, device_properties="h100").explain()

    assert "split-K" not in explain()
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", True)
    assert "backward split-K 16 x 64 x 16, two barriers" in explain()
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", True)
    assert "backward split-K 16 x 64 x 16, one barrier" in explain()


ONE_BARRIER_WS = {"split_k.partials": (2, 4, 16, 64), "split_k.carries": (2, 2, 16, 64)}
HELD = {"split_k.held": (4, 16, 64)}


@pytest.mark.parametrize("two, one, family, device, want", [
    (False, False, "persistent_grid", "h100", {}),
    (True, False, "persistent_grid", "h100",
     {"split_k.partials": (4, 16, 64), "split_k.carries": (2, 16, 64)}),
    (False, True, "persistent_grid", "h100", ONE_BARRIER_WS),
    (True, True, "persistent_grid", "h100", ONE_BARRIER_WS),
    (False, True, "stepwise", "h100", {**ONE_BARRIER_WS, **HELD}),
    (False, True, "persistent_grid", "interpreter", {**ONE_BARRIER_WS, **HELD}),
])
def test_split_k_workspace_is_in_the_plans_buffers(two, one, family, device, want,
                                                   monkeypatch):
    """The plan lists the workspace the split-K backward allocates (`split_k.workspace`),
    in the form its switches give (LSTM H=64 B=16 on an H100: 16 x 64 x 16 tiles, 4 K
    blocks; the one-barrier form's two slots of each, and where its steps take several
    launches, a stepwise plan or the interpreter's 16 programs, its held gradients, [G,
    Bpad, H] in the layer's dtype), and its cache keeps the switches apart: a plan made under
    one setting does not answer for another. Either form writes dpre_x over pre_x
    (`backward_writes_over_preacts`)."""
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import plan_for

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", two)
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", one)
    with plan_constraints(family=family):
        plan = plan_for(rnn_mode="lstm", num_units=64, input_size=64, batch=16, max_time=8,
                        dtype=torch.bfloat16, device_properties=device)
    got = {b.name: b.shape for b in plan.buffers if b.name.startswith("split_k.")}
    assert got == want
    pre = {b.name for b in plan.buffers if b.phase == "backward" and "pre_" in b.name}
    assert pre == {"pre_x / dpre_x", "pre_h"}
    for b in plan.buffers:
        if b.name.startswith("split_k."):
            dtype = "bfloat16" if b.name == "split_k.held" else "float32"
            assert (b.dtype, b.nbytes) == (dtype, (2 if b.name == "split_k.held" else 4)
                                           * math.prod(b.shape)), b


def test_split_k_workspace_counts_each_layer_in_flight(monkeypatch):
    """In the layer pipeline's backward, the layers in flight (its width) each run their
    split-K backward on their own stream, with their own workspace: the plan lists that many
    copies, and counts them in its peak."""
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import plan_for

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", True)
    plans = {}
    for chunks in (1, 4):
        with plan_constraints(family="persistent_grid", pipeline_chunks=chunks):
            plans[chunks] = plan_for(rnn_mode="lstm", num_units=64, input_size=64, batch=16,
                                     max_time=8, num_layers=3, dtype=torch.bfloat16,
                                     device_properties="h100")
    # (the copies follow the backward's layers in flight: 3, as the forward's, here)
    assert (plans[4].pipeline.width, plans[4].pipeline.backward_width) == (3, 3)
    one, many = ({b.name: b for b in plans[k].buffers if b.name.startswith("split_k.")}
                 for k in (1, 4))
    assert {n: b.shape for n, b in one.items()} == {"split_k.partials": (4, 16, 64),
                                                    "split_k.carries": (2, 16, 64)}
    assert {n: b.shape for n, b in many.items()} == {"split_k.partials": (3, 4, 16, 64),
                                                     "split_k.carries": (3, 2, 16, 64)}
    assert all(many[n].nbytes == 3 * one[n].nbytes for n in one)


def test_split_k_backward_failing_persistent_launch_reruns_stepwise(monkeypatch):
    """As the grid launches (`_with_stepwise_fallback`): a persistent split-K launch that
    raises RuntimeError (a refused cooperative launch, a barrier timeout in sync mode) is
    rerun stepwise, with a warning, and the layer still matches the oracle."""
    from tritonrnn.kernels import split_k

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", True)
    calls, run = [], split_k.split_k_backward

    def flaky(*args, **kw):
        calls.append(kw["persistent"])
        if kw["persistent"]:
            raise RuntimeError("cooperative launch refused")
        return run(*args, **kw)

    monkeypatch.setattr(split_k, "split_k_backward", flaky)
    with plan_constraints(family="persistent_grid", block_h=16), pytest.warns(
            RuntimeWarning, match="cooperative launch refused.*rerunning stepwise"):
        compare_with_torch("lstm", L=1, lengths="varlen", I=4, H=64, T=4, backend="triton",
                           **FP32)
    assert calls == [True, False]


def test_an_error_raised_after_a_persistent_launch_ran_is_not_rerun_stepwise(monkeypatch):
    """An error the launcher raises after its kernel ran (`grid_barrier.check_flags`' queuing
    of the flags, tagged after_launch) propagates: the backward may have written its
    gradients over its pre-activations, so a stepwise rerun would compute from them."""
    from tritonrnn.kernels import persistent_grid as pg

    calls, run = [], pg.grid_backward

    def ran_then_failed(*args, **kw):
        calls.append(kw["persistent"])
        run(*args, **kw)
        err = RuntimeError("CUDA error: out of memory (pinned host memory)")
        err.after_launch = True
        raise err

    monkeypatch.setattr(pg, "grid_backward", ran_then_failed)
    with (plan_constraints(family="persistent_grid", block_h=16), warnings.catch_warnings(),
          pytest.raises(RuntimeError, match="pinned host memory")):
        warnings.simplefilter("error")
        compare_with_torch("lstm", L=1, lengths="varlen", I=4, H=32, T=3, backend="triton",
                           **FP32)
    assert calls == [True]


@pytest.mark.parametrize("mode, after", [("deferred", True), ("sync", False)])
def test_a_barrier_timeout_checked_at_once_may_be_rerun_only_in_sync_mode(monkeypatch, mode,
                                                                         after):
    """Off the GPU (the interpreter) the flags are read at once in either mode; only the
    sync mode keeps a backward's inputs for a rerun (`backward_writes_over_preacts`), so a
    timeout reported in the deferred mode is tagged after_launch (no stepwise rerun)."""
    from tritonrnn.kernels import grid_barrier

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", mode)
    sync = torch.tensor([[3, 0], [2, 1]], dtype=torch.int32)
    with pytest.raises(grid_barrier.BarrierTimeoutError, match="grid_backward: ") as info:
        grid_barrier.check_flags(sync, "grid_backward")
    assert info.value.after_launch is after and not info.value.earlier


@pytest.mark.gpu
def test_check_flags_tags_a_failure_of_its_queuing_as_after_the_launch(monkeypatch):
    """The deferred check's bookkeeping (pinned copy, event) failing: the error carries
    after_launch, which the stepwise fallback honours."""
    from tritonrnn.kernels import grid_barrier

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "deferred")
    real = torch.empty

    def no_pinned(*args, **kw):
        if kw.get("pin_memory"):
            raise RuntimeError("CUDA error: out of memory")
        return real(*args, **kw)

    monkeypatch.setattr(torch, "empty", no_pinned)
    sync = torch.zeros(2, 2, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="out of memory") as info:
        grid_barrier.check_flags(sync, "grid_backward")
    assert info.value.after_launch


@pytest.mark.parametrize("path", ["ops", "library", "library-compiled", "module"])
def test_the_backward_keeps_the_forwards_plan_constraints_on_another_thread(path, monkeypatch):
    """Autograd runs a CUDA backward on the device's own thread, where the caller's
    plan_constraints (a contextvar) is not set: each path carries the forward's constraints
    to its backward (the torch.library op, which the modules call, ran the heuristic's plan
    there), also from a compiled graph, which calls the backprop op outside any Python
    context of the backward's (the constraints are an argument of the op). A thread of our
    own stands in for the device's."""
    import threading

    from tritonrnn.rnn import LSTM, library
    from tritonrnn.rnn import triton_backend as tb
    from tritonrnn.rnn.planner import device_properties, recurrence_choice

    families, launch = [], tb._backward_launch

    def spy(lp, shape, args):
        families.append(lp.family)
        return launch(lp, shape, args)

    monkeypatch.setattr(tb, "_backward_launch", spy)
    T, B, I, H = 2, 1, 2, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g, requires_grad=True)
    with plan_constraints(family="stepwise"):
        if path == "module":
            out = LSTM(I, H, backend="triton")(x)[0]
        else:
            fn = cudnn_rnn if path == "ops" else library.cudnn_rnn
            n = params_size(rnn_mode="lstm", num_layers=1, num_units=H, input_size=I)
            p = (torch.randn(n, generator=g) * 0.3).requires_grad_()
            h0 = torch.zeros(1, B, H)

            def run(x, p):
                return fn(x, h0, h0, p, rnn_mode="lstm", backend="triton").output

            if path == "library-compiled":
                run = torch.compile(run, backend="aot_eager", fullgraph=True)
            out = run(x, p)
    assert recurrence_choice("lstm", H, H, 0, torch.float32, B,
                             device_properties(x.device))[0].family != "stepwise"
    worker = threading.Thread(target=lambda: out.sum().backward())
    worker.start()
    worker.join()
    assert families == ["stepwise"]
    assert x.grad is not None and torch.isfinite(x.grad).all()
