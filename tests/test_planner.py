"""The planner on faked device properties: family rule, caching, constraints, tuning cache."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest
import torch

from tritonrnn.kernels import grid_tiles as gt
from tritonrnn.kernels import persistent_grid as pg
from tritonrnn.rnn import reserve as reserve_mod
from tritonrnn.rnn.planner import (
    PRESETS,
    candidates,
    kernels_fingerprint,
    load_tuning_cache,
    plan_constraints,
    plan_for,
    sources_fingerprint,
    store_tuning_entry,
    tuning_cache_path,
    write_json_atomic,
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))


def _plan(mode="lstm", H=64, B=16, T=1024, dtype=torch.bfloat16, device="h100", **kw):
    return plan_for(rnn_mode=mode, input_size=H, num_units=H, batch=B, max_time=T, dtype=dtype,
                    device_properties=device, **kw)


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_family_rule_on_hopper(device):
    assert _plan(H=64, device=device).layer(0).family == "persistent_cta"
    assert _plan(H=768, device=device).layer(0).family == "persistent_grid"
    assert _plan(mode="gru", H=1024, device=device).layer(0).family == "persistent_grid"
    # Beyond what fits on chip the grid streams its weights (chunks of 64 columns per step).
    big = _plan(H=8192, device=device).layer(0)
    assert (big.family, big.block_k) == ("persistent_grid", 64)
    # A grid that cannot be co-resident even with the largest tiles: stepwise, streamed.
    huge = _plan(H=8192, B=8192, device=device).layer(0)
    assert (huge.family, huge.block_k) == ("stepwise", 64)
    assert _plan(H=64, dtype=torch.float64, device=device).layer(0).family == "reference"


@pytest.mark.parametrize("mode,H", [("lstm", 768), ("lstm", 1024), ("gru", 1024), ("gru", 1536)])
def test_reach_with_weights_resident_on_h100(mode, H):
    # The issue's reach: LSTM to H = 1024 and GRU to 1536 in bf16 with R fully on chip (the
    # reduction split 1024 + 512 is what lets GRU 1536 fit), grid co-resident, at B = 16.
    lp = _plan(mode=mode, H=H, B=16).layer(0)
    assert (lp.family, lp.block_k) == ("persistent_grid", 0), lp
    assert lp.num_programs <= PRESETS["h100"].sm_count
    assert lp.onchip_bytes <= PRESETS["h100"].smem_per_program


def test_explain_names_no_tiles_for_the_reference_family():
    text = _plan(H=64, dtype=torch.float64).explain()
    line = next(t for t in text.splitlines() if "layer 0 dir 0" in t)
    assert "reference" in line and "no kernel" in line
    assert "block_b" not in line and "warps" not in line and "weights" not in line


# The backward's gate operands loaded ahead (PAIRG, `grid_pairs_gates`, the default) where
# their larger footprint fits the device's budget, the gates apart where it does not: against
# the gates always apart (TRITONRNN_BWD_PAIRED_GATES=off), it changes no plan's family, tiles
# or warps, only pair_gates and onchip_bytes.
@pytest.mark.parametrize("device, paired, apart", [
    ("h100", [("lstm", 768, 147456), ("lstm", 1024, 196608), ("gru", 1024, 163840)],
     [("gru", 1536, 196608)]),  # paired it would need 245760 B
    ("a100", [("lstm", 768, 147456), ("lstm", 512, 98304)], [("gru", 1024, 131072)]),
])
def test_paired_gates_only_within_the_budget(request, device, paired, apart):
    from tritonrnn.rnn import planner

    request.getfixturevalue("no_split_k_rule")  # (LSTM H=1024 B=16: the grid's backward)

    def tiles(lp):
        return lp.family, lp.block_h, lp.block_b, lp.block_k, lp.num_warps, lp.backward_warps

    shapes = [(mode, H, B) for mode in ("lstm", "gru", "rnn_tanh")
              for H in (256, 512, 768, 1024, 1536) for B in (1, 16, 64)]
    on = {s: _plan(mode=s[0], H=s[1], B=s[2], device=device).layer(0) for s in shapes}
    assert "backward gates paired" in _plan(H=768, device=device).explain()
    request.getfixturevalue("gates_apart")
    budget = planner._smem_budget(PRESETS[device])
    off = {s: _plan(mode=s[0], H=s[1], B=s[2], device=device).layer(0) for s in shapes}
    assert not any(lp.pair_gates for lp in off.values())
    assert "backward gates paired" not in _plan(H=768, device=device).explain()
    for s in shapes:
        assert tiles(on[s]) == tiles(off[s]), s
        if on[s].pair_gates:
            assert off[s].onchip_bytes <= on[s].onchip_bytes <= budget, s
        else:
            assert on[s].onchip_bytes == off[s].onchip_bytes, s
    for mode, H, onchip in paired + apart:
        lp = on[(mode, H, 16)]
        assert (lp.family, lp.block_k, lp.onchip_bytes) == ("persistent_grid", 0, onchip), lp
        assert lp.pair_gates == ((mode, H, onchip) in paired), lp


# PAIRG on 16 x 32 tiles (TRITONRNN_BWD_PAIRED_GATES_WIDE, opt-in) within the budget too:
def test_a_switch_set_in_process_reaches_the_heuristics_cached_plans(monkeypatch):
    """The heuristic's cache is keyed by the kernel switches (`_switch_state`): a switch set
    in-process after a plan was cached gives the switch's plan, with no cache emptied by
    hand (rnn_tanh H=768 B=64 pairs its backward's gates under the opt-in wide switch)."""
    from tritonrnn.kernels import grid_tiles
    from tritonrnn.rnn import planner

    args = ("rnn_tanh", 768, 768, 0, torch.bfloat16, 64, PRESETS["h100"])
    assert not planner._heuristic(*args).pair_gates
    monkeypatch.setattr(grid_tiles, "_BWD_PAIRED_GATES_WIDE", True)
    assert planner._heuristic(*args).pair_gates
    assert planner.recurrence_choice(*args)[0].pair_gates
    monkeypatch.setattr(grid_tiles, "_BWD_PAIRED_GATES_WIDE", False)
    assert not planner._heuristic(*args).pair_gates


# LSTM / GRU H=768 B=64 pair their gates on an H100 (sm_90 compiles, Triton 3.6: 30 / 26 ->
# 18 BAR.SYNC per backward step, no spills), H=1024 B=64 would need 262144 / 229376 B and
# keeps them apart; no plan's tiles or warps change.
def test_wide_paired_gates_only_within_the_budget(request, monkeypatch):
    # The switch's subject is a 16 x 32 backward: at H=768 B=64 the planner's is 32 x 16
    # (`_taller_backward`), kept on the forward's tiles here.
    from tritonrnn.rnn import planner

    def fresh() -> None:  # the caches' keys do not hold the patch
        planner.clear_plan_caches()

    monkeypatch.setattr(planner, "_taller_backward", lambda lp, *_a: lp)
    fresh()
    request.addfinalizer(fresh)
    shapes = [(mode, H, B) for mode in ("lstm", "gru") for H in (512, 768, 1024)
              for B in (32, 64)]
    off = {s: _plan(mode=s[0], H=s[1], B=s[2]).layer(0) for s in shapes}
    request.getfixturevalue("paired_gates_wide")
    on = {s: _plan(mode=s[0], H=s[1], B=s[2]).layer(0) for s in shapes}
    for s in shapes:
        a, b = off[s], on[s]
        assert (a.family, a.block_h, a.block_b, a.block_k, a.num_warps, a.backward_warps) == (
            b.family, b.block_h, b.block_b, b.block_k, b.num_warps, b.backward_warps), s
        if b.block_b == 32 and not a.pair_gates:
            assert b.pair_gates == (s in (("lstm", 768, 64), ("gru", 768, 64))), (s, b)
    assert (on[("lstm", 768, 64)].onchip_bytes, on[("gru", 768, 64)].onchip_bytes) == (
        196608, 172032)
    assert not on[("lstm", 1024, 64)].pair_gates and not on[("gru", 1024, 64)].pair_gates


@pytest.mark.parametrize("mode,H,B", [("lstm", 128, 16), ("lstm", 512, 16), ("gru", 768, 16),
                                      ("rnn_tanh", 512, 64), ("lstm", 512, 1)])
def test_float32_streams_its_mma_tile_weights(mode, H, B):
    # fp32 dots run on the FMA units, which load a resident chunk's whole reduction per
    # thread and spill (`_weight_layouts`): the MMA-tile plans stream fp32 weights in chunks
    # of 64 where bf16 keeps them resident; the vector tiles (B = 1) keep theirs in registers.
    half = _plan(mode=mode, H=H, B=B).layer(0)
    lp = _plan(mode=mode, H=H, B=B, dtype=torch.float32).layer(0)
    assert half.block_k == 0 and lp.family == "persistent_grid"
    assert lp.block_k == (0 if B == 1 else 64), lp
    assert lp.num_programs <= PRESETS["h100"].sm_count
    with plan_constraints(family="stepwise"):
        assert _plan(mode=mode, H=H, B=16, dtype=torch.float32).layer(0).block_k == 64
    with plan_constraints(family="persistent_grid", block_k=0):  # still reachable
        assert _plan(mode=mode, H=H, B=16, dtype=torch.float32).layer(0).block_k == 0
    # The persistent CTA keeps its resident fp32 weights.
    assert _plan(mode=mode, H=64, B=B, dtype=torch.float32).layer(0).family == "persistent_cta"
    # The interpreter's fp32 dots are its bf16 dots (no FMA lowering): there fp32 keeps its
    # weights resident as a GPU's bf16 does, so CI checks that path to fp32 accuracy.
    if B > 1:  # (no vector tiles on the interpreter preset)
        interp = _plan(mode=mode, H=H, B=B, dtype=torch.float32, device="interpreter").layer(0)
        assert (interp.family, interp.block_h, interp.block_b, interp.block_k) == (
            lp.family, lp.block_h, lp.block_b, 0)


@pytest.mark.parametrize("mode,H", [("lstm", 1536), ("gru", 2048)])
def test_float32_stepwise_slices_stay_narrow(mode, H):
    # fp32 at B = 256: too large for a co-resident grid, stepwise, streamed. Its FMA dots
    # spill with 64-unit hidden slices (`_stepwise_fit`): slices of 32 there; bf16 and the
    # interpreter's fp32 (forced stepwise) keep 64.
    lp = _plan(mode=mode, H=H, B=256, dtype=torch.float32).layer(0)
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k) == ("stepwise", 32, 64, 64), lp
    with plan_constraints(family="stepwise"):
        half = _plan(mode=mode, H=H, B=256).layer(0)
        interp = _plan(mode=mode, H=H, B=256, dtype=torch.float32, device="interpreter")
    assert half.block_h == interp.layer(0).block_h == 64, half


def test_bidirectional_pair_launch_counts_both_directions():
    # LSTM H=768 B=16: 48 programs per direction, 96 together <= 132 SMs: one pair launch.
    p = _plan(H=768, B=16, direction="bidirectional")
    lp = p.layer(0, 1)
    assert (lp.family, lp.num_dirs, lp.num_programs) == ("persistent_grid", 2, 96)
    assert p.key.endswith("|D2") and "(pair launch)" in p.explain()
    # LSTM H=1024 B=16 needs 64 per direction: 128 together still fit.
    assert _plan(H=1024, B=16, direction="bidirectional").layer(0).num_dirs == 2
    # GRU H=1536 B=16: 96 per direction, 192 together do not fit: each direction alone, so
    # each direction's backward is the split-K rule's (108 programs; `_split_k_rule`).
    lp = _plan(mode="gru", H=1536, B=16, direction="bidirectional").layer(0)
    assert (lp.family, lp.num_dirs, lp.forward_programs, lp.num_programs, lp.split_k_bwd) == (
        "persistent_grid", 1, 96, 108, 2)
    # Forced tiles: the pair when it fits, else one launch per direction, never an error.
    with plan_constraints(family="persistent_grid", block_h=16):
        assert _plan(H=1024, B=16, direction="bidirectional").layer(0).num_dirs == 2
        assert _plan(H=1536, B=16, direction="bidirectional").layer(0).num_dirs == 1
    # CTA and stepwise pairs need no co-residency.
    assert _plan(H=64, direction="bidirectional").layer(0).num_dirs == 2


def test_block_k_constraint():
    with plan_constraints(family="persistent_grid", block_k=128):
        lp = _plan(H=768).layer(0)
    assert (lp.family, lp.block_k) == ("persistent_grid", 128)
    with plan_constraints(block_k=0):
        assert _plan(H=768).layer(0).block_k == 0
    for bad in (48, 8):  # not a power of two; a power of two below 16 (tl.dot's minimum)
        with pytest.raises(ValueError, match=rf"block_k expected 0 .* got {bad}"), \
                plan_constraints(block_k=bad):
            pass


def test_grid_plans_are_co_resident_and_fit():
    for H in (256, 512, 768, 1024):
        lp = _plan(H=H).layer(0)
        if lp.family == "persistent_grid":
            assert lp.num_programs <= PRESETS["h100"].sm_count
            assert lp.onchip_bytes <= PRESETS["h100"].smem_per_program


# Devices beside the H100 and H200: the A100 (108 SMs, 163 KiB per program), a small one and
# a tiny one, where few of the H100's tiles fit.
_OTHER_DEVICES = (
    PRESETS["a100"],
    dataclasses.replace(PRESETS["h100"], name="small", sm_count=20, smem_per_program=99 * 1024),
    dataclasses.replace(PRESETS["h100"], name="tiny", sm_count=2, smem_per_program=48 * 1024,
                        regs_per_sm=32768),
)


