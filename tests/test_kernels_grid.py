"""Persistent-grid and stepwise recurrent kernels (kernels/persistent_grid.py) against the
float64 reference recurrences (rnn/reference.py) on the same inputs.

Every launch splits H across several programs (H = 33, block_h = 16: 3 hidden slices) unless
a test says otherwise. Under the interpreter a persistent launch with more than one program
runs one sub-step per launch (a barrier would deadlock), and with one program runs all steps
in one launch, so the in-kernel step loop is covered too; the barrier itself is covered by
the GPU tests.

Tolerances. fp32: the kernel rounds every operation to fp32 (unit roundoff u = 6e-8); an
output depends on dot products of K <= 4*40 terms over T <= 6 steps. The worst-case linear
bound T*K*u ~ 6e-5 assumes every rounding error has one sign; they accumulate as a random
walk, ~ sqrt(T*K)*u ~ 2e-6 relative to the operand magnitudes (O(1) here), and the largest
error measured over these tests is 1.3e-6 at values up to 5.8: rtol = atol = 1e-5. An
indexing or masking bug shows up as O(0.1..1). bf16 / fp16 (GPU): inputs
and weights are the same rounded values on both sides; the kernel additionally rounds the
dot operand h (or dph) to the dtype each step and the stored outputs: a few units of the
dtype's epsilon (bf16 7.8e-3, fp16 9.8e-4), hence 3e-2 and 5e-3.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from helpers import stepwise_runs

from tritonrnn.kernels import cells
from tritonrnn.kernels import grid_tiles as gt
from tritonrnn.kernels import persistent_grid as pg
from tritonrnn.rnn import reference
from tritonrnn.rnn.packing import make_pack_info

CELLS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEV.type == "cuda"
VARLEN = ([5, 0, 3, 5, 1], 6)  # ties, a length-0 row, max_len < T
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
    torch.float16: dict(rtol=5e-3, atol=5e-3),
}


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def _col_view(n, c, dtype):
    """A [n, c] column slice of a wider NaN buffer, as the engine passes y and dy (the
    buffer kept as `wide`, for `_check_outside_view`)."""
    wide = _nan(n, 2 * c + 3, dtype=dtype)
    view = wide[:, 3 : 3 + c]
    view.wide = wide
    return view


def _check_outside_view(view):
    """Where `view` is a `_col_view`: its buffer's columns outside it are still NaN, so a
    launch wrote only its view (in the engine they are the other direction's output)."""
    wide = getattr(view, "wide", None)
    if wide is None:  # another layout a test gave (a transposed view, ...)
        return
    outside = torch.ones(wide.shape[1], dtype=torch.bool)
    outside[3 : 3 + view.shape[1]] = False
    assert wide[:, outside.to(wide.device)].isnan().all(), "a write outside y's columns"


def _d(t):
    return t.double() if t is not None else None


def _zeros64(t):
    return torch.zeros(t.shape, dtype=torch.float64, device=t.device) if t is not None else None


def _close(got, want, dtype, what):
    assert got is not None and want is not None, what
    assert torch.isfinite(got).all(), f"{what}: non-finite (missing write?)"
    tol = dict(TOL[dtype])
    if dtype in (torch.bfloat16, torch.float16):
        # 16-bit results are accurate to a fraction of the tensor's scale, not of each element:
        # every step rounds h (or the gate gradients) to 16 bits before the next product, so an
        # element that is a small difference of large terms carries the large terms' rounding.
        # The absolute part is relative to max(1, max |want|), as in the benchmark oracle's
        # scaled error (bench.oracle.scaled_error); unchanged for outputs bounded by 1. (relu
        # outputs and tanh / relu gradients reach 11 to 20 here; on an H200 single elements
        # missed a fixed 0.03 by up to 0.042 at values near 0.1.)
        tol["atol"] *= max(1.0, want.abs().max().item())
    torch.testing.assert_close(got.double(), want, **tol, msg=lambda m: f"{what}: {m}")


# -------------------------------------------------------------------------------------------
# Problem builders
# -------------------------------------------------------------------------------------------


def _forward_problem(cell, H, P, lengths, T, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    info = make_pack_info(lengths, T, DEV)
    B, N, Hout = info.B, info.N, P or H
    lstm = cell == "lstm"

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(dtype).to(DEV)

    ins = dict(
        cell=cell, xg=rnd(N, G * H), R=rnd(G * H, Hout, scale=1.5 / math.sqrt(Hout)),
        bR=rnd(G * H, scale=0.2), Pw=rnd(P, H, scale=1.5 / math.sqrt(H)) if P else None,
        h0=rnd(B, Hout), c0=rnd(B, H) if lstm else None, info=info,
    )
    outs = dict(
        y=_col_view(N, Hout, dtype), c_seq=_nan(N, H, dtype=dtype) if lstm else None,
        hT=_nan(B, Hout, dtype=dtype), cT=_nan(B, H, dtype=dtype) if lstm else None,
    )
    return ins, outs


def _run_forward(ins, outs, reverse, **kw):
    return pg.grid_forward(ins["cell"], ins["xg"], ins["R"], ins["bR"], ins["Pw"], ins["h0"],
                    ins["c0"], ins["info"], reverse, outs["y"], outs["c_seq"], outs["hT"],
                    outs["cT"], **kw)


def _check_forward(ins, outs, reverse, dtype=torch.float32):
    ref = {k: _zeros64(v) for k, v in outs.items()}
    reference.recurrence_forward(
        ins["cell"], _d(ins["xg"]), _d(ins["R"]), _d(ins["bR"]), _d(ins["Pw"]), _d(ins["h0"]),
        _d(ins["c0"]), ins["info"], reverse, ref["y"], ref["c_seq"], ref["hT"], ref["cT"])
    for k, v in outs.items():
        if v is not None:
            _close(v, ref[k], dtype, k)
    _check_outside_view(outs["y"])


def _backward_problem(cell, H, P, lengths, T, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    info = make_pack_info(lengths, T, DEV)
    B, N, Hout = info.B, info.N, P or H
    lstm, gru = cell == "lstm", cell == "gru"

    def rnd(*s, scale=1.0, squash=False):
        t = torch.randn(*s, generator=g) * scale
        return (torch.tanh(t) if squash else t).to(dtype).to(DEV)

    # The pre-activations each cell's backward reads (reference.backward_preacts): the
    # gated cells' two sides, none for tanh / relu.
    ins = dict(
        cell=cell, pre_x=rnd(N, G * H) if lstm or gru else None,
        pre_h=rnd(N, G * H) if lstm or gru else None,
        R=rnd(G * H, Hout, scale=1.5 / math.sqrt(Hout)),
        Pw=rnd(P, H, scale=1.5 / math.sqrt(H)) if P else None,
        # Outputs of a real forward are bounded; tanh's backward uses 1 - y^2.
        y=rnd(N, Hout, squash=True), h_prev=rnd(N, Hout, squash=True),
        c_seq=rnd(N, H) if lstm else None, c_prev=rnd(N, H) if lstm else None,
        dhT=rnd(B, Hout), dcT=rnd(B, H) if lstm else None, info=info,
    )
    dy = _col_view(N, Hout, dtype)
    dy.copy_(rnd(N, Hout))
    ins["dy"] = dy
    outs = dict(
        dpre_x=_nan(N, G * H, dtype=dtype), dpre_h=_nan(N, G * H, dtype=dtype) if gru else None,
        dh0=_nan(B, Hout, dtype=dtype), dc0=_nan(B, H, dtype=dtype) if lstm else None,
        dh_total=_nan(N, P, dtype=dtype) if P else None,
        m_seq=_nan(N, H, dtype=dtype) if P else None,
    )
    return ins, outs


_BWD_IN = ["pre_x", "pre_h", "R", "Pw", "y", "h_prev", "c_seq", "c_prev", "dy", "dhT", "dcT"]
_BWD_OUT = ["dpre_x", "dpre_h", "dh0", "dc0", "dh_total", "m_seq"]


def _run_backward(ins, outs, reverse, **kw):
    return pg.grid_backward(ins["cell"], *(ins[k] for k in _BWD_IN), ins["info"], reverse,
                     *(outs[k] for k in _BWD_OUT), **kw)


def _check_backward(ins, outs, reverse, dtype=torch.float32):
    ref = {k: _zeros64(outs[k]) for k in _BWD_OUT}
    reference.recurrence_backward(ins["cell"], *(_d(ins[k]) for k in _BWD_IN), ins["info"],
                                  reverse, *(ref[k] for k in _BWD_OUT))
    for k in _BWD_OUT:
        if outs[k] is not None:
            _close(outs[k], ref[k], dtype, k)


PERSIST = pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "stepwise"])
# Cases whose weights are never hoisted (streamed, or with a projection): stepwise where
# helpers.stepwise_runs says so.
PERSIST_UNHOISTED = pytest.mark.parametrize(
    "persistent", [pytest.param(p, id="persistent" if p else "stepwise")
                   for p in (True, False) if p or stepwise_runs(hoistable=False)])
REVERSE = pytest.mark.parametrize("reverse", [False, True], ids=["fwd_dir", "rev_dir"])


def directed(argnames: str, cases: list) -> pytest.MarkDecorator:
    """`cases` (tuples whose first value is the cell) parametrized with `reverse` appended:
    LSTM forward in time, the other cells reversed. The direction is the time index of a row
    at a step, the same code under every tiling and schedule; test_forward_matches_reference,
    test_backward_matches_reference and test_projection_forward_backward cross it with every
    cell, and the tests of one tiling or schedule take it from the cell, so each runs both
    directions (and the Triton-version jobs, which select LSTM forward, every LSTM case)."""
    return pytest.mark.parametrize(f"{argnames}, reverse", [
        pytest.param(*case, case[0] != "lstm",
                     id="-".join(map(str, case)) + ("-fwd_dir" if case[0] == "lstm" else
                                                    "-rev_dir"))
        for case in cases])
# block_k = 0: weights resident on chip, the reduction H = 33 in two chunks 32 + 16 (the second
# mostly padding); block_k = 16: weights streamed from memory every step in three 16-wide
# chunks, the last masked past K. With PERSIST: both families where the weights are resident,
# streamed stepwise only on a GPU (PERSIST_UNHOISTED).
BLOCK_K = pytest.mark.parametrize("block_k", [0, 16], ids=["resident", "streamed"])
BLOCK_K_PERSIST = pytest.mark.parametrize(
    "block_k, persistent",
    [pytest.param(k, p, id=f"{'streamed' if k else 'resident'}-"
                  f"{'persistent' if p else 'stepwise'}")
     for k in (0, 16) for p in (True, False) if p or stepwise_runs(hoistable=not k)])


# -------------------------------------------------------------------------------------------
# Correctness against the reference (interpreter and GPU)
# -------------------------------------------------------------------------------------------


def _check_layer(cell, H, P, lengths, T, *, reverse, dtype=torch.float32, **launch):
    """The forward and the backward of one layer/direction in `dtype`, each launched with
    `launch` (grid_forward / grid_backward keywords), against the float64 reference."""
    ins, outs = _forward_problem(cell, H, P, lengths, T, dtype=dtype)
    _run_forward(ins, outs, reverse, **launch)
    _check_forward(ins, outs, reverse, dtype)
    ins, outs = _backward_problem(cell, H, P, lengths, T, dtype=dtype)
    _run_backward(ins, outs, reverse, **launch)
    _check_backward(ins, outs, reverse, dtype)


@BLOCK_K_PERSIST
@REVERSE
@pytest.mark.parametrize("cell", CELLS)
def test_forward_matches_reference(cell, reverse, persistent, block_k):
    ins, outs = _forward_problem(cell, 33, 0, *VARLEN)
    _run_forward(ins, outs, reverse, persistent=persistent, block_h=16, block_k=block_k)
    _check_forward(ins, outs, reverse)


@BLOCK_K_PERSIST
@REVERSE
@pytest.mark.parametrize("cell", CELLS)
def test_backward_matches_reference(cell, reverse, persistent, block_k):
    ins, outs = _backward_problem(cell, 33, 0, *VARLEN)
    _run_backward(ins, outs, reverse, persistent=persistent, block_h=16, block_k=block_k)
    _check_backward(ins, outs, reverse)


# Each cell's backward takes only the pre-activations it reads (reference.backward_preacts):
# LSTM and GRU both sides, tanh / relu neither (their derivatives follow from y). Any other
# combination is refused by every backend, naming the argument, before anything runs.
_WRONG_PREACTS = {
    "lstm": ("pre_h", None, r"pre_h: expected a \[8, 64\] tensor for cell 'lstm', got None"),
    "gru": ("pre_x", None, r"pre_x: expected a \[8, 48\] tensor for cell 'gru', got None"),
    "rnn_tanh": ("pre_x", "full", r"pre_x: expected None for cell 'rnn_tanh' \(its "
                                  r"derivative follows from y\), got a tensor of shape "
                                  r"\[8, 16\]"),
    "rnn_relu": ("pre_h", "short", r"pre_h: expected None for cell 'rnn_relu'"),
    "lstm-short": ("pre_x", "short", r"pre_x: expected shape \[8, 64\] for cell 'lstm', "
                                     r"got \[7, 64\]"),
}


@pytest.mark.parametrize("backend", ["reference", "persistent_cta", "persistent_grid"])
@pytest.mark.parametrize("case", list(_WRONG_PREACTS))
def test_backward_refuses_preactivations_its_cell_does_not_read(case, backend):
    from tritonrnn.kernels.persistent_cta import cta_backward

    cell = case.split("-")[0]
    name, given, message = _WRONG_PREACTS[case]
    ins, outs = _backward_problem(cell, 16, 0, [3, 3, 2], 3)
    N, GH = ins["info"].N, ins["R"].shape[0]
    ins[name] = {"full": torch.zeros(N, GH), "short": torch.zeros(N - 1, GH), None: None}[given]
    before = {k: v.clone() for k, v in outs.items() if v is not None}
    args = (ins["cell"], *(ins[k] for k in _BWD_IN), ins["info"], False,
            *(outs[k] for k in _BWD_OUT))
    run = {"reference": reference.recurrence_backward,
           "persistent_cta": lambda *a: cta_backward(*a, block_b=16),
           "persistent_grid": lambda *a: pg.grid_backward(*a, persistent=False, block_h=16)}
    with pytest.raises(ValueError, match=message):
        run[backend](*args)
    for k, v in before.items():  # nothing written
        assert torch.equal(outs[k].isnan(), v.isnan()), k


@BLOCK_K
@PERSIST_UNHOISTED
@REVERSE
def test_projection_forward_backward(reverse, persistent, block_k):
    # H = 33 over 3 programs, P = 20 spread over them in 16-wide output slices (2 own one).
    _check_layer("lstm", 33, 20, *VARLEN, reverse=reverse, persistent=persistent, block_h=16,
                 block_k=block_k)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_streamed_single_program_loop(cell):
    # One program (all steps in one launch, even in the interpreter) with streamed weights:
    # the K loop inside the step loop, 2 chunks of 16 for H = 32.
    lengths, T = [6, 4, 0], 7
    _check_layer(cell, 32, 0, lengths, T, reverse=False, persistent=True, block_h=32, block_k=16)


class _LaunchRecord:
    """Stands in for a grid kernel: `kernel[grid](*args, **kwargs)` records the grid, the
    arguments (tensors as shape, dtype and strides) and the keywords, and runs nothing."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            args = tuple((tuple(a.shape), a.dtype, a.stride()) if torch.is_tensor(a) else a
                         for a in args)
            self.calls.append((tuple(grid), args, kwargs))
        return launch


@pytest.mark.skipif(ON_GPU, reason="the interpreter's launches (a GPU launches persistently)")
@pytest.mark.parametrize("cell, P, block_k, hoisted", [
    ("lstm", 0, 0, True), ("gru", 0, 16, False), ("lstm", 20, 0, False)],
    ids=["resident", "streamed", "projection"])
def test_interpreted_launches_differ_only_in_hoist(monkeypatch, cell, P, block_k, hoisted):
    """What PERSIST_UNHOISTED relies on: in the interpreter, a persistent and a stepwise run
    of the same grid (several programs) make the same launches, keyword for keyword, except
    HOIST where the persistent one hoists its weights."""
    def launches(persistent):
        rec = {"fwd": _LaunchRecord(), "bwd": _LaunchRecord()}
        monkeypatch.setattr(pg, "_grid_fwd_kernel", rec["fwd"])
        monkeypatch.setattr(pg, "_grid_bwd_kernel", rec["bwd"])
        kw = dict(persistent=persistent, block_h=16, block_k=block_k)
        _run_forward(*_forward_problem(cell, 33, P, *VARLEN), False, **kw)
        _run_backward(*_backward_problem(cell, 33, P, *VARLEN), False, **kw)
        return rec

    persistent, stepwise = launches(True), launches(False)
    for kind in ("fwd", "bwd"):
        a, b = persistent[kind].calls, stepwise[kind].calls
        assert len(a) == len(b) > 1, kind  # one launch per sub-step, both
        assert {kw["HOIST"] for *_, kw in a} == {hoisted}, kind
        assert {kw["HOIST"] for *_, kw in b} == {False}, kind
        for (grid_a, args_a, kw_a), (grid_b, args_b, kw_b) in zip(a, b, strict=True):
            assert grid_a == grid_b and args_a == args_b, kind
            assert {**kw_a, "HOIST": None} == {**kw_b, "HOIST": None}, kind


def test_reduction_split():
    # Two power-of-two chunks whenever they beat one padded chunk.
    assert gt._ksplit(768) == (512, 256)
    assert gt._ksplit(1536) == (1024, 512)
    assert gt._ksplit(1024) == (512, 512)  # one chunk would be wider than _MAX_CHUNK
    assert gt._ksplit(1000) == (512, 512)
    assert gt._ksplit(2048) == (1024, 1024)
    assert gt._ksplit(512) == (512, 0)
    assert gt._ksplit(33) == (32, 16)
    assert gt._ksplit(24) == (32, 0)  # 16 + 16 is no shorter than pad(24) = 32
    assert gt._ksplit(5) == (16, 0)
    assert gt._ksplit(1100) == (1024, 128)
    for K in range(1, 3000):
        ka, kb = gt._ksplit(K)
        # Two different chunks pad less than one; equal ones are a halved single chunk.
        assert ka + kb >= K and ka + kb <= gt._pad(K)
        assert kb in (0, ka) or ka + kb < 1.25 * K + 16
        assert kb != ka or ka + kb == gt._pad(K) > gt._MAX_CHUNK
    # Streamed weights: chunks of block_k.
    assert gt._ksplit(1536, 64) == (64, 0)
    # Wider batch tiles halve narrower single chunks: the operand [chunk, block_b] stays
    # within _MAX_CHUNK x 32 elements; two different chunks are kept as they are.
    assert [gt._max_chunk(bb) for bb in (1, 16, 32, 64, 128)] == [512, 512, 512, 256, 128]
    assert gt._ksplit(512, 0, 32) == (512, 0)
    assert gt._ksplit(512, 0, 64) == (256, 256)
    assert gt._ksplit(256, 0, 64) == (256, 0)
    assert gt._ksplit(256, 0, 128) == (128, 128)
    assert gt._ksplit(768, 0, 64) == (512, 256)
    assert gt._ksplit(1024, 0, 64) == (512, 512)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_halved_chunk_matches_reference(cell, monkeypatch):
    # A reduction held as two equal halves (H = 1024's 512 + 512 on a GPU), forced small:
    # with _MAX_CHUNK = 16, H = 32 is two chunks of 16 in both passes.
    monkeypatch.setattr(gt, "_MAX_CHUNK", 16)
    assert gt._ksplit(32) == (16, 16)
    _check_layer(cell, 32, 0, *VARLEN, reverse=False, persistent=True, block_h=16)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_wide_tile_halves_its_chunk(cell, monkeypatch):
    # 64-column batch tiles hold half the single chunk 32-column tiles do (`_max_chunk`):
    # with _MAX_CHUNK = 32, H = 32 stays one chunk at block_b = 32 and is 16 + 16 at 64, in
    # both passes, the planner's shared-memory count following.
    monkeypatch.setattr(gt, "_MAX_CHUNK", 32)
    assert gt._ksplit(32, 0, 32) == (32, 0) and gt._ksplit(32, 0, 64) == (16, 16)
    lengths, T = [5, 3, 0, 5, 1], 5
    _check_layer(cell, 32, 0, lengths, T, reverse=False, persistent=True, block_h=16, block_b=64)
    halved = gt.grid_onchip_bytes(cell, 32, 32, 0, torch.bfloat16, 16, 64, 0, 8)
    monkeypatch.setattr(gt, "_MAX_CHUNK", 64)
    assert gt._ksplit(32, 0, 64) == (32, 0)
    assert halved < gt.grid_onchip_bytes(cell, 32, 32, 0, torch.bfloat16, 16, 64, 0, 8)


@PERSIST
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_batch_one(cell, persistent):
    _check_layer(cell, 33, 0, [4], 4, reverse=True, persistent=persistent, block_h=16)


@pytest.mark.parametrize("cell", CELLS)
def test_single_program_runs_all_steps_in_one_launch(cell):
    # One program needs no barrier: even the interpreter runs the whole in-kernel step loop
    # (states carried in registers, ping-pong parity, final-state writes) in one launch.
    assert pg._launch_ranges(7, persistent=True, on_gpu=False, programs=1) == [(0, 7)]
    lengths, T = [6, 4, 0], 7
    _check_layer(cell, 16, 0, lengths, T, reverse=True, persistent=True, block_h=16)


def test_single_program_projection_in_one_launch():
    lengths, T = [5, 5, 2], 6
    _check_layer("lstm", 16, 12, lengths, T, reverse=False, persistent=True, block_h=16)


@pytest.mark.parametrize("proj", [0, 12], ids=["noproj", "proj"])
def test_finished_batch_tile_is_skipped_correctly(proj, monkeypatch):
    # B = 18 with block_b = 16: the second batch tile's rows end early, so from step 2 on its
    # programs skip the matmuls and only carry their state (final states still written).
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", "off")  # keep the skipping branches
    lengths, T = [5] * 16 + [2, 1], 5
    _check_layer("lstm", 16, proj, lengths, T, reverse=True, persistent=False, block_h=16)


@directed("cell", [("lstm",), ("gru",), ("rnn_tanh",)])
def test_hoisted_weights_match_reference(monkeypatch, cell, reverse):
    """TRITONRNN_HOIST_WEIGHTS (`gt._hoist_weights`): the dots leave their runtime branches,
    so a finished batch tile (the second: rows of lengths 2, 1 and 0) keeps forming its
    products on stale exchange columns, and the backward reads the dph slot its first step
    never wrote; every result must still be the reference's (act masks them out). Both
    launches must hold their whole slice (HOIST applies to persistent launches without a
    projection only, `hoist_tiles`, which test_hoist_weights_choice covers)."""
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", "fwd,bwd")
    held, real = [], gt.hoist_pass

    def recorded(pass_name, *args, **kwargs):
        held.append((pass_name, real(pass_name, *args, **kwargs)))
        return held[-1][1]

    monkeypatch.setattr(gt, "hoist_pass", recorded)
    lengths, T = [5] * 16 + [2, 1, 0], 5
    _check_layer(cell, 33, 0, lengths, T, reverse=reverse, persistent=True, block_h=16)
    assert held == [("fwd", gt.Hoist.ALL), ("bwd", gt.Hoist.ALL)]


# Hoist.FIRST (`gt._hoist_by_default`): only the first resident chunk leaves the runtime
# branches (HOIST_FIRST), the second chunk's products keep theirs (tile_b); forced here by an
# 8-warp budget below the whole slice. H = 33: chunks of 32 + 16 in both passes; the second
# batch tile's rows (lengths 2, 1, 0) finish early, so its programs skip the second chunk's
# products while still forming the first's on stale columns, which act must mask out.
@directed("cell", [("lstm",), ("gru",), ("rnn_tanh",)])
def test_first_chunk_hoisted_matches_reference(monkeypatch, cell, reverse):
    monkeypatch.delenv("TRITONRNN_HOIST_WEIGHTS", raising=False)
    monkeypatch.setattr(gt, "_HOIST_8WARP_THREAD_BYTES", 8)
    for p in ("fwd", "bwd"):
        assert gt.hoist_pass(p, cell, 33, 33, 0, torch.float32, 16, 16, 0, 8,
                             True) == gt.Hoist.FIRST, p
    lengths, T = [5] * 16 + [2, 1, 0], 5
    _check_layer(cell, 33, 0, lengths, T, reverse=reverse, persistent=True, block_h=16,
                 num_warps=8)


def test_hoist_weights_choice(monkeypatch):
    """By default: persistent launches of resident 16-wide MMA tiles without a projection,
    at most 256 B of weights per thread (512 B on 8 warps); off; per pass
    whatever the size; a bad value names the variable."""
    hoist = gt._hoist_weights
    bf16 = torch.bfloat16
    lstm256 = gt.weight_thread_bytes(4 * 16, 256, 0, bf16, 4)
    anchor = gt.weight_thread_bytes(4 * 16, 512, 256, bf16, 4)
    assert (lstm256, anchor, gt.weight_thread_bytes(4 * 16, 512, 256, bf16, 8)) == (256, 768,
                                                                                   384)
    monkeypatch.delenv("TRITONRNN_HOIST_WEIGHTS", raising=False)
    assert hoist("fwd", 0, 16, True, 0, lstm256) and hoist("bwd", 0, 16, True, 0, lstm256)
    assert not hoist("fwd", 0, 16, True, 0, anchor)  # 768 B: spills (module comment)
    assert not hoist("fwd", 0, 32, True, 0, 192)  # 32-wide batch tiles spilled at 192 B
    assert not hoist("fwd", 0, 16, False, 0, lstm256)  # stepwise: skipping tiles pays
    assert not hoist("fwd", 0, 16, True, 12, lstm256)  # projection: no effect
    assert not hoist("fwd", 64, 16, True, 0, 0)  # streamed: nothing resident to hoist
    assert not hoist("fwd", 0, 1, True, 0, 0)  # vector tiles: weights in registers already
    # Either pass on 8 warps up to 512 B per thread (`hoist_budget`): the anchor's 384 B,
    # LSTM H=1024's 512, not GRU H=1536's 576.
    assert [gt.hoist_budget(p, w) for p in ("fwd", "bwd") for w in (4, 8)] == [256, 512,
                                                                              256, 512]
    with pytest.raises(ValueError, match="hoist_budget: pass_name expected .* got 'fw'"):
        gt.hoist_budget("fw", 8)
    anchor8 = gt.weight_thread_bytes(4 * 16, 512, 256, bf16, 8)
    assert hoist("fwd", 0, 16, True, 0, anchor8, 8) and hoist("bwd", 0, 16, True, 0,
                                                              anchor8, 8)
    for p in ("fwd", "bwd"):
        assert hoist(p, 0, 16, True, 0, 512, 8) == gt.Hoist.ALL
        assert not hoist(p, 0, 16, True, 0, 576, 8)
        # Past the budget, the first of two chunks on 8 warps up to 384 B (GRU H=1536's
        # 1024 of 1536 columns; not LSTM H=1280's 512 B, nor on 4 warps).
        assert hoist(p, 0, 16, True, 0, 576, 8, 384) == gt.Hoist.FIRST
        assert not hoist(p, 0, 16, True, 0, 640, 8, 512)
        assert not hoist(p, 0, 16, True, 0, 576, 4, 384)
        assert not hoist(p, 0, 32, True, 0, 576, 8, 384)  # 16-wide batch tiles only
    assert not hoist("fwd", 0, 16, True, 0, anchor8, 4)  # the budget of the launch's warps
    assert not hoist("fwd", 0, 16, True, 12, anchor8, 8)  # projection
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", "off")
    assert not hoist("fwd", 0, 16, True, 0, lstm256)
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", " fwd ")
    assert hoist("fwd", 0, 16, True, 0, anchor) and not hoist("bwd", 0, 16, True, 0, lstm256)
    assert hoist("fwd", 0, 16, True, 0, 576, 8, 384) == gt.Hoist.ALL  # named: all of it
    assert not hoist("fwd", 0, 16, False, 0, anchor)
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", "")  # empty: as unset
    assert hoist("fwd", 0, 16, True, 0, lstm256) and not hoist("fwd", 0, 16, True, 0, anchor)
    for bad in ("fwd,both", "on", ","):
        monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", bad)
        with pytest.raises(ValueError, match=r"TRITONRNN_HOIST_WEIGHTS: expected auto, off "
                                             r"or a comma list of fwd, bwd, got "):
            hoist("fwd", 0, 16, True, 0, lstm256)


@PERSIST
def test_lstm_without_c_seq(persistent):
    # Inference: c_seq=None (no reserve); everything else still written.
    ins, outs = _forward_problem("lstm", 33, 0, [3, 1], 3)
    outs["c_seq"] = None
    _run_forward(ins, outs, False, persistent=persistent, block_h=16)
    _check_forward(ins, outs, False)


def test_all_sequences_empty_copies_states():
    ins, outs = _forward_problem("lstm", 16, 0, [0, 0], 3)
    _run_forward(ins, outs, False, persistent=True, block_h=16)
    assert torch.equal(outs["hT"], ins["h0"]) and torch.equal(outs["cT"], ins["c0"])
    ins, outs = _backward_problem("lstm", 16, 0, [0, 0], 3)
    _run_backward(ins, outs, False, persistent=True, block_h=16)
    assert torch.equal(outs["dh0"], ins["dhT"]) and torch.equal(outs["dc0"], ins["dcT"])


def test_outputs_without_unit_column_stride():
    # Written in place through a temporary: the caller's strided views get the values.
    ins, outs = _forward_problem("gru", 33, 0, *VARLEN)
    B, N = ins["info"].B, ins["info"].N
    outs["hT"] = _nan(33, B).t()
    outs["y"] = _nan(33, N).t()
    _run_forward(ins, outs, False, persistent=False, block_h=16)
    _check_forward(ins, outs, False)


def _column_strided(t):
    """t's values with column stride = its row count (a transposed view of a copy)."""
    if t is None or t.dim() < 2:
        return t
    out = t.t().contiguous().t()
    assert out.stride(-1) != 1 and torch.equal(out, t)
    return out


@pytest.mark.parametrize("kind", ["forward", "backward"])
@pytest.mark.parametrize("cell, P", [("lstm", 0), ("gru", 0), ("lstm", 20)],
                         ids=["lstm", "gru", "lstm_proj"])
def test_inputs_without_unit_column_stride(kind, cell, P):
    """The kernels take row strides and assume unit column strides: an input whose columns
    are strided is copied first (`_inp`); a launcher that passed it as it is would read the
    wrong elements."""
    if kind == "forward":
        ins, outs = _forward_problem(cell, 33, P, *VARLEN, seed=3)
        names, run, check, reverse = ("xg", "R", "Pw", "h0", "c0"), _run_forward, \
            _check_forward, False
    else:
        ins, outs = _backward_problem(cell, 33, P, *VARLEN, seed=4)
        names, run, check, reverse = ("pre_x", "pre_h", "R", "Pw", "y", "h_prev", "c_seq",
                                      "c_prev", "dy", "dhT", "dcT"), _run_backward, \
            _check_backward, True
    for k in names:
        ins[k] = _column_strided(ins[k])
    run(ins, outs, reverse, persistent=False, block_h=16)
    check(ins, outs, reverse)


# Split K (`gt._nsplit`): the reduction cut into S slices, one per warp, where the output tile
# has fewer 16 x 8 MMA tiles than the program has warps. (H, block_h, block_k, num_warps, S of
# the recurrent dots): one 64 chunk in 4 slices; 64 + 32 in 2; streamed 32-wide chunks in 2;
# one program, all steps in one launch, 2 slices (the in-kernel loop with split K).
SPLIT_K = pytest.mark.parametrize("H, block_h, block_k, num_warps, S", [
    (64, 16, 0, 4, 4), (96, 16, 0, 4, 2), (64, 16, 32, 4, 2), (32, 32, 0, 8, 2),
    (128, 16, 0, 8, 8),
], ids=["one-chunk-S4", "two-chunks-S2", "streamed-S2", "single-program-S2", "one-chunk-S8"])


def test_split_k_factor():
    assert gt._nsplit(512, 256, 8, 16, 16) == 8  # the anchor: 2 MMA tiles, 8 warps
    assert gt._nsplit(1024, 512, 8, 16, 16) == 8
    assert gt._nsplit(64, 0, 8, 32, 64) == 1  # 16 MMA tiles cover 8 warps: a plain dot
    assert gt._nsplit(64, 0, 4, 16, 16) == 4
    assert gt._nsplit(64, 32, 4, 16, 16) == 2  # the 32 chunk keeps 16 columns a slice
    assert gt._nsplit(32, 16, 4, 16, 16) == 1
    assert gt._nsplit(16, 0, 8, 16, 16) == 1
    assert gt._nsplit(512, 256, 16, 16, 16) == 16  # 16 warps (forced): 16 slices
    # The forward's gate dots: one slice per warp, up to 8 (`_FWD_GATE_SPLIT`).
    assert gt._gate_split(512, 256, 16, 16, 16) == 8
    assert gt._gate_split(512, 256, 8, 16, 16) == 8
    assert gt._gate_split(512, 256, 4, 16, 16) == 4
    assert gt._gate_split(64, 32, 4, 16, 16) == 2  # the 32 chunk keeps 16 columns a slice
    assert gt._gate_split(32, 16, 4, 16, 16) == 1
    assert gt._gate_split(64, 0, 4, 16, 32) == 1  # 4 MMA tiles for 4 warps: a plain dot


@SPLIT_K
@directed("cell", [(c,) for c in CELLS])
def test_split_k_matches_reference(cell, reverse, H, block_h, block_k, num_warps, S):
    assert gt._nsplit(*gt._ksplit(H, block_k), num_warps, block_h, 16) == S  # backward
    assert gt._gate_split(*gt._ksplit(H, block_k), num_warps, block_h, 16) == S
    kw = dict(persistent=True, block_h=block_h, block_k=block_k, num_warps=num_warps)
    _check_layer(cell, H, 0, *VARLEN, reverse=reverse, **kw)


# 16 warps (forced): the backward's 16 slices are added by tl.sum (`_ksum` halves 2, 4 and 8),
# the forward's gate dots stay at 8 (`_FWD_GATE_SPLIT`, by halves). H = 256: one chunk of
# 256 columns, 16 slices of 16.
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_sixteen_slices_match_reference(cell):
    assert gt._nsplit(*gt._ksplit(256, 0), 16, 16, 16) == 16
    assert gt._gate_split(*gt._ksplit(256, 0), 16, 16, 16) == 8
    _check_layer(cell, 256, 0, [3, 1, 3, 2], 3, reverse=False, persistent=True, block_h=16,
                 num_warps=16)


# The backward's resident gate products as 1 or 4 independent MMA chains (CHAINS): the
# same sum in either grouping. H = 33: two chunks (32 + 16); H = 32: one.
@pytest.mark.parametrize("chains", [1, 4])
@pytest.mark.parametrize("cell, H", [("lstm", 33), ("gru", 33), ("lstm", 32), ("gru", 32)],
                         ids=lambda v: str(v))
def test_backward_gate_chains_match_reference(monkeypatch, cell, H, chains):
    monkeypatch.setattr(gt, "_bwd_chains", lambda *_a: chains)
    ins, outs = _backward_problem(cell, H, 0, *VARLEN)
    _run_backward(ins, outs, True, persistent=False, block_h=16)
    _check_backward(ins, outs, True)


def test_backward_chain_rule():
    # 16 x 16 tiles, 4 warps, S = 4: 2 MMA tiles per warp; LSTM H=768 (4 gates * 768 / 64 =
    # 48 per chain) -> 4 chains; H=256 (16: short) -> 1; one gate -> 1.
    assert gt._bwd_chains(16, 16, 4, 4, 4, 768) == 4
    assert gt._bwd_chains(16, 16, 4, 4, 3, 1536) == 4
    assert gt._bwd_chains(16, 16, 4, 4, 4, 256) == 1
    assert gt._bwd_chains(16, 16, 4, 4, 1, 1024) == 1
    # 16 x 32 tiles, 8 warps, S = 8: 4 tiles per warp, chains overlap already -> 1.
    assert gt._bwd_chains(16, 32, 8, 8, 4, 1024) == 1


# The streamed forward's joint gate dot (`_joint_gates`): one [4 * block_h, block_k] product
# per chunk for all gates, split out afterwards; GRU padded with a zero gate; with a
# projection too.
@directed("cell, H, P", [("lstm", 64, 0), ("gru", 64, 0), ("lstm", 96, 64)])
def test_joint_gate_forward_matches_reference(cell, reverse, H, P):
    assert gt._joint_gates(cell, 32) and not gt._joint_gates(cell)
    ins, outs = _forward_problem(cell, H, P, *VARLEN)
    _run_forward(ins, outs, reverse, persistent=True, block_h=16, block_k=32, num_warps=4)
    _check_forward(ins, outs, reverse)


# Streamed weights with batch tiles of 64 (the large-batch plans): every dot of the loop is
# formed transposed, [batch, K] @ [K, rows] (SWAP), the forward's gates joined in one tile
# (one gate: GP = 1) and the backward's gates in one loop over G*H. 70 rows: a full and a
# partial batch tile, lengths 0..6 in a shuffled order (rows of a tile finish at different
# steps); H = 33: three hidden slices, chunks of 16 with a ragged last one.
def _shuffled_lengths(rows: int, seed: int) -> tuple[list[int], int]:
    """`rows` lengths drawn from 0..6 (seeded); T = 7."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 7, (rows,), generator=g).tolist(), 7


def _swap_lengths():
    return _shuffled_lengths(70, 5)


@directed("cell, P", [(c, 0) for c in CELLS] + [("lstm", 20)])
@PERSIST_UNHOISTED
def test_streamed_swapped_dots_match_reference(cell, P, reverse, persistent):
    assert gt._swap_dots(16, 64) and not gt._swap_dots(16, 32) and not gt._swap_dots(0, 64)
    assert gt._joint_gates(cell, 16, 64)
    kw = dict(persistent=persistent, block_h=16, block_b=64, block_k=16, num_warps=4)
    _check_layer(cell, 33, P, *_swap_lengths(), reverse=reverse, **kw)


def _wide_lengths():
    """150 rows (a full and a partial 128-wide batch tile), lengths 0..6 shuffled; T = 7."""
    return _shuffled_lengths(150, 6)


# 128-wide batch tiles (the planner's streamed 64 x 128 tiles past B = 512 at large H,
# `planner._grid_batch_tiles`) over `_wide_lengths`; H = 33 three hidden slices of 16.
@directed("cell, P", [(c, 0) for c in CELLS] + [("lstm", 20)])
def test_128_column_batch_tiles_match_reference(cell, P, reverse):
    kw = dict(persistent=True, block_h=16, block_b=128, block_k=16, num_warps=8)
    _check_layer(cell, 33, P, *_wide_lengths(), reverse=reverse, **kw)


# The gated cells, and LSTM with a projection (two backward phases).
GATED = directed("cell, P", [("lstm", 0), ("gru", 0), ("lstm", 20)])


# XJOIN: the forward's prefetched input-side tiles start the transposed joint product (all
# of a gated cell's gates but GRU's n, whose input side stays a tile of its own). On a GPU
# only tiles of 64 x 64 or more take it; _XJOIN_TILE lowered, the 16 x 64 tiles here do.
@GATED
@PERSIST_UNHOISTED
def test_streamed_xjoin_matches_reference(monkeypatch, cell, P, reverse, persistent):
    monkeypatch.setattr(gt, "_XJOIN_TILE", 16 * 64)
    assert gt._xjoin(cell, 16, 16, 64)
    kw = dict(persistent=persistent, block_h=16, block_b=64, block_k=16, num_warps=4)
    _check_layer(cell, 33, P, *_swap_lengths(), reverse=reverse, **kw)


# LATE: each backward sub-step loads its own inputs after its product (the carry product; with
# a projection also Pw^T's, phase B), not the sub-step before it ahead of the barrier's wait. On
# a GPU only gated cells' tiles of 128 x 64 or more take it; _LATE_TILE lowered, the 16 x 64
# tiles here do. The interpreter runs one sub-step per launch, so every sub-step's inputs come
# from LATE's loads.
@GATED
@BLOCK_K
def test_late_loads_match_reference(monkeypatch, cell, P, reverse, block_k):
    monkeypatch.setattr(gt, "_LATE_TILE", 16 * 64)
    assert gt._late_loads(cell, 16, 64) and not gt._late_loads(cell, 16, 32)
    kw = dict(persistent=True, block_h=16, block_b=64, block_k=block_k, num_warps=4)
    _check_layer(cell, 33, P, *_swap_lengths(), reverse=reverse, **kw)


# The stepwise family's own tiles past the co-resident grid (`planner._stepwise_fit`): 64 x 64,
# streamed in 64-column chunks, where XJOIN applies without lowering _XJOIN_TILE. H = 96: one
# full and one ragged hidden slice and chunk; 70 rows: a full and a partial batch tile.
@directed("cell, P", [("lstm", 0), ("gru", 0), ("rnn_tanh", 0), ("lstm", 48)])
def test_stepwise_64_tiles_match_reference(cell, P, reverse):
    assert gt._xjoin(cell, 64, 64, 64) == (cell != "rnn_tanh")
    kw = dict(persistent=False, block_h=64, block_b=64, block_k=64, num_warps=8)
    _check_layer(cell, 96, P, *_swap_lengths(), reverse=reverse, **kw)


def test_resident_operands_fit():
    # A resident chunk's operand [chunk, block_b] within 512 x 32 elements in both passes'
    # reductions (H and Hout): 1024-column chunks at 16-column tiles (GRU H=1536: 1024 + 512,
    # the issue's reach), 512 at 32 (H=1024: 512 + 512), 256 at 64 (H=512: 256 + 256).
    assert gt.resident_operands_fit(1536, 1536, 16) and gt.resident_operands_fit(2048, 2048, 16)
    assert gt.resident_operands_fit(1024, 1024, 32) and not gt.resident_operands_fit(1536, 1536, 32)
    assert gt.resident_operands_fit(512, 512, 64) and not gt.resident_operands_fit(768, 768, 64)
    # With a projection both reductions count: R over Hout = P, R^T over H.
    assert not gt.resident_operands_fit(1024, 256, 64)
    assert not gt.resident_operands_fit(256, 1024, 64)
    assert gt.resident_operands_fit(1024, 256, 16)


def test_xjoin_choice():
    # Gated cells, streamed and swapped (batch tiles >= 64), tiles of >= 64 x 64 elements.
    assert gt._xjoin("lstm", 64, 64, 64) and gt._xjoin("gru", 32, 128, 64)
    assert gt._xjoin("lstm", 64, 32, 128) and not gt._xjoin("lstm", 64, 32, 64)
    assert not gt._xjoin("rnn_tanh", 64, 128, 64) and not gt._xjoin("rnn_relu", 64, 64, 64)
    assert not gt._xjoin("lstm", 0, 64, 64) and not gt._xjoin("lstm", 64, 128, 32)


def test_late_loads_choice():
    # Gated cells on tiles of >= 128 x 64 elements, whichever way round.
    assert gt._late_loads("lstm", 128, 64) and gt._late_loads("gru", 64, 128)
    assert gt._late_loads("lstm", 256, 64)
    assert not gt._late_loads("lstm", 64, 64) and not gt._late_loads("gru", 32, 128)
    assert not gt._late_loads("rnn_tanh", 128, 64) and not gt._late_loads("rnn_relu", 128, 64)


def test_fold_dy_choice():
    # dy joins the carry after the wait, except on resident 64-column tiles (Triton 3.9
    # spilled there); the resident 16 x 64 layer tests above run that path.
    assert gt._fold_dy(0, 16) and gt._fold_dy(0, 32) and gt._fold_dy(64, 64)
    assert gt._fold_dy(16, 128) and not gt._fold_dy(0, 64)


def test_streamed_joint_gate_choice():
    # Streamed gated cells always join their gates (no split K); one-gate cells only where
    # the dot is swapped; resident weights never.
    assert gt._joint_gates("lstm", 16, 16) and gt._joint_gates("gru", 64, 32)
    assert not gt._joint_gates("rnn_tanh", 16, 32) and gt._joint_gates("rnn_relu", 16, 64)
    assert not gt._joint_gates("lstm", 0, 64) and not gt._joint_gates("lstm")


def test_switches_from_the_environment(monkeypatch):
    # A switch read when the module is imported (TRITONRNN_BWD_PAIRED_GATES_WIDE, off by
    # default): on / off, else an error naming it.
    for raw, want in (("", False), ("off", False), ("on", True), (" on ", True)):
        monkeypatch.setenv("TRITONRNN_BWD_PAIRED_GATES_WIDE", raw)
        assert gt._env_on_off("TRITONRNN_BWD_PAIRED_GATES_WIDE") is want
    monkeypatch.setenv("TRITONRNN_BWD_PAIRED_GATES_WIDE", "1")
    with pytest.raises(ValueError, match=r"TRITONRNN_BWD_PAIRED_GATES_WIDE: expected on or "
                                         r"off, got '1'"):
        gt._env_on_off("TRITONRNN_BWD_PAIRED_GATES_WIDE")
    # A switch that is on by default (TRITONRNN_FWD_JOINED_SUMS).
    for raw, want in (("", True), ("off", False), ("on", True)):
        monkeypatch.setenv("TRITONRNN_FWD_JOINED_SUMS", raw)
        assert gt._env_on_off("TRITONRNN_FWD_JOINED_SUMS", default=True) is want


# The forward's gate pre-activations summed joined (the default on MMA tiles, SUMS) and per
# gate (`_FWD_JOINED_SUMS` off), every cell: GRU folds r's and z's input side only (n keeps it
# apart), one-gate cells and vector tiles always sum per gate.
@pytest.mark.parametrize("joined", [True, False], ids=["joined", "per_gate"])
@pytest.mark.parametrize("cell, block_b", [(c, 16) for c in CELLS] + [("lstm", 2)])
def test_gate_sums_match_reference(monkeypatch, cell, block_b, joined):
    monkeypatch.setattr(gt, "_FWD_JOINED_SUMS", joined)
    assert gt._joined_sums(block_b) == (joined and block_b >= 16)
    ins, outs = _forward_problem(cell, 33, 0, *VARLEN)
    _run_forward(ins, outs, False, persistent=True, block_h=16 if block_b >= 16 else 8,
                 block_b=block_b)
    _check_forward(ins, outs, False)


# The forward's active-row mask formed in its step loop (MASK_IN_LOOP, `_mask_in_loop`: MMA
# tiles below 64 x 64) or carried over from the prefetch (vector tiles, wide tiles, or
# `_FWD_MASK_IN_LOOP` off): a 16-wide tile whose columns past B (lens 0), a length-0 row and
# rows ending before T must stay as they are, forward and reversed, with the projection's
# two phases per step.
@pytest.mark.parametrize("in_loop", [True, False], ids=["in_loop", "carried"])
@pytest.mark.parametrize("cell, P, reverse", [("lstm", 0, False), ("gru", 0, True),
                                              ("lstm", 20, True)])
def test_forward_active_mask_both_ways_matches_reference(monkeypatch, cell, P, reverse,
                                                         in_loop):
    monkeypatch.setattr(gt, "_FWD_MASK_IN_LOOP", in_loop)
    assert gt._mask_in_loop(16, 16) is in_loop
    assert not gt._mask_in_loop(16, 2) and not gt._mask_in_loop(64, 64)
    ins, outs = _forward_problem(cell, 33, P, *VARLEN)
    _run_forward(ins, outs, reverse, persistent=True, block_h=16, block_b=16)
    _check_forward(ins, outs, reverse)


# The per-gate forward's two resident chunks (H = 40: 32 + 16, the second padded past H)
# loaded together before either product (PAIR, `_paired_chunks`: 16- and 32-column tiles)
# or each where its dots use it (`_FWD_PAIRED_CHUNKS` off, and 64-column tiles); forward and
# reversed, every gate count, 35 rows in 16-wide tiles (the third partial), lengths 0 to T.
@pytest.mark.parametrize("mode", [1, 0], ids=["paired", "apart"])
@pytest.mark.parametrize("cell, reverse", [("lstm", False), ("gru", True), ("rnn_tanh", False)])
def test_forward_chunks_paired_or_apart_match_reference(monkeypatch, cell, reverse, mode):
    assert gt._paired_chunks(16) == 1 and gt._paired_chunks(32) == 1  # the defaults
    assert gt._paired_chunks(64) == 0 and gt._paired_chunks(2) == 0
    monkeypatch.setattr(gt, "_FWD_PAIRED_CHUNKS", mode > 0)
    assert gt._paired_chunks(16) == mode and gt._paired_chunks(64) == 0
    lengths = [5] * 20 + [3, 0, 1, 5, 2] * 3
    ins, outs = _forward_problem(cell, 40, 0, lengths, 5)
    _run_forward(ins, outs, reverse, persistent=True, block_h=16, block_b=16)
    _check_forward(ins, outs, reverse)


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "apart"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_backward_gates_loaded_ahead_match_reference(monkeypatch, cell, paired):
    assert gt._paired_gates(0, 16)  # on by default
    assert not gt._paired_gates(64, 16) and not gt._paired_gates(0, 32)
    assert not gt._paired_gates(0, 2)
    # The planner's count at H = 768: the weights, 2*G*16*768 B, and paired the backward's
    # two gates' operands staged at once (2*16*2*768 B; tanh's one gate, whose paired
    # backward stays within its forward's footprint); apart the forward's staged h is the
    # larger (LSTM / GRU: both 512-row chunks, 2*16*1024 B).
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    on = 2 * G * 16 * 768 + 2 * 16 * min(G, 2) * 768
    apart = {"lstm": 131072, "gru": 106496, "rnn_tanh": 49152}[cell]
    monkeypatch.setattr(gt, "_BWD_PAIRED_GATES", paired)
    assert gt._paired_gates(0, 16) is paired
    assert gt.grid_onchip_bytes(cell, 768, 768, 0, torch.bfloat16, 16, 16) == (
        on if paired else apart)
    assert gt.grid_pairs_gates(cell, 768, 768, 0, torch.bfloat16, 16, 16, 0, on) is paired
    assert not gt.grid_pairs_gates(cell, 768, 768, 0, torch.bfloat16, 16, 16, 0, on - 1)
    if paired:
        # Within a budget only (`grid_pairs_gates`): GRU H=1536 paired needs 2*3*16*1536 +
        # 2*16*2*1536 B, past an H100's; apart, its forward's 2*3*16*1536 + 2*16*1536 is
        # the most.
        for budget, fits, onchip in ((None, True, 245760), (225280, False, 196608)):
            assert gt.grid_pairs_gates("gru", 1536, 1536, 0, torch.bfloat16, 16, 16, 0,
                                       budget) is fits
            assert gt.grid_onchip_bytes("gru", 1536, 1536, 0, torch.bfloat16, 16, 16,
                                        smem_limit=budget) == onchip
    _check_layer(cell, 40, 0, *VARLEN, reverse=True, persistent=True, block_h=16, block_b=16)


# PAIRG on 16 x 32 tiles (the B = 32 / 64 plans; `_BWD_PAIRED_GATES_WIDE`, an opt-in
# experiment): two gates' 32-column operands staged at once, every gate count, two chunks
# (H = 40: 32 + 16), 35 rows (two batch tiles, the second partial), against the reference.
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_wide_tiles_backward_gates_loaded_ahead_match_reference(monkeypatch, cell):
    assert not gt._paired_gates(0, 32)  # off by default
    monkeypatch.setattr(gt, "_BWD_PAIRED_GATES_WIDE", True)
    assert gt._paired_gates(0, 32) and gt._paired_gates(0, 16)
    assert not gt._paired_gates(64, 32) and not gt._paired_gates(0, 64)
    # The count at H = 768: the weights 2*G*16*768 B and two gates' 32-column operands
    # 2*32*2*768 B (tanh: one gate's).
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    on = 2 * G * 16 * 768 + 2 * 32 * min(G, 2) * 768
    assert gt.grid_onchip_bytes(cell, 768, 768, 0, torch.bfloat16, 16, 32) == on
    lengths = [9] * 20 + [7, 0, 5, 2] * 3 + [3, 8, 1]
    _check_layer(cell, 40, 0, lengths, 9, reverse=True, persistent=True, block_h=16,
                 block_b=32)


# Vector tiles (block_b < 16): the resident products run on the FMA units (`_vdot`), the
# weights held in registers, the backward's from transposed copies (contiguous along the
# reduction). H = 17 with block_h = 8: three hidden slices, the last with one unit; three
# rows (a tie, a zero length, max_len < T) in batch tiles of 1, 2, 4 (3, 2, 1 tiles, the
# last partial); a projection P = 20 (output slices of 16 over the 3 programs). Small: the
# interpreter runs every program of every step's launch (block_b = 1: 9 programs).
VEC_LENGTHS = ([3, 0, 3], 4)


# Every cell (and the projection) in tiles of 1 row, forward direction, persistent; tiles of
# 2 and 4 rows for LSTM (with and without the projection) and GRU, reversed and stepwise.
VEC_CASES = [(c, P, 1, False, True, False) for c, P in [(c, 0) for c in CELLS] + [("lstm", 20)]] + [
    (c, P, bb, True, False, False) for c, P in (("lstm", 0), ("lstm", 20), ("gru", 0))
    for bb in (2, 4)] + [
    (c, P, bb, False, True, True) for c, P, bb in (("lstm", 0, 1), ("lstm", 20, 1), ("gru", 0, 2),
                                                  ("rnn_relu", 0, 4))]


@pytest.mark.parametrize("cell, P, block_b, reverse, persistent, sliced", VEC_CASES,
                         ids=lambda v: str(v))
def test_vector_tiles_match_reference(cell, P, block_b, reverse, persistent, sliced,
                                      monkeypatch):
    assert gt.vector_tiles(block_b) and gt._nsplit(16, 16, 8, 8, block_b) == 1
    if sliced:
        # Slices of 8 columns (`vector_width`, 256 for bf16 on a GPU) of chunks of 16 (with
        # _MAX_CHUNK = 16, H = 17 is 16 + 16): R, R^T, Pw and Pw^T chunks are each held as
        # [2, rows, 8] (`_vgates`, `_vgate_sum`, `_vdot`); otherwise one slice per chunk.
        monkeypatch.setattr(gt, "_MAX_CHUNK", 16)
        monkeypatch.setattr(gt, "vector_width", lambda dot_dt: 8)
        assert gt._ksplit(17) == (16, 16)
    kw = dict(persistent=persistent, block_h=8, block_b=block_b, num_warps=8)
    _check_layer(cell, 17, P, *VEC_LENGTHS, reverse=reverse, **kw)


# A sliced chunk's two slices (`_vgates`, `_vgate_sum`, `_vdot`) added by halves, R's and
# Pw's products in both passes.
@pytest.mark.parametrize("cell, P", [("lstm", 20), ("gru", 0)])
def test_vector_slices_halved_match_reference(monkeypatch, cell, P):
    monkeypatch.setattr(gt, "_MAX_CHUNK", 16)
    monkeypatch.setattr(gt, "vector_width", lambda dot_dt: 8)
    kw = dict(persistent=True, block_h=8, block_b=2, num_warps=8)
    _check_layer(cell, 17, P, *VEC_LENGTHS, reverse=False, **kw)


def test_vector_tiles_batch_one_single_program():
    # One program (H = 8, block_h = 8, B = 1): the persistent launch runs every step in one
    # launch under the interpreter too, so the in-kernel step loop carries h, c in registers.
    for cell in ("lstm", "gru"):
        kw = dict(persistent=True, block_h=8, block_b=1, num_warps=4)
        _check_layer(cell, 8, 0, [6], 6, reverse=False, **kw)


@pytest.mark.parametrize("block_k", [0, 32], ids=["resident", "streamed"])
def test_split_k_projection(block_k):
    # H = 96 (64 + 32: S = 2 for R in the forward, R^T in the backward), P = 64 (Pw's
    # reduction over H in the forward, Pw^T's over P in the backward, split too).
    assert gt._nsplit(*gt._ksplit(64, block_k), 4, gt._block_o(96, 64, 16), 16) > 1
    kw = dict(persistent=False, block_h=16, block_k=block_k, num_warps=4)
    _check_layer("lstm", 96, 64, *VARLEN, reverse=True, **kw)


# Every sub-step of a launch but its last arrives at the barrier exactly once, whatever branch
# it takes (cell or projection phase, finished batch tiles, the backward's final dh0 step):
# one launch of all sub-steps that only counts arrivals (`_count_arrivals`, safe in the
# interpreter; its outputs are not checked) must count (n_sub - 1) * programs per direction.
@pytest.mark.parametrize("pair", [False, True], ids=["one_dir", "pair"])
@pytest.mark.parametrize("cell, P", [(c, 0) for c in CELLS] + [("lstm", 20)],
                         ids=[*CELLS, "lstm_proj"])
def test_every_sub_step_arrives_once(cell, P, pair):
    lengths, T = [5, 0, 3, 5, 1, 2, 4, 1, 3, 2, 5, 4, 1, 3, 2, 5, 4], 6  # 2 batch tiles
    H, nph = 33, 2 if P else 1
    programs = gt.grid_programs(H, P or H, P, len(lengths), 16, 16)
    kw = dict(persistent=True, block_h=16, _count_arrivals=True)
    for kind, n_sub in (("forward", nph * max(lengths)), ("backward", nph * max(lengths) + 1)):
        make, run = ((_forward_problem, _run_forward) if kind == "forward"
                     else (_backward_problem, _run_backward))
        counts = []
        for reverse in ([False, True] if pair else [False]):
            ins, outs = make(cell, H, P, lengths, T)
            counts.append(run(ins, outs, reverse, **kw))
        sync = torch.cat(counts).cpu()
        assert sync[:, 0].tolist() == [(n_sub - 1) * programs] * len(counts), kind
        assert sync[:, 1].tolist() == [0] * len(counts), kind



# A persistent launch of one program runs every sub-step in one launch with its grid barrier
# compiled in, under the interpreter too (it never waits for another program): the barrier's
# targets and the step loop's carries run without a GPU. At `_barrier_extra` = 1 every target
# is one arrival past what the program provides, so the first wait must time out; a target
# one sub-step short would pass it. At 0 every wait passes: the launch matches the reference,
# and in the interpreter equals one launch per sub-step (stepwise) bit for bit.
@pytest.mark.parametrize("kind", ["forward", "backward"])
@directed("cell, P", [(c, 0) for c in CELLS] + [("lstm", 16)])
def test_single_program_launch_meets_its_barrier(monkeypatch, kind, cell, P, reverse):
    from tritonrnn.kernels.grid_barrier import BarrierTimeoutError

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "sync")  # the launch itself raises
    lengths, T, H = [5, 0, 3, 5, 1], 6, 16
    assert gt.grid_programs(H, P or H, P, len(lengths), 16, 16) == 1
    make, run, check = ((_forward_problem, _run_forward, _check_forward) if kind == "forward"
                        else (_backward_problem, _run_backward, _check_backward))
    results = {}
    for persistent in (True, False):
        ins, outs = make(cell, H, P, lengths, T)
        run(ins, outs, reverse, persistent=persistent, block_h=16)
        check(ins, outs, reverse)
        results[persistent] = {k: v for k, v in outs.items() if v is not None}
    if not ON_GPU:
        for k, v in results[True].items():
            assert torch.equal(v, results[False][k]), k
    ins, outs = make(cell, H, P, lengths, T)
    with pytest.raises(BarrierTimeoutError, match=f"grid_{kind}: .*grid barrier timed out"):
        run(ins, outs, reverse, persistent=True, block_h=16, _max_spin=64, _barrier_extra=1)
    # The launches: one with the barrier (persistent) against one per sub-step without.
    n_sub = (2 if P else 1) * max(lengths) + (kind == "backward")
    for persistent, launches, barrier in ((True, 1, 1), (False, n_sub, 0)):
        rec = _LaunchRecord()
        with monkeypatch.context() as m:
            m.setattr(pg, "_grid_fwd_kernel" if kind == "forward" else "_grid_bwd_kernel", rec)
            run(*make(cell, H, P, lengths, T), reverse, persistent=persistent, block_h=16)
        assert len(rec.calls) == launches
        assert {kw["BARRIER"] for *_, kw in rec.calls} == {barrier}

def _poison(outs: dict) -> None:
    """NaN into every output again, so a second run that wrote nothing cannot match."""
    for v in outs.values():
        if v is not None:
            v.fill_(float("nan"))


def test_deterministic_run_to_run():
    ins, outs = _forward_problem("lstm", 33, 20, [3, 0, 2], 3)
    _run_forward(ins, outs, True, persistent=True, block_h=16)
    first = {k: v.clone() for k, v in outs.items()}
    _poison(outs)
    _run_forward(ins, outs, True, persistent=True, block_h=16)
    for k in outs:
        assert torch.equal(outs[k], first[k]), k
    ins, outs = _backward_problem("lstm", 33, 20, [3, 0, 2], 3)
    _run_backward(ins, outs, True, persistent=True, block_h=16)
    first = {k: v.clone() for k, v in outs.items() if v is not None}
    _poison(outs)
    _run_backward(ins, outs, True, persistent=True, block_h=16)
    for k in first:
        assert torch.equal(outs[k], first[k]), k


# -------------------------------------------------------------------------------------------
# Argument checks, launch plan and formulas
# -------------------------------------------------------------------------------------------


def test_rejects_float64_bad_tiles_and_gru_projection():
    ins, outs = _forward_problem("lstm", 16, 0, [2], 2)
    with pytest.raises(ValueError, match="block_h"):
        _run_forward(ins, outs, False, persistent=False, block_h=24)
    with pytest.raises(ValueError, match="block_b in 1, 2, 4 .* got block_b = 8"):
        _run_forward(ins, outs, False, persistent=False, block_h=16, block_b=8)
    with pytest.raises(ValueError, match="needs resident weights .* block_k = 16"):
        _run_forward(ins, outs, False, persistent=False, block_h=16, block_b=2, block_k=16)
    with pytest.raises(ValueError, match="block_h >= 8, got block_b = 1, block_h = 4"):
        _run_forward(ins, outs, False, persistent=False, block_h=4, block_b=1)
    with pytest.raises(ValueError, match="block_h must be >= 16 with MMA tiles .* got 8"):
        _run_forward(ins, outs, False, persistent=False, block_h=8, block_b=16)
    with pytest.raises(ValueError, match="block_b must be a power of two, got 3"):
        _run_forward(ins, outs, False, persistent=False, block_h=16, block_b=3)
    with pytest.raises(ValueError, match="block_k must be 0 .* got 24"):
        _run_forward(ins, outs, False, persistent=False, block_h=16, block_k=24)
    # num_stages: the streamed loops' pipeline depth, for streamed weights only
    with pytest.raises(ValueError, match=r"num_stages applies to streamed weights \(block_k > "
                       r"0\): expected 0 with resident weights \(block_k = 0\), got "
                       r"num_stages = 4"):
        _run_forward(ins, outs, False, persistent=False, block_h=16, num_stages=4)
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match=r"num_stages must be an int >= 0 \(0: Triton's "
                           rf"default, 3\), got {bad!r}"):
            _run_forward(ins, outs, False, persistent=False, block_h=16, block_k=16,
                         num_stages=bad)
    ins64 = {k: (v.double() if torch.is_tensor(v) else v) for k, v in ins.items()}
    outs64 = {k: (v.double() if v is not None else None) for k, v in outs.items()}
    with pytest.raises(ValueError, match=r"xg: expected dtype float32, float16 or bfloat16 "
                       r"\(the grid kernels'\), got torch.float64 \(float64 runs on the "
                       r"reference backend\)"):
        _run_forward(ins64, outs64, False, persistent=False, block_h=16)
    with pytest.raises(ValueError, match=r"hT: expected shape \[1, 16\], got None"):
        _run_forward(ins, {**outs, "hT": None}, False, persistent=False, block_h=16)
    ins, outs = _backward_problem("gru", 16, 0, [2], 2)
    with pytest.raises(ValueError, match=r"num_stages applies to streamed weights"):
        _run_backward(ins, outs, False, persistent=False, block_h=16, num_stages=6)
    ins["Pw"] = torch.zeros(8, 16, device=DEV)
    with pytest.raises(ValueError, match="LSTM-only"):
        _run_backward(ins, outs, False, persistent=False, block_h=16)


def _replaced(ins: dict, outs: dict, name: str, value) -> tuple[dict, dict]:
    """A problem's (ins, outs) with the argument `name` (an input or an output) replaced."""
    if name in ins:
        return {**ins, name: value}, outs
    return ins, {**outs, name: value}


def _on(device, ins: dict, outs: dict) -> tuple[dict, dict]:
    """A problem's (ins, outs) with every tensor on `device`."""
    move = lambda d: {k: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
                      for k, v in d.items()}
    return move(ins), move(outs)


@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_rejects_tensors_of_another_dtype_or_device(pass_, monkeypatch):
    """Every tensor in the first one's dtype and on its device (xg's in the forward, pre_x's
    in the backward), info's index tensors too, and that a GPU unless the interpreter runs
    the kernels: only the first tensor's device was checked, and a CPU R beside a CUDA xg
    reached Triton's launch, whose error names no argument ("Pointer argument (at 2)
    cannot be accessed from Triton"). meta stands in for another device."""
    forward = pass_ == "forward"
    ins, outs = (_forward_problem if forward else _backward_problem)("lstm", 16, 0, [2, 1], 2)
    run = _run_forward if forward else _run_backward
    first = "xg" if forward else "pre_x"
    others = ("R", "c0", "y") if forward else ("R", "dy", "dc0")
    tiles = dict(persistent=False, block_h=16)
    dev = ins[first].device
    with pytest.raises(ValueError, match=re.escape(
            f"R: expected dtype torch.float32 ({first}'s), got torch.bfloat16")):
        run(*_replaced(ins, outs, "R", ins["R"].bfloat16()), False, **tiles)
    for name in others:
        t = ins[name] if name in ins else outs[name]
        with pytest.raises(ValueError, match=re.escape(
                f"{name}: expected a tensor on {dev} ({first}'s), got meta")):
            run(*_replaced(ins, outs, name, t.to("meta")), False, **tiles)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (read at the call: nothing is launched)
    with pytest.raises(ValueError, match=re.escape(
            f"info: expected its index tensors on meta ({first}'s), got {dev}")):
        run(*_on("meta", ins, outs), False, **tiles)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu_ins, cpu_outs = _on("cpu", ins, outs)
    cpu_ins["info"] = make_pack_info([2, 1], 2, torch.device("cpu"))
    with pytest.raises(ValueError, match=re.escape(
            f"{first}: expected a CUDA tensor (or TRITON_INTERPRET=1 for the interpreter), "
            "got device cpu")):
        run(cpu_ins, cpu_outs, False, **tiles)


@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_rejects_a_weight_matrix_of_another_rank(pass_):
    """R is [G * H, Hout]: one of another rank, or none, is named before its shape is
    unpacked (which failed with "not enough values to unpack", naming nothing)."""
    forward = pass_ == "forward"
    ins, outs = (_forward_problem if forward else _backward_problem)("lstm", 16, 0, [2, 1], 2)
    run = _run_forward if forward else _run_backward
    for R, got in ((ins["R"].flatten(), "shape [1024]"), (ins["R"][None], "shape [1, 64, 16]"),
                   (None, "None")):
        with pytest.raises(ValueError, match=re.escape(
                f"R: expected a 2-D tensor [4 * H, Hout] for cell 'lstm', got {got}")):
            run({**ins, "R": R}, outs, False, persistent=False, block_h=16)


def test_coresidency_check_names_grid_and_sm_count():
    pg.check_coresident(132, 132)
    with pytest.raises(ValueError, match=r"133 programs.*132 SMs"):
        pg.check_coresident(133, 132)


def test_launch_ranges():
    # GPU persistent: one launch; stepwise, or the interpreter with several programs: one
    # sub-step per launch.
    assert pg._launch_ranges(4, persistent=True, on_gpu=True, programs=9) == [(0, 4)]
    assert pg._launch_ranges(3, persistent=False, on_gpu=True, programs=1) == [
        (0, 1), (1, 2), (2, 3)]
    assert pg._launch_ranges(2, persistent=True, on_gpu=False, programs=3) == [(0, 1), (1, 2)]


def test_launch_ranges_keep_the_barrier_counter_in_int32():
    # A persistent launch's barrier targets reach (sub-steps + 1) x programs (with its first
    # target at 1 x programs): past 2**31 - 1 they would wrap and a wait would pass early.
    # Longer runs are split: at 132 programs after 16268814 sub-steps.
    limit = 2**31 - 1
    for n_sub, programs in ((2**24, 132), (3 * 2**24 + 5, 128), (2**31 - 1, 1), (5 * 10**8, 100)):
        ranges = pg._launch_ranges(n_sub, persistent=True, on_gpu=True, programs=programs)
        assert ranges[0][0] == 0 and ranges[-1][1] == n_sub
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert all((u1 - u0 + 1) * programs <= limit for u0, u1 in ranges), (n_sub, programs)
    assert pg._launch_ranges(2**24, persistent=True, on_gpu=True, programs=132) == [
        (0, 16268814), (16268814, 2**24)]
    assert pg._launch_ranges(16268814, persistent=True, on_gpu=True, programs=132) == [
        (0, 16268814)]


@pytest.mark.parametrize("cell,P", [("lstm", 0), ("lstm", 12), ("gru", 0), ("rnn_relu", 0)])
def test_persistent_run_split_into_launches(monkeypatch, cell, P):
    # A persistent run split where the barrier counter would overflow (`_launch_ranges`),
    # forced here with a small limit on a one-program grid (which the interpreter runs as
    # persistent launches): launches of 3 sub-steps, so with a projection (2 sub-steps per
    # step) some boundaries fall inside a step; states and exchange slots carried across;
    # every output bit-identical to the one-launch run and to the reference.
    lengths, T = [7, 5, 0], 7
    runs = []
    for limit in (2**31 - 1, 4):
        monkeypatch.setattr(pg, "_COUNTER_LIMIT", limit)
        assert len(pg._launch_ranges(2 * T + 1, True, False, 1)) == (1 if limit > 4 else 5)
        f_ins, f_outs = _forward_problem(cell, 16, P, lengths, T)
        _run_forward(f_ins, f_outs, True, persistent=True, block_h=16)
        b_ins, b_outs = _backward_problem(cell, 16, P, lengths, T)
        _run_backward(b_ins, b_outs, True, persistent=True, block_h=16)
        runs.append({**{"f." + k: v for k, v in f_outs.items() if v is not None},
                     **{"b." + k: v for k, v in b_outs.items() if v is not None}})
    for k, v in runs[0].items():
        assert torch.equal(runs[1][k], v), k
    _check_forward(f_ins, f_outs, True)
    _check_backward(b_ins, b_outs, True)


def test_grid_formulas(monkeypatch):
    assert gt.grid_programs(33, 33, 0, 5, 16, 16) == 3
    assert gt.grid_programs(1024, 1024, 0, 64, 16, 16) == 64 * 4
    assert gt.grid_programs(1024, 256, 256, 16, 16, 16) == 64
    # Shared memory as Triton 3.6 allocates it for sm_90 (checked against compiled kernels):
    # the resident slice plus the larger of the staged exchange operand (bf16; the per-gate
    # forward stages both chunks of its reduction at once on tiles up to 32 columns,
    # `_paired_chunks`, the backward one at a time) and
    # the split-K scratch (8 warps: the backward's S = 8 slices of fp32 partial sums; the
    # forward's 4 gates joined in S = 4, its cap with the slices added by halves). First
    # with the backward's gates apart (TRITONRNN_BWD_PAIRED_GATES=off), then paired.
    monkeypatch.setattr(gt, "_BWD_PAIRED_GATES", False)
    # LSTM H=1024, 16x16 tiles: R slice 2*4*16*1024 + max(the forward's stage of both 512
    # chunks 2*16*1024, scratch 4*4*4*16*16); the backward stages 2*16*512.
    assert gt.grid_onchip_bytes("lstm", 1024, 1024, 0, torch.bfloat16, 16, 16) == 163840
    # 16 x 32 tiles: the stage doubles (2*32*1024).
    assert gt.grid_onchip_bytes("lstm", 1024, 1024, 0, torch.bfloat16, 16, 32) == 196608
    # GRU, per-gate forward dots (the default): 3 gates' rows 2*3*16*1024 +
    # stage 2*32*1024, as compiled.
    assert gt.grid_onchip_bytes("gru", 1024, 1024, 0, torch.bfloat16, 16, 32) == 163840
    # Projection P=256: backward R columns 2*4*16*1024 + Pw columns 2*16*256 + stage 2*16*512
    # (the forward's R rows 2*4*16*256 + Pw rows 2*16*1024 + Pw's stage 2*16*512: less).
    assert gt.grid_onchip_bytes("lstm", 1024, 256, 256, torch.bfloat16, 16, 16) == 155648
    # GRU H=512 (16 x 16 tiles), the planner's 4 forward warps: either pass 2*3*16*512 +
    # 2*16*512. With 8 (the default here) the forward's 8 slices' scratch 4*8*4*16*16
    # outweighs its stage: 2*3*16*512 + 32768 (the sm_90 compile holds these weights in
    # registers, `_hoist_weights`, and takes 49152: an over-estimate, safe).
    assert gt.grid_onchip_bytes("gru", 512, 512, 0, torch.bfloat16, 16, 16,
                                fwd_warps=4) == 65536
    assert gt.grid_onchip_bytes("gru", 512, 512, 0, torch.bfloat16, 16, 16) == 81920
    # The split reduction: LSTM H=768 holds 512 + 256 columns (a 1024 tile would be 2*4*16*1024),
    # staged together in the forward (2*16*768; the backward's 98304 + 2*16*512 is less); GRU
    # H=1536 1024 + 512: 2*3*16*1536 + 2*16*1536 (196608 as compiled; the backward 180224).
    # That is with the planner's 4 forward warps; with 8 (the default here, `w8`) the
    # forward's 8 slices' scratch 4*8*4*16*16 is the larger: 131072, as compiled.
    assert gt.grid_onchip_bytes("lstm", 768, 768, 0, torch.bfloat16, 16, 16,
                                fwd_warps=4) == 98304 + 24576
    assert gt.grid_onchip_bytes("lstm", 768, 768, 0, torch.bfloat16, 16, 16) == 98304 + 32768
    assert gt.grid_onchip_bytes("gru", 1536, 1536, 0, torch.bfloat16, 16, 16) == 196608
    # Paired (the default), 16-wide tiles: the backward stages two gates' operands at once,
    # 2*16*2*K, past the forward's stage (as compiled at the anchor, tests/test_aot.py).
    monkeypatch.setattr(gt, "_BWD_PAIRED_GATES", True)
    for cell, H, P, paired in (("lstm", 1024, 0, 2 * 4 * 16 * 1024 + 2 * 16 * 2 * 1024),
                               ("lstm", 768, 0, 98304 + 2 * 16 * 2 * 768),
                               ("gru", 1536, 0, 2 * 3 * 16 * 1536 + 2 * 16 * 2 * 1536),
                               ("lstm", 1024, 256, 155648 - 2 * 16 * 512 + 2 * 16 * 2 * 1024)):
        assert gt.grid_onchip_bytes(cell, H, P or H, P, torch.bfloat16, 16,
                                    16) == paired, (cell, H, P)
    assert gt.grid_onchip_bytes("lstm", 1024, 1024, 0, torch.bfloat16, 16, 32) == 196608
    monkeypatch.setattr(gt, "_BWD_PAIRED_GATES", False)
    # 16 x 32 tiles, 8 warps: the forward's scratch [8, 4*16, 32] fp32 (its 4 joined gates in
    # 8 slices, one per warp) is the largest, 98304 as compiled (Triton 3.6); the backward's
    # [8, 16, 32] is as large as the staged operand (2*32*256). With 4 forward warps (the
    # planner's) its 4 MMA tiles cover the warps: no split, the backward's 49152, as
    # compiled.
    assert gt.grid_onchip_bytes("lstm", 256, 256, 0, torch.bfloat16, 16, 32) == 2 * 4 * 16 * 256 + (
        4 * 8 * 4 * 16 * 32) == 98304
    assert gt.grid_onchip_bytes("lstm", 256, 256, 0, torch.bfloat16, 16, 32,
                                fwd_warps=4) == 49152
    # 2 warps: the 4 MMA tiles of a 16 x 32 output keep them busy, a plain dot, no scratch.
    assert gt.grid_onchip_bytes("lstm", 256, 256, 0, torch.bfloat16, 16, 32, num_warps=2) == (
        2 * 4 * 16 * 256 + 2 * 32 * 256)
    # fp32: the exchange is staged in fp32.
    assert gt.grid_onchip_bytes("lstm", 1024, 1024, 0, torch.float32, 16, 16) == (
        4 * 4 * 16 * 1024 + 4 * 16 * 1024)
    # Streamed weights: one chunk's tiles, 3 pipeline buffers, independent of H; the forward's
    # joint gate tile (4 * block_h rows, GRU padded) is the widest (as compiled, Triton 3.6).
    assert gt.grid_onchip_bytes("gru", 1536, 1536, 0, torch.bfloat16, 16, 16, 64) == 3 * 64 * 2 * (
        4 * 16 + 16) == 30720
    assert gt.grid_onchip_bytes("lstm", 8192, 8192, 0, torch.bfloat16, 16, 16, 64) == 30720
    assert gt.grid_onchip_bytes("lstm", 768, 768, 0, torch.bfloat16, 32, 64, 64) == 3 * 64 * 2 * (
        4 * 32 + 64) == 73728
    assert gt.grid_onchip_bytes("lstm", 768, 768, 0, torch.bfloat16, 32, 64, 128) == 147456
    # One gate: rows = block_h in both directions.
    assert gt.grid_onchip_bytes("rnn_tanh", 2048, 2048, 0, torch.bfloat16, 64, 64, 64) == (
        3 * 64 * 2 * (64 + 64))


# -------------------------------------------------------------------------------------------
# GPU only: half precision, the barrier under load, its timeout path, grid refusal
# -------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("cell,P", [("lstm", 0), ("lstm", 48), ("gru", 0)])
def test_gpu_split_persistent_launches(monkeypatch, cell, P):
    """A persistent run split into launches where the barrier counter would overflow
    (`_launch_ranges`; forced with a small limit: launches of 9 sub-steps at 48 programs, bf16,
    T = 120): each launch's barrier counts from a zeroed counter (a stale count would let the
    waits pass early), and every output is bit-identical to the one-launch run."""
    from tritonrnn.kernels.grid_barrier import check_barriers

    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 121, (40,), generator=g).tolist()
    lengths[0] = 120
    runs = []
    for limit in (2**31 - 1, 480):
        monkeypatch.setattr(pg, "_COUNTER_LIMIT", limit)
        f_ins, f_outs = _forward_problem(cell, 256, P, lengths, 120, dtype=torch.bfloat16)
        _run_forward(f_ins, f_outs, False, persistent=True, block_h=16)
        b_ins, b_outs = _backward_problem(cell, 256, P, lengths, 120, dtype=torch.bfloat16)
        _run_backward(b_ins, b_outs, False, persistent=True, block_h=16)
        check_barriers()
        runs.append({**{"f." + k: v for k, v in f_outs.items() if v is not None},
                     **{"b." + k: v for k, v in b_outs.items() if v is not None}})
    for k, v in runs[0].items():
        assert torch.equal(runs[1][k], v), k
    _check_forward(f_ins, f_outs, False, torch.bfloat16)
    _check_backward(b_ins, b_outs, False, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_relu"])
def test_gpu_hoisted_weights(monkeypatch, cell, warps):
    """bf16 with the weights held in registers (TRITONRNN_HOIST_WEIGHTS), 16 x 16 tiles, each
    launch recorded holding its whole slice (HOIST applies to persistent launches without a
    projection only: `hoist_tiles`)."""
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", "fwd,bwd")
    held, real = [], gt.hoist_pass

    def recorded(pass_name, *args, **kwargs):
        held.append((pass_name, real(pass_name, *args, **kwargs)))
        return held[-1][1]

    monkeypatch.setattr(gt, "hoist_pass", recorded)
    lengths, T = [9] * 16 + [7, 0, 5, 2], 9
    _check_layer(cell, 96, 0, lengths, T, reverse=True, dtype=torch.bfloat16,
                 persistent=True, block_h=16, num_warps=warps)
    assert held == [("fwd", gt.Hoist.ALL), ("bwd", gt.Hoist.ALL)]


@pytest.mark.gpu
@pytest.mark.parametrize("H, block_h", [(1536, 16), (768, 32)])
def test_gpu_first_chunk_hoisted(monkeypatch, H, block_h):
    """bf16 GRU on 8 warps where HOIST holds only the first resident chunk in registers
    (`gt.Hoist.FIRST`, the default rule): H=1536 on 16 x 16 tiles (1024 of 1536 columns),
    H=768 on 32 x 16 (512 of 768). H=768's second batch tile, whose rows finish early, skips
    only the second chunk's products; H=1536 has one batch tile (two would be 192 programs,
    more than an H100's or H200's SMs)."""
    monkeypatch.delenv("TRITONRNN_HOIST_WEIGHTS", raising=False)
    for p in ("fwd", "bwd"):
        assert gt.hoist_pass(p, "gru", H, H, 0, torch.bfloat16, block_h, 16, 0, 8,
                             True) == gt.Hoist.FIRST, p
    lengths, T = ([9] * 12 + [7, 0, 5, 2]) if H == 1536 else ([9] * 16 + [7, 0, 5, 2]), 9
    programs = gt.grid_programs(H, H, 0, len(lengths), block_h, 16)
    assert programs <= torch.cuda.get_device_properties(DEV).multi_processor_count, programs
    _check_layer("gru", H, 0, lengths, T, reverse=True, dtype=torch.bfloat16, persistent=True,
                 block_h=block_h, num_warps=8)


def test_direct_backward_pairs_gates_within_the_device_memory():
    """A grid_backward called without a plan (pair_gates None) pairs its gates only where the
    paired footprint fits the device's budget (`launch_pairs_gates`): GRU H=1536 B=16's
    paired backward needs 245760 B, more than an H100's or H200's 227 KiB opt-in less the
    slack, so it keeps the gates apart there; the interpreter (no limit) pairs; a plan's
    answer stands where pairing applies at all."""
    bf16, optin = torch.bfloat16, 232448  # H100 / H200 shared memory per block (opt-in)
    budget = gt.grid_smem_budget(optin)
    assert budget == optin - gt.SMEM_SLACK == 225280

    def pairs(ask, cell, H, smem, block_k=0, block_b=16, warps=4):
        return gt.launch_pairs_gates(ask, cell, H, H, 0, bf16, 16, block_b, block_k, warps,
                                     smem)

    assert gt._grid_bwd_bytes("gru", 1536, 1536, 0, bf16, 16, 16, 4, True) > budget
    assert not pairs(None, "gru", 1536, optin) and pairs(None, "gru", 1536, None)
    assert pairs(None, "lstm", 768, optin) and pairs(True, "gru", 1536, optin)
    assert not pairs(False, "lstm", 768, optin) and not pairs(False, "lstm", 768, None)
    assert not pairs(True, "lstm", 768, optin, block_k=64)  # streamed: never paired
    assert not pairs(None, "lstm", 768, None, block_b=32)  # 16 x 32: opt-in only


@pytest.mark.gpu
def test_gpu_direct_backward_fits_where_paired_gates_do_not():
    """GRU H=1536 on 16 x 16 tiles launched directly (no plan): the gates stay apart and the
    launch fits (paired it asked for 245760 B of shared memory and failed to launch)."""
    lengths, T = [3] * 16, 3
    _check_layer("gru", 1536, 0, lengths, T, reverse=False, dtype=torch.bfloat16,
                 persistent=True, block_h=16)


@pytest.mark.gpu
@pytest.mark.parametrize("paired, block_b", [(True, 16), (False, 16), (True, 32)],
                         ids=["paired", "apart", "paired-wide"])
@pytest.mark.parametrize("H", [40, 640])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_gpu_backward_gates_loaded_ahead(monkeypatch, cell, H, paired, block_b):
    """bf16 on 16 x 16 tiles with the backward's gate operands loaded ahead (PAIRG, the
    default) and apart, and on 16 x 32 tiles paired (`_BWD_PAIRED_GATES_WIDE`, opt-in): two
    resident chunks per gate (H = 40: 32 + 16, H = 640: 512 + 128), two batch tiles (the
    second partial), varlen."""
    monkeypatch.setattr(gt, "_BWD_PAIRED_GATES", paired)
    monkeypatch.setattr(gt, "_BWD_PAIRED_GATES_WIDE", block_b == 32)
    assert gt._paired_gates(0, block_b) is paired
    lengths, T = [9] * (block_b + 3) + [7, 0, 5, 2], 9
    _check_layer(cell, H, 0, lengths, T, reverse=True, dtype=torch.bfloat16, persistent=True,
                 block_h=16, block_b=block_b)


@pytest.mark.gpu
@PERSIST
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("cell,P", [("lstm", 0), ("lstm", 48), ("gru", 0), ("rnn_tanh", 0),
                                    ("rnn_relu", 0)])
def test_gpu_half_precision(cell, P, dtype, persistent):
    lengths, T = [7, 0, 5, 7, 2, 6], 7
    _check_layer(cell, 96, P, lengths, T, reverse=True, dtype=dtype, persistent=persistent,
                 block_h=32)


@pytest.mark.gpu
@PERSIST
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("block_b", [1, 2, 4])
@pytest.mark.parametrize("cell,P", [("lstm", 0), ("lstm", 48), ("gru", 0), ("rnn_tanh", 0)])
def test_gpu_vector_tiles_half_precision(cell, P, block_b, dtype, persistent):
    # Vector tiles on hardware: weights in registers, FMA products, transposed backward
    # weights; H = 96 in 12 slices of 8, 6 rows with varlen.
    lengths, T = [7, 0, 5, 7, 2, 6], 7
    _check_layer(cell, 96, P, lengths, T, reverse=True, dtype=dtype, persistent=persistent,
                 block_h=8, block_b=block_b, num_warps=8)


@pytest.mark.gpu
@PERSIST
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("cell,P", [("lstm", 0), ("lstm", 48), ("gru", 0), ("rnn_relu", 0)])
def test_gpu_streamed_wgmma_loops(cell, P, dtype, persistent):
    # The large-batch loops as the GPU compiles them (wgmma, transposed, joint gates), at the
    # planner's large-batch tiles and warps: 64-wide batch tiles, chunks of 64 over H = 96
    # (one full chunk and a ragged one).
    _check_layer(cell, 96, P, *_swap_lengths(), reverse=True, dtype=dtype,
                 persistent=persistent, block_h=32, block_b=64, block_k=64, num_warps=8)


@pytest.mark.gpu
@pytest.mark.parametrize("cell,P,H,block_h,block_b,num_stages", [
    ("lstm", 0, 640, 32, 64, 8),  # 10 forward chunks, 40 backward ones, 7 in flight
    ("gru", 0, 96, 16, 16, 8),  # fewer chunks (2 / 5) than stages
    ("rnn_tanh", 0, 640, 16, 32, 8),  # the unswapped loops
    ("lstm", 48, 96, 32, 64, 5),  # with the projection's loops
])
def test_gpu_streamed_loops_on_deep_stages(cell, P, H, block_h, block_b, num_stages):
    # The streamed loops pipelined deeper than Triton's default 3 (the launches' num_stages,
    # `planner._stream_stages`) as the GPU compiles them, with the grid barrier: the
    # interpreter runs no software pipeline, so only a GPU checks these.
    _check_layer(cell, H, P, *_swap_lengths(), reverse=True, dtype=torch.bfloat16,
                 persistent=True, block_h=block_h, block_b=block_b, block_k=64, num_warps=8,
                 num_stages=num_stages)


@pytest.mark.gpu
@pytest.mark.parametrize("cell,H,units,kblock,btile,dtype,one", [
    ("lstm", 128, 64, 128, 16, torch.bfloat16, False),  # four accumulators (`split`)
    ("lstm", 128, 64, 128, 16, torch.float32, False),  # the FMA dots
    ("gru", 128, 64, 128, 64, torch.bfloat16, False),  # two; a unit block's program w/o cells
    ("rnn_tanh", 256, 64, 64, 32, torch.float32, False),
    ("lstm", 256, 128, 512, 128, torch.bfloat16, False),  # one: the B = 256 config's tiles
    ("lstm", 256, 256, 128, 16, torch.bfloat16, True),  # one barrier: the B = 16 rule's tiles
    ("lstm", 256, 128, 256, 16, torch.bfloat16, True),  # and its wider cell tiles
    ("gru", 128, 32, 96, 32, torch.float32, True),  # one barrier, units narrower than a block
], ids=["lstm-bf16", "lstm-fp32", "gru-bf16", "tanh-fp32", "lstm-128x128-bf16",
        "one-barrier-lstm-bf16", "one-barrier-lstm-wide-cells-bf16", "one-barrier-gru-fp32"])
def test_gpu_split_k_backward(cell, H, units, kblock, btile, dtype, one):
    # kernels/split_k.py's persistent launch (two grid barriers a step, or one, wgmma /
    # mma.sync with the R block resident), which the interpreter runs as one launch per phase
    # of a step.
    from tritonrnn.kernels.split_k import split_k_backward

    ins, outs = _backward_problem(cell, H, 0, *_swap_lengths(), dtype=dtype)
    split_k_backward(ins["cell"], *(ins[k] for k in _BWD_IN if k != "Pw"), ins["info"], True,
                     *(outs[k] for k in _BWD_OUT[:4]), units=units, kblock=kblock,
                     btile=btile, one_barrier=one)
    _check_backward(ins, outs, True, dtype)


@pytest.mark.gpu
def test_gpu_split_k_reports_an_earlier_failed_launch_first(monkeypatch):
    # A persistent split-K launch first reports a failed launch that the deferred checks
    # already know of (stand-in: a finished event with its error flag set), as the grid's do.
    from collections import deque

    from tritonrnn.kernels import grid_barrier as gb
    from tritonrnn.kernels.split_k import split_k_backward

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "deferred")
    done = torch.cuda.Event()
    done.record()
    monkeypatch.setattr(gb, "_pending", deque([
        (done, torch.ones(1, dtype=torch.int32), "an earlier stand-in")]))
    ins, outs = _backward_problem("lstm", 128, 0, *_swap_lengths(), dtype=torch.float32)
    with pytest.raises(gb.BarrierTimeoutError, match="an earlier launch of an earlier stand-in"):
        split_k_backward(ins["cell"], *(ins[k] for k in _BWD_IN if k != "Pw"), ins["info"],
                         True, *(outs[k] for k in _BWD_OUT[:4]), units=64, kblock=128,
                         btile=16, one_barrier=False)
    assert not gb._pending


