"""Bidirectional layers: both directions in one kernel launch (programs split between them).

Kernel level: the pair launchers (`cta_*_pair`, `grid_*_pair`) on pairs laid out as the engine
lays them out (workspace halves, adjacent state slices, column halves of the layer output,
weights at a non-adjacent offset in one flat buffer) must give exactly the per-direction
launchers' results, bit for bit (same arithmetic in the same order; only the addressing and
the time reversal move from constexprs to the program's direction), and the float64 reference
within fp32 rounding. Every launch is counted: a pair is one launch with a direction axis of
2 (persistent families), or one per sub-step for both directions (stepwise, and persistent
under the interpreter when a direction has several programs, since a grid barrier cannot run
there).

End to end: cudnn_rnn(backend="triton") with each family forced, bidirectional, two layers,
varlen with length-0 rows, against torch.nn in float64 (tests/helpers.compare_with_torch),
with every launch counted; bit for bit against the engine's pair path with each pair split
into two per-direction launches, and within GEMM rounding (PER_DIRECTION_TOL) of the engine's
per-direction path (one backend call per direction).

Tolerances. fp32 kernels vs float64 on the same fp32 inputs: unit roundoff u = 6e-8; an
output depends on dot products of K <= 4*33 terms over T <= 6 steps, a worst-case linear
bound T*K*u ~ 5e-5 relative to O(1) operands, hence rtol 1e-4, atol 1e-5 (as in
tests/test_kernels_grid.py). End to end (two layers, GEMMs in fp32): 2e-5, the bound the
existing end-to-end tests (tests/test_triton_backend.py) use for the same shapes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest
import torch
import triton
from helpers import compare_with_torch, make_case, params_from_module, stepwise_runs

from tritonrnn.kernels import cells
from tritonrnn.kernels import grid_tiles as gt
from tritonrnn.kernels import persistent_cta as pc
from tritonrnn.kernels import persistent_grid as pg
from tritonrnn.rnn import cudnn_rnn, engine, reference
from tritonrnn.rnn import triton_backend as tb
from tritonrnn.rnn.config import make_config
from tritonrnn.rnn.packing import make_pack_info
from tritonrnn.rnn.params import config_params_size
from tritonrnn.rnn.planner import PRESETS, plan_constraints

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEV.type == "cuda"
NAN = float("nan")
KERNEL_TOL = dict(rtol=1e-5, atol=1e-5)
E2E = dict(dtype=torch.float32, rtol=2e-5, atol=2e-5)
# The engine's pair and per-direction paths run the same kernels on the same values, but the
# second direction's workspace half sits at another address, and CPU BLAS (like cuBLAS) picks
# alignment-dependent GEMM kernels: the input-projection and weight-gradient GEMMs may differ
# in the last bit (measured: addmm [9, 5] x [5, 68] differs by 1 ulp at |x| ~ 8), and the second
# layer carries that on. A GEMM of K <= 4*17 terms reorders at most K roundings (K*u ~ 4e-6
# relative to the operands), hence 1e-5; a wrong half or offset shows up as O(0.1).
PER_DIRECTION_TOL = dict(rtol=1e-5, atol=1e-5)
VARLEN = ([5, 0, 3, 5, 1], 6)  # unsorted, ties, a length-0 row, max_len < T
FAMILIES = ["persistent_cta", "persistent_grid", "stepwise"]
KERNELS = ("_cta_forward_kernel", "_cta_backward_kernel", "_grid_fwd_kernel", "_grid_bwd_kernel")


# -------------------------------------------------------------------------------------------
# Launch counting: every kernel launch's grid, by kernel name
# -------------------------------------------------------------------------------------------


class _Counted:
    """Stands in for a @triton.jit kernel in its module: records the grid of every launch."""

    def __init__(self, kernel, grids: list):
        self.kernel, self.grids = kernel, grids

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.grids.append(tuple(grid))
            return launch(*args, **kwargs)

        return run


@pytest.fixture
def launches(monkeypatch):
    """{kernel name: [grid of each launch]} for the test's launches."""
    grids = defaultdict(list)
    for name in KERNELS:
        mod = pc if name.startswith("_cta") else pg
        monkeypatch.setattr(mod, name, _Counted(getattr(mod, name), grids[name]))
    return grids


# -------------------------------------------------------------------------------------------
# Pairs laid out as the engine lays them out
# -------------------------------------------------------------------------------------------


def _nan(*shape):
    return torch.full(shape, NAN, device=DEV)


def _halves(t):
    """(t[0], t[1]) of a [2, ...] tensor, or the column halves of a [N, 2C] tensor."""
    if t is None:
        return None
    if t.dim() == 2:
        c = t.shape[1] // 2
        return t[:, :c], t[:, c:]
    return t[0], t[1]