@pytest.mark.parametrize("seed", range(4))
def test_random_configurations_always_plan_within_the_device(seed):
    # "Beyond what fits, the planner picks the fastest remaining option and never fails": drawn
    # stacks (cells, sizes 1..8192, projections, layers, directions, batches 1..4096, dtypes,
    # dropout) on the presets and smaller devices always get a plan, every grid plan is
    # co-resident and within the shared memory, every CTA plan's weights within it too.
    from tritonrnn.kernels.persistent_cta import cta_onchip_parts

    rng = random.Random(seed)
    devices = [PRESETS["h100"], PRESETS["h200"], PRESETS["interpreter"], *_OTHER_DEVICES]
    families = set()
    for _ in range(250):
        mode = rng.choice(["lstm", "gru", "rnn_tanh", "rnn_relu"])
        H = rng.choice([1, 7, 16, 33, 100, 128, 255, 256, 512, 768, 1024, 1536, 2048, 4096, 8192])
        P = rng.choice([0, 0, 1, H // 2, H // 3]) if mode == "lstm" else 0
        P = P if 0 < P < H else 0
        props = rng.choice(devices)
        dtype = rng.choice([torch.bfloat16, torch.float16, torch.float32])
        layers = rng.choice([1, 2, 3])
        plan = plan_for(
            rnn_mode=mode, input_size=rng.choice([1, H, 3 * H + 1]), num_units=H,
            num_layers=layers, direction=rng.choice(["unidirectional", "bidirectional"]),
            num_proj=P, batch=rng.choice([1, 2, 3, 15, 16, 17, 64, 65, 256, 1024, 4096]),
            max_time=rng.choice([1, 2, 100, 1024]), dtype=dtype, device_properties=props,
            dropout=rng.choice([0.0, 0.3]),
        )
        for layer in range(layers):
            lp = plan.layer(layer)
            families.add(lp.family)
            where = (mode, H, P, dtype, props.name, lp)
            if lp.family == "persistent_grid":
                assert lp.num_programs <= props.sm_count, where
                assert lp.onchip_bytes <= props.smem_per_program, where
            elif lp.family == "persistent_cta":
                parts = cta_onchip_parts(mode, H, P or H, P, dtype, lp.block_b)
                assert parts.smem <= props.smem_per_program, where
            else:
                assert lp.family == "stepwise", where
                # On a GPU within the shared memory, or the family's floor (16 x 16 tiles,
                # streamed: `smaller_choice`'s last resort; where even that exceeds the
                # device, as on "tiny", its launch reports Triton's OutOfResources).
                assert props.interpreter or lp.onchip_bytes <= props.smem_per_program or (
                    lp.block_h, lp.block_b, lp.block_k) == (16, 16, 64), where
        assert plan.explain()
    assert families == {"persistent_cta", "persistent_grid", "stepwise"}


@pytest.mark.parametrize("mode,H,B,old", [
    ("gru", 1536, 1024, (16, 16)), ("lstm", 1024, 4096, (16, 64)), ("lstm", 768, 2048, (32, 16)),
    ("rnn_tanh", 2048, 1024, (32, 32)),
])
def test_stepwise_tiles_read_the_fewest_bytes(mode, H, B, old):
    # A stepwise launch runs one step, so a resident weight slice is read from L2 once per
    # launch, as a streamed one is: residency must not buy small tiles, which multiply the
    # bytes (`_stepwise_traffic`). These shapes took the first resident tile that fit, `old`
    # (block_h, block_b), before the rule; 64 x 64 streamed tiles read half the bytes or less.
    from tritonrnn.rnn.config import GATES
    from tritonrnn.rnn.planner import _stepwise_traffic

    lp = _plan(mode=mode, H=H, B=B).layer(0)
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k) == ("stepwise", 64, 64, 64), lp
    assert _stepwise_traffic(GATES[mode], *old) >= 2 * _stepwise_traffic(GATES[mode], 64, 64)
    # Where the 64 x 64 slice fits on chip, its chunks' operands small (256 + 256 columns,
    # `resident_operands_fit`), it stays resident (equal bytes: resident first).
    lp = _plan(mode="rnn_tanh", H=512, B=4096).layer(0)
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k) == ("stepwise", 64, 64, 0), lp
    # On a device with less shared memory (an A100's 108 SMs and 163 KiB) likewise.
    lp = _plan(mode=mode, H=H, B=B, device=_OTHER_DEVICES[0]).layer(0)
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k) == ("stepwise", 64, 64, 64), lp


@pytest.mark.parametrize("why,mode,H,B,direction,tiles", [
    # The first co-resident tiles would hold chunks whose dot operands [chunk, block_b] spill
    # (`kernels.grid_tiles.resident_operands_fit`; they were these shapes' resident
    # plans): the grid streams the weights instead of keeping them resident elsewhere.
    ("chunks", "rnn_tanh", 1536, 64, "unidirectional", (16, 64, 64)),
    ("chunks", "lstm", 768, 128, "unidirectional", (16, 64, 64)),
    ("chunks", "gru", 768, 256, "unidirectional", (32, 64, 64)),
    # The pair's 16 x 64 tiles would hold 512-column chunks: each direction alone, resident.
    ("chunks", "lstm", 768, 64, "bidirectional", (16, 32, 0)),
    # Resident, these held 32 x 64 / 64 x 64 / 128 x 64 tiles whose chunks pass that rule but
    # whose sm_90 compiles spill in the step loop (`planner._RESIDENT_TILE`): the same tiles
    # streamed, or a pair launch's streamed tiles.
    ("tile", "lstm", 512, 512, "unidirectional", (32, 64, 64)),
    ("tile", "lstm", 256, 1024, "unidirectional", (32, 64, 64)),
    ("tile", "gru", 384, 1024, "unidirectional", (64, 64, 64)),
    ("tile", "rnn_tanh", 512, 1024, "unidirectional", (64, 64, 64)),
    ("tile", "rnn_tanh", 384, 1024, "bidirectional", (64, 128, 64)),
])
def test_wide_resident_weights_stream_instead(why, mode, H, B, direction, tiles):
    from tritonrnn.kernels.grid_tiles import resident_operands_fit
    from tritonrnn.rnn.planner import _RESIDENT_TILE

    lp = _plan(mode=mode, H=H, B=B, direction=direction).layer(0)
    assert lp.family == "persistent_grid" and (lp.block_h, lp.block_b, lp.block_k) == tiles, lp
    assert resident_operands_fit(H, H, 64) == (why == "tile")
    assert lp.num_programs <= PRESETS["h100"].sm_count
    # No persistent-grid plan of the shape keeps tiles wider than the rule's resident.
    for b in (256, 512, 1024):
        for d in ("unidirectional", "bidirectional"):
            lp = _plan(mode=mode, H=H, B=b, direction=d).layer(0)
            assert lp.family != "persistent_grid" or lp.block_k or (
                lp.block_h * lp.block_b <= _RESIDENT_TILE), (b, d, lp)