@pytest.mark.gpu
@pytest.mark.parametrize("cell,kblock", [("lstm", 64), ("gru", 48)])
def test_gpu_one_barrier_split_k_writes_over_the_preacts(cell, kblock):
    # The one-barrier form with its gradients written over the pre-activations (as the
    # backend runs it): every program of a K block reads that block's pre-activations, each
    # stores its share of a step's gradients one iteration late. H = 128 in 32-unit blocks
    # and 16-unit K blocks (4 programs per K block), 3 batch tiles: 96 programs, T = 400. The
    # gradients must match the reference and be bit-identical to those written into buffers
    # of their own, run after run.
    _one_barrier_over(cell, kblock, 400, runs=3, dtype=torch.bfloat16)


def _one_barrier_over(cell: str, kblock: int, T: int, runs: int, dtype: torch.dtype) -> None:
    from tritonrnn.kernels.split_k import split_k_backward

    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(1, T + 1, (48,), generator=g).tolist()
    lengths[0] = T
    ins, outs = _backward_problem(cell, 128, 0, lengths, T, dtype=dtype)
    args = [ins["cell"], *(ins[k] for k in _BWD_IN if k != "Pw"), ins["info"], True]
    split_k_backward(*args, *(outs[k] for k in _BWD_OUT[:4]), units=32, kblock=kblock,
                     btile=16, one_barrier=True)
    _check_backward(ins, outs, True, dtype)
    for _ in range(runs):
        pre_x, pre_h = ins["pre_x"].clone(), ins["pre_h"].clone()
        over = {k: torch.full_like(outs[k], float("nan")) if outs[k] is not None else None
                for k in ("dh0", "dc0")}
        args[1:3] = pre_x, pre_h
        split_k_backward(*args, pre_x, pre_h if cell == "gru" else None, over["dh0"],
                         over["dc0"], units=32, kblock=kblock, btile=16, one_barrier=True)
        assert torch.equal(pre_x, outs["dpre_x"])
        if cell == "gru":
            assert torch.equal(pre_h, outs["dpre_h"])
        for k, v in over.items():
            if v is not None:
                assert torch.equal(v, outs[k]), k


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("cell,P", [("lstm", 0), ("gru", 0), ("rnn_tanh", 0), ("lstm", 48)])
def test_gpu_stepwise_64_tiles(cell, P, dtype):
    # The stepwise family's own tiles past the grid (`planner._stepwise_fit`) as the GPU
    # compiles them: 64 x 64, streamed in chunks of 64, 8 warps, one launch per step.
    _check_layer(cell, 96, P, *_swap_lengths(), reverse=True, dtype=dtype, persistent=False,
                 block_h=64, block_b=64, block_k=64, num_warps=8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("cell,P", [("lstm", 0), ("gru", 0), ("rnn_tanh", 0), ("lstm", 48)])
@pytest.mark.parametrize("block_h,block_b", [(64, 128), (128, 64)], ids=["64x128", "128x64"])
def test_gpu_8192_element_tiles(cell, P, dtype, block_h, block_b):
    # The B = 1024 plans' 64 x 128 tiles (and the 128 x 64 ones they replaced), streamed in
    # chunks of 64 on 8 warps, as the GPU compiles them, with the grid barrier; the gated
    # cells' backward loads each sub-step's inputs after its product (`_late_loads`).
    # H = 160: full and ragged hidden slices; `_wide_lengths`: a full and a partial 128-wide
    # batch tile.
    assert gt._late_loads(cell, block_h, block_b) == (cell != "rnn_tanh")
    _check_layer(cell, 160, P, *_wide_lengths(), reverse=True, dtype=dtype, persistent=True,
                 block_h=block_h, block_b=block_b, block_k=64, num_warps=8)


@pytest.mark.gpu
@pytest.mark.parametrize("num_warps", [4, 8])
def test_gpu_bare_barrier_counts_every_arrival(num_warps):
    from tritonrnn.kernels.grid_barrier import run_bare_barriers

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    for programs in (1, 7, sms):
        sync = run_bare_barriers(2000, programs, DEV, num_warps=num_warps)
        assert sync.tolist() == [2000 * programs, 0], programs


@pytest.mark.gpu
@pytest.mark.parametrize("P", [0, 64], ids=["noproj", "proj"])
def test_gpu_barrier_stress(P):
    # 16 hidden slices x 3 batch tiles = 48 programs meeting at 300-600 barriers per launch;
    # repeated runs must be bit-identical and agree with the per-step launches. The fp32
    # tolerance holds over T = 300 because the recurrence (R scaled by 1.5 / sqrt(Hout)) is
    # contractive: rounding errors do not accumulate linearly with T.
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, 301, (40,), generator=g).tolist()
    lengths[0] = 300
    ins, outs = _forward_problem("lstm", 256, P, lengths, 300)
    runs = []
    for _ in range(3):  # (each run on NaN-filled outputs: one that wrote nothing cannot match)
        _poison(outs)
        _run_forward(ins, outs, False, persistent=True, block_h=16)
        runs.append({k: v.clone() for k, v in outs.items()})
    for r in runs[1:]:
        for k in r:
            assert torch.equal(r[k], runs[0][k]), k
    _check_forward(ins, outs, False)
    _poison(outs)
    _run_forward(ins, outs, False, persistent=False, block_h=16)
    for k in outs:
        torch.testing.assert_close(outs[k], runs[0][k], rtol=1e-5, atol=1e-6)

    bins, bouts = _backward_problem("lstm", 256, P, lengths, 300)
    bruns = []
    for _ in range(3):
        _poison(bouts)
        _run_backward(bins, bouts, False, persistent=True, block_h=16)
        bruns.append({k: v.clone() for k, v in bouts.items() if v is not None})
    for r in bruns[1:]:
        for k in r:
            assert torch.equal(r[k], bruns[0][k]), k
    _check_backward(bins, bouts, False)