def _weights(g, G, H, Hout, P):
    """R, bR, Pw pairs as views into one flat buffer, like the params layout: direction 1's R
    lies after direction 0's R, Pw and a gap of 7 elements (an odd offset), bR at the end."""
    GH = G * H
    sizes = [GH * Hout, P * H, 7, GH * Hout, P * H, GH, GH]
    flat = torch.randn(sum(sizes), generator=g)
    flat[: sum(sizes[:5])] *= 1.5 / math.sqrt(Hout)
    flat[sum(sizes[:5]) :] *= 0.2
    flat = flat.to(DEV)
    parts = flat.split(sizes)
    R = (parts[0].view(GH, Hout), parts[3].view(GH, Hout))
    Pw = (parts[1].view(P, H), parts[4].view(P, H)) if P else None
    return R, (parts[5], parts[6]), Pw, flat


def _forward_pairs(cell, H, P, lengths, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    info = make_pack_info(lengths, T, DEV)
    B, N, Hout, lstm = info.B, info.N, P or H, cell == "lstm"
    rnd = lambda *s: torch.randn(*s, generator=g).to(DEV)  # noqa: E731
    R, bR, Pw, _ = _weights(g, G, H, Hout, P)
    ins = dict(xg=_halves(rnd(2, N, G * H)), R=R, bR=bR, Pw=Pw, h0=_halves(rnd(2, B, Hout)),
               c0=_halves(rnd(2, B, H)) if lstm else None)
    return info, ins


def _forward_outs(cell, H, P, info):
    lstm, Hout = cell == "lstm", P or H
    return dict(y=_halves(_nan(info.N, 2 * Hout)),
                c_seq=_halves(_nan(2, info.N, H)) if lstm else None,
                hT=_halves(_nan(2, info.B, Hout)), cT=_halves(_nan(2, info.B, H)) if lstm else None)


def _backward_pairs(cell, H, P, lengths, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    info = make_pack_info(lengths, T, DEV)
    B, N, Hout, lstm = info.B, info.N, P or H, cell == "lstm"
    rnd = lambda *s: torch.randn(*s, generator=g).to(DEV)  # noqa: E731
    R, _, Pw, _ = _weights(g, G, H, Hout, P)
    # Outputs of a real forward are bounded (tanh's backward uses 1 - y^2).
    # The pre-activations each cell's backward reads (reference.backward_preacts).
    gated = cell in ("lstm", "gru")
    ins = dict(pre_x=_halves(rnd(2, N, G * H)) if gated else None,
               pre_h=_halves(rnd(2, N, G * H)) if gated else None, R=R, Pw=Pw,
               y=_halves(torch.tanh(rnd(N, 2 * Hout))), h_prev=_halves(torch.tanh(rnd(2, N, Hout))),
               c_seq=_halves(rnd(2, N, H)) if lstm else None,
               c_prev=_halves(rnd(2, N, H)) if lstm else None, dy=_halves(rnd(N, 2 * Hout)),
               dhT=_halves(rnd(2, B, Hout)), dcT=_halves(rnd(2, B, H)) if lstm else None)
    return info, ins


def _backward_outs(cell, H, P, info):
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    lstm, gru, Hout, N, B = cell == "lstm", cell == "gru", P or H, info.N, info.B
    return dict(dpre_x=_halves(_nan(2, N, G * H)),
                dpre_h=_halves(_nan(2, N, G * H)) if gru else None,
                dh0=_halves(_nan(2, B, Hout)), dc0=_halves(_nan(2, B, H)) if lstm else None,
                dh_total=_halves(_nan(2, N, P)) if P else None,
                m_seq=_halves(_nan(2, N, H)) if P else None)


def _d(pairs: dict, d: int) -> dict:
    return {k: (v[d] if v is not None else None) for k, v in pairs.items()}


def _run_pair(kind, launcher, cell, info, ins, outs, **kw):
    names = pc.FORWARD_TENSORS if kind == "fwd" else pc.BACKWARD_TENSORS
    allt = {**ins, **outs}
    launcher(cell, info=info, **{k: allt[k] for k in names}, **kw)


def _run_single(kind, launcher, cell, info, ins, outs, **kw):
    names = pc.FORWARD_TENSORS if kind == "fwd" else pc.BACKWARD_TENSORS
    for d in range(2):
        allt = {**_d(ins, d), **_d(outs, d)}
        launcher(cell, info=info, reverse=d == 1, **{k: allt[k] for k in names}, **kw)


def _reference(kind, cell, info, ins, outs):
    """float64 reference of both directions, as dicts of per-direction outputs."""
    want = []
    for d in range(2):
        x = {k: (v.double() if v is not None else None) for k, v in _d(ins, d).items()}
        o = {k: (torch.zeros(v.shape, dtype=torch.float64, device=DEV) if v is not None else None)
             for k, v in _d(outs, d).items()}
        if kind == "fwd":
            reference.recurrence_forward(cell, *(x[k] for k in pc.FORWARD_TENSORS[:6]), info,
                                         d == 1, *(o[k] for k in pc.FORWARD_TENSORS[6:]))
        else:
            reference.recurrence_backward(cell, *(x[k] for k in pc.BACKWARD_TENSORS[:11]), info,
                                          d == 1, *(o[k] for k in pc.BACKWARD_TENSORS[11:]))
        want.append(o)
    return want


LAUNCHERS = {
    "persistent_cta": dict(fwd=(pc.cta_forward_pair, pc.cta_forward),
                           bwd=(pc.cta_backward_pair, pc.cta_backward), kw={}),
    "persistent_grid": dict(fwd=(pg.grid_forward_pair, pg.grid_forward),
                            bwd=(pg.grid_backward_pair, pg.grid_backward),
                            kw=dict(persistent=True, block_h=16)),
    "stepwise": dict(fwd=(pg.grid_forward_pair, pg.grid_forward),
                     bwd=(pg.grid_backward_pair, pg.grid_backward),
                     kw=dict(persistent=False, block_h=16)),
}
KERNEL_OF = {("persistent_cta", "fwd"): "_cta_forward_kernel",
             ("persistent_cta", "bwd"): "_cta_backward_kernel",
             ("persistent_grid", "fwd"): "_grid_fwd_kernel",
             ("persistent_grid", "bwd"): "_grid_bwd_kernel",
             ("stepwise", "fwd"): "_grid_fwd_kernel", ("stepwise", "bwd"): "_grid_bwd_kernel"}


def _expected_launches(family, kind, H, P, info, block_h=16, block_b=16):
    """(launches, grid) of one pair: the per-direction launcher's count, each with a direction
    axis of 2."""
    if family == "persistent_cta":
        return 1, (triton.cdiv(info.B, block_b), 2)
    nph = 2 if P else 1
    n_sub = nph * info.max_len + (1 if kind == "bwd" else 0)
    programs = gt.grid_programs(H, P or H, P, info.B, block_h, block_b)
    ranges = pg._launch_ranges(n_sub, family == "persistent_grid", ON_GPU, programs)
    return len(ranges), (programs, 2)


CELLS = [
    pytest.param("lstm", 20, 20, id="lstm-H20-P20"),  # 2 hidden slices, both own output slices
    pytest.param("gru", 20, 0, id="gru-H20"),
    pytest.param("rnn_tanh", 33, 0, id="rnn_tanh-H33"),  # 3 hidden slices
]


@pytest.mark.parametrize("cell,H,P", CELLS)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_pair_launch_equals_per_direction_launches(kind, family, cell, H, P, launches):
    _check_pair_launch(kind, family, cell, H, P, launches)


def _check_pair_launch(kind, family, cell, H, P, launches):
    make, make_outs = ((_forward_pairs, _forward_outs) if kind == "fwd"
                       else (_backward_pairs, _backward_outs))
    info, ins = make(cell, H, P, *VARLEN)
    pair_launcher, single_launcher = LAUNCHERS[family][kind]
    kw = LAUNCHERS[family]["kw"]
    kernel = KERNEL_OF[(family, kind)]

    got = make_outs(cell, H, P, info)
    _run_pair(kind, pair_launcher, cell, info, ins, got, **kw)
    count, grid = _expected_launches(family, kind, H, P, info)
    assert launches[kernel] == [grid] * count, "both directions must share every launch"

    launches[kernel].clear()
    want = make_outs(cell, H, P, info)
    _run_single(kind, single_launcher, cell, info, ins, want, **kw)
    assert len(launches[kernel]) == 2 * count and all(g[1] == 1 for g in launches[kernel])

    ref = _reference(kind, cell, info, ins, got)
    for name, pair in got.items():
        if pair is None:
            continue
        for d in range(2):
            what = f"{name}[dir {d}]"
            assert torch.isfinite(pair[d]).all(), f"{what}: non-finite (missing write?)"
            assert torch.equal(pair[d], want[name][d]), f"{what}: differs from per-direction"
            torch.testing.assert_close(pair[d].double(), ref[d][name], **KERNEL_TOL,
                                       msg=lambda m, w=what: f"{w}: {m}")


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_persistent_grid_pair_is_one_launch_for_all_steps(kind, launches, monkeypatch):
    """One program per direction never waits at its barrier for another, so even the
    interpreter runs the whole in-kernel step loop of both directions in one launch of grid
    (1, 2), barriers compiled in: with every target one arrival too far, the launch raises."""
    from tritonrnn.kernels.grid_barrier import BarrierTimeoutError

    make, make_outs = ((_forward_pairs, _forward_outs) if kind == "fwd"
                       else (_backward_pairs, _backward_outs))
    cell, H, P = "lstm", 16, 12
    info, ins = make(cell, H, P, [6, 4, 0], 7)
    pair_launcher, single_launcher = LAUNCHERS["persistent_grid"][kind]
    kw = LAUNCHERS["persistent_grid"]["kw"]
    got = make_outs(cell, H, P, info)
    _run_pair(kind, pair_launcher, cell, info, ins, got, **kw)
    assert launches[KERNEL_OF[("persistent_grid", kind)]] == [(1, 2)]
    want = make_outs(cell, H, P, info)
    _run_single(kind, single_launcher, cell, info, ins, want, **kw)
    for name, pair in got.items():
        if pair is not None:
            for d in range(2):
                assert torch.equal(pair[d], want[name][d]), f"{name}[dir {d}]"
    what = "grid_forward" if kind == "fwd" else "grid_backward"
    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "sync")  # the launch itself raises
    with pytest.raises(BarrierTimeoutError, match=f"{what}: .*grid barrier timed out"):
        _run_pair(kind, pair_launcher, cell, info, ins, make_outs(cell, H, P, info), **kw,
                  _max_spin=64, _barrier_extra=1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_pairs_whose_second_direction_comes_first_in_memory(kind, family, launches):
    """Direction 1's weights and states stored before direction 0's (negative offsets,
    which `direction_offsets` accepts): still one launch for both directions, and exactly
    the per-direction launches' results."""
    cell, H, P = "lstm", 20, 20
    make, make_outs = ((_forward_pairs, _forward_outs) if kind == "fwd"
                       else (_backward_pairs, _backward_outs))
    info, ins = make(cell, H, P, *VARLEN)
    flipped = ("R", "Pw") + (("h0", "c0") if kind == "fwd" else ("dhT", "dcT"))
    for name in flipped:
        a, b = ins[name]
        both = torch.stack((b, a))  # direction 1's values first
        ins[name] = (both[1], both[0])
    names = pc.FORWARD_TENSORS if kind == "fwd" else pc.BACKWARD_TENSORS
    offs = pc.direction_offsets({k: ins[k] for k in names if k in ins})
    assert offs is not None and all(offs[k] < 0 for k in flipped), offs
    pair_launcher, single_launcher = LAUNCHERS[family][kind]
    kw = LAUNCHERS[family]["kw"]
    got = make_outs(cell, H, P, info)
    _run_pair(kind, pair_launcher, cell, info, ins, got, **kw)
    count, grid = _expected_launches(family, kind, H, P, info)
    assert launches[KERNEL_OF[(family, kind)]] == [grid] * count
    want = make_outs(cell, H, P, info)
    _run_single(kind, single_launcher, cell, info, ins, want, **kw)
    for name, pair in got.items():
        if pair is not None:
            for d in range(2):
                assert torch.isfinite(pair[d]).all(), f"{name}[dir {d}]"
                assert torch.equal(pair[d], want[name][d]), f"{name}[dir {d}]"


def test_pairs_that_are_not_base_plus_offset_run_per_direction(launches):
    """Separate allocations (or aliased outputs) cannot be addressed as base + offset: the pair
    launcher falls back to two launches and the results are the per-direction ones."""
    cell, H, P = "gru", 20, 0
    info, ins = _forward_pairs(cell, H, P, *VARLEN)
    ins["xg"] = tuple(t.clone() for t in ins["xg"])  # two storages
    assert pc.direction_offsets(ins) is None
    got = _forward_outs(cell, H, P, info)
    _run_pair("fwd", pc.cta_forward_pair, cell, info, ins, got)
    assert launches["_cta_forward_kernel"] == [(1, 1), (1, 1)]
    want = _forward_outs(cell, H, P, info)
    _run_single("fwd", pc.cta_forward, cell, info, ins, want)
    for name, pair in got.items():
        if pair is not None:
            for d in range(2):
                assert torch.equal(pair[d], want[name][d]), f"{name}[dir {d}]"
    y = _nan(info.N, H)
    assert pc.direction_offsets(dict(y=(y, y)), outputs=("y",)) is None
    assert pc.direction_offsets(dict(y=(y, y))) == dict(y=0)  # inputs may alias


def test_direction_offsets_of_engine_layouts():
    info, ins = _forward_pairs("lstm", 20, 20, *VARLEN)
    offs = pc.direction_offsets(ins)
    N, B = info.N, info.B
    assert offs["xg"] == N * 4 * 20 and offs["h0"] == B * 20 and offs["c0"] == B * 20
    # Direction 1's R: after R0 (80 x 20), Pw0 (20 x 20) and the 7-element gap.
    assert offs["R"] == 80 * 20 + 20 * 20 + 7 and offs["bR"] == 80
    y = _nan(N, 2 * 20)
    assert pc.direction_offsets(dict(y=_halves(y))) == dict(y=20)
    with pytest.raises(ValueError, match="both directions"):
        pc.direction_offsets(dict(c0=(y, None)))
    with pytest.raises(ValueError, match="pair"):
        pc.direction_offsets(dict(c0=y))


def test_grid_programs_counts_both_directions():
    assert gt.grid_programs(33, 33, 0, 5, 16, 16) == 3
    assert gt.grid_programs(33, 33, 0, 5, 16, 16, num_dirs=2) == 6
    assert gt.grid_programs(1024, 256, 256, 40, 16, 16, num_dirs=2) == 64 * 3 * 2


def test_backend_falls_back_per_direction_when_pair_is_not_coresident(monkeypatch, launches):
    """2 programs per direction on a device of 3 SMs: each direction's grid is co-resident,
    the pair's 4 programs are not, so the backend launches each direction on its own."""
    props = replace(PRESETS["interpreter"] if not ON_GPU else tb.device_properties(DEV),
                    sm_count=3)
    monkeypatch.setattr(tb, "device_properties", lambda device=None: props)
    cell, H, P = "rnn_tanh", 20, 0
    info, ins = _forward_pairs(cell, H, P, *VARLEN)
    got = _forward_outs(cell, H, P, info)
    rec = tb.TritonRecurrence()
    with plan_constraints(family="persistent_grid", block_h=16):
        rec.forward_bidir(cell, *(ins[k] for k in pc.FORWARD_TENSORS[:6]), info,
                          *(got[k] for k in pc.FORWARD_TENSORS[6:]))
    grids = launches["_grid_fwd_kernel"]
    assert grids and all(g == (2, 1) for g in grids)
    ref = _reference("fwd", cell, info, ins, got)
    for name, pair in got.items():
        if pair is not None:
            for d in range(2):
                torch.testing.assert_close(pair[d].double(), ref[d][name], **KERNEL_TOL)


def test_a_pair_plan_that_does_not_share_a_launch_runs_per_direction_as_planned(
        monkeypatch, tmp_path):
    """The pair key's tuning entry (|D2) names a persistent grid on 2 warps whose pair is not
    co-resident (2 programs per direction, 3 SMs): each direction runs that plan in a launch
    of its own, forward and backward, not the one-direction key's plan (the heuristic's
    persistent CTA at H=20), and the layer matches the oracle."""
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    props = replace(PRESETS["interpreter"], name="3-SM test device", sm_count=3)
    monkeypatch.setattr(tb, "device_properties", lambda device=None: props)
    from tritonrnn.rnn.planner import recurrence_choice, recurrence_key, store_tuning_entry

    assert recurrence_choice("rnn_tanh", 20, 20, 0, torch.float32, 4, props)[0].family == (
        "persistent_cta")
    choice = {"family": "persistent_grid", "block_h": 16, "num_warps": 2}
    store_tuning_entry(recurrence_key("rnn_tanh", 20, 0, torch.float32, 4, props, 2), choice,
                       1.0, props.name)
    lp, source = recurrence_choice("rnn_tanh", 20, 20, 0, torch.float32, 4, props, 2)
    assert (source, lp.family, lp.num_dirs, lp.num_warps) == ("tuned", "persistent_grid", 1, 2)
    seen = defaultdict(list)
    for name in ("grid_forward", "grid_backward", "cta_forward", "cta_backward"):
        module = pg if name.startswith("grid") else pc
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kw):
            seen[_name].append((args[8] if _name.endswith("forward") else args[13],
                                kw["num_warps"]))
            return _real(*args, **kw)

        monkeypatch.setattr(module, name, spy)
    compare_with_torch("rnn_tanh", L=1, bidirectional=True, lengths="varlen", I=4, H=20, T=4,
                       backend="triton", dtype=torch.float32, rtol=2e-5, atol=2e-5)
    assert dict(seen) == {"grid_forward": [(False, 2), (True, 2)],
                          "grid_backward": [(False, 2), (True, 2)]}


# -------------------------------------------------------------------------------------------
# Engine: pairs handed to the backend, per-direction path kept for other backends
# -------------------------------------------------------------------------------------------


class _PairedReference(engine.ReferenceRecurrence):
    """The reference recurrences behind the pair methods; checks that the engine hands over
    views (weights inside params, workspaces and states as halves of one buffer)."""

    def __init__(self, params):
        self.params, self.calls = params, 0

    def _check(self, R, pairs):
        for t in R:
            assert t.untyped_storage().data_ptr() == self.params.untyped_storage().data_ptr()
        assert pc.direction_offsets(pairs) is not None

    def forward_bidir(self, cell, xg, R, bR, Pw, h0, c0, info, y, c_seq, hT, cT):
        self.calls += 1
        self._check(R, dict(xg=xg, R=R, bR=bR, Pw=Pw, h0=h0, c0=c0, y=y, c_seq=c_seq, hT=hT,
                            cT=cT))
        for d in range(2):
            ts = [t[d] if t is not None else None for t in (xg, R, bR, Pw, h0, c0)]
            os_ = [t[d] if t is not None else None for t in (y, c_seq, hT, cT)]
            reference.recurrence_forward(cell, *ts, info, d == 1, *os_)

    def backward_bidir(self, cell, *args):
        self.calls += 1
        ins, info, outs = args[:11], args[11], args[12:]
        self._check(ins[2], dict(zip(pc.BACKWARD_TENSORS, (*ins, *outs), strict=True)))
        for d in range(2):
            reference.recurrence_backward(
                cell, *(t[d] if t is not None else None for t in ins), info, d == 1,
                *(t[d] if t is not None else None for t in outs))


@pytest.mark.parametrize("mode,proj,input_mode", [
    ("lstm", 3, "linear_input"), ("gru", 0, "skip_input"), ("rnn_relu", 0, "linear_input")])
def test_engine_pair_path_equals_per_direction_path(mode, proj, input_mode):
    """float64 reference recurrences behind both paths: the engine's pair plumbing (workspace
    halves, weight views, dx accumulation order) gives bit-identical results."""
    L, H, T = 2, 4, 5
    I = H if input_mode == "skip_input" else 3
    cfg = make_config(rnn_mode=mode, num_layers=L, num_units=H, input_size=I,
                      input_mode=input_mode, direction="bidirectional", num_proj=proj)
    g = torch.Generator().manual_seed(7)
    info = make_pack_info([5, 0, 2, 4], T, torch.device("cpu"))
    Hout, f64 = proj or H, torch.float64
    x = torch.randn(info.N, I, generator=g, dtype=f64)
    h0 = torch.randn(2 * L, info.B, Hout, generator=g, dtype=f64)
    c0 = torch.randn(2 * L, info.B, H, generator=g, dtype=f64) if mode == "lstm" else None
    params = torch.randn(config_params_size(cfg), generator=g, dtype=f64) * 0.5
    dy = torch.randn(info.N, 2 * Hout, generator=g, dtype=f64)
    dhT = torch.randn_like(h0)
    dcT = torch.randn_like(c0) if c0 is not None else None

    results = []
    for rec in (engine.ReferenceRecurrence(), _PairedReference(params)):
        assert engine.pairs_directions(rec, 2) == isinstance(rec, _PairedReference)
        fw = engine.forward(cfg, rec, x, h0, c0, params, info, True)
        bw = engine.backward(cfg, rec, x, h0, c0, params, info, fw.y, dy, dhT, dcT, fw.reserve)
        results.append((fw.y, fw.hT, fw.cT, fw.reserve, bw.dx, bw.dh0, bw.dc0, bw.dparams))
        if isinstance(rec, _PairedReference):
            assert rec.calls == 2 * L  # one forward and one backward call per layer
    for a, b in zip(*results, strict=True):
        if a is not None:
            assert not a.is_floating_point() or torch.isfinite(a).all()
            assert torch.equal(a, b)


def test_pair_path_only_for_bidirectional_layers_of_capable_backends():
    assert engine.pairs_directions(tb.triton_recurrence(), 2)
    assert not engine.pairs_directions(tb.triton_recurrence(), 1)
    assert not engine.pairs_directions(engine.ReferenceRecurrence(), 2)


# -------------------------------------------------------------------------------------------
# End to end: cudnn_rnn(backend="triton") with each family forced
# -------------------------------------------------------------------------------------------


class _PerDirection(tb.TritonRecurrence):
    """The Triton backend without the pair methods: the engine calls it once per direction."""

    forward_bidir = None
    backward_bidir = None


class _SplitPairs(tb.TritonRecurrence):
    """The engine's pair path (same workspaces), each pair run as two per-direction launches."""

    @staticmethod
    def _shares_launch(*args) -> bool:
        return False


def _family(family):
    # block_h=16 splits H=17 over two programs per direction, so the grid families exchange h.
    extra = {} if family == "persistent_cta" else {"block_h": 16}
    return plan_constraints(family=family, **extra)


def _op_results(mode, proj, H, lengths, T, dtype=torch.float32):
    """Output, final states and every gradient of cudnn_rnn(backend="triton"), one layer (a
    second layer's launches are the same kernels; the engine's plumbing of layers is
    test_engine_pair_path_equals_per_direction_path's)."""
    module, x, h0, c0, lens = make_case(mode, 3, H, 1, True, proj, T, lengths, True, seed=3)
    params = params_from_module(module)
    leaves = [t.to(DEV, dtype).requires_grad_(True) for t in (x, h0, params)]
    c = c0.to(DEV, dtype).requires_grad_(True) if c0 is not None else None
    res = cudnn_rnn(leaves[0], leaves[1], c, leaves[2], lens, rnn_mode=mode,
                    direction="bidirectional", num_proj=proj, backend="triton")
    g = torch.Generator().manual_seed(4)
    loss = (res.output * torch.randn(res.output.shape, generator=g).to(DEV, dtype)).sum()
    loss = loss + res.output_h.sum() + (res.output_c.sum() if c is not None else 0)
    grads = torch.autograd.grad(loss, leaves + ([c] if c is not None else []))
    return [res.output, res.output_h, res.output_c, *grads]


# A projection rules out hoisted weights: its stepwise case where helpers.stepwise_runs says.
E2E_CASES = [
    pytest.param(family, mode, proj, id=f"{family}-{mode}{f'-proj{proj}' if proj else ''}")
    for family in FAMILIES for mode, proj in (("lstm", 5), ("gru", 0), ("rnn_tanh", 0))
    if family != "stepwise" or stepwise_runs(hoistable=not proj)]


@pytest.mark.parametrize("family,mode,proj", E2E_CASES)
def test_end_to_end_matches_torch_with_shared_launches(family, mode, proj, launches,
                                                        monkeypatch):
    H, T = 17, 4
    with _family(family):
        compare_with_torch(mode, L=2, bidirectional=True, lengths="zero", proj=proj, I=3, H=H,
                           T=T, backend="triton", device=DEV.type, **E2E)
    # The forward (training) and the backward of both layers, both directions sharing launches.
    info = make_pack_info([2, 0, T, 0, 1], T, DEV)  # helpers.LENGTHS["zero"]
    # The backward runs the forced family too, also on a GPU, where autograd runs it on a
    # worker thread: the op carries the forward's plan_constraints over.
    for kind in ("fwd", "bwd"):
        name = KERNEL_OF[(family, kind)]
        count, grid = _expected_launches(family, kind, H, proj, info)
        assert launches[name] == [grid] * (2 * count), f"{name}: {launches[name]}"

    # Against per-direction launches: bit for bit inside the engine's pair path (same kernels,
    # same arithmetic, same workspaces), and, for the grid family, the engine's per-direction
    # path to the rounding of its GEMMs (see PER_DIRECTION_TOL; that path's plumbing against
    # the pair path's is test_engine_pair_path_equals_per_direction_path's, bit for bit).
    backends = [_SplitPairs()] + ([_PerDirection()] if family == "persistent_grid" else [])
    with _family(family):
        _pair_against(backends, (mode, proj, H, [3, 0, 2], 3), PER_DIRECTION_TOL, monkeypatch)


def _pair_against(backends, args, per_direction_tol, monkeypatch):
    """`_op_results(*args)` of the pair path against each backend's: bit for bit against
    `_SplitPairs` (same workspaces), to `per_direction_tol` against `_PerDirection`."""
    paired = _op_results(*args)
    for backend in backends:
        monkeypatch.setattr(tb, "_BACKEND", backend)
        single = _op_results(*args)
        for i, (a, b) in enumerate(zip(paired, single, strict=True)):
            what = f"result {i}, {type(backend).__name__}"
            if isinstance(backend, _SplitPairs):
                assert torch.equal(a, b), what
            else:
                torch.testing.assert_close(a.float(), b.float(), **per_direction_tol, msg=what)


@pytest.mark.parametrize("mode,proj", [pytest.param("lstm", 5, id="lstm-proj5"),
                                       pytest.param("gru", 0, id="gru"),
                                       pytest.param("rnn_relu", 0, id="rnn_relu")])
def test_large_batch_streamed_plan_end_to_end(mode, proj):
    """The large-batch plan's kernels through the op: weights streamed, batch tiles of 64 (70
    rows: a full and a partial tile), so every streamed dot runs transposed
    (`grid_tiles._swap_dots`), both directions sharing launches; 2 layers against
    torch.nn in float64, every output and gradient."""
    assert gt._swap_dots(16, 64)
    with plan_constraints(family="persistent_grid", block_h=16, block_b=64, block_k=16):
        compare_with_torch(mode, L=2, bidirectional=True, lengths="batch70", proj=proj, I=3,
                           H=17, T=4, backend="triton", device=DEV.type, **E2E)


# -------------------------------------------------------------------------------------------
# GPU only: the persistent pair with its two barriers, the timeout path, grid refusal, bf16
# -------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("P", [0, 64], ids=["noproj", "proj"])
def test_gpu_persistent_pair_barriers(P, launches):
    """16 hidden slices x 3 batch tiles per direction = 96 co-resident programs meeting at
    300-600 barriers, one counter per direction: bit-identical to per-direction launches
    (which share the barrier code), and without a projection against the float64 reference
    (which does not; to 1e-4 of each tensor's scale over 300 steps: a stale exchange slot is
    O(0.1); passed on an H200, 2026-11-29). With the projection these weights make the
    recurrence chaotic over 300 steps: the float32 reference itself ends 3.8 from the
    float64 one (|y| <= 4.5), as the kernels did (3.9), so only the bit-identity holds."""
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, 301, (40,), generator=g).tolist()
    lengths[0] = 300
    H = 256
    for kind in ("fwd", "bwd"):
        make, make_outs = ((_forward_pairs, _forward_outs) if kind == "fwd"
                           else (_backward_pairs, _backward_outs))
        info, ins = make("lstm", H, P, lengths, 300)
        pair_launcher, single_launcher = LAUNCHERS["persistent_grid"][kind]
        got = make_outs("lstm", H, P, info)
        _run_pair(kind, pair_launcher, "lstm", info, ins, got, persistent=True, block_h=16)
        assert launches[KERNEL_OF[("persistent_grid", kind)]] == [(48, 2)]
        want = make_outs("lstm", H, P, info)
        _run_single(kind, single_launcher, "lstm", info, ins, want, persistent=True, block_h=16)
        ref = _reference(kind, "lstm", info, ins, got)
        for name, pair in got.items():
            if pair is not None:
                for d in range(2):
                    assert torch.equal(pair[d], want[name][d]), f"{kind} {name}[dir {d}]"
                    if P:
                        continue
                    scale = max(1.0, ref[d][name].abs().max().item())
                    what = f"{kind} {name}[dir {d}] against the reference"
                    torch.testing.assert_close(pair[d].double(), ref[d][name], rtol=1e-4,
                                               atol=1e-4 * scale, msg=lambda m, w=what: f"{w}: {m}")