@pytest.mark.parametrize("mode,H,B,direction,programs", [
    ("lstm", 1024, 1024, "unidirectional", 128), ("lstm", 768, 1024, "unidirectional", 96),
    ("gru", 1536, 512, "unidirectional", 96), ("rnn_tanh", 1024, 1024, "unidirectional", 128),
    ("lstm", 1024, 512, "bidirectional", 128),  # a pair launch
])
def test_streamed_grid_takes_64_wide_slices_of_128_batch_columns(mode, H, B, direction,
                                                                 programs):
    # Where the streamed grid needs as few programs as 128 x 64 tiles give, it runs 64 x 128
    # tiles: the same programs, less L2 traffic per step (`planner._grid_batch_tiles`).
    from tritonrnn.rnn.planner import _grid_batch_tiles

    lp = _plan(mode=mode, H=H, B=B, direction=direction).layer(0)
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k) == (
        "persistent_grid", 64, 128, 64), lp
    assert lp.num_programs == programs <= PRESETS["h100"].sm_count
    # Not with resident weights or float32's FMA dots, and never below 64-unit slices.
    assert _grid_batch_tiles(64, 64, False) == (16, 32, 64, 128)
    assert _grid_batch_tiles(64, 0, False) == _grid_batch_tiles(64, 64, True) == (16, 32, 64)
    assert _grid_batch_tiles(32, 64, False) == _grid_batch_tiles(128, 64, False) == (16, 32, 64)
    # Where 64 x 64 tiles are co-resident they stay.
    lp = _plan(mode=mode, H=H, B=B // 2).layer(0)
    assert (lp.block_h, lp.block_b) != (64, 128), lp


def test_small_shared_memory_device_falls_back():
    tiny = dataclasses.replace(PRESETS["h100"], name="tiny", smem_per_program=4096, sm_count=4)
    lp = _plan(H=256, device=tiny).layer(0)
    assert lp.family == "stepwise"


def test_plans_are_cached_and_bucketed():
    a = _plan(B=13, T=1000)
    assert _plan(B=13, T=1000) is a
    b = _plan(B=15, T=1020)
    assert a.key == b.key and a.layers == b.layers  # same bucket: same kernel choice
    assert _plan(B=100, T=1000).key != a.key


def test_reserve_and_buffers_in_plan():
    p = _plan(H=32, B=4, T=10, num_layers=3, direction="bidirectional")
    N, D, L, H = 40, 2, 3, 32
    assert p.reserve_bytes == reserve_mod.PAYLOAD_OFFSET + 2 * N * D * (L * H + (L - 1) * H)
    assert p.peak_bytes > p.reserve_bytes
    text = p.explain()
    for word in ("reserve.c_seq", "dpre_x", "persistent_cta", "layer 2 dir 1", "peak"):
        assert word in text


@pytest.mark.parametrize("check", ["deferred", "sync"])
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_backward_buffers_hold_only_what_the_cell_reads(monkeypatch, mode, check):
    """tanh / relu read no recomputed pre-activation (their derivatives follow from y): their
    plans list neither pre_x nor pre_h. LSTM / GRU write their pre-activation gradients over
    the pre-activations (dpre_x over pre_x, GRU's dpre_h over pre_h), except where a timed-out
    launch is rerun stepwise (TRITONRNN_BARRIER_CHECK=sync)."""
    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", check)
    p = _plan(mode=mode, H=256, B=16, T=64)
    names = {b.name for b in p.buffers if b.phase == "backward"}
    N, H, G, item = 16 * 64, 256, {"lstm": 4, "gru": 3}.get(mode, 1), 2
    bwd = sum(b.nbytes for b in p.buffers if b.phase == "backward")
    # h_prev, the dx / dy buffer ([N, H] each), LSTM's c_prev [N, H], then the pre-activations
    # and their gradients ([N, G*H] each).
    rest = (2 + (mode == "lstm")) * N * H * item
    want = {
        ("lstm", "deferred"): ({"pre_x / dpre_x", "pre_h"}, 2),
        ("lstm", "sync"): ({"pre_x", "pre_h", "dpre_x"}, 3),
        ("gru", "deferred"): ({"pre_x / dpre_x", "pre_h / dpre_h"}, 2),
        ("gru", "sync"): ({"pre_x", "pre_h", "dpre_x", "dpre_h"}, 4),
    }.get((mode, check), ({"dpre_x"}, 1))
    assert {n for n in names if "pre_" in n} == want[0]
    assert bwd == rest + want[1] * N * G * H * item


def test_dropout_enters_the_pipelined_buffers():
    kw = dict(mode="rnn_tanh", H=32, B=4, T=64, num_layers=3, device="h100")
    with plan_constraints(pipeline_chunks=2):
        dry, wet = _plan(**kw), _plan(**kw, dropout=0.25)
    extra = {(b.phase, b.name) for b in wet.buffers} - {(b.phase, b.name) for b in dry.buffers}
    assert extra == {("forward", "dropped"), ("backward", "dropped"),
                     ("backward", "pipeline.dropped")}
    assert wet.peak_bytes > dry.peak_bytes
    with pytest.raises(ValueError, match=r"dropout: expected a float in \[0, 1\), got 1.5"):
        _plan(dropout=1.5)


def test_constraints_force_each_family():
    for family in ("persistent_cta", "persistent_grid", "stepwise", "reference"):
        with plan_constraints(family=family):
            p = _plan(H=64)
        assert p.layer(0).family == family and p.source == "constrained"
    with plan_constraints(family="stepwise", block_h=32, num_warps=8):
        lp = _plan(H=64).layer(0)
    assert (lp.block_h, lp.num_warps) == (32, 8)
    assert _plan(H=64).layer(0).family == "persistent_cta"  # restored after the block


@pytest.mark.parametrize("mode,H,B,fwd,bwd", [
    # 16 x 16 tiles: each pass 8 warps where its weights stay in registers on 8 warps
    # (<= 512 B per thread) and not on 4 (<= 256 B), else 4
    ("lstm", 768, 16, 8, 8), ("gru", 1024, 16, 8, 8),
    ("lstm", 512, 16, 8, 8), ("lstm", 1024, 16, 8, 8),
    ("gru", 512, 16, 8, 8), ("lstm", 768, 8, 8, 8),
    ("lstm", 256, 16, 4, 4), ("rnn_tanh", 1024, 16, 4, 4),  # 256 B on 4
    # Too large for registers on 8 warps (576 B per thread), but not their first chunk (384
    # B, `Hoist.FIRST`): GRU H=1536 and H=1408 on 8 in both passes
    ("gru", 1536, 16, 8, 8), ("gru", 1536, 1, 8, 8), ("gru", 1408, 16, 8, 8),
    # Too large for registers on either, the first chunk too (LSTM H=1152 / 1280: 512 B of
    # it): the forward on 4, the backward on 8 unhoisted (on 4 its sm_90 compile spilled in
    # the step loop)
    ("lstm", 1280, 16, 4, 8), ("lstm", 1152, 4, 4, 8),
    # 16 x 32: both passes 8 (the forward's per-gate dots split K 8 ways,
    # `planner._split_k_on_8`)
    ("lstm", 768, 64, 8, 8), ("lstm", 1024, 64, 8, 8),
    ("gru", 1024, 64, 8, 8), ("gru", 768, 64, 8, 8),
    ("rnn_tanh", 1024, 64, 8, 8),
])
def test_persistent_grid_warps_per_pass(mode, H, B, fwd, bwd):
    lp = _plan(mode=mode, H=H, B=B).layer(0)
    assert lp.family == "persistent_grid"
    assert (lp.num_warps, lp.backward_warps) == (fwd, bwd)
    assert lp.num_warps_bwd == (0 if bwd == fwd else bwd)  # 0: the forward's
    assert ("(backward 8)" in _plan(mode=mode, H=H, B=B).explain()) == (bwd == 8 != fwd)
    # 16 x 16 tiles' weights in registers in both passes: on 4 warps up to 256 B, else on 8.
    for p, w in (("fwd", lp.num_warps), ("bwd", lp.backward_warps)):
        hoisted = gt.hoist_pass(p, mode, H, H, 0, torch.bfloat16, lp.block_h, lp.block_b,
                                lp.block_k, w, True)
        too_large = (mode, H) in (("lstm", 1280), ("lstm", 1152))
        assert bool(hoisted) == (lp.block_h == lp.block_b == 16 and not too_large), p
        first = (mode, H) in (("gru", 1536), ("gru", 1408))
        assert (hoisted == gt.Hoist.FIRST) == first, p


@pytest.mark.parametrize("cell, H, P", [("lstm", 768, 0), ("lstm", 768, 384),
                                        ("gru", 1024, 0), ("lstm", 256, 0)])
def test_forward_warps_follow_the_register_weights(cell, H, P):
    """`_persistent_grid_warps` gives a 16 x 16 forward 8 warps exactly where
    `hoist_pass` holds its weights in registers on 8 and not on 4: never with a projection
    (HOIST does not apply), nor with streamed weights, nor without the shape (H = 0)."""
    from tritonrnn.rnn.planner import _persistent_grid_warps

    bf16 = torch.bfloat16

    def hoisted(w, block_k=0):
        return gt.hoist_pass("fwd", cell, H, P or H, P, bf16, 16, 16, block_k, w, True)

    want = 8 if hoisted(8) and not hoisted(4) else 4
    assert want == (8 if (cell, H, P) in (("lstm", 768, 0), ("gru", 1024, 0)) else 4)
    assert _persistent_grid_warps(16, 16, cell, 0, bf16, H, P or H, P) == want
    assert _persistent_grid_warps(16, 16, cell, 0, bf16) == 4  # shape unknown
    assert _persistent_grid_warps(16, 16, cell, 64, bf16, H, P or H, P) == 4  # streamed
    # 16 x 32: 8 for resident weights on MMA dots, whatever the shape or cell
    assert _persistent_grid_warps(16, 32, cell, 0, bf16, H, P or H, P) == 8
    assert _persistent_grid_warps(16, 32, "rnn_tanh", 0, bf16, H, H, 0) == 8
    assert _persistent_grid_warps(16, 32, cell, 64, bf16, H, P or H, P) == 4  # streamed
    assert _persistent_grid_warps(16, 32, cell, 0, torch.float32, H, P or H, P) == 4  # FMA


@pytest.mark.parametrize("mode,H,B,grid,stepwise", [
    ("lstm", 128, 16, (4, 4), (4, 4)), ("gru", 64, 64, (4, 4), (4, 4)),
    ("lstm", 96, 1, (4, 4), (4, 4)),
    # 32 x 16 tiles: the grid's forward on 4 warps, its backward on 8; stepwise 8 for both
    # (a tile of 512)
    ("rnn_tanh", 256, 256, (4, 8), (8, 8)),
])
def test_grid_families_forced_on_a_cta_plan_take_their_own_warps(mode, H, B, grid,
                                                                 stepwise):
    """The CTA's warps are its one program's (8 at these shapes): the grid's kernels forced
    on its plan without num_warps take, for the tiles that run, the persistent grid's rule
    (`_persistent_grid_warps` / `_bwd_warps`) or the stepwise heuristic's (`_grid_warps`,
    both passes) (they kept the CTA's 8), and num_warps forced with the family still wins."""
    from tritonrnn.rnn.planner import (
        _grid_warps,
        _persistent_grid_bwd_warps,
        _persistent_grid_warps,
    )

    base = _plan(mode=mode, H=H, B=B).layer(0)
    assert (base.family, base.num_warps) == ("persistent_cta", 8)
    for family, want in (("persistent_grid", grid), ("stepwise", stepwise)):
        with plan_constraints(family=family):
            lp = _plan(mode=mode, H=H, B=B).layer(0)
        assert lp.family == family and (lp.num_warps, lp.backward_warps) == want, family
        tiles = (lp.block_h, lp.block_b)
        if family == "persistent_grid":
            rule = tuple(f(*tiles, mode, lp.block_k, torch.bfloat16, H, H, 0)
                         for f in (_persistent_grid_warps, _persistent_grid_bwd_warps))
        else:
            rule = (_grid_warps(lp.onchip_bytes, *tiles),) * 2
        assert rule == want, family
        with plan_constraints(family=family, num_warps=8):
            assert _plan(mode=mode, H=H, B=B).layer(0).backward_warps == 8


@pytest.mark.parametrize("env", ["off", "fwd,bwd", "bwd"])
def test_warps_do_not_follow_the_hoist_switch(monkeypatch, env):
    """TRITONRNN_HOIST_WEIGHTS decides the launches' HOIST, not the plan: the anchor's
    passes keep 8 warps (`off`: unhoisted; forcing the passes hoisted does not move them
    back to 4 warps, where their weights spill), and each launch hoists as the switch says."""
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", env)
    lp = _plan(H=768, B=16).layer(0)
    assert (lp.num_warps, lp.backward_warps) == (8, 8)
    for p in ("fwd", "bwd"):
        assert gt.hoist_pass(p, "lstm", 768, 768, 0, torch.bfloat16, 16, 16, 0, 8,
                             True) == (p in env)


def test_forced_tiles_take_their_own_warps():
    """plan_constraints forcing other tiles on a persistent-grid heuristic: the warps rule of
    the tiles that run (the anchor's 16 x 16 tiles on 8 warps, streamed on 4; 16 x 64
    tiles 8 both passes), unless the warps are forced too."""
    assert _plan(H=768, B=16).layer(0).num_warps == 8
    for cons, warps in (({"block_k": 64}, (4, 4)), ({"block_b": 64}, (8, 8)),
                        ({"block_h": 16}, (8, 8)), ({"block_k": 64, "num_warps": 8}, (8, 8))):
        with plan_constraints(**cons):
            lp = _plan(H=768, B=16).layer(0)
        assert (lp.num_warps, lp.backward_warps) == warps, cons


@pytest.mark.parametrize("mode,H,B,cons", [
    # a stepwise heuristic (64 x 64 tiles, 8 warps) retiled to 16 x 16
    ("lstm", 2048, 1024, {"block_h": 16, "block_b": 16}),
    # stepwise 64 x 64 streamed forced on a grid heuristic (step_ablation's sw64)
    ("lstm", 256, 16, {"family": "stepwise", "block_h": 64, "block_b": 64, "block_k": 64}),
    ("rnn_tanh", 1024, 16, {"family": "stepwise", "block_h": 64, "block_b": 64,
                            "block_k": 64}),
    # the grid heuristic's own tiles in the stepwise family
    ("lstm", 1024, 64, {"family": "stepwise"}),
    # vector tiles forced on an MMA heuristic (the README's recipe)
    ("lstm", 256, 2, {"family": "persistent_grid", "block_b": 2, "block_h": 8}),
    ("rnn_tanh", 1024, 2, {"family": "stepwise", "block_b": 2, "block_h": 8}),
], ids=["stepwise-retiled", "sw64-lstm", "sw64-tanh", "grid-to-stepwise", "vector-grid",
        "vector-stepwise"])
def test_forced_tiles_or_family_take_the_warps_of_the_rule_that_runs_them(mode, H, B, cons):
    """Tiles or a family forced without num_warps: the warps the heuristic's rule gives the
    tiles and family that run (stepwise: `_stepwise_plan`'s; vector tiles: _VECTOR_WARPS),
    whichever family the heuristic picked for the shape (they kept the heuristic's where it
    was stepwise, or a grid forced to stepwise, or an MMA plan forced to vector tiles)."""
    from tritonrnn.rnn import planner

    with plan_constraints(**cons):
        lp = _plan(mode=mode, H=H, B=B).layer(0)
    if lp.block_b < 16:
        want = planner._VECTOR_WARPS
    else:
        want = planner._stepwise_plan(mode, H, H, 0, torch.bfloat16, lp.block_b, lp.block_h,
                                      planner._bucket(B), lp.block_k, 1,
                                      planner._smem_budget(PRESETS["h100"])).num_warps
    assert (lp.num_warps, lp.backward_warps) == (want, want), lp
    base = _plan(mode=mode, H=H, B=B).layer(0)
    assert base.num_warps != want or base.family != lp.family or base.block_b != lp.block_b
    with plan_constraints(**cons, num_warps=2):
        assert _plan(mode=mode, H=H, B=B).layer(0).num_warps == 2


def test_warps_constraints_per_pass():
    with plan_constraints(num_warps=4):  # both passes (the rule's: 8 and 8)
        lp = _plan(H=768, B=64).layer(0)
    assert (lp.num_warps, lp.backward_warps) == (4, 4)
    with plan_constraints(num_warps_bwd=2):  # the backward only; the forward's from the rule
        lp = _plan(H=768, B=64).layer(0)
    assert (lp.num_warps, lp.backward_warps) == (8, 2)
    with plan_constraints(num_warps_bwd=2):
        lp = _plan(mode="rnn_tanh", H=768, B=64, dtype=torch.float32).layer(0)
    # float32 on a GPU streams its weights (FMA dots): that forward keeps 4
    assert (lp.block_h, lp.block_b, lp.block_k, lp.num_warps, lp.backward_warps) == (
        16, 32, 64, 4, 2)
    with plan_constraints(num_warps=2, num_warps_bwd=16, family="stepwise"):
        lp = _plan(H=768, B=16).layer(0)
    assert (lp.family, lp.num_warps, lp.backward_warps) == ("stepwise", 2, 16)
    assert _plan(H=768, B=64, device="interpreter").layer(0).backward_warps == 8
    with plan_constraints(family="persistent_cta"):  # from that grid base (no smem check)
        lp = _plan(H=768, B=64, device="interpreter").layer(0)
    assert (lp.family, lp.num_warps, lp.backward_warps) == ("persistent_cta", 8, 8)
    # The CTA's own 8 warps, also on a grid base of 16 x 16 tiles (rnn_tanh H=768: forward
    # and backward 4, their weights in registers on 4); asked, the asked ones.
    tanh = {"mode": "rnn_tanh", "H": 768, "B": 16, "device": "interpreter"}
    lp = _plan(**tanh).layer(0)
    assert (lp.family, lp.num_warps, lp.backward_warps) == ("persistent_grid", 4, 4)
    with plan_constraints(family="persistent_cta"):
        lp = _plan(**tanh).layer(0)
    assert (lp.family, lp.num_warps, lp.backward_warps) == ("persistent_cta", 8, 8)
    with plan_constraints(family="persistent_cta", num_warps=4):
        lp = _plan(**tanh).layer(0)
    assert (lp.family, lp.num_warps, lp.backward_warps) == ("persistent_cta", 4, 4)
    for key, bad in (("num_warps", 3), ("num_warps_bwd", 64), ("num_warps_bwd", 0)):
        with pytest.raises(ValueError, match=rf"plan_constraints: {key} expected"), \
                plan_constraints(**{key: bad}):
            pass


def test_constraints_that_cannot_apply_raise():
    with plan_constraints(family="persistent_cta"), pytest.raises(
        ValueError, match=r"persistent_cta' needs \d+ bytes of shared memory for H=4096"
    ):
        _plan(H=4096)
    with plan_constraints(family="persistent_grid", block_h=16), pytest.raises(
        ValueError, match=r"needs \d+ co-resident programs.*132 SMs"
    ):
        _plan(H=8192)
    with plan_constraints(family="stepwise"), pytest.raises(ValueError, match="float64"):
        _plan(dtype=torch.float64)
    with pytest.raises(ValueError, match=r"expected keys .*got 'tile'"), plan_constraints(tile=3):
        pass
    with pytest.raises(ValueError, match=r"family expected one of.*'fast'"), plan_constraints(
        family="fast"
    ):
        pass
    with pytest.raises(ValueError, match=r"block_b expected 1, 2, 4 .* got 24"), \
            plan_constraints(block_b=24):
        pass
    with pytest.raises(ValueError, match=r"block_b expected 1, 2, 4 .* got 8"), \
            plan_constraints(block_b=8):
        pass
    with pytest.raises(ValueError, match=r"block_h expected a power of two >= 8, got 4"), \
            plan_constraints(block_h=4):
        pass


@pytest.mark.parametrize("mode,H,B,block_h,programs", [
    ("lstm", 512, 1, 8, 64), ("lstm", 768, 1, 8, 96), ("lstm", 1024, 1, 8, 128),
    ("gru", 1024, 1, 8, 128), ("rnn_tanh", 2048, 1, 16, 128),
])
def test_vector_tiles_at_batch_one(mode, H, B, block_h, programs):
    # Batch 1: one batch tile of one row, the smallest co-resident hidden
    # slice from 8 whose weights fit 256 B per thread at 8 warps (rnn_tanh H=2048: block_h 8
    # would be 256 programs; 16 is 128 programs of 64 KiB, 256 B per thread).
    lp = _plan(mode=mode, H=H, B=B).layer(0)
    assert (lp.family, lp.block_b, lp.block_h, lp.block_k) == ("persistent_grid", B, block_h, 0)
    assert (lp.num_programs, lp.num_warps, lp.backward_warps) == (programs, 8, 8)
    assert "vector tiles" in _plan(mode=mode, H=H, B=B).explain()


def test_vector_tiles_fall_back_to_mma_tiles():
    # Buckets 2 and up: MMA tiles. GRU H=1536: block_h 8 needs 192 programs, 16 holds 576 B of
    # weights per thread (the sm_90 compile spills): MMA tiles, weights in shared memory.
    for mode, H, B in (("lstm", 768, 2), ("lstm", 768, 3), ("lstm", 768, 16), ("gru", 1536, 1)):
        lp = _plan(mode=mode, H=H, B=B).layer(0)
        assert (lp.block_b, lp.block_h) == (16, 16), (mode, H, B, lp)
    # A pair launch of vector tiles that does not fit together runs a direction per launch.
    lp = _plan(H=768, B=1, direction="bidirectional").layer(0)
    assert (lp.block_b, lp.num_dirs, lp.num_programs) == (1, 1, 96)
    assert _plan(H=256, B=1, direction="bidirectional").layer(0).num_dirs == 2


def test_vector_tile_constraints():
    # Forcing MMA tiles, streamed weights or the CTA family on a vector-tile heuristic leaves
    # vector tiles (block_b 16, block_h >= 16, the MMA tiles' warps: at H=768 the weights in
    # registers on 8 in both passes); contradictions raise.
    with plan_constraints(block_b=16):
        lp = _plan(H=768, B=1).layer(0)
    assert (lp.block_b, lp.block_h, lp.num_warps, lp.backward_warps) == (16, 16, 8, 8)
    with plan_constraints(block_b=32):  # the MMA tiles' warps rule: 16 x 32 LSTM 8 and 8
        lp = _plan(H=768, B=1).layer(0)
    assert (lp.block_b, lp.num_warps, lp.backward_warps) == (32, 8, 8)
    with plan_constraints(block_b=16, num_warps_bwd=2):
        lp = _plan(H=768, B=1).layer(0)
    assert (lp.num_warps, lp.backward_warps) == (8, 2)
    with plan_constraints(block_k=64):
        assert _plan(H=768, B=1).layer(0).block_b == 16
    with plan_constraints(family="stepwise"):
        lp = _plan(H=768, B=1).layer(0)
    assert (lp.family, lp.block_b, lp.block_h) == ("stepwise", 1, 8)
    with plan_constraints(block_b=4, block_h=8):
        assert (_plan(H=768, B=3).layer(0).block_b, _plan(H=768, B=3).layer(0).block_h) == (4, 8)
    with plan_constraints(block_b=1, block_k=64), pytest.raises(
            ValueError, match=r"block_b = 1 \(vector tiles\) needs resident weights"):
        _plan(H=768, B=1)
    # Vector tiles forced on a heuristic that streams the weights (float32 on a GPU): resident,
    # not the heuristic's block_k, which no vector-tile launch takes.
    for b, B in ((4, 16), (2, 8)):  # 4 batch tiles of 32 hidden slices: 128 programs
        assert _plan(H=512, B=B, dtype=torch.float32).layer(0).block_k == 64
        with plan_constraints(block_b=b):
            lp = _plan(H=512, B=B, dtype=torch.float32).layer(0)
        assert (lp.family, lp.block_b, lp.block_k, lp.num_stages) == (
            "persistent_grid", b, 0, 0)
    with plan_constraints(block_b=2, family="persistent_cta"), pytest.raises(
            ValueError, match=r"family 'persistent_cta'"):
        _plan(H=64, B=2)
    with plan_constraints(block_b=16, block_h=8), pytest.raises(
            ValueError, match=r"block_h = 8 needs vector tiles"):
        _plan(H=768, B=1)


def test_tuning_cache_overrides_heuristic():
    base = _plan(H=128)
    assert base.source == "heuristic"
    choice = {"family": "stepwise", "block_b": 16, "block_h": 32, "num_warps": 8}
    store_tuning_entry(base.key, choice, 1.25, "h100")
    assert tuning_cache_path().exists()
    assert load_tuning_cache()[base.key]["ms"] == 1.25
    tuned = _plan(H=128)
    assert tuned.source == "tuned"
    assert (tuned.layer(0).family, tuned.layer(0).block_h) == ("stepwise", 32)


def test_plans_follow_the_tuning_cache_file_not_the_id_of_its_loaded_dict(monkeypatch):
    """Plans are cached by the tuning file's (mtime, inode, size): a store within one mtime
    tick still changes the plan, and a freed cache dict whose id Python hands to the next
    one does not bring back the plan made from it (both returned stale plans before)."""
    import os

    from tritonrnn.rnn import planner

    base = _plan(H=224)
    first = {"family": "stepwise", "block_b": 16, "block_h": 32, "num_warps": 8}
    second = {"family": "stepwise", "block_b": 16, "block_h": 16, "num_warps": 4}
    store_tuning_entry(base.key, first, 1.5, "h100")
    path = tuning_cache_path()
    tick = os.stat(path).st_mtime_ns
    assert _plan(H=224).layer(0).block_h == 32
    store_tuning_entry(base.key, second, 1.0, "h100")
    os.utime(path, ns=(tick, tick))  # the same mtime as the first store
    assert _plan(H=224).layer(0).block_h == 16
    # Every load returns the same dict object (as a reused id would make it look): the plan
    # still follows the file.
    shared: dict = {}
    read = planner._load_cache.__wrapped__

    def same_dict(path, stamp):
        shared.clear()
        shared.update(read(path, stamp))
        return shared

    same_dict.cache_clear = lambda: None  # (a store empties the real one's cache)
    monkeypatch.setattr(planner, "_load_cache", same_dict)
    store_tuning_entry(base.key, first, 0.5, "h100")
    assert _plan(H=224).layer(0).block_h == 32


def test_a_store_keeps_the_entry_that_covers_more_candidates():
    """Two tune runs of one key (concurrent, one of them partial or cut short): the later
    store does not replace an entry of the same release, kernels and switches that timed
    more of the candidates (a complete one, or a partial one of more); a store of at least
    as much coverage replaces it, and an entry of other kernels counts for nothing."""
    key = _plan(H=176).key
    one = {"family": "stepwise", "block_b": 16, "block_h": 32, "num_warps": 8}
    two = {"family": "stepwise", "block_b": 16, "block_h": 16, "num_warps": 4}

    def stored() -> tuple:
        e = load_tuning_cache()[key]
        return e["block_h"], e["ms"], e.get("measured")

    assert store_tuning_entry(key, one, 1.0, "h100")
    assert not store_tuning_entry(key, two, 2.0, "h100", measured=2, candidates=3)
    assert stored() == (32, 1.0, None)
    assert store_tuning_entry(key, two, 2.0, "h100")  # complete over complete: the later
    assert stored() == (16, 2.0, None)
    _write_tuning_cache({})
    assert store_tuning_entry(key, one, 1.0, "h100", measured=3, candidates=9)
    assert not store_tuning_entry(key, two, 0.5, "h100", measured=2, candidates=9)
    assert store_tuning_entry(key, two, 0.5, "h100", measured=3, candidates=9)
    assert stored() == (16, 0.5, 3)
    _write_tuning_cache({key: {**load_tuning_cache()[key], "kernels": "0" * 16,
                               "measured": 9, "candidates": 9}})
    assert store_tuning_entry(key, one, 1.0, "h100", measured=1, candidates=9)
    assert stored() == (32, 1.0, 1)


def test_a_store_reaches_this_processs_plans_even_where_the_files_stamp_repeats(monkeypatch):
    """The cache's stamp (mtime, inode, size) can repeat across stores (an inode reused
    within one tick of the file clock): this process's own stores empty its caches."""
    from tritonrnn.rnn import planner

    base = _plan(H=208)
    store_tuning_entry(base.key, {"family": "stepwise", "block_b": 16, "block_h": 32,
                                  "num_warps": 8}, 1.0, "h100")
    path = str(tuning_cache_path())
    monkeypatch.setattr(planner, "_tuning_cache_stamp", lambda: (path, (1, 2, 3)))
    assert _plan(H=208).layer(0).block_h == 32
    store_tuning_entry(base.key, {"family": "stepwise", "block_b": 16, "block_h": 16,
                                  "num_warps": 4}, 1.0, "h100")
    assert _plan(H=208).layer(0).block_h == 16


def test_a_partial_tuning_entry_says_so_in_the_plan():
    base = _plan(H=160)
    choice = {"family": "stepwise", "block_b": 16, "block_h": 32, "num_warps": 8}
    store_tuning_entry(base.key, choice, 1.5, "h100", measured=4, candidates=84)
    partial = _plan(H=160)
    assert partial.source == "tuned, partial: best of 4 of 84 candidates"
    assert "(choice: tuned, partial: best of 4 of 84 candidates)" in partial.explain()
    assert partial.layer(0).block_h == 32
    store_tuning_entry(base.key, choice, 1.5, "h100", measured=84, candidates=84)
    assert _plan(H=160).source == "tuned"


def test_tuning_entries_of_another_triton_are_ignored(monkeypatch):
    import triton

    base = _plan(H=192)
    choice = {"family": "stepwise", "block_b": 16, "block_h": 32, "num_warps": 8}
    monkeypatch.setattr(triton, "__version__", "3.4.0")
    store_tuning_entry(base.key, choice, 1.25, "h100")
    assert load_tuning_cache()[base.key]["triton"] == "3.4.0"
    assert _plan(H=192).source == "tuned"
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    other = _plan(H=192)
    assert other.source == "heuristic" and other.layer(0) == base.layer(0)


def test_candidates_run_on_the_device():
    p = _plan(H=256, B=16)
    cands = candidates(p)
    families = {c["family"] for c in cands}
    assert {"persistent_grid", "stepwise"} <= families
    assert {c.get("block_k") for c in cands} >= {0, 64, 128}
    for c in cands:
        with plan_constraints(**c):
            lp = _plan(H=256, B=16).layer(0)  # every candidate plans without error
        assert lp.backward_warps == c.get("num_warps_bwd", c["num_warps"])
    # The backward's warps are tuned apart from the forward's in the grid families.
    grid = [c for c in cands if c["family"] == "persistent_grid"]
    assert {(c["num_warps"], c["num_warps_bwd"]) for c in grid} == {(4, 4), (4, 8), (8, 4),
                                                                      (8, 8)}
    assert min(c["block_b"] for c in cands) == 16  # no vector tiles at B = 16
    # B = 1: vector tiles too (block_b 1, block_h from 8, resident weights only).
    p = _plan(H=256, B=1)
    vec = [c for c in candidates(p) if c["block_b"] < 16]
    assert vec and {c["block_b"] for c in vec} == {1} and {c["block_k"] for c in vec} == {0}
    assert {c["block_h"] for c in vec} == {8, 16, 32}
    assert {c["family"] for c in vec} == {"persistent_grid", "stepwise"}
    for c in vec:
        with plan_constraints(**c):
            assert _plan(H=256, B=1).layer(0).block_b == 1
    # B = 1024: the grid families' 128-column batch tiles too, the planner's own choice among
    # them (tune times it first).
    p = _plan(H=1024, B=1024)
    lp = p.layer(0)
    own = {"family": lp.family, "block_b": lp.block_b, "num_warps": lp.num_warps,
           "block_h": lp.block_h, "block_k": lp.block_k, "num_warps_bwd": lp.backward_warps,
           "num_stages": 3, "num_stages_bwd": 3,  # streamed: the stages named, the default
           "split_k_bwd": 0}
    cands = candidates(p)
    assert own in cands and lp.block_b == 128 and own == lp.choice(), own
    assert lp.num_stages == 0  # (64 x 128 gated tiles: `_STAGED_TILE`)
    assert {c["family"] for c in cands if c["block_b"] == 128} == {"persistent_grid",
                                                                   "stepwise"}


def test_candidates_try_the_taller_backward():
    # Resident grid tiles of 32 columns or more are also tried with the backward on tiles
    # twice as tall and half as wide, where those plan; the plan's own choice is among them
    # once, and each plans as asked.
    p = _plan(H=768, B=64)
    cands = candidates(p)
    taller = [c for c in cands if "block_h_bwd" in c]
    assert taller and all((c["block_h_bwd"], c["block_b_bwd"]) == (2 * c["block_h"],
                                                                   c["block_b"] // 2)
                          for c in taller)
    assert all(c["block_k"] == 0 and c["block_b"] >= 32 for c in taller)
    lp = p.layer(0)
    own = [c for c in taller if c["num_warps"] == lp.num_warps
           and c["num_warps_bwd"] == lp.backward_warps and c["block_b"] == lp.block_b
           and c["block_h"] == lp.block_h and c["family"] == lp.family]
    assert len(own) == 1
    for c in taller:
        with plan_constraints(**c):
            got = _plan(H=768, B=64).layer(0)
        assert (got.backward_block_h, got.backward_block_b) == (c["block_h_bwd"],
                                                                c["block_b_bwd"])
    assert not any("block_h_bwd" in c for c in candidates(_plan(H=768, B=16)))


def test_plan_for_errors():
    with pytest.raises(ValueError, match=r"device_properties: expected one of.*'h200'"):
        _plan(device="a700")
    with pytest.raises(ValueError, match=r"batch: expected an int >= 1, got 0"):
        _plan(B=0)
    with pytest.raises(TypeError, match=r"dtype: expected torch.float16.*got dtype torch.int32"):
        _plan(dtype=torch.int32)
    with pytest.raises(TypeError, match=r"dtype: expected torch.float16.*got str 'float16'"):
        _plan(dtype="float16")


# ----------------------------------------------------------------------------- audit fixes


def _write_tuning_cache(entries: dict) -> None:
    """The tuning cache as a hand-edited or damaged file may hold it (store_tuning_entry
    writes only valid choices)."""
    import json

    path = tuning_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "entries": entries}))