@pytest.mark.gpu
def test_gpu_barrier_timeout_raises_instead_of_hanging(monkeypatch):
    # Test hook: every barrier waits for one arrival more than the grid provides, so each
    # program times out after _max_spin polls and sets the error flag. "sync": the launch
    # itself reads the flag and raises.
    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "sync")
    ins, outs = _forward_problem("lstm", 64, 0, [6, 3], 6)
    with pytest.raises(RuntimeError, match="grid barrier .*timed out"):
        _run_forward(ins, outs, False, persistent=True, block_h=16, _max_spin=2000,
                     _barrier_extra=1)
    bins, bouts = _backward_problem("lstm", 64, 0, [6, 3], 6)
    with pytest.raises(RuntimeError, match="grid barrier .*timed out"):
        _run_backward(bins, bouts, False, persistent=True, block_h=16, _max_spin=2000,
                      _barrier_extra=1)
    # The device is still usable and a normal launch is correct.
    ins, outs = _forward_problem("lstm", 64, 0, [6, 3], 6)
    _run_forward(ins, outs, False, persistent=True, block_h=16)
    _check_forward(ins, outs, False)


@pytest.mark.gpu
def test_gpu_persistent_launches_in_a_cuda_graph(monkeypatch):
    """Persistent forward and backward launches captured into one CUDA graph (after a warm-up
    on the capturing stream's side, as torch asks): replays on new inputs give the eager
    results bit for bit; a replay whose barrier times out is reported by check_barriers()."""
    from collections import deque

    from tritonrnn.kernels import grid_barrier as gb
    from tritonrnn.kernels.grid_barrier import BarrierTimeoutError, check_barriers

    monkeypatch.setattr(gb, "_captured", deque(maxlen=gb._CAPTURED_KEPT))  # this test's only
    lengths, T = [40, 33, 0, 12, 40], 40
    f_ins, f_outs = _forward_problem("lstm", 96, 0, lengths, T, dtype=torch.bfloat16)
    b_ins, b_outs = _backward_problem("lstm", 96, 0, lengths, T, dtype=torch.bfloat16)

    def run(**kw):
        _run_forward(f_ins, f_outs, False, persistent=True, block_h=16, **kw)
        _run_backward(b_ins, b_outs, False, persistent=True, block_h=16, **kw)

    def snapshot():
        return {**{"f." + k: v.clone() for k, v in f_outs.items() if v is not None},
                **{"b." + k: v.clone() for k, v in b_outs.items() if v is not None}}

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # compiles and warms up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    check_barriers()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    g = torch.Generator().manual_seed(5)
    for _ in range(2):
        for ins in (f_ins, b_ins):
            for k in ("xg", "h0", "pre_x", "pre_h", "dy"):
                if torch.is_tensor(ins.get(k)):
                    ins[k].copy_(torch.randn(ins[k].shape, generator=g).to(ins[k].dtype))
        _poison(f_outs)  # (in place: the graph's pointers stay; a replay or a run that
        _poison(b_outs)  # wrote nothing cannot match)
        graph.replay()
        torch.cuda.synchronize()
        check_barriers()
        replayed = snapshot()
        _poison(f_outs)
        _poison(b_outs)
        run()
        check_barriers()
        for k, v in snapshot().items():
            assert torch.equal(replayed[k], v), k
    _check_forward(f_ins, f_outs, False, torch.bfloat16)
    _check_backward(b_ins, b_outs, False, torch.bfloat16)
    failing = torch.cuda.CUDAGraph()
    with torch.cuda.graph(failing):
        _run_forward(f_ins, f_outs, False, persistent=True, block_h=16, _max_spin=2000,
                     _barrier_extra=1)
    failing.replay()
    with pytest.raises(BarrierTimeoutError, match="a CUDA-graph replay of grid_forward"):
        check_barriers()


