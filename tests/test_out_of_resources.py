"""A kernel that Triton refuses at launch for needing more of the device than it has
(OutOfResources) is replaced by a smaller plan (`rnn.planner.smaller_choice`,
`rnn.triton_backend.TritonRecurrence._run`).

The planner's on-chip estimates are calibrated on one compiler's sm_90 compiles (Triton 3.6);
Triton 3.4's persistent-CTA backward at LSTM H=128 B=16 bf16 takes 241920 B of shared memory,
over an H100's 232448. The interpreter has no such limit, so the CPU tests make the launchers
refuse the way Triton does (its own exception, raised before anything runs); the GPU test
gets a real refusal by planning for more shared memory than the GPU has.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from helpers import compare_with_torch
from triton.runtime.errors import OutOfResources

from tritonrnn.kernels import persistent_cta as pc
from tritonrnn.kernels import persistent_grid as pg
from tritonrnn.rnn import planner
from tritonrnn.rnn import triton_backend as tb
from tritonrnn.rnn.planner import PRESETS, plan_constraints, recurrence_choice, smaller_choice

H100 = PRESETS["h100"]
FP32 = dict(dtype=torch.float32, rtol=2e-5, atol=2e-5)


def _ladder(cell, H, P, dtype, batch, num_dirs):
    lp, _ = recurrence_choice(cell, H, P or H, P, dtype, batch, H100, num_dirs)
    steps = [lp]
    while (nxt := smaller_choice(steps[-1], cell, H, P or H, P, dtype, batch, H100,
                                 num_dirs)) is not None:
        steps.append(nxt)
        assert len(steps) <= 8, steps  # stepwise: 64 x 64 down to 16 x 16 in five steps
    return steps


CTA, GRID, STEP = "persistent_cta", "persistent_grid", "stepwise"


@pytest.mark.parametrize("shape, want", [
    (("lstm", 96, 0, torch.bfloat16, 16, 1), [(CTA, 0, 0), (GRID, 0, 0)]),
    # H = 128: the resident grid's forward (its 4 gates' slices added by halves, 16 KiB of
    # fp32 scratch, `kernels.persistent_grid._ksum`) counts more than streamed tiles.
    (("lstm", 128, 0, torch.bfloat16, 16, 1), [(CTA, 0, 0), (GRID, 0, 0), (GRID, 64, 0)]),
    (("gru", 96, 0, torch.float16, 64, 2), [(CTA, 0, 0), (GRID, 0, 0)]),
    # streamed on `_stream_stages`' stages (8: 16 x 16 tiles), then on Triton's default (0)
    (("lstm", 768, 0, torch.bfloat16, 16, 1), [(GRID, 0, 0), (GRID, 64, 8), (GRID, 64, 0)]),
    (("lstm", 768, 0, torch.bfloat16, 1, 1), [(GRID, 0, 0)]),  # vector tiles: R in registers
    (("lstm", 768, 0, torch.bfloat16, 256, 1),
     [(GRID, 64, 5), (GRID, 64, 0)] + [(STEP, 64, 0)] * 4),  # 32 x 64: forward 5
    # (the pair's streamed stages count more than its resident weights: passed over)
    (("gru", 512, 0, torch.bfloat16, 16, 2), [(GRID, 0, 0), (GRID, 64, 0)]),
    (("lstm", 1024, 512, torch.bfloat16, 32, 1), [(GRID, 0, 0), (GRID, 64, 8), (GRID, 64, 0)]),
    (("rnn_tanh", 512, 0, torch.float32, 16, 1), [(GRID, 64, 0)]),  # FMA dots: the default
    (("gru", 4096, 0, torch.bfloat16, 16, 1), [(GRID, 64, 7), (GRID, 64, 0), (STEP, 64, 0)]),
], ids=["cta", "cta-128", "cta-pair", "grid", "vector", "streamed", "grid-pair", "proj", "fp32",
        "wide"])
def test_each_smaller_plan_needs_less_on_chip(shape, want):
    """The steps on an H100 (family, block_k, num_stages): each needs less on chip by the
    planner's estimate than the one before, keeps the pair launch of a bidirectional layer
    where it fits, and never goes back to the CTA. A streamed chunk's tiles (30720 B at 16 x
    16 for LSTM) can take more than a small resident slice (LSTM H=96: 20480 B): no such
    step."""
    steps = _ladder(*shape)
    assert [(lp.family, lp.block_k, lp.num_stages) for lp in steps] == want, steps
    for prev, nxt in zip(steps, steps[1:], strict=False):
        assert nxt.onchip_bytes < prev.onchip_bytes, steps
        if nxt.family == GRID:
            assert nxt.num_programs <= H100.sm_count
    assert {lp.num_dirs for lp in steps} == {shape[-1]}
    floor = planner._grid(STEP, *shape[:2], shape[1], *shape[2:4], 16, 16, shape[4], 4,
                          planner._STREAM_K, shape[5])
    assert steps[-1].onchip_bytes <= floor.onchip_bytes  # nothing smaller was skipped


# Stepwise tiles (block_h, block_b) by L2 bytes per step, 64 x 64 first (LSTM: 0.20, 0.28,
# 0.41, 0.44, 0.56, 0.81 of the bytes per element pair; `planner._stepwise_traffic`).
_BY_BYTES = [(64, 64), (32, 64), (32, 32), (16, 64), (16, 32), (16, 16)]


@pytest.mark.parametrize("shape, first", [
    (("lstm", 1024, 0, torch.bfloat16, 4096, 1), 0),
    (("gru", 1536, 0, torch.bfloat16, 1024, 1), 0),
    (("lstm", 768, 0, torch.bfloat16, 256, 1), 2),
], ids=["lstm-b4096", "gru-b1024", "lstm-b256"])
def test_stepwise_steps_read_the_fewest_bytes_below_the_refused_plan(shape, first):
    """Past the persistent families each step is the stepwise plan that reads the fewest L2
    bytes per step among those the planner estimates below the refused one (`_stepwise_fit`
    with `below`): after 64 x 64 tiles 32 x 64, not 16 x 16 with 2.9x its bytes; after the
    grid's 32 x 64 tiles (73728 B) stepwise 32 x 32. The ladder ends at 16 x 16."""
    steps = [lp for lp in _ladder(*shape) if lp.family == STEP]
    assert [(lp.block_h, lp.block_b) for lp in steps] == _BY_BYTES[first:], steps
    G = planner.GATES[shape[0]]
    traffic = [planner._stepwise_traffic(G, lp.block_h, lp.block_b) for lp in steps]
    assert traffic == sorted(traffic)