def _this_triton(**entry) -> dict:
    import triton

    return {**entry, "triton": triton.__version__, "kernels": kernels_fingerprint(),
            "ms": 1.0}


@pytest.mark.parametrize("entry, problem", [
    ([1, 2], "expected a dict of choices, got list"),
    ("stepwise", "expected a dict of choices, got str"),
    (_this_triton(family="bogus"), "family expected one of .* got 'bogus'"),
    (_this_triton(family="stepwise", block_b="16"), "block_b expected a positive int, got '16'"),
    (_this_triton(family="persistent_grid", block_b=8, block_h=16), "block_b expected 1, 2, 4"),
    (_this_triton(family="stepwise", block_h=24), "block_h expected a power of two >= 8, got 24"),
    (_this_triton(family="persistent_grid", block_h=0), "block_h expected a positive int, got 0"),
    (_this_triton(family="stepwise", num_warps=0), "num_warps expected a positive int, got 0"),
    (_this_triton(family="stepwise", num_warps=3), "num_warps expected a power of two <= 32"),
    (_this_triton(family="stepwise", block_k=7), "block_k expected 0 .* got 7"),
    (_this_triton(family="stepwise", measured="3", candidates=5),
     "measured and candidates expected two ints >= 0, got measured='3', candidates=5"),
    (_this_triton(family="stepwise", measured=3),
     "measured and candidates expected two ints >= 0, got measured=3, candidates=None"),
    (_this_triton(family="stepwise", num_stage=4),
     r"fields expected among \[.*\] and the timing's \[.*\], got \['num_stage'\]"),
    (_this_triton(family="stepwise", block_K=128, pipeline_chunks=4),
     r"fields expected among .* got \['block_K', 'pipeline_chunks'\]"),
], ids=["list", "str", "family", "block_b-str", "block_b-8", "block_h-24", "block_h-0",
        "warps-0", "warps-3", "block_k-7", "measured-str", "measured-alone", "misspelled",
        "unknown"])