@pytest.mark.gpu
def test_gpu_deferred_barrier_check_reports_the_failed_launch(monkeypatch):
    # Default mode: no host sync at the launch; the failure is reported by the explicit check
    # point, and by the next launch once the failed one has finished.
    from tritonrnn.kernels.grid_barrier import BarrierTimeoutError, check_barriers

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "deferred")
    check_barriers()  # nothing pending from earlier tests
    ins, outs = _forward_problem("lstm", 64, 0, [6, 3], 6)
    _run_forward(ins, outs, False, persistent=True, block_h=16, _max_spin=2000,
                 _barrier_extra=1)
    with pytest.raises(BarrierTimeoutError, match="earlier launch of grid_forward"):
        check_barriers()
    check_barriers()  # reported once
    _run_forward(ins, outs, False, persistent=True, block_h=16, _max_spin=2000,
                 _barrier_extra=1)
    torch.cuda.synchronize()
    # The next launch reports the earlier failure before it launches anything...
    with pytest.raises(BarrierTimeoutError, match="grid barrier .*timed out"):
        _run_forward(ins, outs, False, persistent=True, block_h=16)
    # ...and a retry runs: the good launch is fine.
    _run_forward(ins, outs, False, persistent=True, block_h=16)
    check_barriers()
    _check_forward(ins, outs, False)