def test_a_refused_cta_splits_r_on_the_default_stages_where_deeper_ones_count_more():
    """On an A100 (163 KiB) the split plan after a refused CTA can stream on more stages
    than the CTA's footprint: rnn_tanh H=128 B=1024 bf16, CTA 57856 B, the grid's 32 x 64
    tiles on `_stream_stages`' 8 stages 98304 B; the same grid on Triton's default (36864 B)
    comes next, not the stepwise tiles."""
    a100 = PRESETS["a100"]
    lp, _ = recurrence_choice("rnn_tanh", 128, 128, 0, torch.bfloat16, 1024, a100, 1)
    assert (lp.family, lp.onchip_bytes) == (CTA, 57856)
    nxt = smaller_choice(lp, "rnn_tanh", 128, 128, 0, torch.bfloat16, 1024, a100, 1)
    assert (nxt.family, nxt.block_k, nxt.num_stages) == (GRID, 64, 0), nxt
    assert nxt.onchip_bytes == 36864 < lp.onchip_bytes
    deep = planner._split_heuristic("rnn_tanh", 128, 128, 0, torch.bfloat16, 1024, a100, 1)
    assert (deep.block_h, deep.block_b, deep.num_stages, deep.onchip_bytes) == (
        nxt.block_h, nxt.block_b, 8, 98304)


def test_reference_and_unknown_families_have_nothing_smaller():
    for lp in (planner.LayerPlan("reference"), planner.LayerPlan("persistent_cta",
                                                                 onchip_bytes=0)):
        assert smaller_choice(lp, "lstm", 8, 8, 0, torch.float32, 4, H100) is None


@pytest.fixture
def backend(monkeypatch):
    """The process's Triton backend with no plans replaced yet (restored afterwards)."""
    monkeypatch.setattr(tb._BACKEND, "_smaller", {})
    return tb._BACKEND