def test_tuning_entries_that_are_not_valid_choices_are_ignored(entry, problem):
    # An entry plan_constraints would refuse is treated as absent (with one warning naming
    # the key and the problem): the heuristic runs, not a "tuned" plan that fails at launch.
    base = _plan(H=768, B=16)
    _write_tuning_cache({base.key: entry})
    with pytest.warns(RuntimeWarning, match=rf"tuning cache entry '{base.key}': {problem}"):
        plan = _plan(H=768, B=16)
    assert plan.source == "heuristic" and plan.layers == base.layers


@pytest.mark.parametrize("content, problem", [
    ('{"version": 1, "entries": {"a": {}', "got unreadable JSON"),
    ('{"version": 2, "entries": {"a": {}}}', "got version 2"),
    ('{"version": true, "entries": {"a": {}}}', "got version True"),
    ('{"version": 1.0, "entries": {"a": {}}}', "got version 1.0"),
    ('[1, 2]', "got a JSON list"),
    ('{"version": 1, "entries": [1]}', "got entries of type list"),
    (b'\xff{"version": 1}', "got unreadable JSON ('utf-8' codec can't decode"),
], ids=["truncated", "version-2", "version-true", "version-float", "list", "entries-list",
        "not-utf8"])
def test_a_store_leaves_a_cache_it_cannot_read_alone(content, problem):
    """The planner reads such a file as empty; a store, which replaces the file whole,
    raises instead of overwriting its entries with one."""
    path = tuning_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    base = _plan(H=128)
    assert base.source == "heuristic"
    with pytest.raises(ValueError, match=rf"tuning cache {re.escape(str(path))}: expected a "
                       rf"JSON object with version 1 and its entries, {re.escape(problem)}"
                       rf".*move it aside"):
        store_tuning_entry(base.key, {"family": "stepwise"}, 1.0, "h100")
    assert path.read_bytes() == content
    assert not list(path.parent.glob("*.tmp"))  # no temporary left


def test_a_stores_data_reach_the_disk_before_the_rename(monkeypatch):
    """write_json_atomic syncs the new file's data before renaming it over the old one (a
    rename can reach the disk before unsynced data: a crash then leaves an empty file)."""
    import os

    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"),
                                                     real_replace(a, b))[1])
    store_tuning_entry("k9", {"family": "stepwise"}, 1.0, "h100")
    assert events == ["fsync", "replace"]
    assert "k9" in load_tuning_cache()


def test_a_store_keeps_the_cache_files_permissions(monkeypatch):
    """Written beside the cache and renamed over it, the file keeps its mode (a directory
    shared between users stays readable by them); a new one gets a plain open()'s."""
    import os
    import stat

    path = tuning_cache_path()
    old = os.umask(0o022)
    try:
        store_tuning_entry("k1", {"family": "stepwise"}, 1.0, "h100")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.chmod(path, 0o664)
        store_tuning_entry("k2", {"family": "stepwise"}, 1.0, "h100")
        assert stat.S_IMODE(path.stat().st_mode) == 0o664
    finally:
        os.umask(old)
    assert set(load_tuning_cache()) == {"k1", "k2"}
    before = path.read_text()
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json_atomic(path, {"entries": object()})
    assert path.read_text() == before and not list(path.parent.glob("*.tmp"))


@pytest.mark.parametrize("stale", ["kernels", "unnamed"])
def test_a_tuning_entry_from_other_kernels_is_ignored(stale):
    """An entry timed on other kernel sources (an upgrade since `tune` ran), or on sources it
    does not name (a cache from before the fingerprint), does not apply: the heuristic runs.
    The same entry with this checkout's fingerprint applies."""
    base = _plan(H=768, B=16)
    entry = _this_triton(family="stepwise", block_b=16, block_h=32, block_k=64, num_warps=4)
    _write_tuning_cache({base.key: {**entry, "kernels": "0123456789abcdef"} if stale ==
                         "kernels" else {k: v for k, v in entry.items() if k != "kernels"}})
    plan = _plan(H=768, B=16)
    assert plan.source == "heuristic" and plan.layers == base.layers
    _write_tuning_cache({base.key: entry})
    plan = _plan(H=768, B=16)
    assert plan.source == "tuned" and plan.layer(0).family == "stepwise"


@pytest.mark.parametrize("switch, value, variants", [
    ("_FWD_PAIRED_CHUNKS", False, {"FWD_PAIRED_CHUNKS": False}),
    ("_BWD_SPLIT_K", True, {"BWD_SPLIT_K": True}),
    ("HOIST_WEIGHTS", "bwd,fwd", {"HOIST_WEIGHTS": "bwd,fwd"}),
])
def test_a_tuning_entry_applies_only_under_the_switches_that_timed_it(switch, value, variants,
                                                                      monkeypatch):
    """`tune` run under a kernel switch stores its variant with the entry and in its partial
    key: default runs ignore that entry (the heuristic runs), runs under the switch use it,
    and an entry stored by default runs names no variant."""
    from tritonrnn.bench import tune
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import kernel_variants

    choice = {"family": "stepwise", "block_b": 16, "block_h": 32, "block_k": 64, "num_warps": 4}
    base = _plan(H=768, B=16)
    default_partial = tune._partial_key(base.key)
    store_tuning_entry(base.key, choice, 1.0, "h100")
    assert "variants" not in load_tuning_cache()[base.key] and kernel_variants() == {}
    assert _plan(H=768, B=16).source == "tuned"
    with monkeypatch.context() as m:
        if switch == "HOIST_WEIGHTS":
            m.setenv("TRITONRNN_HOIST_WEIGHTS", "fwd, bwd")
        else:
            m.setattr(split_k if "SPLIT_K" in switch else gt, switch, value)
        assert kernel_variants() == variants
        assert _plan(H=768, B=16).source == "heuristic"  # the default's timing, not this
        assert tune._partial_key(base.key) != default_partial
        store_tuning_entry(base.key, choice, 1.0, "h100")
        assert load_tuning_cache()[base.key]["variants"] == variants
        assert _plan(H=768, B=16).source == "tuned"
    plan = _plan(H=768, B=16)
    assert plan.source == "heuristic" and plan.layers == base.layers


def test_kernels_fingerprint_follows_the_kernel_sources(tmp_path):
    """The fingerprint is that of kernels/*.py: any byte or name of a source changes it,
    other files do not."""
    kernels = Path(pg.__file__).resolve().parent
    for f in kernels.glob("*.py"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    assert sources_fingerprint(tmp_path) == kernels_fingerprint()
    (tmp_path / "NOTES.md").write_text("not a source")
    assert sources_fingerprint(tmp_path) == kernels_fingerprint()
    cells = tmp_path / "cells.py"
    cells.write_bytes(cells.read_bytes() + b"\n")
    edited = sources_fingerprint(tmp_path)
    assert edited != kernels_fingerprint()
    cells.rename(tmp_path / "cells2.py")
    assert sources_fingerprint(tmp_path) not in (edited, kernels_fingerprint())


def test_a_valid_hand_written_tuning_entry_still_applies():
    base = _plan(H=768, B=16)
    _write_tuning_cache({base.key: _this_triton(family="stepwise", block_b=16, block_h=32,
                                                block_k=64, num_warps=4, measured=3,
                                                candidates=5)})
    plan = _plan(H=768, B=16)
    assert plan.source == "tuned, partial: best of 3 of 5 candidates"
    assert (plan.layer(0).family, plan.layer(0).block_h, plan.layer(0).block_k) == (
        "stepwise", 32, 64)


@pytest.mark.parametrize("H, choice, why", [
    (768, {"family": "persistent_cta"}, r"'persistent_cta' needs \d+ bytes of shared memory"),
    (2048, {"family": "stepwise", "block_h": 64, "block_b": 64, "block_k": 0},
     r"'stepwise' needs 1179648 bytes on chip"),
    (64, {"block_h": 32}, r"block_h = 32 cannot apply to family 'persistent_cta'"),
], ids=["cta-too-large", "stepwise-over-budget", "cta-block_h"])
def test_a_tuning_entry_that_cannot_apply_leaves_the_heuristic_labelled_so(H, choice, why):
    # _apply refuses the entry for this shape: the plan is the heuristic's, and says so.
    base = _plan(H=H, B=16)
    store_tuning_entry(base.key, choice, 1.0, "h100")
    with pytest.warns(RuntimeWarning, match=rf"tuning cache entry '{base.key}': .*{why}"):
        plan = _plan(H=H, B=16)
    assert plan.layers == base.layers and plan.source == "heuristic"
    assert "(choice: heuristic)" in plan.explain()


@pytest.mark.parametrize("family", ["persistent_grid", "stepwise"])
def test_forced_grid_families_are_held_to_the_shared_memory(family):
    # Resident 64 x 64 tiles of LSTM H=2048: 1179648 B per program against the H100's
    # 225280 B budget (`_smem_budget`). Both grid families stage the slice in shared memory.
    from tritonrnn.rnn.planner import _smem_budget

    forced = dict(family=family, block_k=0, block_h=64, block_b=64)
    with plan_constraints(**forced), pytest.raises(
            ValueError, match=rf"plan_constraints: family '{family}' needs 1179648 bytes on "
                              rf"chip per program .* allows {_smem_budget(PRESETS['h100'])}"):
        _plan(H=2048, B=16)
    with plan_constraints(**forced):  # the interpreter has no on-chip limit
        assert _plan(H=2048, B=16, device="interpreter").layer(0).family == family


@pytest.mark.parametrize("mode, H, B", [("lstm", 2048, 16), ("gru", 1536, 64)])
def test_candidates_fit_the_shared_memory(mode, H, B):
    from tritonrnn.rnn.planner import _smem_budget

    p = _plan(mode=mode, H=H, B=B)
    cands = candidates(p)
    assert {c["family"] for c in cands} >= {"persistent_grid", "stepwise"}
    for c in cands:
        with plan_constraints(**c):
            lp = _plan(mode=mode, H=H, B=B).layer(0)
        assert lp.onchip_bytes <= _smem_budget(p.device), (c, lp)


@pytest.mark.parametrize("forced, dtype, match", [
    (dict(block_k=32), torch.float32,
     r"block_k = 32 cannot apply to family 'persistent_cta' \(the heuristic's family"),
    (dict(block_h=8), torch.float32, r"block_h = 8 cannot apply to family 'persistent_cta'"),
    (dict(family="persistent_cta", block_h=64, block_k=64), torch.float32,
     r"block_h = 64 cannot apply to family 'persistent_cta': .*no hidden slices"),
    (dict(family="persistent_cta", block_k=64), torch.bfloat16,
     r"block_k = 64 cannot apply to family 'persistent_cta': .*no streamed weights"),
    (dict(block_b=16), torch.float64,
     r"block_b = 16 cannot apply to family 'reference' \(the heuristic's family"),
    (dict(family="reference", num_warps=4), torch.bfloat16,
     r"num_warps = 4 cannot apply to family 'reference': .*no tiles or warps"),
], ids=["cta-block_k", "cta-block_h", "cta-block_h-block_k", "cta-streamed", "fp64-block_b",
        "reference-warps"])
def test_forced_choices_a_family_has_no_use_for_raise(forced, dtype, match):
    # LSTM H=64: the heuristic's persistent CTA (float64: the reference family). These were
    # dropped without a word, the plan labelled "constrained".
    with plan_constraints(**forced), pytest.raises(ValueError, match=match):
        _plan(H=64, dtype=dtype)


def test_forced_choices_the_cta_has_still_apply():
    # Its batch tile and warps, and block_k = 0 (resident weights: what the CTA does).
    with plan_constraints(block_b=32, num_warps=4, num_warps_bwd=8, block_k=0):
        lp = _plan(H=64, B=64, dtype=torch.float32).layer(0)
    assert (lp.family, lp.block_b, lp.num_warps, lp.backward_warps) == (
        "persistent_cta", 32, 4, 8)
    with plan_constraints(family="reference"):
        assert _plan(H=64).layer(0).family == "reference"


@pytest.mark.parametrize("B, direction, programs", [
    (16, "bidirectional", 2), (64, "bidirectional", 8), (17, "bidirectional", 4),
    (64, "unidirectional", 4),
])
def test_cta_programs_count_both_directions_of_a_pair_launch(B, direction, programs):
    # cta_forward_pair launches cdiv(B, block_b) x 2 programs (LayerPlan.num_programs: "x 2
    # for a pair launch", as the grid families count them).
    p = _plan(H=64, B=B, direction=direction)
    lp = p.layer(0)
    assert (lp.family, lp.num_dirs, lp.num_programs) == (
        "persistent_cta", 2 if direction == "bidirectional" else 1, programs)
    assert f"programs={programs}" in p.explain()
    grid = _plan(H=256, B=B, direction=direction, device="interpreter").layer(0)
    with plan_constraints(family="persistent_cta"):  # forced on a grid heuristic, likewise
        forced = _plan(H=256, B=B, direction=direction, device="interpreter").layer(0)
    assert grid.family == "persistent_grid"
    assert (forced.family, forced.num_programs) == ("persistent_cta", programs)


@pytest.mark.parametrize("layers, direction, args, error", [
    (2, "unidirectional", (0, 1), r"direction: expected an int in \[0, 0\], got 1"),
    (2, "unidirectional", (0, -1), r"direction: expected an int in \[0, 0\], got -1"),
    (2, "unidirectional", (2, 0), r"layer: expected an int in \[0, 1\], got 2"),
    (2, "unidirectional", (-1, 0), r"layer: expected an int in \[0, 1\], got -1"),
    (1, "bidirectional", (0, 2), r"direction: expected an int in \[0, 1\], got 2"),
], ids=["direction-1-uni", "direction-negative", "layer-past-end", "layer-negative",
        "direction-2-bi"])
def test_plan_layer_checks_its_arguments(layers, direction, args, error):
    p = _plan(H=16, num_layers=layers, direction=direction)
    with pytest.raises(ValueError, match=error):
        p.layer(*args)


def test_plan_layer_takes_numpy_ints():
    import numpy as np

    p = _plan(H=16, num_layers=2, direction="bidirectional")
    assert p.layer(np.int64(1), np.int64(1)) is p.layers[3]


@pytest.mark.parametrize("device", [123, {"name": "h100"}, 1.5],
                         ids=["int", "dict", "float"])
def test_plan_for_names_what_device_properties_takes(device):
    with pytest.raises(TypeError, match=r"device_properties: expected a DeviceProperties, a "
                                        r"preset name \(one of \['a100', 'h100', 'h200', "
                                        r"'interpreter'\]\) or None .*, got "):
        _plan(device=device)


def test_device_properties_takes_presets_and_names_a_bad_device():
    from tritonrnn.rnn import device_properties
    from tritonrnn.rnn.planner import PRESETS

    assert device_properties("h100") is PRESETS["h100"]
    assert device_properties("cpu") is PRESETS["interpreter"]
    expected = r"^device: expected a torch.device, a device string or index, or one of \["
    with pytest.raises(TypeError, match=expected + r".*got float 5.0$"):
        device_properties(5.0)
    with pytest.raises(TypeError, match=expected + r".*got bool True$"):
        device_properties(True)
    with pytest.raises(ValueError, match=expected + r".*got 'h1000'$"):
        device_properties("h1000")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=r"^device: expected .*got cuda:99"):
        device_properties("cuda:99")
    if not count:
        with pytest.raises(ValueError, match=r"torch sees no CUDA device"):
            device_properties("cuda")