def test_bare_barrier_counts_are_validated():
    from tritonrnn.kernels.grid_barrier import run_bare_barriers

    for n, programs in ((2**24, 132), (-1, 4), (10, 0)):
        with pytest.raises(ValueError, match=rf"programs={programs}, n_barriers={n}"):
            run_bare_barriers(n, programs, DEV)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        run_bare_barriers(16268815, 132, torch.device("cpu"))


@pytest.mark.parametrize("mode", ["deferred", "sync"])
def test_captured_launch_flags_are_checked_after_replays(monkeypatch, mode):
    # During a CUDA-graph capture the checks must not query events, allocate pinned memory or
    # sync (each would invalidate the capture): the launch's device flags are kept, and
    # check_barriers() reads them after the replays (each replay rewrites them). Simulated:
    # capture state patched, flags on the CPU standing in for the graph's device flags.
    from collections import deque

    from tritonrnn.kernels import grid_barrier as gb

    class _NoQuery:
        def query(self):
            raise AssertionError("an event was queried during the capture")

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", mode)
    monkeypatch.setattr(gb, "_captured", deque(maxlen=gb._CAPTURED_KEPT))
    monkeypatch.setattr(gb, "_pending", deque([(_NoQuery(), torch.zeros(1), "earlier")]))
    monkeypatch.setattr(gb, "capturing", lambda device=None: True)
    sync = torch.zeros(2, 2, dtype=torch.int32)
    gb.poll_earlier_launches()  # the persistent launchers' first call: no query
    gb.check_flags(sync, "grid_forward")  # no raise, no copy: kept
    with pytest.raises(RuntimeError, match="check_barriers: called during a CUDA-graph"):
        gb.check_barriers()
    monkeypatch.setattr(gb, "_pending", deque())
    monkeypatch.setattr(gb, "capturing", lambda device=None: False)
    gb.check_barriers()  # the replays so far succeeded
    sync[1, 1] = 1  # a replay whose barrier (direction 1) timed out
    with pytest.raises(gb.BarrierTimeoutError, match="a CUDA-graph replay of grid_forward"):
        gb.check_barriers()
    sync[1, 1] = 0  # the next replay succeeded and rewrote the flags
    gb.check_barriers()


