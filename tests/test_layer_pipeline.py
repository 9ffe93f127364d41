"""The layer pipeline (rnn/pipeline.py): a unidirectional stack run over time chunks, layer l
on chunk k while layer l-1 runs chunk k+1, must give the unpipelined results: outputs, final
states and every gradient, through the public ops. Plus the window layouts it runs on
(packing.window) and the rule that decides the number of chunks.

Tolerances. The pipelined and unpipelined runs execute the same operations on the same
values, except that the GEMMs over one chunk's packed rows (input projections, recomputed
pre-activations, input gradients) may add their K products in another order than one GEMM
over all rows (a BLAS picks its blocking from the row count). Reassociating a K-term sum
changes it by at most 2 (K - 1) u sum|a_k b_k| (u the unit roundoff); here K <= G * H = 96,
so in fp32 (u = 2^-24) at most 1.1e-5 of the terms' magnitude, which the recurrence (gate
derivatives <= 1, |R| <= 1/sqrt(H) from torch.nn's init) carries over T <= 7 steps and L <= 3
layers without growing beyond a small factor: each compared tensor must agree to 2e-5 of its
largest entry (the bound the fp32 engine also holds against the float64 oracle elsewhere in
the suite). float64 (u = 2^-53): within 1e-12. Measured: <= 1e-6 (fp32), <= 2e-15 (float64).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import make_case, params_from_module

from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop
from tritonrnn.rnn import reference as reference_mod
from tritonrnn.rnn.config import make_config
from tritonrnn.rnn.packing import make_pack_info, prev_rows, window
from tritonrnn.rnn.pipeline import (
    Pipeline,
    concurrent_layers,
    decide,
    model_time_us,
    pipeline_chunks,
    run,
    stack_plans,
    step_bounds,
)
from tritonrnn.rnn.planner import PRESETS, LayerPlan, plan_constraints

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
T = 7
LENGTHS = [T, 3, 0, T - 2, 1]  # unsorted, one length-0 sequence, max_len = T
CHUNKS = [2, 3, T]  # T: every chunk one step
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def _run(mode, *, chunks, L=3, H=7, I=5, proj=0, dropout=0.0, time_major=True,
         dtype=torch.float32, backend="reference", lengths=LENGTHS, constraints=None,
         device=DEVICE, skip_input=False, steps=T):
    """cudnn_rnn forward + autograd backward under plan_constraints(pipeline_chunks=chunks)
    (chunks None: the rule decides). Returns {name: tensor} for the outputs and every
    gradient."""
    module, x, h0, c0, lens = make_case(mode, I, H, L, False, proj, steps, lengths, time_major,
                                        seed=7)
    params = params_from_module(module, skip_input=skip_input)
    leaves = [t.to(device=device, dtype=dtype).requires_grad_(True) if t is not None else None
              for t in (x, h0, c0, params)]
    xs, hs, cs, ps = leaves
    g = torch.Generator().manual_seed(8)
    forced = {"pipeline_chunks": chunks} if chunks is not None else {}
    with plan_constraints(**forced, **(constraints or {})):
        res = cudnn_rnn(xs, hs, cs, ps, lens, rnn_mode=mode, num_proj=proj, dropout=dropout,
                        seed=21, seed2=22, time_major=time_major, backend=backend,
                        input_mode="skip_input" if skip_input else "linear_input")
        outs = {"output": res.output, "output_h": res.output_h}
        if cs is not None:
            outs["output_c"] = res.output_c
        loss = sum((v * torch.randn(v.shape, generator=g, dtype=torch.float64).to(v)).sum()
                   for v in outs.values())
        grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    names = ["dx", "dh0"] + (["dc0"] if cs is not None else []) + ["dparams"]
    return {**{k: v.detach() for k, v in outs.items()}, **dict(zip(names, grads, strict=True))}


def _assert_same(got: dict, want: dict, dtype) -> float:
    """Every tensor of `got` equals `want`'s within TOL[dtype] of its largest entry; returns
    the largest difference."""
    assert got.keys() == want.keys()
    worst = 0.0
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape, name
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        tol = TOL[dtype] * max([1.0, *w.abs().flatten().tolist()])
        torch.testing.assert_close(g, w, rtol=TOL[dtype], atol=tol,
                                   msg=lambda m, n=name: f"{n}: {m}")
        worst = max([worst, *(g - w).abs().flatten().tolist()])
    return worst


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("chunks", CHUNKS, ids=lambda c: f"C{c}")
@pytest.mark.parametrize("mode", MODES)
def test_reference_three_layers_varlen(mode, chunks, dtype):
    want = _run(mode, chunks=1, dtype=dtype)
    _assert_same(_run(mode, chunks=chunks, dtype=dtype), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("chunks", CHUNKS, ids=lambda c: f"C{c}")
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_reference_dropout_batch_major(mode, chunks, dtype):
    """Training dropout between layers: each chunk's rows get exactly the unpipelined mask
    (a window keeps its rows' dropout counters), forward and backward."""
    kw = dict(dropout=0.4, time_major=False, dtype=dtype)
    want = _run(mode, chunks=1, **kw)
    _assert_same(_run(mode, chunks=chunks, **kw), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("chunks", CHUNKS, ids=lambda c: f"C{c}")
def test_reference_lstm_projection(chunks, dtype):
    kw = dict(L=2, H=8, proj=3, dropout=0.3, dtype=dtype)
    want = _run("lstm", chunks=1, **kw)
    _assert_same(_run("lstm", chunks=chunks, **kw), want, dtype)


@pytest.mark.parametrize("mode", ["lstm", "rnn_tanh"])
def test_reference_skip_input(mode):
    """skip_input: layer 0 adds x to every gate (no W); its input gradient is the gate sum,
    formed chunk by chunk."""
    kw = dict(L=2, H=6, I=6, skip_input=True, dropout=0.2)
    want = _run(mode, chunks=1, **kw)
    _assert_same(_run(mode, chunks=3, **kw), want, torch.float32)


def test_dropout_really_applies():
    """The dropout cases above would pass vacuously if dropout were a no-op in both runs."""
    a = _run("gru", chunks=2, dropout=0.4)
    b = _run("gru", chunks=2, dropout=0.0)
    assert (a["output"] - b["output"]).abs().max() > 1e-2


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_backprop_op_mixed_forward_and_backward(mode):
    """The reserve is the same whether the forward was pipelined or not: a pipelined
    backward from an unpipelined forward's reserve (and the reverse) gives the same
    gradients as both unpipelined (cudnn_rnn_backprop, the explicit op)."""
    L, H, I = 3, 6, 4
    module, x, h0, c0, lens = make_case(mode, I, H, L, False, 0, T, LENGTHS, True, seed=3)
    p = params_from_module(module)
    x, h0, p = (t.float().to(DEVICE) for t in (x, h0, p))
    c0 = c0.float().to(DEVICE) if c0 is not None else None
    attrs = dict(rnn_mode=mode, dropout=0.25, seed=5, seed2=6, backend="reference")
    g = torch.Generator().manual_seed(4)

    def forward(chunks):
        with plan_constraints(pipeline_chunks=chunks):
            return cudnn_rnn(x, h0, c0, p, lens, **attrs)

    fwd = {c: forward(c) for c in (1, 3)}
    dy = torch.randn(fwd[1].output.shape, generator=g).to(DEVICE)
    dh = torch.randn(h0.shape, generator=g).to(DEVICE)
    dc = torch.randn(c0.shape, generator=g).to(DEVICE) if c0 is not None else None

    def backward(f, chunks):
        with plan_constraints(pipeline_chunks=chunks):
            r = cudnn_rnn_backprop(x, h0, c0, p, lens, f.output, f.output_h, f.output_c, dy,
                                   dh, dc, f.reserve_space, f.host_reserved, **attrs)
        return {"dx": r.input_backprop, "dh0": r.input_h_backprop, "dc0": r.input_c_backprop,
                "dparams": r.params_backprop}

    want = backward(fwd[1], 1)
    for f_chunks, b_chunks in ((1, 4), (3, 1), (3, 2)):
        _assert_same(backward(fwd[f_chunks], b_chunks), want, torch.float32)


def test_reserve_identical_up_to_rounding():
    """The pipelined forward writes the same reserve views (c_t of every layer, the outputs
    of every layer but the last), chunk by chunk."""
    module, x, h0, c0, lens = make_case("lstm", 4, 6, 3, False, 0, T, LENGTHS, True, seed=2)
    args = [t.to(DEVICE) for t in (x, h0, c0, params_from_module(module))]
    res = {}
    for chunks in (1, 3):
        with plan_constraints(pipeline_chunks=chunks):
            res[chunks] = cudnn_rnn(*args, lens, rnn_mode="lstm", backend="reference")
    a, b = (res[c].reserve_space for c in (1, 3))
    assert a.shape == b.shape
    assert torch.equal(a[:256], b[:256])  # header
    torch.testing.assert_close(a[256:].view(torch.float64), b[256:].view(torch.float64),
                               rtol=1e-12, atol=1e-12)


def test_schedule_runs_every_layer_over_the_windows(monkeypatch):
    """The pipelined path really runs: the recurrence sees each layer's chunks as windows
    (forward: layer by layer, chunks in time order; backward: from the top layer down,
    chunks in reverse time order), each window the rows and steps of its chunk."""
    calls = []

    def spy(kind, fn):
        def wrapped(*args):
            info = args[7] if kind == "fwd" else args[12]
            calls.append((kind, info.max_len, info.N))
            return fn(*args)
        return wrapped

    monkeypatch.setattr(reference_mod, "recurrence_forward",
                        spy("fwd", reference_mod.recurrence_forward))
    monkeypatch.setattr(reference_mod, "recurrence_backward",
                        spy("bwd", reference_mod.recurrence_backward))
    _run("gru", chunks=3, L=2)
    # LENGTHS sorted: [7, 5, 3, 1, 0], batch_sizes (4, 3, 3, 2, 2, 1, 1); chunks [0, 2),
    # [2, 4), [4, 7): 7, 5 and 4 rows.
    fwd = [("fwd", 2, 7), ("fwd", 2, 5), ("fwd", 3, 4)] * 2
    bwd = [("bwd", 3, 4), ("bwd", 2, 5), ("bwd", 2, 7)] * 2
    assert calls == fwd + bwd


def test_unpipelined_by_default_on_cpu(monkeypatch):
    calls = []
    fn = reference_mod.recurrence_forward
    monkeypatch.setattr(reference_mod, "recurrence_forward",
                        lambda *a: (calls.append(a[7].max_len), fn(*a))[1])
    module, x, h0, c0, lens = make_case("gru", 3, 5, 2, False, 0, T, LENGTHS, True)
    cudnn_rnn(x, h0, None, params_from_module(module), lens, rnn_mode="gru",
              backend="reference")
    assert calls == [T, T]


def test_forced_chunks_on_bidirectional_stack_raises():
    module, x, h0, c0, lens = make_case("gru", 3, 5, 2, True, 0, T, LENGTHS, True)
    p = params_from_module(module)
    with plan_constraints(pipeline_chunks=2), pytest.raises(ValueError) as err:
        cudnn_rnn(x, h0, None, p, lens, rnn_mode="gru", direction="bidirectional",
                  backend="reference")
    msg = str(err.value)
    assert "pipeline_chunks" in msg and "expected 1" in msg and "got 2" in msg
    with plan_constraints(pipeline_chunks=1):  # 1 is the unpipelined stack: allowed
        cudnn_rnn(x, h0, None, p, lens, rnn_mode="gru", direction="bidirectional",
                  backend="reference")


# ----------------------------------------------------------------------------- triton


TRITON_CASES = [
    # (mode, family constraints, H, proj, chunks): the grid family with H = 33 split over
    # three 16-wide slices exchanges h between programs inside every window.
    ("lstm", {"family": "persistent_grid", "block_h": 16}, 33, 0, 3),
    ("gru", {"family": "persistent_grid", "block_h": 16}, 33, 0, 2),
    ("lstm", {"family": "persistent_cta"}, 12, 4, 3),
    ("rnn_relu", {"family": "persistent_cta"}, 12, 0, T),
]


@pytest.mark.parametrize(
    "mode, constraints, H, proj, chunks", TRITON_CASES,
    ids=[f"{m}-{c['family']}-H{h}-P{p}-C{k}" for m, c, h, p, k in TRITON_CASES])
def test_triton_matches_unpipelined(mode, constraints, H, proj, chunks):
    kw = dict(L=2, H=H, I=4, proj=proj, dropout=0.3, backend="triton",
              constraints=constraints, lengths=[T, 3, 0, 5])
    want = _run(mode, chunks=1, **kw)
    _assert_same(_run(mode, chunks=chunks, **kw), want, torch.float32)


@pytest.mark.parametrize("mode, H, form, chunks, sms", [("lstm", 32, 1, 3, 4),
                                                        ("gru", 64, 2, 2, 16)])
def test_triton_split_k_backward_matches_unpipelined(mode, H, form, chunks, sms, monkeypatch):
    """The split-K backward forced (plan_constraints split_k_bwd) under a pipelined forward.
    On a device of `sms` SMs (the interpreter's preset narrowed) its launch (4 / 16
    programs) fills the device, the forward's (2 / 4) does not: the forward keeps both
    layers in flight, and the backward, one layer at a time (`Decision.backward_width`),
    runs unpipelined, once per layer, reading the pipelined forward's reserve. On twice the
    SMs both passes pipeline: the backward runs it on each (layer, window), every window's
    rows a packed layout of their own. Both match the unpipelined run."""
    import tritonrnn.rnn.pipeline as pipeline_mod
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn import planner

    seen, run = [], split_k.split_k_backward

    def spy(*args, **kw):
        seen.append(kw["one_barrier"])
        return run(*args, **kw)

    monkeypatch.setattr(split_k, "split_k_backward", spy)
    monkeypatch.setitem(planner.PRESETS, "interpreter",
                        dataclasses.replace(PRESETS["interpreter"], sm_count=sms))
    widths, schedule = [], pipeline_mod.run
    monkeypatch.setattr(pipeline_mod, "run", lambda pipe, *a, **k: (
        widths.append((pipe.chunks, pipe.width)), schedule(pipe, *a, **k))[1])
    kw = dict(L=2, H=H, I=4, proj=0, dropout=0.3, backend="triton", lengths=[4, 3, 0, 2],
              steps=4, constraints={"family": "persistent_grid", "block_h": 16,
                                    "split_k_bwd": form})
    want = _run(mode, chunks=1, **kw)
    assert seen == [form == 1] * 2
    got = _run(mode, chunks=chunks, **kw)
    assert seen == [form == 1] * 4  # the backward once per layer
    assert widths == [(chunks, 2)]  # the forward's pipeline alone
    _assert_same(got, want, torch.float32)
    # Where the backward's launches leave room for two layers too, both passes pipeline:
    # the backward runs the split-K kernel on each (layer, window).
    monkeypatch.setitem(planner.PRESETS, "interpreter",
                        dataclasses.replace(PRESETS["interpreter"], sm_count=2 * sms))
    widths.clear()
    seen.clear()
    got = _run(mode, chunks=chunks, **kw)
    assert len(seen) > 2 and set(seen) == {form == 1}
    assert widths == [(chunks, 2), (chunks, 2)]
    _assert_same(got, want, torch.float32)
    _assert_same(want, _run(mode, chunks=1, **{**kw, "backend": "reference",
                                               "constraints": None}), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["persistent_cta", "persistent_grid"])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_gpu_side_streams_match_unpipelined(mode, family):
    """On CUDA the layers run on side streams (forced 4 chunks, three layers: all three in
    flight, their programs co-resident). Tolerance as in the module docstring with
    K = 4 * 64 = 256: 2 * 255 * 2^-24 = 3e-5 per GEMM, 1e-4 after three layers."""
    import tritonrnn.rnn.pipeline as pipeline_mod

    lengths = [128, 100, 0, 77, 128, 3, 64, 128]
    kw = dict(L=3, H=64, I=32, steps=128, lengths=lengths, dropout=0.2, backend="triton",
              constraints={"family": family}, device="cuda")
    want = _run(mode, chunks=1, **kw)
    seen = []
    run = pipeline_mod.run
    with pytest.MonkeyPatch.context() as m:
        m.setattr(pipeline_mod, "run", lambda pipe, *a, **k: (seen.append(pipe),
                                                              run(pipe, *a, **k))[1])
        got = _run(mode, chunks=4, **kw)
    # The pipelined run's forward and backward: 4 chunks, all three layers in flight.
    assert [(p.chunks, p.width) for p in seen] == [(4, 3), (4, 3)], seen
    for name, w in want.items():
        tol = 1e-4 * max(1.0, w.abs().max().item())
        torch.testing.assert_close(got[name], w, rtol=1e-4, atol=tol,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.gpu
def test_gpu_split_k_rule_pipelines_the_forward_alone():
    """LSTM H=1024 B=16 bf16 on an H100 / H200: the planner's split-K rule runs the
    one-barrier backward (128 programs) under the 64-program forward, so a forced 4-chunk
    pipeline of three layers keeps two forwards in flight, and the backward runs
    unpipelined, one layer at a time (two 128-program launches are not co-resident: a
    deadlock if they were in flight together); the result matches the unpipelined run of
    the same plans to bf16's rounding (2e-2 of each tensor's largest entry)."""
    import tritonrnn.rnn.pipeline as pipeline_mod
    from tritonrnn.rnn.planner import device_properties, recurrence_choice

    props = device_properties("cuda")
    lp, _ = recurrence_choice("lstm", 1024, 1024, 0, torch.bfloat16, 16, props)
    if lp.split_k_bwd != 1:
        pytest.skip(f"the rule does not apply on {props.name} (sm_{props.arch})")
    seen = []
    run = pipeline_mod.run
    kw = dict(L=3, H=1024, I=64, steps=128, lengths=[128, 90, 128, 5] * 4, backend="triton",
              device="cuda", dtype=torch.bfloat16)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(pipeline_mod, "run", lambda pipe, *a, **k: (seen.append(pipe),
                                                              run(pipe, *a, **k))[1])
        got = _run("lstm", chunks=4, **kw)
    assert [(p.chunks, p.width) for p in seen] == [(4, 2)], seen  # the forward's alone
    want = _run("lstm", chunks=1, **kw)
    for name, w in want.items():
        tol = 2e-2 * max(1.0, w.abs().max().item())
        torch.testing.assert_close(got[name].float(), w.float(), rtol=2e-2, atol=tol,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.gpu
def test_gpu_rule_pipelines_a_long_stack(monkeypatch):
    """Unforced on CUDA, a 2-layer persistent stack with T = 128 is pipelined (the rule
    gives C = 4: T // 32) and matches the unpipelined run."""
    import tritonrnn.rnn.pipeline as pipeline_mod

    monkeypatch.setenv("TRITONRNN_PIPELINE", "1")  # the automatic choice is opt-in
    seen = []
    run = pipeline_mod.run
    monkeypatch.setattr(pipeline_mod, "run", lambda pipe, *a, **k: (seen.append(pipe),
                                                                    run(pipe, *a, **k))[1])
    kw = dict(L=2, H=64, I=32, steps=128, lengths=[128, 90, 128, 5], backend="triton",
              device="cuda")
    got = _run("lstm", chunks=None, **kw)
    assert [p.chunks for p in seen] == [4, 4], seen  # forward and backward
    assert all(p.width == 2 for p in seen)
    want = _run("lstm", chunks=1, **kw)
    for name, w in want.items():
        tol = 1e-4 * max(1.0, w.abs().max().item())
        torch.testing.assert_close(got[name], w, rtol=1e-4, atol=tol)


# ----------------------------------------------------------------------------- windows


def test_window_layout():
    info = make_pack_info([3, 7, 0, 5, 7], 8, torch.device("cpu"))
    w = window(info, 2, 5)
    # Sorted lengths [7, 7, 5, 3, 0] -> clamp(len - 2, 0, 3).
    assert (w.B, w.N, w.max_len, w.T) == (5, 10, 3, 8)
    assert w.lengths == (3, 3, 3, 1, 0)
    assert w.lengths_sorted.tolist() == [3, 3, 3, 1, 0]
    assert w.batch_sizes == info.batch_sizes[2:5] == (4, 3, 3)
    assert w.offsets.tolist() == [0, 4, 7, 10]
    assert w.perm.tolist() == w.inv_perm.tolist() == [0, 1, 2, 3, 4]
    assert w.row_time.tolist() == [0] * 4 + [1] * 3 + [2] * 3
    assert w.row_batch.tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]
    o0 = sum(info.batch_sizes[:2])
    assert torch.equal(w.padded_index, info.padded_index[o0 : o0 + 10])  # parent's counters
    # Forward prev rows of the window point into cat([window state0, window rows]).
    assert prev_rows(w, False).tolist() == [0, 1, 2, 3, 5, 6, 7, 9, 10, 11]
    assert window(info, 2, 5) is w  # cached
    for s0, s1 in ((3, 3), (-1, 2), (0, 8)):
        with pytest.raises(ValueError, match="window: expected"):
            window(info, s0, s1)


@pytest.mark.parametrize("mode", MODES)
def test_window_chain_equals_full_recurrence(mode):
    """The contract every backend implements, chained over windows: the reference
    recurrence over [0, 2), [2, 5), [5, 8) with the carried states gives the full run's
    rows and states bit for bit, forward and backward."""
    g = torch.Generator().manual_seed(1)
    info = make_pack_info([3, 7, 0, 5, 8], 8, torch.device("cpu"))
    G, H, B, N = {"lstm": 4, "gru": 3}.get(mode, 1), 5, info.B, info.N
    lstm = mode == "lstm"
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    xg, R, bR, h0 = rnd(N, G * H), rnd(G * H, H) * 0.4, rnd(G * H), rnd(B, H)
    c0 = rnd(B, H) if lstm else None
    bounds = [0, 2, 5, 8]
    offs = [0]
    for n in info.batch_sizes:
        offs.append(offs[-1] + n)

    def fwd(info_, xg_, h, c):
        y, hT = torch.empty(info_.N, H, dtype=torch.float64), torch.empty(B, H).double()
        cs = torch.empty(info_.N, H).double() if lstm else None
        cT = torch.empty(B, H).double() if lstm else None
        reference_mod.recurrence_forward(mode, xg_, R, bR, None, h, c, info_, False, y, cs,
                                         hT, cT)
        return y, cs, hT, cT

    y, cs, hT, cT = fwd(info, xg, h0, c0)
    h, c, ys, css = h0, c0, [], []
    for a, b in zip(bounds, bounds[1:], strict=False):
        r = slice(offs[a], offs[b])
        y_, c_, h, c = fwd(window(info, a, b), xg[r], h, c)
        ys.append(y_)
        css.append(c_)
    assert torch.equal(torch.cat(ys), y) and torch.equal(h, hT)
    if lstm:
        assert torch.equal(torch.cat(css), cs) and torch.equal(c, cT)

    # Backward: h_prev / c_prev gathered once over the full layout, windows in reverse.
    prev = prev_rows(info, False)
    h_prev = torch.cat([h0, y])[prev]
    c_prev = torch.cat([c0, cs])[prev] if lstm else None
    pre_h = h_prev @ R.t() + bR
    # The pre-activations each cell's backward reads (reference.backward_preacts).
    gated = mode in ("lstm", "gru")
    pre_x, pre_h = (xg, pre_h) if gated else (None, None)
    dy, dhT = rnd(N, H), rnd(B, H)
    dcT = rnd(B, H) if lstm else None

    def bwd(info_, r, dh, dc):
        out = {k: torch.empty(info_.N, G * H).double() for k in ("dpx", "dph")}
        dh0, dc0 = torch.empty(B, H).double(), torch.empty(B, H).double() if lstm else None
        reference_mod.recurrence_backward(
            mode, pre_x[r] if pre_x is not None else None,
            pre_h[r] if pre_h is not None else None, R, None, y[r], h_prev[r],
            cs[r] if lstm else None,
            c_prev[r] if lstm else None, dy[r], dh, dc, info_, False, out["dpx"],
            out["dph"] if mode == "gru" else None, dh0, dc0, None, None)
        return out["dpx"], out["dph"], dh0, dc0

    full = bwd(info, slice(0, N), dhT, dcT)
    dh, dc, parts = dhT, dcT, []
    for a, b in reversed(list(zip(bounds, bounds[1:], strict=False))):
        dpx, dph, dh, dc = bwd(window(info, a, b), slice(offs[a], offs[b]), dh, dc)
        parts.insert(0, (dpx, dph))
    assert torch.equal(torch.cat([p[0] for p in parts]), full[0])
    if mode == "gru":
        assert torch.equal(torch.cat([p[1] for p in parts]), full[1])
    assert torch.equal(dh, full[2])
    if lstm:
        assert torch.equal(dc, full[3])


# ----------------------------------------------------------------------------- the rule


def _cfg(L=2, direction="unidirectional", mode="lstm"):
    return make_config(rnn_mode=mode, num_layers=L, num_units=256, input_size=256,
                       direction=direction)


def _plans(family, programs, L=2):
    return (LayerPlan(family, num_programs=programs),) * L


H100 = PRESETS["h100"]


@pytest.mark.parametrize("family", ["persistent_cta", "persistent_grid"])
@pytest.mark.parametrize("max_len, want", [(1024, 16), (64, 2), (63, 1), (4096, 32)])
def test_rule_two_layers(family, max_len, want):
    """L = 2, W = 2: the model (T + T / C) * 5 us + 20 C us is smallest near
    C* = sqrt(T * 5 / 20): C = 16 for T = 1024, 32 for T = 4096; T = 64 allows only C = 2
    (chunks >= 32 steps) and still wins (520 us vs 660 us); T = 63 allows none."""
    got = pipeline_chunks(_cfg(), 16, max_len, "cuda", _plans(family, 48), props=H100)
    assert got == want


def test_rule_model_numbers():
    assert model_time_us(2, 1024, 1, 1) == 2 * 1024 * 5 + 2 * 10
    assert model_time_us(2, 1024, 16, 2) == (1024 + 64) * 5 + 16 * 2 * 10
    # Three layers, two in flight: (2 T + T / C) steps.
    assert model_time_us(3, 1024, 8, 2) == (2 * 1024 + 128) * 5 + 8 * 3 * 10


def test_rule_co_residency_per_pass():
    """A plan whose backward launch takes more programs than its forward (the split-K
    kernel's 128 under a 64-program forward, LayerPlan.forward_programs): the forward's
    layers in flight count the forward's programs, the backward's the larger launch."""
    plans = (LayerPlan("persistent_grid", num_programs=128, forward_programs=64),) * 3
    assert concurrent_layers(3, plans, H100, backward=False) == 2
    assert concurrent_layers(3, plans, H100) == 1
    d = decide(_cfg(3), 16, 1024, "cuda", plans, props=H100, automatic=True)
    assert (d.source, d.width, d.backward_width) == ("automatic", 2, 1)
    # (one backward layer at a time: unpipelined, its chunks would only add launches)
    assert (d.pipeline.width, d.backward_pipeline) == (2, None)
    wide = (LayerPlan("persistent_grid", num_programs=64, forward_programs=32),) * 3
    d = decide(_cfg(3), 16, 1024, "cuda", wide, props=H100, automatic=True)
    assert (d.width, d.backward_width, d.backward_pipeline.width) == (3, 2, 2)
    assert d.pipeline.bounds == d.backward_pipeline.bounds
    with plan_constraints(pipeline_chunks=4):
        d = decide(_cfg(3), 16, 1024, "cuda", plans, props=H100)
    assert (d.chunks, d.width, d.backward_width) == (4, 2, 1)
    off = decide(_cfg(3), 16, 1024, "cuda", (LayerPlan("persistent_grid", num_programs=128),)
                 * 3, props=H100, automatic=True)
    assert off.chunks == 1 and off.backward_pipeline is None and "2 x 128" in off.reason


def test_co_residency_counts_the_persistent_plans_beside_others():
    """A stack whose backward plan was replaced by a stepwise one (a refused launch) still
    runs persistent forwards: a forced pipeline keeps only as many in flight as fit the SMs
    together (128-program grids: one), not the two that stepwise launches alone may have."""
    grid = LayerPlan("persistent_grid", num_programs=128)
    mixed = (grid, LayerPlan("stepwise", num_programs=512)) * 2
    assert concurrent_layers(2, mixed, H100) == concurrent_layers(2, mixed, H100,
                                                                  backward=False) == 1
    assert concurrent_layers(2, (LayerPlan("stepwise", num_programs=512),) * 2, H100) == 2
    with plan_constraints(pipeline_chunks=4):
        d = decide(_cfg(2), 16, 1024, "cuda", mixed, props=H100)
    assert (d.chunks, d.width, d.backward_width, d.backward_pipeline) == (4, 1, 1, None)


def test_rule_co_residency():
    """W = SMs // programs layers in flight (H100: 132 SMs); fewer than two -> off."""
    assert concurrent_layers(2, _plans("persistent_grid", 66), H100) == 2
    assert concurrent_layers(2, _plans("persistent_grid", 67), H100) == 1
    assert concurrent_layers(4, _plans("persistent_cta", 16, 4), H100) == 4
    assert concurrent_layers(3, _plans("persistent_grid", 50, 3), H100) == 2
    assert pipeline_chunks(_cfg(), 16, 1024, "cuda", _plans("persistent_grid", 67),
                           props=H100) == 1
    assert pipeline_chunks(_cfg(), 16, 1024, "cuda", _plans("persistent_grid", 66),
                           props=H100) == 16
    # L = 3 with W = 2: (2 T + T / C) * 5 + 30 C is smallest at C = 13.
    assert pipeline_chunks(_cfg(3), 16, 1024, "cuda", _plans("persistent_grid", 50, 3),
                           props=H100) == 13


@pytest.mark.parametrize("case", ["cpu", "bidirectional", "one_layer", "stepwise", "reference"])
def test_rule_off(case):
    cfg, device, plans = _cfg(), "cuda", _plans("persistent_cta", 1)
    if case == "cpu":
        device = "cpu"
    elif case == "bidirectional":
        cfg = _cfg(direction="bidirectional")
    elif case == "one_layer":
        cfg, plans = _cfg(1), _plans("persistent_cta", 1, 1)
    else:
        plans = _plans(case, 32)
    assert pipeline_chunks(cfg, 16, 1024, device, plans, props=H100) == 1


def test_rule_forced():
    plans = _plans("stepwise", 32)
    for k, want in ((1, 1), (3, 3), (9, 7)):  # clamped to max_len = 7
        with plan_constraints(pipeline_chunks=k):
            assert pipeline_chunks(_cfg(), 4, 7, "cpu", plans, props=H100) == want
    with plan_constraints(pipeline_chunks=3):
        assert pipeline_chunks(_cfg(), 4, 0, "cpu", plans) == 1  # nothing to split
        with pytest.raises(ValueError, match=r"pipeline_chunks: expected 1 .*got 3"):
            pipeline_chunks(_cfg(direction="bidirectional"), 4, 7, "cpu", plans)
    with plan_constraints(pipeline_chunks=1):
        assert pipeline_chunks(_cfg(direction="bidirectional"), 4, 7, "cpu", plans) == 1


def test_rule_default_plans_are_the_triton_backends():
    cfg = make_config(rnn_mode="lstm", num_layers=2, num_units=768, input_size=768)
    plans = stack_plans(cfg, "triton", 16, torch.bfloat16, H100)
    assert len(plans) == 2 and plans[0] == plans[1]
    assert stack_plans(cfg, "reference", 16, torch.bfloat16, H100)[0].family == "reference"
    assert (pipeline_chunks(cfg, 16, 1024, "cuda", dtype=torch.bfloat16, props=H100)
            == pipeline_chunks(cfg, 16, 1024, "cuda", plans, props=H100))


def test_run_order_and_slots():
    """run(): layer-major, chunks in the given order, finish after a layer's chunks, layer
    i of the order on slot i mod W (the CPU runs them in exactly this order)."""
    calls = []
    pipe = Pipeline(3, 2, (0, 1, 2, 3))
    run(pipe, torch.device("cpu"), [2, 1, 0], [2, 1, 0],
        lambda layer, k, slot: calls.append(("work", layer, k, slot)),
        lambda layer, slot: calls.append(("finish", layer, slot)))
    want = []
    for i, layer in enumerate([2, 1, 0]):
        want += [("work", layer, k, i % 2) for k in (2, 1, 0)] + [("finish", layer, i % 2)]
    assert calls == want


def test_step_bounds():
    assert step_bounds(7, 3) == (0, 2, 4, 7)
    assert step_bounds(7, 7) == tuple(range(8))
    with pytest.raises(ValueError, match="chunks"):
        step_bounds(7, 8)


def test_automatic_pipeline_is_opt_in(monkeypatch):
    """Without TRITONRNN_PIPELINE=1 the engine never pipelines on its own (until the overlap
    is measured on a GPU); the device check comes after the opt-in, so this holds anywhere."""
    from tritonrnn.rnn import pipeline as pipeline_mod
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.packing import make_pack_info

    cfg = make_config(rnn_mode="lstm", num_layers=2, num_units=64, input_size=64)
    info = make_pack_info([256] * 4, 256, torch.device("cpu"))
    monkeypatch.delenv("TRITONRNN_PIPELINE", raising=False)
    assert pipeline_mod.plan_pipeline(cfg, None, info, torch.float32,
                                      torch.device("cuda")) is None


def test_recorded_windows_are_freed_with_their_caches():
    """`_Slots.keep` remembers which layouts it recorded on the side streams; that memory
    must not keep a window (and its parent layout's index tensors) alive once the packing
    cache evicted the parent. The windows live as long as their parent layout, no longer
    (their own cache kept 256 of them, each holding its parent, alive)."""
    import gc
    import weakref

    from tritonrnn.rnn import packing
    from tritonrnn.rnn import pipeline as pipeline_mod

    refs = []
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        lengths = [64] + torch.randint(1, 64, (7,), generator=g).tolist()
        info = make_pack_info(lengths, 64, torch.device("cpu"))
        for k in range(2):
            w = window(info, 32 * k, 32 * (k + 1))
            assert window(info, 32 * k, 32 * (k + 1)) is w  # cached with its parent
            pipeline_mod._used_on(w, ())
            pipeline_mod._used_on(w, ())  # once per (layout, streams): no second entry
            assert pipeline_mod._RECORDED[w] == {()}
            refs.append(weakref.ref(w))
        refs.append(weakref.ref(info))
    del info, w
    packing._make_pack_info.cache_clear()
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