@pytest.mark.parametrize("name", ["batch", "max_time"])
def test_plan_for_takes_numpy_ints_for_batch_and_max_time(name):
    import numpy as np

    kw = dict(rnn_mode="lstm", input_size=8, num_units=16, batch=2, max_time=5,
              dtype=torch.float32, device_properties="h100")
    want = plan_for(**kw)
    got = plan_for(**{**kw, name: np.int64(kw[name])})
    assert (got.batch, got.max_time) == (2, 5) and type(getattr(got, name)) is int
    assert got.layers == want.layers and got.buffers == want.buffers
    with pytest.raises(TypeError, match=rf"{name}: expected an int, got float 2.0"):
        plan_for(**{**kw, name: 2.0})
    with pytest.raises(ValueError, match=rf"{name}: expected an int >= 1, got 0"):
        plan_for(**{**kw, name: np.int64(0)})


@pytest.mark.parametrize("mode,H,B,direction,proj,bwd", [
    # 16 x 32 forward, 32 x 16 backward (`_taller_backward`): gated cells at B = 64
    ("lstm", 768, 64, "unidirectional", 0, (32, 16)),
    ("gru", 768, 64, "bidirectional", 0, (32, 16)),
    ("lstm", 640, 48, "unidirectional", 0, (32, 16)),
    ("gru", 1024, 64, "unidirectional", 0, (32, 16)),  # three gates: 212992 B
    ("lstm", 512, 64, "bidirectional", 0, (32, 16)),  # a pair launch
    # not where the 32 x 16 backward does not fit (LSTM H=1024: 262144 B), for a one-gate
    # cell, with a projection, nor outside the batch bucket it was timed at
    ("lstm", 1024, 64, "unidirectional", 0, (16, 32)),
    ("rnn_tanh", 768, 64, "unidirectional", 0, (16, 32)),
    ("lstm", 768, 64, "unidirectional", 384, None),
    ("lstm", 768, 32, "bidirectional", 0, (16, 32)),
    ("lstm", 512, 128, "unidirectional", 0, (16, 32)),
])
@pytest.mark.parametrize("device", ["h100", "h200"])
def test_taller_backward_tiles(mode, H, B, direction, proj, bwd, device):
    from tritonrnn.rnn.planner import _smem_budget

    plan = _plan(mode=mode, H=H, B=B, direction=direction, num_proj=proj, device=device)
    lp = plan.layer(0)
    if bwd is None:
        assert (lp.block_h_bwd, lp.block_b_bwd) == (0, 0), lp
        return
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k) == ("persistent_grid", 16, 32, 0)
    assert (lp.backward_block_h, lp.backward_block_b) == bwd
    assert (lp.block_h_bwd, lp.block_b_bwd) == (bwd if bwd != (16, 32) else (0, 0))
    assert (lp.num_warps, lp.backward_warps) == (8, 8)
    assert lp.num_programs <= PRESETS[device].sm_count
    assert lp.onchip_bytes <= _smem_budget(PRESETS[device])
    taller = bwd == (32, 16)
    assert ("(backward 32 x 16)" in plan.explain()) == taller
    if taller:  # the same programs: half the hidden slices, twice the batch tiles
        assert lp.num_programs == -(-H // 16) * -(-B // 32) * lp.num_dirs


def test_backward_tile_constraints():
    base = _plan(H=768, B=64).layer(0)
    assert (base.backward_block_h, base.backward_block_b) == (32, 16)
    # Tiles forced for the layer apply to both passes; warps alone keep the backward's tiles.
    with plan_constraints(block_b=32):
        lp = _plan(H=768, B=64).layer(0)
    assert (lp.block_h_bwd, lp.block_b_bwd, lp.backward_block_h) == (0, 0, 16)
    with plan_constraints(num_warps_bwd=4):
        lp = _plan(H=768, B=64).layer(0)
    assert (lp.backward_block_h, lp.backward_block_b, lp.backward_warps) == (32, 16, 4)
    # Forced on a small shape: the backward's programs count when they are the larger pass.
    with plan_constraints(family="persistent_grid", block_h=32, block_b=16, block_h_bwd=16,
                          block_b_bwd=16):
        lp = _plan(H=40, B=35, device="interpreter").layer(0)
    assert (lp.block_h, lp.block_b, lp.backward_block_h, lp.backward_block_b) == (32, 16, 16, 16)
    # (B's bucket, 64: backward 3 hidden slices x 4 batch tiles, forward 2 x 4)
    assert lp.num_programs == 3 * 4 and lp.backward_warps == 4  # 16 x 16's rule
    # The plan's own choice is a tuning candidate, and forcing it gives the plan back.
    plan = _plan(H=768, B=64)
    own = {"family": base.family, "block_b": base.block_b, "num_warps": base.num_warps,
           "num_warps_bwd": base.backward_warps, "block_h": base.block_h, "block_k": 0,
           "block_h_bwd": 32, "block_b_bwd": 16, "split_k_bwd": 0}
    assert own in candidates(plan)
    with plan_constraints(**own):
        assert _plan(H=768, B=64).layer(0) == base


@pytest.mark.parametrize("constraints, message", [
    (dict(block_h_bwd=8), "block_h_bwd expected a power of two >= 16 (the backward's MMA "
                          "tiles), got 8"),
    (dict(block_b_bwd=24), "block_b_bwd expected a power of two >= 16"),
    (dict(block_b_bwd=True), "block_b_bwd expected a positive int, got True"),
])
def test_backward_tile_constraints_refuse_bad_values(constraints, message):
    with pytest.raises(ValueError, match=re.escape(message)), plan_constraints(**constraints):
        pass


def test_constraints_take_integers_of_any_integer_type():
    """NumPy and torch integer scalars are ints to plan_constraints (as plan_for's sizes);
    their float and bool scalars are not."""
    import numpy as np

    from tritonrnn.rnn import planner as planner_mod

    with plan_constraints(block_b=np.int64(16), num_warps=torch.tensor(4), block_k=np.int32(64)):
        got = planner_mod.current_constraints()
        lp = _plan(H=768, B=16).layer(0)
    assert got == {"block_b": 16, "num_warps": 4, "block_k": 64}
    assert all(type(v) is int for v in got.values())
    assert (lp.block_b, lp.num_warps, lp.block_k) == (16, 4, 64)
    for bad, shown in ((np.float64(16.0), "16.0"), (np.bool_(True), "True"),
                       (torch.tensor(16.0), "tensor(16.)"), (torch.tensor(True), "True"),
                       (torch.tensor([16]), "tensor([16])")):
        with pytest.raises(ValueError, match=rf"block_b expected a positive int, got .*"
                                             rf"{re.escape(shown)}"), plan_constraints(
                block_b=bad):
            pass


@pytest.mark.parametrize("H, B, constraints, message", [
    (256, 1, dict(family="persistent_cta", block_h_bwd=32),
     "block_h_bwd = 32 cannot apply to family 'persistent_cta'"),
    (256, 1, dict(family="persistent_grid", block_k=64, block_b_bwd=16),
     "the backward's own tiles (block_h_bwd = 16, block_b_bwd = 16) need resident weights "
     "(block_k = 0)"),
    (256, 1, dict(family="persistent_grid", block_b=1, block_h=8, block_h_bwd=16),
     "got family 'persistent_grid', block_k = 0, block_b = 1"),
    (1024, 64, dict(family="persistent_grid", block_k=0, block_h=16, block_b=32,
                    block_h_bwd=16, block_b_bwd=16),
     "needs 256 co-resident programs for H=1024, block_h=16, block_b=32, batch bucket 64 "
     "(backward block_h=16, block_b=16)"),
])
def test_backward_tile_constraints_that_cannot_apply(H, B, constraints, message):
    with plan_constraints(**constraints), pytest.raises(ValueError, match=re.escape(message)):
        _plan(H=H, B=B).layer(0)


def test_backward_tile_constraints_that_apply():
    """The control of the cases above: 16 x 16 backward tiles under H=512 B=64's own 16 x 16
    forward apply (128 co-resident programs; the forward's own tiles, so none of its own)."""
    with plan_constraints(family="persistent_grid", block_h_bwd=16, block_b_bwd=16):
        lp = _plan(H=512, B=64).layer(0)
    assert (lp.num_programs, lp.block_h, lp.block_b) == (128, 16, 16)
    assert (lp.backward_block_h, lp.backward_block_b) == (16, 16)


# The streamed loops' stages (`_stream_stages`): a persistent grid with streamed weights on
# MMA dots pipelines each pass's loop deep enough for 96 KiB in flight (stages - 1 chunks),
# within the shared-memory budget and at most 8 stages, but a gated cell's backward on tiles
# past 2048 elements and its forward past 4096; resident weights, the stepwise family and
# float32's FMA dots (on a GPU) keep Triton's default (stored as 0). One stage of a 32 x 64
# LSTM tile is 24 KiB in the forward (the joint gate tile, 128 rows) and 12 KiB in the
# backward; 64 x 64 tiles take 40 / 16 KiB.
@pytest.mark.parametrize("mode, H, B, direction, dtype, want", [
    ("lstm", 768, 256, "unidirectional", torch.bfloat16, (5, 8)),
    ("lstm", 384, 1024, "unidirectional", torch.bfloat16, (4, 3)),  # 64 x 64
    ("lstm", 1024, 1024, "unidirectional", torch.bfloat16, (0, 0)),  # 64 x 128
    ("rnn_tanh", 640, 1024, "unidirectional", torch.bfloat16, (5, 5)),  # one gate: 64 x 128
    ("gru", 3072, 1, "bidirectional", torch.bfloat16, (4, 8)),  # a pair launch, 64 x 16
    ("rnn_tanh", 1152, 32, "unidirectional", torch.float16, (8, 8)),  # 6 KiB: the cap
    ("gru", 4096, 16, "unidirectional", torch.bfloat16, (7, 8)),
    ("lstm", 768, 16, "unidirectional", torch.bfloat16, (0, 0)),  # resident
    ("rnn_tanh", 512, 16, "unidirectional", torch.float32, (0, 0)),  # FMA dots
    ("lstm", 1152, 1024, "unidirectional", torch.bfloat16, (0, 0)),  # stepwise
])
@pytest.mark.parametrize("device", ["h100", "h200"])
def test_streamed_loops_take_the_stages_that_fit(mode, H, B, direction, dtype, want, device):
    from tritonrnn.rnn.planner import _IN_FLIGHT, _MAX_STAGES, _STAGED_TILE, _smem_budget

    plan = _plan(mode=mode, H=H, B=B, direction=direction, dtype=dtype, device=device)
    lp = plan.layer(0)
    assert (lp.num_stages, lp.backward_stages) == want, lp
    if not want[0]:
        assert lp.num_stages_bwd == 0 and "stages" not in plan.explain()
        return
    assert lp.family == "persistent_grid" and lp.block_k == 64
    budget = _smem_budget(PRESETS[device])
    per_stage = [gt.stream_stage_bytes(mode, H, 0, dtype, lp.block_h, lp.block_b, 64, p)
                 for p in ("fwd", "bwd")]
    tile = lp.block_h * lp.block_b
    for p, stages, nbytes in zip(("fwd", "bwd"), want, per_stage, strict=True):
        assert stages * nbytes <= budget
        if mode != "rnn_tanh" and tile > _STAGED_TILE[p]:
            assert stages == 3
        else:  # the bytes in flight, or as many as fit, or the cap
            assert (stages - 1) * nbytes >= _IN_FLIGHT or stages == _MAX_STAGES or (
                (stages + 1) * nbytes > budget)
            assert (stages - 2) * nbytes < _IN_FLIGHT  # no deeper than the bytes need
    assert lp.onchip_bytes == max(s * b for s, b in zip(want, per_stage, strict=True))
    assert lp.num_stages_bwd == (0 if want[0] == want[1] else want[1])
    backward = f", backward {want[1]}" if want[1] != want[0] else ""
    assert f"{want[0]} stages{backward})" in plan.explain()


def test_stage_constraints():
    base = _plan(H=768, B=256).layer(0)
    assert (base.block_k, base.num_stages, base.backward_stages) == (64, 5, 8)
    # num_stages applies to both passes, num_stages_bwd to the backward alone (the forward
    # keeps the planner's); each counts in the plan's shared memory.
    for forced, want in ((dict(num_stages=6), (6, 6)), (dict(num_stages_bwd=6), (5, 6)),
                         (dict(num_stages=4, num_stages_bwd=2), (4, 2))):
        with plan_constraints(**forced):
            lp = _plan(H=768, B=256).layer(0)
        assert (lp.num_stages, lp.backward_stages) == want
        assert (lp.block_h, lp.block_b, lp.block_k) == (base.block_h, base.block_b, 64)
        assert lp.onchip_bytes == gt.grid_onchip_bytes(
            "lstm", 768, 768, 0, torch.bfloat16, lp.block_h, lp.block_b, 64,
            fwd_warps=lp.num_warps, stages=want[0], stages_bwd=want[1])
    # Streamed tiles forced on a resident plan get the rule's stages.
    with plan_constraints(block_k=64):
        lp = _plan(H=768, B=16).layer(0)
    assert (lp.block_k, lp.num_stages) == (64, 8)
    # The plan's own choice names its stages, is a tuning candidate, and forcing it gives
    # the plan back; the candidates also try it on Triton's default stages.
    plan = _plan(H=768, B=256)
    own = base.choice()
    assert (own["num_stages"], own["num_stages_bwd"]) == (5, 8)
    cands = candidates(plan)
    assert own in cands and {**own, "num_stages": 3, "num_stages_bwd": 3} in cands
    with plan_constraints(**own):
        assert _plan(H=768, B=256).layer(0) == base
    staged = [c for c in cands if "num_stages" in c]
    assert staged and all(c["block_k"] for c in staged)
    # A split-K backward's candidates name the forward's stages alone (its backward streams
    # nothing).
    split = [c for c in staged if c["split_k_bwd"]]
    assert split and not any("num_stages_bwd" in c for c in split)
    for c in split:
        with plan_constraints(**c):
            got = _plan(H=768, B=256).layer(0)
        assert (got.num_stages or 3, got.split_k_bwd) == (c["num_stages"], c["split_k_bwd"])
        assert got.choice() == c
    for c in (c for c in staged if not c["split_k_bwd"]):
        with plan_constraints(**c):
            got = _plan(H=768, B=256).layer(0)
        assert (got.num_stages or 3, got.backward_stages or 3) == (c["num_stages"],
                                                                 c["num_stages_bwd"])
        assert got.choice() == c  # (Triton's default is named 3, stored as 0)
    # Resident candidates name none.
    assert not any("num_stages" in c for c in candidates(_plan(H=768, B=16))
                   if c.get("block_k") == 0)


@pytest.mark.parametrize("constraints, message", [
    (dict(num_stages=0), "num_stages expected a positive int, got 0"),
    (dict(num_stages_bwd=True), "num_stages_bwd expected a positive int, got True"),
    (dict(num_stages="8"), "num_stages expected a positive int, got '8'"),
])
def test_stage_constraints_refuse_bad_values(constraints, message):
    with pytest.raises(ValueError, match=re.escape(message)), plan_constraints(**constraints):
        pass


@pytest.mark.parametrize("H, B, dtype, constraints, message", [
    (768, 16, torch.bfloat16, dict(num_stages=4),
     "num_stages = 4 needs streamed weights (block_k > 0: the stages of the loop over their "
     "chunks), got block_k = 0 (resident)"),
    (768, 256, torch.bfloat16, dict(block_k=0, num_stages_bwd=4),
     "num_stages_bwd = 4 needs streamed weights"),
    (64, 16, torch.bfloat16, dict(family="persistent_cta", num_stages=4),
     "num_stages = 4 cannot apply to family 'persistent_cta'"),
    (64, 16, torch.float64, dict(family="reference", num_stages=4),
     "num_stages = 4 cannot apply to family 'reference'"),
    (768, 256, torch.bfloat16, dict(num_stages=12),
     "family 'persistent_grid' needs 294912 bytes on chip per program for H=768, block_h=32, "
     "block_b=64, block_k=64, num_stages=12 (backward 12)"),
])
def test_stage_constraints_that_cannot_apply(H, B, dtype, constraints, message):
    with plan_constraints(**constraints), pytest.raises(ValueError,
                                                        match=re.escape(message)):
        _plan(H=H, B=B, dtype=dtype).layer(0)


# ----------------------------------------------------------------------------- split-K backward


def test_split_k_backward_is_a_plan_choice(request, monkeypatch):
    """split_k_bwd: forced, the plan's backward runs the split-K kernel in that form on its
    rule's tiles (LSTM H=1024 B=16 on an H100: one barrier 256 x 128 x 16, two 64 x 512 x
    16; 128 programs each), its forward as before; the plan counts the larger launch's
    programs and shared memory (the forward's, not the grid backward's), so the layer
    pipeline keeps the two 64-program forwards in flight that the grid plan gets, and one
    backward (two 128-program launches in flight are not co-resident); its choice
    round-trips and `explain` names it; its workspace is in the buffers. 0 forced keeps the
    plan's own backward with a switch on, and a choice that names none gets the switches'
    form. (The grid's own backward is the heuristic's here with the split-K rule off.)"""
    from tritonrnn.kernels import split_k

    request.getfixturevalue("no_split_k_rule")
    monkeypatch.setenv("TRITONRNN_PIPELINE", "1")
    plan = _plan(H=1024, B=16, num_layers=3)
    base = plan.layer(0)
    assert (base.split_k_bwd, base.num_programs, base.forward_programs) == (0, 64, 0)
    assert (plan.pipeline.width, plan.pipeline.backward_width) == (2, 2)
    assert base.choice()["split_k_bwd"] == 0
    for form, tiles in ((1, "256 x 128 x 16, one barrier"), (2, "64 x 512 x 16, two barriers")):
        with plan_constraints(split_k_bwd=form):
            p = _plan(H=1024, B=16, num_layers=3)
        lp = p.layer(0)
        assert (lp.family, lp.block_h, lp.block_b, lp.num_warps) == (
            base.family, base.block_h, base.block_b, base.num_warps)
        assert (lp.split_k_bwd, lp.backward_warps, lp.num_programs) == (form, 8, 128)
        assert (lp.forward_programs, lp.pass_programs(False), lp.pass_programs(True)) == (
            64, 64, 128)
        assert (lp.pair_gates, lp.own_backward_tiles) == (False, False)
        # (the forward's alone, 163840 B, not the grid backward's 196608 in base's)
        forward = gt.grid_onchip_bytes("lstm", 1024, 1024, 0, torch.bfloat16, 16, 16, 0,
                                       fwd_warps=8, backward=False)
        assert (forward, base.onchip_bytes) == (163840, 196608)
        assert lp.onchip_bytes == max(forward, split_k.onchip_bytes(
            *split_k.form_tiles(form, "lstm", 1024, 16, torch.bfloat16, PRESETS["h100"])[:3],
            torch.bfloat16, form == 1))
        assert (p.pipeline.chunks > 1, p.pipeline.width, p.pipeline.backward_width) == (
            True, 2, 1)
        assert p.pipeline.backward_pipeline is None  # (one backward at a time: unpipelined)
        text = p.explain()
        assert f"backward split-K {tiles}" in text and "programs=128 (forward 64)" in text
        assert ("2 layers concurrent in the forward; the backward unpipelined (two layers' "
                "backward launches, 2 x 128 programs, exceed the 132 SMs)") in text
        # One copy of the split-K workspace (one backward in flight), and the backward's
        # buffers the unpipelined engine's: no stream slot or chunk state of the pipeline's.
        assert {b.name: b.shape[0] for b in p.buffers if b.name.startswith("split_k.")} == {
            "split_k.partials": 2 if form == 1 else 8, "split_k.carries": 2}
        assert {b.name for b in p.buffers if b.name.startswith("pipeline.")} == {
            "pipeline.h_mid", "pipeline.c_mid"}
        with plan_constraints(split_k_bwd=form, pipeline_chunks=1):
            serial = _plan(H=1024, B=16, num_layers=3)
        assert [b for b in p.buffers if b.phase == "backward"] == [
            b for b in serial.buffers if b.phase == "backward"]
        with plan_constraints(**lp.choice()):
            assert _plan(H=1024, B=16, num_layers=3).layer(0) == lp
    # A forced pipeline of one layer: the backward unpipelined, nothing to overlap.
    with plan_constraints(pipeline_chunks=4):
        single = _plan(H=64, B=16)
    assert (single.pipeline.chunks, single.pipeline.backward_pipeline) == (4, None)
    assert "4 chunks, 1 layer concurrent in the forward; the backward unpipelined (a single " \
        "layer)" in single.explain()
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", True)
    assert _plan(H=1024, B=16).layer(0).split_k_bwd == 1
    with plan_constraints(family="persistent_grid", block_h=16):
        assert _plan(H=1024, B=16).layer(0).split_k_bwd == 1
    with plan_constraints(split_k_bwd=0):
        assert _plan(H=1024, B=16).layer(0) == base
    # The switches' form replaces the heuristic's own backward tiles (H=768 B=64: 32 x 16),
    # not forced ones.
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", True)
    wide = _plan(H=768, B=64).layer(0)
    assert (wide.split_k_bwd, wide.own_backward_tiles) == (2, False)
    with plan_constraints(block_h_bwd=32, block_b_bwd=16):
        forced = _plan(H=768, B=64).layer(0)
    assert (forced.split_k_bwd, forced.backward_block_h, forced.backward_block_b) == (0, 32, 16)
    # A streamed forward (H=768 B=256: 5 stages, the grid backward's 8 unused): its choice
    # names the forward's stages alone, and forcing it gives the plan back.
    streamed = _plan(H=768, B=256).layer(0)
    assert (streamed.split_k_bwd, streamed.block_k, streamed.num_stages) == (2, 64, 5)
    assert "num_stages_bwd" not in streamed.choice()
    with plan_constraints(**streamed.choice()):
        assert _plan(H=768, B=256).layer(0) == streamed


def test_split_k_backward_from_the_tuning_cache():
    """A tuning entry that names a split-K form plans it (source tuned); one that names a
    form with no tiles for the shape is ignored with a warning."""
    base = _plan(H=1024, B=16)
    store_tuning_entry(base.key, {**base.layer(0).choice(), "split_k_bwd": 2,
                                  "num_warps_bwd": 8}, 1.0, "h100")
    tuned = _plan(H=1024, B=16)
    assert (tuned.source, tuned.layer(0).split_k_bwd) == ("tuned", 2)
    wide = _plan(H=1024, B=64)
    store_tuning_entry(wide.key, {**wide.layer(0).choice(), "split_k_bwd": 1}, 1.0, "h100")
    with pytest.warns(RuntimeWarning, match=r"split_k_bwd = 1 has no tiles .* B <= 32"):
        again = _plan(H=1024, B=64)
    assert again.source == "heuristic" and again.layer(0) == wide.layer(0)


# The split-K rule (`planner._split_k_rule`): the heuristic's backward is the split-K kernel's
# at three of the four shapes an H200 timed it faster in the layer (not LSTM H=1024 B=256,
# whose compile spills), in the form that won there, on both sm_90 presets and both 16-bit
# dtypes; nowhere else.
_RULED = [("lstm", 1024, 16, 1), ("lstm", 1024, 64, 2), ("gru", 1536, 16, 2)]


@pytest.mark.parametrize("device", ["h100", "h200"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode, H, B, form", _RULED)
def test_split_k_rule_picks_the_timed_form(request, device, dtype, mode, H, B, form):
    """At a ruled shape the heuristic's plan keeps its forward (family, tiles, warps,
    stages) and runs the split-K backward in the timed form on that form's tiles (the
    launch `split_k_launch` gives, the plan counting its programs); the source stays
    "heuristic", and the batch bucket's other sizes get it too (B = 9..16 at B = 16).
    Without the rule (`no_split_k_rule`) the same shape plans the grid's own backward."""
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn import planner

    plan = _plan(mode=mode, H=H, B=B, dtype=dtype, device=device)
    lp = plan.layer(0)
    assert (plan.source, lp.family, lp.split_k_bwd) == ("heuristic", "persistent_grid", form)
    launch = planner.split_k_launch(lp, mode, H, B, dtype, PRESETS[device])
    assert (launch.one_barrier, tuple(launch[:3])) == (form == 1,
                                                       planner._SPLIT_K_RULE[(mode, H, B)][1])
    programs, _ = split_k.footprint(mode, H, B, dtype, launch)
    forward = gt.grid_programs(H, H, 0, B, lp.block_h, lp.block_b, 1)
    assert (lp.pass_programs(False), lp.num_programs) == (forward, max(programs, forward))
    assert "backward split-K" in plan.explain()
    assert _plan(mode=mode, H=H, B=B // 2 + 1, dtype=dtype, device=device).layer(0) == lp
    request.getfixturevalue("no_split_k_rule")
    own = _plan(mode=mode, H=H, B=B, dtype=dtype, device=device).layer(0)
    assert own.split_k_bwd == 0
    forward = ("family", "block_b", "block_h", "block_k", "num_warps", "num_stages", "num_dirs")
    assert [getattr(lp, k) for k in forward] == [getattr(own, k) for k in forward]
    # Forcing the timed form on the rule-less plan gives the rule's plan, and forcing the
    # family's own backward gives the rule-less plan (what `aot --split-k-bwd 0` compiles
    # for step_ablation's `nosplitk` rows).
    with plan_constraints(split_k_bwd=form):
        assert _plan(mode=mode, H=H, B=B, dtype=dtype, device=device).layer(0) == lp
    with plan_constraints(split_k_bwd=0):
        assert _plan(mode=mode, H=H, B=B, dtype=dtype, device=device).layer(0) == own


@pytest.mark.parametrize("mode, H, B, dtype, device, kw, why", [
    # the shapes it lost at, or never ran at
    ("lstm", 768, 64, torch.bfloat16, "h100", {}, "lost: 1.19x"),
    ("lstm", 768, 256, torch.bfloat16, "h100", {}, "lost: 1.16x"),
    ("lstm", 1024, 256, torch.bfloat16, "h100", {}, "won 0.98x, but spills on sm_90"),
    ("gru", 1024, 16, torch.bfloat16, "h100", {}, "lost: 1.13x / 1.22x"),
    ("gru", 1024, 64, torch.bfloat16, "h100", {}, "lost: 1.18x"),
    ("lstm", 1024, 32, torch.bfloat16, "h100", {}, "untimed bucket"),
    ("lstm", 1024, 128, torch.bfloat16, "h100", {}, "untimed bucket"),
    ("gru", 1536, 32, torch.bfloat16, "h100", {}, "untimed bucket"),
    ("lstm", 1024, 8, torch.bfloat16, "h100", {}, "untimed bucket"),
    ("rnn_tanh", 1024, 16, torch.bfloat16, "h100", {}, "untimed cell"),
    # the timed shapes under conditions that were not timed
    ("lstm", 1024, 16, torch.float32, "h100", {}, "float32"),
    ("lstm", 1024, 64, torch.bfloat16, "a100", {}, "sm_80"),
    ("lstm", 1024, 16, torch.bfloat16, "interpreter", {}, "the interpreter"),
    ("lstm", 1024, 16, torch.bfloat16, "h100", {"num_proj": 512}, "a projection"),
    ("lstm", 1024, 16, torch.bfloat16, "h100", {"direction": "bidirectional"},
     "a pair launch (128 programs: both directions in one)"),
])
def test_split_k_rule_stays_where_it_was_not_timed(mode, H, B, dtype, device, kw, why):
    lp = _plan(mode=mode, H=H, B=B, dtype=dtype, device=device, **kw).layer(0)
    assert lp.split_k_bwd == 0, why


def test_split_k_rule_needs_its_timed_launch_on_the_device():
    """An sm_90 device with fewer SMs (an H100 PCIe's 114): where the form's tiles there are
    not the timed ones (LSTM H=1024 B=16: 256 x 256 x 16 on 64 programs instead of 256 x 128
    x 16 on 128) the grid's own backward runs; where they are (GRU H=1536 B=16: 128 x 512 x
    16 on 108 programs), the rule's form."""
    from tritonrnn.kernels import split_k

    pcie = dataclasses.replace(PRESETS["h100"], name="NVIDIA H100 PCIe", sm_count=114)
    assert split_k.form_tiles(1, "lstm", 1024, 16, torch.bfloat16, pcie) == (256, 256, 16,
                                                                             True)
    lp = _plan(H=1024, B=16, device=pcie).layer(0)
    assert (lp.family, lp.split_k_bwd) == ("persistent_grid", 0), lp
    lp = _plan(mode="gru", H=1536, B=16, device=pcie).layer(0)
    assert (lp.family, lp.split_k_bwd, lp.num_programs) == ("persistent_grid", 2, 108), lp


def test_split_k_rule_is_the_heuristics_alone(tmp_path, monkeypatch):
    """The rule gives the heuristic's plan its backward, not a choice: constraints that do
    not name split_k_bwd, and a tuning entry from before the key, keep the family's own
    backward (what they were timed or asked with); split_k_bwd = 0 forced keeps it too, and
    a switch's form goes before the rule's (LSTM H=1024 B=16: one barrier, the switch of
    the two-barrier form on alone gives two). A ruled plan's replacement after a refused
    launch (`smaller_choice`) is the plan's forward with the grid's backward."""
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn import planner

    ruled = _plan(H=1024, B=16).layer(0)
    assert ruled.split_k_bwd == 1
    with plan_constraints(family="persistent_grid"):
        forced = _plan(H=1024, B=16)
    assert (forced.source, forced.layer(0).split_k_bwd) == ("constrained", 0)
    with plan_constraints(split_k_bwd=0):
        own = _plan(H=1024, B=16).layer(0)
    assert own.split_k_bwd == 0 and own.forward_programs == 0 and own.num_programs == 64
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", True)
    assert _plan(H=1024, B=16).layer(0).split_k_bwd == 2
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", False)
    smaller = planner.smaller_choice(ruled, "lstm", 1024, 1024, 0, torch.bfloat16, 16,
                                     PRESETS["h100"])
    assert smaller == own
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    key = _plan(H=1024, B=64).key
    old = {k: v for k, v in own.choice().items() if k != "split_k_bwd"}
    store_tuning_entry(key, {**old, "block_b": 32}, 1.0, "h100")
    tuned = _plan(H=1024, B=64)
    assert (tuned.source, tuned.layer(0).split_k_bwd) == ("tuned", 0)


@pytest.mark.parametrize("mode, H, B, P, constraints, message", [
    ("lstm", 64, 16, 0, dict(family="persistent_cta", split_k_bwd=1),
     "split_k_bwd = 1 cannot apply to family 'persistent_cta': the split-K backward runs a "
     "persistent-grid or stepwise plan's backward"),
    ("lstm", 64, 16, 0, dict(split_k_bwd=2),
     "split_k_bwd = 2 cannot apply to family 'persistent_cta' (the heuristic's family for "
     "this shape)"),
    ("lstm", 1024, 16, 256, dict(split_k_bwd=2),
     "split_k_bwd = 2 needs a layer without a projection (num_proj = 0), got num_proj = 256"),
    ("lstm", 1024, 64, 0, dict(split_k_bwd=1),
     "split_k_bwd = 1 has no tiles for lstm H=1024 torch.bfloat16 batch bucket 64 on NVIDIA "
     "H100 80GB HBM3 (`kernels.split_k.split_k1_tiles`: power-of-two unit blocks and K blocks "
     "of >= 16 units that divide H, B <= 32, on at most 132 programs within its shared "
     "memory)"),
    ("gru", 1000, 16, 0, dict(family="persistent_grid", split_k_bwd=2),
     "split_k_bwd = 2 has no tiles for gru H=1000 torch.bfloat16 batch bucket 16 on NVIDIA "
     "H100 80GB HBM3 (`kernels.split_k.split_k_tiles`: power-of-two unit blocks that divide H "
     "and K blocks "
     "of >= 64 gate rows that divide the G*H, on at most 132 programs"),
    ("lstm", 768, 64, 0, dict(split_k_bwd=2, block_h_bwd=32, block_b_bwd=16),
     "block_h_bwd = 32 cannot apply with split_k_bwd = 2: the split-K backward runs the tiles "
     "its rule picks"),
    ("lstm", 768, 256, 0, dict(split_k_bwd=2, num_stages_bwd=4),
     "num_stages_bwd = 4 cannot apply with split_k_bwd = 2"),
])
def test_split_k_backward_constraints_that_cannot_apply(mode, H, B, P, constraints, message):
    with plan_constraints(**constraints), pytest.raises(ValueError, match=re.escape(message)):
        _plan(mode=mode, H=H, B=B, num_proj=P).layer(0)


@pytest.mark.parametrize("value", [3, -1, True, "1", 1.0])
def test_split_k_backward_constraint_refuses_bad_values(value):
    message = (f"split_k_bwd expected 0 (the family's own backward), 1 (the split-K backward, "
               f"one grid barrier a step) or 2 (the split-K backward, two), got {value!r}")
    with pytest.raises(ValueError, match=re.escape(message)), plan_constraints(split_k_bwd=value):
        pass


@pytest.mark.parametrize("mode, H, B, P, forms", [
    ("lstm", 1024, 16, 0, {1, 2}), ("gru", 1536, 16, 0, {2}), ("lstm", 1024, 256, 0, {2}),
    ("lstm", 1024, 16, 256, set()),
])
def test_candidates_try_each_split_k_form_once_per_forward(mode, H, B, P, forms):
    """`tritonrnn tune` times the split-K backward's forms that have tiles beside every
    persistent-grid forward among the candidates (one candidate per forward and form, the
    kernel's 8 warps), and each plans as spelled."""
    plan = _plan(mode=mode, H=H, B=B, num_proj=P)
    cands = candidates(plan)
    split = [c for c in cands if c.get("split_k_bwd")]
    assert {c["split_k_bwd"] for c in split} == forms
    forwards = {tuple(sorted((k, v) for k, v in c.items()
                             if k not in ("num_warps_bwd", "block_h_bwd", "block_b_bwd",
                                          "num_stages_bwd", "split_k_bwd")))
                for c in cands if c["family"] == "persistent_grid" and not c["split_k_bwd"]}
    assert len(split) == len(forwards) * len(forms)
    for c in split:
        assert c["family"] == "persistent_grid" and c["num_warps_bwd"] == 8
        assert not {"block_h_bwd", "block_b_bwd", "num_stages_bwd"} & set(c)
        with plan_constraints(**c):
            lp = _plan(mode=mode, H=H, B=B, num_proj=P).layer(0)
        assert lp.choice() == c


# ----------------------------- mutation round over rnn/ (tests/test_rnn_mutation_gaps.py)


def test_a_resident_tile_of_exactly_the_resident_limit_stays_resident():
    """`_grid_fit` streams the weights past _RESIDENT_TILE (1024) elements of tile; a 16 x 64
    tile is exactly that and keeps them resident (LSTM H=512 B=256 on an H100)."""
    lp = _plan(H=512, B=256).layer(0)
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k, lp.num_programs) == (
        "persistent_grid", 16, 64, 0, 128)


def test_a_projection_has_its_own_tuning_key():
    """The tuning key names P: an entry timed without a projection does not apply to the
    same H with one."""
    plain, projected = _plan(H=256), _plan(H=256, num_proj=128)
    assert "|P0|" in plain.key and "|P128|" in projected.key
    store_tuning_entry(plain.key, {"family": "stepwise", "block_b": 16, "block_h": 32,
                                   "num_warps": 8}, 1.0, "h100")
    assert _plan(H=256).source == "tuned"
    assert _plan(H=256, num_proj=128).source == "heuristic"


def test_planned_reserve_counts_projected_layer_outputs():
    """Plan.reserve_bytes = 256 + itemsize * N * D * (L * H + (L - 1) * Hout) for LSTM
    (rnn/reserve.py): the layer outputs are Hout = P wide, and the op's reserve agrees."""
    from tritonrnn.rnn import cudnn_rnn, params_size

    L, D, H, P, B, T = 2, 2, 64, 32, 3, 5
    p = _plan(H=H, B=B, T=T, num_layers=L, num_proj=P, direction="bidirectional")
    N = B * T
    assert p.reserve_bytes == reserve_mod.PAYLOAD_OFFSET + 2 * N * D * (L * H + (L - 1) * P)
    g = torch.Generator().manual_seed(0)
    n = params_size(rnn_mode="lstm", num_layers=L, num_units=H, input_size=H,
                    direction="bidirectional", num_proj=P)
    out = cudnn_rnn(torch.randn(T, B, H, generator=g).bfloat16(),
                    torch.zeros(L * D, B, P, dtype=torch.bfloat16),
                    torch.zeros(L * D, B, H, dtype=torch.bfloat16),
                    (torch.randn(n, generator=g) * 0.1).bfloat16(), rnn_mode="lstm",
                    direction="bidirectional", num_proj=P, backend="reference")
    assert out.reserve_space.numel() == p.reserve_bytes


def test_vector_tiles_are_not_planned_on_the_interpreter_preset():
    """`_vector_fit`: batch 1 runs vector tiles on a GPU preset, not on the interpreter's
    (whose NumPy programs make them several times slower): MMA tiles there."""
    def layer(device):
        return plan_for(rnn_mode="lstm", input_size=512, num_units=512, batch=1, max_time=16,
                        dtype=torch.bfloat16, device_properties=device).layer(0)

    gpu, cpu = layer("h100"), layer("interpreter")
    assert (gpu.family, gpu.block_b, gpu.block_h) == ("persistent_grid", 1, 8)
    assert cpu.family == "persistent_grid" and cpu.block_b == 16


def test_a_single_layer_pipeline_has_no_dropout_workspace():
    """Dropout applies between layers only: a forced one-layer pipeline with dropout > 0
    allocates (and plans) no `dropped` workspace, as without dropout."""
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.pipeline import forward_workspaces

    cfg = make_config(rnn_mode="lstm", num_layers=1, num_units=32, input_size=32, dropout=0.25)
    assert "dropped" not in forward_workspaces(cfg, 64, 4, True)
    kw = dict(mode="rnn_tanh", H=32, B=4, T=64, num_layers=1)
    with plan_constraints(pipeline_chunks=2):
        dry, wet = _plan(**kw), _plan(**kw, dropout=0.25)
    assert wet.pipeline.chunks == 2
    assert [(b.phase, b.name, b.nbytes) for b in wet.buffers] == [
        (b.phase, b.name, b.nbytes) for b in dry.buffers]