def test_polling_asks_the_launchs_device_whether_it_captures(monkeypatch):
    """The launchers poll with their tensors' device: a capture on that device (not the
    current one) is what an event query would invalidate."""
    from collections import deque

    from tritonrnn.kernels import grid_barrier as gb

    asked = []
    monkeypatch.setattr(gb, "_pending", deque())
    monkeypatch.setattr(gb, "capturing", lambda device=None: asked.append(device) or False)
    gb.poll_earlier_launches(torch.device("cuda", 1))
    gb.poll_earlier_launches()
    assert asked == [torch.device("cuda", 1), None]


def test_two_threads_polling_report_a_failed_launch_once(monkeypatch):
    """The deferred checks' queue is shared by the launching threads (one per device under
    DataParallel). A thread waiting on the oldest launch's event (the GIL released) while
    another takes that launch off the queue must not then take the next one unchecked: the
    failed launch is reported exactly once. Events are stand-ins with fixed completion times
    (A at 0.3 s, B, which failed, at 0.6 s; a waiter returns 0.1 s after completion)."""
    import threading
    import time
    from collections import deque

    from tritonrnn.kernels import grid_barrier as gb

    class Event:
        def __init__(self, done_at):
            self.done_at = done_at

        def query(self):
            return time.monotonic() >= self.done_at

        def synchronize(self):
            while time.monotonic() < self.done_at:
                time.sleep(0.01)
            time.sleep(0.1)

    t0 = time.monotonic()
    monkeypatch.setattr(gb, "_pending", deque([
        (Event(t0 + 0.3), torch.zeros(1, dtype=torch.int32), "launch A"),
        (Event(t0 + 0.6), torch.ones(1, dtype=torch.int32), "launch B")]))
    reports = []

    def check(fn):
        try:
            fn()
        except gb.BarrierTimeoutError as e:
            reports.append(str(e))

    waiter = threading.Thread(target=check, args=(gb.check_barriers,))
    waiter.start()
    time.sleep(0.35)  # A done, B not: another thread's next launch polls
    check(gb.poll_earlier_launches)
    waiter.join()
    assert len(reports) == 1 and "launch B" in reports[0], reports
    assert not gb._pending