def _refuse(monkeypatch, module, name, calls):
    """Makes module.name raise OutOfResources as Triton's launcher does (nothing run);
    counts the calls in calls[name]."""
    def launcher(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        raise OutOfResources(241920, 232448, "shared memory")
    monkeypatch.setattr(module, name, launcher)


def _count(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def launcher(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, launcher)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-dir", "pair"])
def test_a_refused_cta_backward_runs_on_the_grid_and_stays_replaced(backend, monkeypatch,
                                                                     bidirectional):
    calls = {}
    bwd = "cta_backward_pair" if bidirectional else "cta_backward"
    _refuse(monkeypatch, pc, bwd, calls)
    _count(monkeypatch, pc, "cta_forward_pair" if bidirectional else "cta_forward", calls)
    _count(monkeypatch, pg, "grid_backward_pair" if bidirectional else "grid_backward", calls)
    case = dict(L=1, bidirectional=bidirectional, lengths="varlen", I=4, H=17, T=5,
                backend="triton", **FP32)
    with pytest.warns(RuntimeWarning, match=r"the persistent_cta backward kernel \(block_b=16\) "
                      r"for lstm H=17 torch.float32 B=\d+ needs more than this device has "
                      r"\(out of resource: shared memory.*running persistent_grid"):
        compare_with_torch("lstm", **case)
    assert calls[bwd] == 1
    # The replacement is kept: the next backward of the shape goes straight to the grid, with
    # no warning; the forward still runs the persistent CTA.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare_with_torch("lstm", seed=3, **case)
    assert calls[bwd] == 1
    assert calls["cta_forward_pair" if bidirectional else "cta_forward"] == 2
    assert calls["grid_backward_pair" if bidirectional else "grid_backward"] == 2


@pytest.mark.parametrize("mode, proj", [("lstm", 0), ("lstm", 5), ("gru", 0), ("rnn_tanh", 0),
                                        ("rnn_relu", 0)])
def test_every_cell_runs_on_the_grid_when_the_cta_is_refused(backend, monkeypatch, mode, proj):
    """Every persistent-CTA launcher refuses (forward and backward, one direction and pair):
    two bidirectional layers of each cell (LSTM also with a projection) run on the grid and
    match the oracle; one warning per pass (both layers share the shape's replacement)."""
    calls = {}
    for name in ("cta_forward", "cta_backward", "cta_forward_pair", "cta_backward_pair"):
        _refuse(monkeypatch, pc, name, calls)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compare_with_torch(mode, L=2, bidirectional=True, lengths="zero", proj=proj, I=3,
                           H=17, T=4, backend="triton", **FP32)
    refused = [str(w.message) for w in seen if "needs more than this device has" in str(w.message)]
    assert len(refused) == 2 and calls == {"cta_forward_pair": 1, "cta_backward_pair": 1}, (
        refused, calls)
    assert {k[0] for k in backend._smaller} == {"forward", "backward"}


def test_a_refused_grid_forward_streams_its_weights(backend, monkeypatch):
    """A resident persistent grid refused -> the grid with the weights streamed (block_k = 64),
    which here runs (the refusing stand-in only refuses resident weights), on Triton's default
    stages: on `_stream_stages`' it counts more on chip than the refused plan."""
    seen = []
    real = pg.grid_forward

    def launcher(*args, block_k, **kwargs):
        seen.append(block_k)
        if block_k == 0:
            raise OutOfResources(300000, 232448, "shared memory")
        return real(*args, block_k=block_k, **kwargs)

    monkeypatch.setattr(pg, "grid_forward", launcher)
    with pytest.warns(RuntimeWarning, match=r"persistent_grid forward kernel \(16 x 16 tiles, "
                      r"weights resident\).*running persistent_grid \(16 x 16 tiles, weights "
                      r"streamed/64\)"):
        compare_with_torch("gru", L=1, lengths="varlen", I=4, H=200, T=3, backend="triton",
                           **FP32)
    assert seen == [0, 64]


def test_when_nothing_smaller_is_left_the_error_names_the_last_plan(backend, monkeypatch):
    # LSTM H=17: the CTA -> the resident grid (16 x 16 tiles, 2 KiB of weights per program,
    # less than any streamed layout) -> nothing smaller: Triton's error, with a note.
    calls = {}
    _refuse(monkeypatch, pc, "cta_backward", calls)
    _refuse(monkeypatch, pg, "grid_backward", calls)
    with (pytest.raises(OutOfResources) as info,
          pytest.warns(RuntimeWarning, match="running persistent_grid")):
        compare_with_torch("lstm", L=1, lengths="varlen", I=4, H=17, T=5, backend="triton",
                           **FP32)
    assert info.value.__notes__ == [
        "tritonrnn: the persistent_grid backward kernel (16 x 16 tiles, weights resident) for "
        "lstm H=17 torch.float32 B=4: no smaller plan is left"]
    assert calls == {"cta_backward": 1, "grid_backward": 1}


def test_a_plan_forced_by_plan_constraints_is_not_replaced(backend, monkeypatch):
    calls = {}
    _refuse(monkeypatch, pc, "cta_backward", calls)
    with (warnings.catch_warnings(), pytest.raises(OutOfResources) as info,
          plan_constraints(family="persistent_cta")):
        warnings.simplefilter("error")
        compare_with_torch("lstm", L=1, lengths="varlen", I=4, H=17, T=5, backend="triton",
                           **FP32)
    assert any("forced by plan_constraints" in n for n in info.value.__notes__)
    assert calls == {"cta_backward": 1} and backend._smaller == {}


def test_a_forced_plan_runs_even_where_a_replacement_was_kept_for_it(backend, monkeypatch):
    """A plan refused without constraints is replaced for later calls; forced with
    plan_constraints afterwards, it is launched again (and its error raised), not swapped
    for the kept replacement: a forced plan is the plan that runs or fails."""
    calls = {}
    _refuse(monkeypatch, pc, "cta_backward", calls)
    case = dict(L=1, lengths="varlen", I=4, H=17, T=5, backend="triton", **FP32)
    with pytest.warns(RuntimeWarning, match="running persistent_grid"):
        compare_with_torch("lstm", **case)
    assert calls == {"cta_backward": 1} and len(backend._smaller) == 1
    with (warnings.catch_warnings(), pytest.raises(OutOfResources) as info,
          plan_constraints(family="persistent_cta")):
        warnings.simplefilter("error")
        compare_with_torch("lstm", **case)
    assert any("forced by plan_constraints" in n for n in info.value.__notes__)
    assert calls == {"cta_backward": 2}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_gpu_refused_launches_fall_back_to_a_plan_that_fits(backend, monkeypatch, mode):
    """On a GPU, Triton's own refusal: the planner is told the device has 1 MiB of shared
    memory per program, so it keeps R of H=256 on chip in one persistent CTA (4H x H bf16 =
    512 KiB for LSTM, GRU's three gates 384 KiB: over any GPU's 227 KiB); the launches are
    refused and smaller plans run. Their error against float64 (scaled by max(1, |ref|))
    stays within 4 unit roundoffs of bf16, test_half_precision_on_gpu's floor."""
    real = tb.device_properties(torch.device("cuda"))
    big = dataclasses.replace(real, name=real.name + " (1 MiB planned)",
                              smem_per_program=1 << 20)
    monkeypatch.setattr(tb, "device_properties", lambda device=None: big)
    monkeypatch.setattr(planner, "_cta_fits", lambda *args: True)
    lp, _ = recurrence_choice(mode, 256, 256, 0, torch.bfloat16, 16, big)
    assert lp.family == "persistent_cta" and lp.onchip_bytes > real.smem_per_program
    with pytest.warns(RuntimeWarning, match=r"persistent_cta forward kernel"):
        errs, _ = compare_with_torch(mode, L=1, lengths="varlen", I=32, H=256, T=16,
                                     backend="triton", dtype=torch.bfloat16, device="cuda",
                                     check=False)
    assert max(errs.values()) <= 4 * 2.0**-8, errs
    refused = {key[0] for key in backend._smaller if key[-1].family == "persistent_cta"}
    assert refused == {"forward", "backward"}, backend._smaller


@pytest.mark.parametrize("one", [False, True], ids=["two-barriers", "one-barrier"])
def test_a_refused_split_k_backward_runs_the_familys_own(backend, monkeypatch, one):
    """The split-K backward that a switch gives the plan (LSTM H=96: the persistent grid),
    refused -> the same plan on the grid's own backward (its forward unchanged), kept for the
    shape; the layer matches the oracle."""
    from tritonrnn.kernels import split_k

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1" if one else "_BWD_SPLIT_K", True)
    calls = {}
    _refuse(monkeypatch, split_k, "split_k_backward", calls)
    _count(monkeypatch, pg, "grid_backward", calls)
    _count(monkeypatch, pg, "grid_forward", calls)
    form = "one barrier" if one else "two barriers"
    case = dict(L=1, lengths="varlen", I=4, H=96, T=4, backend="triton", **FP32)
    with pytest.warns(RuntimeWarning, match=rf"the persistent_grid backward kernel \(16 x 16 "
                      rf"tiles, weights resident, split-K backward \({form}\)\) for lstm H=96 "
                      rf".*running persistent_grid \(16 x 16 tiles, weights resident\)"):
        compare_with_torch("lstm", **case)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare_with_torch("lstm", seed=3, **case)
    assert calls == {"split_k_backward": 1, "grid_backward": 2, "grid_forward": 2}
    lp, _ = recurrence_choice("lstm", 96, 96, 0, torch.float32, 4, PRESETS["interpreter"])
    assert lp.split_k_bwd == (1 if one else 2)
    with monkeypatch.context() as m:
        m.setattr(split_k, "_BWD_SPLIT_K1", False)
        m.setattr(split_k, "_BWD_SPLIT_K", False)
        plain, _ = recurrence_choice("lstm", 96, 96, 0, torch.float32, 4,
                                     PRESETS["interpreter"])
    assert plain.split_k_bwd == 0
    assert smaller_choice(lp, "lstm", 96, 96, 0, torch.float32, 4,
                          PRESETS["interpreter"]) == plain


def test_the_layer_pipeline_counts_the_programs_of_a_replacement(backend):
    """The pipeline keeps W layers in flight only where W launches' programs fit the SMs
    together (`pipeline.concurrent_layers`, the bound that rules out a barrier deadlock). It
    must count the plan that runs, in each pass: here the refused persistent CTA (32
    programs, W = 4) runs as a persistent grid of 128 programs, so W = 1 on 132 SMs in the
    pass that runs it."""
    from types import SimpleNamespace

    from tritonrnn.rnn import pipeline
    from tritonrnn.rnn.config import make_config

    cfg = make_config(rnn_mode="lstm", num_layers=4, num_units=128, input_size=128)
    B, dtype, cpu = 512, torch.bfloat16, torch.device("cpu")
    R = torch.empty(4 * 128, 128, dtype=dtype)
    info = SimpleNamespace(B=B, max_len=1024)
    sms = backend.properties(cpu).sm_count

    def width(backward: bool = False) -> int:
        with plan_constraints(pipeline_chunks=8):
            d = pipeline.decide(cfg, info.B, info.max_len, cpu, dtype=dtype, backend=backend)
        return d.backward_width if backward else d.width

    planned = backend._choice("lstm", R, None, B, 1, "forward")[0]
    assert planned.family == "persistent_cta"
    assert width() == width(backward=True) == sms // planned.num_programs == 4

    def launch(lp):
        if lp.family == "persistent_cta":
            raise OutOfResources(300000, 232448, "shared memory")

    with pytest.warns(RuntimeWarning, match="needs more than this device has"):
        backend._run("forward", backend._choice("lstm", R, None, B, 1, "forward"), launch)
    runs = backend._choice("lstm", R, None, B, 1, "forward")[0]
    assert runs.family == "persistent_grid" and runs.num_programs > sms // 2
    assert (width(), width(backward=True)) == (1, 4)  # (the backward's plan still the CTA)
    # The backward's plan replaced alone bounds the backward's W, not the forward's.
    backend._smaller.clear()
    with pytest.warns(RuntimeWarning, match="needs more than this device has"):
        backend._run("backward", backend._choice("lstm", R, None, B, 1, "backward"), launch)
    assert (width(), width(backward=True)) == (4, 1)


def test_a_bench_report_names_the_plan_that_ran(backend, monkeypatch):
    """A bench record's plan is the planner's; where the device refused a pass's kernel, it
    also names the plan that ran and was timed instead (`plan.replaced`)."""
    from tritonrnn.bench import harness, roofline
    from tritonrnn.bench.presets import BenchShape
    from tritonrnn.bench.timing import TimingConfig

    calls, real = {}, pc.cta_backward
    _refuse(monkeypatch, pc, "cta_backward", calls)
    shape = BenchShape(mode="lstm", hidden=16, batch=3, time=4, dtype="float32")
    opts = harness.BenchOptions(device=torch.device("cpu"), passes=("bwd",),
                                impls=("tritonrnn",), timing=TimingConfig(cpu_rep=1))
    ceilings = roofline.Ceilings("cpu", 1e9, {"float32": 1e9})
    with pytest.warns(RuntimeWarning, match="running persistent_grid"):
        record = harness.run_shape(shape, opts, ceilings)
    assert calls["cta_backward"] == 1
    assert record["plan"]["recurrence"]["family"] == CTA  # planned
    [replaced] = record["plan"]["replaced"]
    assert replaced["pass"] == "backward" and replaced["refused"]["family"] == CTA
    assert replaced["ran"]["family"] == GRID and replaced["ran"]["block_h"] > 0
    assert "persistent_cta (block_b=16) refused by the device, ran persistent_grid (" in (
        replaced["summary"])
    assert all(r["status"] == "ok" for r in record["runs"]), record["runs"]
    # Another shape's record names no replacement (the CTA's backward accepted again).
    monkeypatch.setattr(pc, "cta_backward", real)
    other = harness.run_shape(BenchShape(mode="gru", hidden=16, batch=3, time=4,
                                         dtype="float32"), opts, ceilings)
    assert "replaced" not in other["plan"]