@pytest.mark.gpu
def test_gpu_pair_barrier_timeout_raises(monkeypatch):
    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "sync")  # the launch itself raises
    info, ins = _forward_pairs("lstm", 64, 0, [6, 3], 6)
    got = _forward_outs("lstm", 64, 0, info)
    with pytest.raises(RuntimeError, match="grid barrier .*timed out"):
        _run_pair("fwd", pg.grid_forward_pair, "lstm", info, ins, got, persistent=True,
                  block_h=16, _max_spin=2000, _barrier_extra=1)
    got = _forward_outs("lstm", 64, 0, info)
    _run_pair("fwd", pg.grid_forward_pair, "lstm", info, ins, got, persistent=True, block_h=16)
    ref = _reference("fwd", "lstm", info, ins, got)
    for name, pair in got.items():
        if pair is not None:
            for d in range(2):
                torch.testing.assert_close(pair[d].double(), ref[d][name], **KERNEL_TOL)


@pytest.mark.gpu
def test_gpu_refuses_pair_grid_larger_than_sm_count():
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    # 16 * (sms // 2 + 1) rows: sms // 2 + 1 programs per direction, each alone co-resident.
    info, ins = _forward_pairs("rnn_tanh", 16, 0, [2] * (16 * (sms // 2 + 1)), 2)
    got = _forward_outs("rnn_tanh", 16, 0, info)
    with pytest.raises(ValueError, match=f"{2 * (sms // 2 + 1)} programs.*{sms} SMs"):
        _run_pair("fwd", pg.grid_forward_pair, "rnn_tanh", info, ins, got, persistent=True,
                  block_h=16)
    _run_pair("fwd", pg.grid_forward_pair, "rnn_tanh", info, ins, got, persistent=False,
              block_h=16)
    ref = _reference("fwd", "rnn_tanh", info, ins, got)
    for d in range(2):
        torch.testing.assert_close(got["y"][d].double(), ref[d]["y"], **KERNEL_TOL)


# bf16's PER_DIRECTION_TOL: a GEMM output rounded the other way is one bf16 ulp (2**-8
# relative), and the recurrence carries a few of them on; a wrong half or offset is O(0.1).
PER_DIRECTION_TOL_BF16 = dict(rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("family,mode,proj", E2E_CASES)
def test_gpu_bf16_pair_equals_per_direction(family, mode, proj, monkeypatch):
    """As test_end_to_end_matches_torch_with_shared_launches' comparison, in bf16 on a GPU:
    bit for bit against the pair path run as two per-direction launches (same workspaces),
    and against the engine's per-direction path to its GEMMs' rounding (cuBLAS picks kernels
    by alignment too, and the second direction's slots sit at other addresses)."""
    args = (mode, proj, 64, [7, 0, 5, 7, 2], 7, torch.bfloat16)
    with _family(family):
        _pair_against([_SplitPairs(), _PerDirection()], args, PER_DIRECTION_TOL_BF16,
                      monkeypatch)