def test_barrier_check_mode_is_validated(monkeypatch):
    from tritonrnn.kernels.grid_barrier import barrier_check_mode

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "never")
    with pytest.raises(ValueError, match=r"TRITONRNN_BARRIER_CHECK: expected .*'sync'.*'never'"):
        barrier_check_mode()
    monkeypatch.delenv("TRITONRNN_BARRIER_CHECK")
    assert barrier_check_mode() == "deferred"


def test_cooperative_launch_option_matches_the_installed_triton():
    from triton.backends.nvidia.compiler import CUDAOptions

    from tritonrnn.kernels.grid_barrier import cooperative_launch_options

    has = "launch_cooperative_grid" in CUDAOptions.__dataclass_fields__
    assert cooperative_launch_options() == ({"launch_cooperative_grid": True} if has else {})


@pytest.mark.gpu
def test_gpu_refuses_grid_larger_than_sm_count():
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    ins, outs = _forward_problem("rnn_tanh", 16, 0, [2] * (16 * (sms + 1)), 2)
    with pytest.raises(ValueError, match=f"{sms + 1} programs.*{sms} SMs"):
        _run_forward(ins, outs, False, persistent=True, block_h=16)
    _run_forward(ins, outs, False, persistent=False, block_h=16)  # stepwise has no limit
    _check_forward(ins, outs, False)


def test_launch_workspaces_are_poisoned_under_the_tests(monkeypatch):
    """The launchers' own workspaces (exchange slots, carries, stand-ins for strided outputs:
    `kernels.buffers.scratch`) start as NaN under TRITONRNN_POISON=1, as the engine's do: a
    slot read before any launch wrote it, or a masked operand multiplied rather than
    selected, fails the comparison. Every launch of a forward and a backward takes them."""
    from tritonrnn.kernels import buffers

    made = []
    real = buffers.scratch

    def spy(*shape, **kw):
        t = real(*shape, **kw)
        made.append(bool(t.isnan().all()) if t.is_floating_point() else None)
        return t

    monkeypatch.setattr(pg, "scratch", spy)
    assert real(2, 3, dtype=torch.float32, device=DEV).isnan().all()
    assert real((2,), dtype=torch.int32, device=DEV).dtype == torch.int32
    ins, outs = _forward_problem("lstm", 33, 0, *VARLEN)
    outs["y"] = _nan(outs["y"].shape[1], outs["y"].shape[0]).t()  # a stand-in's path too
    _run_forward(ins, outs, False, persistent=False, block_h=16)
    _check_forward(ins, outs, False)
    assert len(made) >= 4 and all(made), made  # (h, x, c and the stand-in of y)
