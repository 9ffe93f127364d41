"""Where does a persistent-grid forward step spend its time? (GPU only, a development tool.)

Times the forward recurrence (the planner's tiles, T steps, one launch) with parts of the step
replaced by no-ops, one variant per process: Triton resolves a kernel's helper functions
from its module's globals when it first compiles it, so swapping a helper in
`tritonrnn.kernels.persistent_grid` before the first launch gives a kernel without that
part (the launch options, `tritonrnn.kernels.grid_tiles`, are swapped the same way). The
outputs of a variant are garbage (no barrier means races); only its time counts.

    python scripts/step_ablation.py [--out DIR]        # every variant, every shape
    python scripts/step_ablation.py --set wide         # a named set (scripts/gpu_session.sh)
    python scripts/step_ablation.py --set decide       # the untimed rules, one decision after
                                                       # another (DECISIONS)
    python scripts/step_ablation.py --aot --set all    # no GPU: compile them for sm_90 instead

`--aot` times nothing: each variant's forward and backward kernels, as the timed run would
launch them, are compiled ahead of time for sm_90 (`tritonrnn.bench.aot`, Triton's ptxas) and
reported per shape and pass: shared memory, registers, spills, whether the compile fits an
H100, and the step loop's static instruction counts. Run it on the CPU before a device
session (with the GPU machine's Triton: PYTHONPATH=.triton36) so that no device minute goes
to a variant that does not compile or does not fit, and to read the timings against the
instruction counts afterwards.

Variants (comma-joined in one process):
    full      the production kernel
    nowait    grid_wait returns at once (arrivals still counted)
    noarrive  grid_arrive does nothing (with nowait: no barrier at all)
    nodot     the recurrent matmul (h load + dots + split-K reduction) returns zeros
    nobdot    the backward's carry product (dph load + dots + split-K reduction,
              `_bwd_carry`) leaves the carry as it is (seen in `layer` times)
    noload    the exchange operand (`_kpart`, `_vx`: h, or dph in the backward) is its own
              mask as 1.0 / 0.0 instead of a load, loop-variant (`_slot_one`: before
              2026-11-27 it was not, and the 16 x 16 forward's whole product left the step
              loop): the staging and the dots stay, the L2 round trips go (full - noload:
              what they cost). It replaces `l1load` (the loads
              cached in L1), which could not show that: the barrier's acquire invalidates L1
              every step (CCTL.IVALL in the sm_90 compiles), so its loads went to L2 too
    nocell    the cell nonlinearity is replaced by additions
    noxg      the input-side gate tiles are not loaded
    nostore   the y / c_seq output stores are dropped
    w2/w4/w8  2 / 4 / 8 warps instead of the planner's (both passes); bh32: block_h 32
    bw2/bw4/bw8  the backward's warps only (seen in `layer` times); fw4/fw8 the forward's
              (fw4 at 16 x 16 tiles: the forward as before 2026-11-26's fourth H200 session,
              4 warps, weights in shared memory)
    nosums    the forward's gate pre-activations summed per gate (kernels' _FWD_JOINED_SUMS;
              by default joined on MMA tiles: one layout conversion for the four gates)
    nopair    the forward loads the second chunk of h where its dots use it (kernels'
              _FWD_PAIRED_CHUNKS; by default both chunks before either product, one L2
              round trip per step instead of two in a row, where the compiler keeps that
              order: on 8 warps hoisted it does not)
    pairg / nopairg  the backward loads its gates' dph operands ahead of their products
              (kernels' _BWD_PAIRED_GATES, on by default since the third H200 session of
              2026-11-26: apart the anchor waits for 8 L2 round trips of dph per step, 2
              paired; 32 KiB more shared memory) / where its products use them
    pairg32   the same on 16 x 32 tiles (the B = 32 / 64 plans; kernels'
              _BWD_PAIRED_GATES_WIDE, off by default; where the footprint fits: LSTM / GRU
              H=768 B=64 on an H100, 30 / 26 -> 18 BAR.SYNC per backward step)
    splitk    the layer's backward on the split-K kernel (kernels/split_k.py, TRITONRNN_BWD_
              SPLIT_K; no projection): R in blocks, each program its K range of dph, two
              grid barriers a step (seen in `layer` times)
    splitk1   the same in its one-barrier form where it has tiles (TRITONRNN_BWD_SPLIT_K1,
              B <= 32): each K block's programs all run its cells, one grid barrier a step
    nosplitk  the family's own backward where the planner's rule runs the split-K kernel's
              (rnn.planner._SPLIT_K_RULE emptied: LSTM H=1024 B=16 / 64, GRU H=1536 B=16)
    samebwd   the backward on the forward's tiles where the planner gives it its own 32 x 16
              tiles under a 16 x 32 forward (rnn.planner._taller_backward)
    carrymask the forward uses the active-row mask its prefetch carried over the barrier
              (kernels' _FWD_MASK_IN_LOOP; by default formed in the loop on MMA tiles below
              64 x 64: Triton 3.6 converts the carried one through shared memory)
    chunk1024 resident reductions of 1024 in one chunk (kernels' _MAX_CHUNK = 1024; the
              default halves them, 512 + 512)
    nowidecap batch tiles wider than 32 columns keep single chunks up to _MAX_CHUNK (the
              default narrows them, kernels' _max_chunk: 512 = 256 + 256 at 64 columns)
    s1/s2/s4  split-K factor forced (kernels' _nsplit), capped by the chunk
    gs2       the forward's gate dots split at most 2 ways (kernels' _FWD_GATE_SPLIT; by
              default up to 8, one slice per warp: no warp computes copies; on the anchor's
              8-warp hoisted forward its Triton 3.6 compile spills, 5112 B)
    layer     also time the whole layer's fwd and bwd through the ops (planner patched to
              the variant's warps)
    noswap / nojoin  streamed weights: the loops' dots untransposed / the forward's gates
              in separate products (kernels' _swap_dots / _joint_gates)
    chains1   the backward's resident gates in one accumulator (kernels' _bwd_chains)
    mma1      MMA tiles (block_b 16) at batch 1 instead of vector tiles (the planner's
              _VECTOR_BATCH = 0)
    hoist / hoistf / nohoist  resident MMA weights held in registers (no runtime branch
              around the dots, kernels' _hoist_weights / TRITONRNN_HOIST_WEIGHTS) in both
              passes / the forward only / neither (the planner's rule: 16-wide batch tiles,
              <= 256 B of weights per thread, on 8 warps <= 512 B; the planner gives 16 x
              16 tiles 8 warps in a pass where that hoists them and 4 would not)
    vec1      vector tiles with each resident chunk in one slice (kernels'
              vector_width: 512-column chunks spread over warps, so their reductions cross
              warps through shared memory)
    bk0 / bk32 / bk64 / bk128 / bb64 / bh16 / bb16 / bb128 / bh128  plan constraints
              (weights resident, or streamed in chunks of 32 / 64 / 128, batch tiles of 64,
              hidden slices of 16, 32 x 16 tiles, 64 x 128 tiles, 128 x 64 tiles) for the
              step and the layer times
    noxjoin   the forward's input-side tiles added after its streamed joint product, as
              tiles of their own, on every tile size (kernels' _XJOIN_TILE; by default they
              start the product on tiles of 64 x 64 and more, `_xjoin`)
    nolate    the backward's sub-steps have their inputs prefetched by the sub-step before,
              ahead of the barrier's wait, on every tile size (kernels' _LATE_TILE; by
              default gated cells' tiles of 128 x 64 and more load them after their
              product, `_late_loads`)
    stepwise  the stepwise family (one launch per step, any number of programs) on the
              32 x 64 tiles streamed in 64-column chunks, which the B = 256 plans use
              without spills, instead of the persistent grid; the step time is then one
              step's launch
    sw64      the same on 64 x 64 tiles, the stepwise family's own choice where it runs
              (`planner._stepwise_fit`: the fewest L2 bytes per step)
    st3 / st4 / st6 / st8  the streamed loops of both passes on 3 (Triton's default) / 4 /
              6 / 8 software-pipeline stages (plan constraint num_stages) instead of the
              planner's (`planner._stream_stages`: 96 KiB in flight per program, at most 8
              stages; LSTM 32 x 64 tiles 5 forward, 8 backward)
and `bare4` / `bare8`: bare grid barriers at the same grid with 4 / 8 warps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import torch
import triton
import triton.language as tl

# The operand pointers and masks of the `noload` replacements (the kernels' own).
from tritonrnn.kernels.persistent_grid import _kptrs, _vxptrs
from tritonrnn.rnn.planner import write_json_atomic

SHAPES = [("lstm", 512, 1), ("lstm", 768, 16), ("lstm", 768, 64), ("gru", 1024, 16)]
VARIANTS = ["full,layer", "mma1,layer", "chains1,layer", "nowait",
            "nowait,noarrive", "nodot", "nocell", "noxg", "nostore", "nowait,noarrive,nodot",
            "nowait,noarrive,nodot,noxg,nostore", "s1", "w8", "bare4"]
T = 1024


def _grid_backward(variants: str) -> str:
    """`variants` (';'-separated) each with `nosplitk` first: the grid family's own backward
    also at the shapes where the planner's rule runs the split-K kernel's (`_SPLIT_K_RULE`:
    LSTM H=1024 B=16 / 64, GRU H=1536 B=16), for the sets whose variants change the grid's
    backward (warps, hoisting, chunks, chains, its barrier or product), which the split-K
    kernel would leave as the plan's. Elsewhere nosplitk changes nothing."""
    return ";".join(f"nosplitk,{v}" for v in variants.split(";"))


# The ablations of scripts/gpu_session.sh's stages, by name (`--set NAME`; the stage's
# `ablate SECONDS NAME` call): (shapes, variants), as --shapes / --variants take them.
SETS = {
    "wide": ("lstm,1024,64;gru,1024,64;lstm,768,64",
             _grid_backward("full,layer;bw4,layer;chunk1024,layer;chunk1024,bw4,layer")),
    "large": ("lstm,768,256;lstm,1024,256;gru,1024,256", "layer;noswap,layer;noswap,nojoin,layer"),
    # B = 64: the resident 16 x 32 plan against streamed 16 x 64 tiles (wgmma loops).
    "b64": ("lstm,768,64;lstm,1024,64;gru,1024,64",
            "layer;bk64,bb64,bh16,layer;bk128,bb64,bh16,layer"),
    # (The planner's plan there is 8 warps since 2026-11-27, hoisted: against 4 warps, both
    # passes (w4) and the forward (fw4); w8 / fw8 were the plan itself.)
    "warps": ("lstm,768,16;lstm,1024,16;gru,1024,16",
              _grid_backward("layer;w4,layer;fw4,layer")),
    "hoist": ("lstm,256,16;lstm,768,16;lstm,1024,16;gru,1024,16",
              _grid_backward("layer;nohoist,layer;w8,layer;w8,hoist,layer;w8,hoistf,layer")),
    "vector": ("lstm,512,1;lstm,768,1;lstm,1024,1;gru,1024,1", "layer;mma1,layer;vec1,layer"),
    # Where a step's time goes with the current kernels, forward (the step time) and
    # backward (the layer's): the exchange operand's L2 round trip (noload: h, and dph in the
    # backward), the whole product (nodot, nobdot), the barrier (nowait,noarrive), at the
    # 16-wide tiles (H200, commit 392b4f0: forward steps 2.8 to 3.8x the barrier, backward
    # 3.9 to 6.5x; the backward 63% of the anchor's layer) and at a vector tile's (2.2x).
    # (sm_90, Triton 3.6, the anchor since 2026-11-27's `_slot_one`: noload keeps the 48
    # mma.sync and the ldmatrix of full's step loops, forward 444 -> 442 instructions and
    # 16 -> 14 BAR.SYNC, backward 617 -> 693 (the operand's selects); before, its forward
    # had no product left in the loop, and its rows of 2026-11-27 equal nodot's.)
    "phases": ("lstm,768,16;lstm,1024,16;lstm,512,1",
               _grid_backward("layer;noload,layer;nodot,nobdot,layer;nowait,noarrive,layer")),
    # The planner's 4-warp backward of GRU H=1536 at B = 1 and 16 (16 x 16 tiles) spills in
    # its step loop (sm_90, Triton 3.6: 48 B, 12 local loads per step). 8 warps: none, 833
    # instead of 1422 instructions per warp, but two warps per scheduler; one MMA chain
    # (chains1): none, 1396 instructions, but chains of 72 MMAs instead of 3 x 24. LSTM
    # H=768 B=16, where 4 warps won, as the control. The planner's backward there is 8 warps
    # since 2026-11-27 (bw8 was the plan itself): against the 4-warp one (bw4).
    "spills": ("gru,1536,1;gru,1536,16;lstm,768,16",
               _grid_backward("layer;bw4,layer;chains1,layer")),
    # The resident 16 x 64 backward of LSTM H=512 B=256 (8 warps) spilled too (72 B, 17
    # local loads per step) with K = 512 in one chunk (nowidecap); as 256 + 256
    # (`_max_chunk`, the default since 2026-11-25) it does not, nor do weights streamed in
    # 64-column chunks (bk64, wgmma loops).
    "spills-b256": ("lstm,512,256;gru,512,256", "layer;nowidecap,layer;bk64,layer"),
    # Resident chunks of 512 / 1024 columns at 64-column batch tiles spilled (Triton 3.6,
    # local loads per step, forward + backward: 40, 1097, 335); the planner streams their
    # weights since (`grid_tiles.resident_operands_fit`); bk0 restores the resident plan.
    "spills-wide": ("lstm,768,128;rnn_tanh,1536,64;gru,768,256", "layer;bk0,layer"),
    # Resident 32 x 64 and 64 x 64 tiles whose chunks pass that rule (K <= 512) still spill
    # (local loads per step, forward / backward: 7 / 22, 0 / 22, 0 / 35): their live tiles
    # outnumber the registers. The planner streams their weights (64-column chunks, no
    # spills) since: against resident (bk0; bk64 was the plan itself).
    "spills-k512": ("lstm,256,1024;lstm,512,512;rnn_tanh,512,1024", "layer;bk0,layer"),
    # Past B = 256 the co-resident grid needs wider tiles than 32 x 64, and their sm_90
    # compiles spill in the step loop (Triton 3.6, streamed, 8 warps; local loads / stores
    # per step, forward and backward): 64 x 64 (LSTM H=1024 B=512, H=1536 B=256) 5-20 / 0
    # and none; 128 x 64 (LSTM H=768 and 1024 at B=1024) about 190-245 / 100-155 and 490 /
    # 390. The planner's plan against the stepwise family on 32 x 64 tiles, and against
    # 32-column chunks (bk32): at LSTM H=1536 B=256 their forward does not spill (1980
    # instructions per step, 60 KiB of shared memory; the planner's 64-column chunks 2048,
    # 20 local loads, 120 KiB), at H=1024 B=512 it spills more (12 local loads, 64-column
    # chunks 5). 128 x 64 tiles spill in any chunk and on 16 warps.
    # Since: the forward's input-side tiles start its joint product on these tiles (`_xjoin`;
    # noxjoin restores them): 64 x 64 forwards spill nothing, 128 x 64 77 local loads per
    # step. 64 x 128 tiles (at B = 1024 the same programs and, for LSTM, a third less L2
    # traffic in the forward, by the count of weight and h bytes each program reads per
    # step; the backward's the same) 41; the planner takes them before 128 x 64 since
    # (`planner._grid_batch_tiles`), bh128 restores those.
    # sw64: stepwise on the 64 x 64 tiles its planner rule picks past the grid (no spills).
    "huge": ("lstm,1536,256;lstm,1024,512;lstm,768,1024;lstm,1024,1024",
             "layer;bh128,layer;stepwise,layer;sw64,layer;noxjoin,layer;bk32,layer"),
    # The backwards of 64 x 128 (the planner's at B = 1024, and B = 512 at H = 1536) and 128 x
    # 64 tiles (bh128) load each sub-step's inputs after its product (`_late_loads`):
    # Triton 3.6, local loads per step, prefetched -> late: LSTM 476-508 -> 69-73, GRU 85-86
    # -> 15-19, with the loads' latency no longer behind the wait. nolate restores the
    # prefetch.
    "late": ("lstm,1024,1024;lstm,768,1024;gru,1024,1024;lstm,1536,512",
             "layer;nolate,layer;bh128,layer;bh128,nolate,layer"),
}
# Sets of decisions: jobs (shapes, variants) run in order, each a shape's planner plan
# (`layer`) against the variants that would undo an untimed rule, so that a stage cut at its
# time box keeps the decisions it finished (a shape's baseline is timed once). `decide` holds
# the rules no GPU has timed (the sets above, one shape each), most consequential first: the
# targets that the 2026-11-22 H100 runs missed (B = 64: LSTM H=1024 1.09x cuDNN; per-step
# latency 4.3-7.4x the bare barrier; B = 256: LSTM H=1024 0.72x), then the rules of the
# large tiles and of the spilling compiles.
# Decided on an H200 (2026-11-26, bench/results/step-ablation-nvidia-h200-2026-11-26-
# decide.json): the per-gate split-K forward (nobatch) against the gate-batched one, which
# it replaced as the default (the gate-batched forward and its variants batch / nobatch were
# removed on 2026-11-28: kernels/NOTES.md, "The step loop"); the streamed B = 256 loops stay
# (noswap,nojoin 1.32x the plan's time); the anchor's tagged exchange lost (1.07x).
# Decided on an H200 (the third session of 2026-11-26, bench/results/step-ablation-nvidia-
# h200-2026-11-26-decide-halves.json, whole layer fwd + bwd against the plan): the split-K
# slices added by halves stay (reducesum, tl.sum's cross-warp reduction, 1.28x at the
# anchor and at LSTM H=1024 B=16; the variant and its path were removed on 2026-11-28), so
# does the forward split up to 8 ways (gs2 1.06x, 1.05x); the backward's gates loaded ahead
# (pairg, 4 warps: backward -13%, -4%) are the default since. Open: 8 warps (w8: the
# backward -4%, -5%, the anchor's forward +5%) and the weights in registers on 8 warps
# (hoist,w8: the anchor's forward 3.28 -> 3.15 ms, the best of the set), timed at one or
# two shapes; the 1024-wide backward chunk (chunk1024 0.98x at LSTM H=1024 B=16, before
# pairg).
# Decided on an H200 (the fourth session of 2026-11-26, bench/results/step-ablation-nvidia-
# h200-2026-11-26-decide-pairg.json, layer forward ; backward): the paired gates stay
# (nopairg 1.03 to 1.09x at four 16-row shapes); the 16 x 16 forward on 8 warps with its
# weights in registers (fw8,hoistf: forward -3% to -13% at all four) is the default since;
# the backward on 8 warps alone (bw8) won at LSTM H=512 B=16 only (-10%; +5% at the
# anchor); pairg32 stays opt-in (1.01x, 0.98x at H=768 B=64); the tagged exchange lost
# again (1.08x, 1.26x at B = 1); reducesum and the gate-batched forward lost at GRU H=1024
# B=64 (1.15x, 1.17x). (The tagged exchange and its variant were removed since: kernels/
# NOTES.md, "Tagged exchange".)
# Decided on an H200 (2026-11-27, bench/results/step-ablation-nvidia-h200-2026-11-27-
# decide.json, layer fwd + bwd against the plan): the 8-warp hoisted forward stays (fw4
# 1.00 to 1.05x at four 16-row shapes); the backward hoisted on 8 warps (hoist,bw8: 0.90 to
# 0.95x at LSTM H=512 / 768 / 1024 and GRU H=1024 B=16) is the default since; the late
# loads of the B = 1024 backward stay (nolate 1.18x). The box cut the set there.
# Decided on an H200 (the second session of 2026-11-27, bench/results/step-ablation-nvidia-
# h200-2026-11-27-decide-bw8.json, layer fwd + bwd against the plan): the 8-warp hoisted
# backward's rule stands where it had not been timed (bw4 1.10x GRU H=512, 1.08x GRU H=768,
# 1.02x LSTM H=384, B=16); the ordered chunk loads were removed (pairx 1.00 to 1.01x at the
# anchor, LSTM / GRU H=1024 B=16); LSTM H=1024 B=1024 keeps its 64 x 128 tiles (bh128
# 1.02x, sw64 1.18x). The rnn_tanh job failed on a KeyError in the bench's step inputs
# (fixed since); the box ended before the last three jobs.
# Decided on an H200 (the third session of 2026-11-27, bench/results/step-ablation-nvidia-
# h200-2026-11-27-decide-partials.json and ...-confirm.json, layer fwd + bwd against the
# plan): the 16 x 32 forward on 8 warps (fw8: 0.94 to 0.98x at LSTM / GRU H=768 / 1024
# B=64, 0.97x at rnn_tanh H=1024) is the default since (planner `_split_k_on_8`); the
# partial-product backward lost everywhere (1.06 to 1.13x at B = 64 but LSTM H=1024 0.99x;
# 1.19 / 1.21x at B = 16; removed on 2026-11-28); 32 x 16 tiles (bb16) won the backward at
# H=768 B=64 but not the layer against the new forward (0.99x LSTM, 0.94x GRU; 1.15 / 1.17x
# at H=512), so the plan keeps 16 x 32; streamed 16 x 64 tiles lost (1.35 to 1.42x); rnn_tanh
# H=1536 B=16 keeps 8 warps (w4 1.09x); LSTM H=256 B=16 keeps its hoisted weights and
# joined sums (nohoist 1.02x, nosums 1.00x); resident tiles past 1024 elements stream since
# (planner `_RESIDENT_TILE`; bk64 0.80x at LSTM H=512 B=512, resident bk0 1.22x at GRU H=512
# B=512, 1.07x at rnn_tanh H=512 B=1024). The box ended inside the last job (bw4 at GRU
# H=1536 / LSTM H=1280 B=16: the plans' rows only).
DECISIONS: dict[str, list[tuple[str, str]]] = {
    "decide": [
        # (A 240 s box holds about 25 rows.) The backward on its own 32 x 16 tiles under the
        # 16 x 32 forward (planner `_taller_backward`; each pass timed apart on 2026-11-27,
        # never as one plan): against both passes on 16 x 32.
        ("lstm,768,64;gru,768,64;gru,1024,64", "layer;samebwd,layer"),
        # Only the first resident chunk in registers (`grid_tiles.Hoist.FIRST`,
        # 2026-11-28: GRU H=1536 B=16 both passes on 8 warps, the 32 x 16 backwards of GRU
        # H=768 / 1024 B=64): against the same warps unhoisted (at B = 64 the plan before),
        # and at H=1536 against the plan before (the forward on 4 warps unhoisted, the
        # backward on 8 unhoisted; the grid sweep's GRU H=1536 B=16 took 11.92 ms fwd + bwd
        # with it).
        ("gru,1536,16", _grid_backward("layer;nohoist,layer;fw4,nohoist,layer")),
        ("gru,768,64;gru,1024,64", "layer;nohoist,layer"),
        # The streamed loops pipelined for 96 KiB in flight (planner `_stream_stages`,
        # 2026-11-27: LSTM / GRU 32 x 64 tiles 5 forward and 8 backward stages, LSTM 16 x 16
        # at B = 1 8 and 8) against Triton's default 3, where the B >= 256 rows miss 1.1x
        # cuDNN (the H200's LSTM H=1024 B=256 backward: 35.46 ms at 3 stages) and at a B = 1
        # shape the grid streams; and against 8 stages in both passes (its own job: the
        # plan's row again first, a repeat).
        ("lstm,1024,256;gru,1024,256;lstm,1408,1", "layer;st3,layer"),
        ("lstm,1024,256", "layer;st8,layer"),
        # The backwards too large to hoist on 8 warps
        # run unhoisted on 8 since (planner `_too_large_to_hoist`; on 4 their compiles
        # spilled 17 local loads per step): against the 4-warp one they replaced.
        ("lstm,1280,16", "layer;bw4,layer"),
        # The 16 x 32 forward on 8 warps where it was not timed: B = 128 / 256 at small H,
        # a one-gate cell at H=768.
        ("lstm,512,128;gru,256,256;rnn_relu,768,64", "layer;fw4,layer"),
        # A resident 32 x 64 tile streamed since (`_RESIDENT_TILE`) where no row has timed
        # the rule: B = 1024 (22 local loads per backward step resident).
        ("lstm,256,1024", "layer;bk0,layer"),
        # Not timed, their compiles spill in the step loop: K = 1024 in one chunk
        # (chunk1024, 0.98x twice before the paired gates; paired, the backward 10 local
        # loads per step) and the 16 x 32 forward hoisted on 8 warps (fw8,hoistf at LSTM
        # H=768 / 1024 B=64: 10 / 13).
    ],
    # The split-K backward (kernels/split_k.py) against the plan's, at the shapes where the
    # layer stays under 2x cuDNN's CUDA graph (B = 16 / 64) or under cuDNN (B = 256), its
    # one-barrier form too at B = 16 (`split_k1_tiles`; none at GRU H=1536), the largest
    # gaps of issue 5 first. One shape a job: a run cut at its box keeps whole comparisons
    # (a job's variants each run over all its shapes, the plan's first).
    # (Through the switches, as timed on 2026-11-29: where the planner's rule runs the
    # split-K kernel since, `nosplitk` first gives the switches the choice again.)
    "splitk": [
        ("lstm,1024,256", "layer;splitk,layer"),
        ("lstm,1024,16", _grid_backward("layer;splitk,layer;splitk1,layer")),
        ("lstm,1024,64", _grid_backward("layer;splitk,layer")),
        ("gru,1024,64", "layer;splitk,layer"),
        ("lstm,768,64", "layer;splitk,layer"),
        ("gru,1024,16", "layer;splitk,layer;splitk1,layer"),
        ("lstm,768,256;gru,1536,16", _grid_backward("layer;splitk,layer")),
    ],
    # The split-K rule (planner `_SPLIT_K_RULE`, 2026-11-30, from the `splitk` rows above)
    # against the grid's own backward it replaced, as one plan (the rows above timed it
    # through the switches), at its three shapes; then the buckets between them, untimed:
    # LSTM H=1024 B=32 (both forms), B=128, GRU H=1536 B=32; then B=256 again (0.98x, left
    # out of the rule for its compile's step-loop reloads: a second timing decides).
    # Then the rules `decide` motivated (2026-11-27, the third session), checked where they
    # were not timed: 32 x 16 tiles against the planner's 16 x 32 (its forward on 8 warps
    # since) at B = 64; the one-gate cells' 16 x 32 forward on 8 warps (a rule of the same
    # session, so the plan's since) against 4 (`fw4`; `fw8` timed the plan twice); the wide
    # resident tiles the planner streams since (`bk0` restores them; their sm_90 compiles
    # spill).
    "confirm": [
        ("lstm,1024,16;gru,1536,16;lstm,1024,64", "layer;nosplitk,layer"),
        ("lstm,1024,32", "layer;splitk,layer;splitk1,layer"),
        ("lstm,1024,128;gru,1536,32", "layer;splitk,layer"),
        ("lstm,1024,256", "layer;splitk,layer"),
        ("lstm,768,64;gru,768,64;lstm,512,64;gru,512,64", "layer;bb16,layer"),
        ("rnn_tanh,1024,64", "layer;fw4,layer"),
        ("gru,512,512;rnn_tanh,512,1024", "layer;bk0,layer"),
    ],
}


def set_jobs(name: str) -> list[tuple[str, str]]:
    """The (shapes, variants) jobs of the named set, in run order."""
    return DECISIONS[name] if name in DECISIONS else [SETS[name]]


@triton.jit
def _no_wait(sync_ptr, target, max_spin):
    return target * 0


@triton.jit
def _no_arrive(sync_ptr):
    tl.debug_barrier()


@triton.jit
def _no_dot(R, s_r, hs, h_ok, src, jb64, b_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3,
            G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr, KA: tl.constexpr,
            KB: tl.constexpr, RESIDENT: tl.constexpr, S: tl.constexpr, DOT_DT: tl.constexpr,
            FP32_DOT: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr,
            GATES: tl.constexpr = 0, GP: tl.constexpr = 4, SWAP: tl.constexpr = False,
            PAIR: tl.constexpr = False, tile_b=True):
    z = tl.zeros([BH, BB], tl.float32)
    return z, z, z, z


@triton.jit
def _no_bdot(carry, R, s_r, os_, o_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3, src, jb64, act1,
             G: tl.constexpr, H: tl.constexpr, KA: tl.constexpr, KB: tl.constexpr,
             RESIDENT: tl.constexpr, S: tl.constexpr, DOT_DT: tl.constexpr,
             FP32_DOT: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_B: tl.constexpr,
             SWAP: tl.constexpr = False, CHAINS: tl.constexpr = 4, PAIRG: tl.constexpr = False,
             tile_b=True):
    return carry


@triton.jit
def _slot_one(X):
    """1.0 from the exchange slot's address X, not its data (an element pointer's address is
    even at runtime, which the compiler cannot know): the slot alternates every step, so a
    `noload` operand built on it stays loop-variant. Built on the mask alone it was
    loop-invariant, and the sm_90 compiles hoisted the whole 16 x 16 forward product (its
    weights in registers) out of the step loop."""
    return 1.0 - (X.to(tl.int64, bitcast=True) & 1).to(tl.float32)


@triton.jit
def _kpart_noload(X, x_row, jb64, x_ok, k0, KC: tl.constexpr, K: tl.constexpr,
                  S: tl.constexpr, DT: tl.constexpr):
    _, ok = _kptrs(X, x_row, jb64, x_ok, k0, KC, K, S)
    return tl.where(ok, _slot_one(X), 0.0).to(DT)


@triton.jit
def _vx_noload(X, x_row, jb, ok, k0, S: tl.constexpr, BM: tl.constexpr, KW: tl.constexpr,
               K: tl.constexpr, DT: tl.constexpr):
    _, m = _vxptrs(X, x_row, jb, ok, k0, S, BM, KW, K)
    return tl.where(m, _slot_one(X), 0.0).to(DT).to(tl.float32)


@triton.jit
def _no_cell(CELL: tl.constexpr, x0, x1, x2, x3, p0, p1, p2, p3, h_old, c):
    return x0 + p0 + x1 + p1 + x2 + p2 + x3 + p3 + h_old, c + p0


@triton.jit
def _no_load(ptr, stride, rows, hs, mask, k: tl.constexpr, G: tl.constexpr,
             H: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    return tl.zeros([BH, BB], tl.float32)


@triton.jit
def _no_store(ptr, stride, rows, cols, val, mask):
    pass


def _hoisted(passes: tuple[str, ...]):
    """`grid_tiles._hoist_weights` as with TRITONRNN_HOIST_WEIGHTS naming `passes`
    (none: off)."""
    from tritonrnn.kernels import grid_tiles as gt

    def hoist(pass_name, block_k, block_b, persistent=True, proj=0, thread_bytes=0,
              num_warps=4, first_bytes=0):
        held = pass_name in passes and gt.hoist_tiles(block_k, block_b, persistent, proj)
        return gt.Hoist.ALL if held else gt.Hoist.NONE

    return hoist


def _forced_split(n: int):
    """An `_nsplit` that always splits K n ways (capped by the chunk), both passes, on MMA
    tiles (vector tiles' FMA products take no split: 1, as `_nsplit` gives them)."""
    from tritonrnn.kernels.grid_tiles import vector_tiles

    def nsplit(ka, kb, num_warps, bm, bb, max_split=32):
        if n == 1 or vector_tiles(bb):
            return 1
        return max(1, min(n, ka // 16, kb // 16 if kb else ka // 16))
    return nsplit


def swaps() -> dict:
    """Variant part -> [(module, attribute, replacement), ...]; the parts "full", "bh32" and
    "layer" swap nothing (bh32 / layer: applied in `_measure`)."""
    from tritonrnn.kernels import cells, split_k
    from tritonrnn.kernels import grid_tiles as gt
    from tritonrnn.kernels import persistent_grid as pg
    from tritonrnn.rnn import planner

    def warps(w):
        return lambda *_a: w

    return {
        "nowait": [(pg, "grid_wait", _no_wait)],
        "noarrive": [(pg, "grid_arrive", _no_arrive)],
        "nodot": [(pg, "_fwd_pre", _no_dot)],
        "nobdot": [(pg, "_bwd_carry", _no_bdot)],
        "noload": [(pg, "_kpart", _kpart_noload), (pg, "_vx", _vx_noload)],
        "nocell": [(cells, "cell_forward", _no_cell)],
        "noxg": [(pg, "_load_gate", _no_load)],
        "nostore": [(pg, "_store_rows", _no_store)],
        "nosums": [(gt, "_FWD_JOINED_SUMS", False)],
        "carrymask": [(gt, "_FWD_MASK_IN_LOOP", False)],
        "nopair": [(gt, "_FWD_PAIRED_CHUNKS", False)],
        "pairg": [(gt, "_BWD_PAIRED_GATES", True)],
        "nopairg": [(gt, "_BWD_PAIRED_GATES", False)],
        "pairg32": [(gt, "_BWD_PAIRED_GATES_WIDE", True)],
        "splitk": [(split_k, "_BWD_SPLIT_K", True)],
        "splitk1": [(split_k, "_BWD_SPLIT_K1", True)],
        # The grid's own backward where the planner's rule picks the split-K kernel's.
        "nosplitk": [(planner, "_SPLIT_K_RULE", {})],
        # The backward on the forward's tiles (the planner's 32 x 16 backward under 16 x 32).
        "samebwd": [(planner, "_taller_backward", lambda lp, *_a: lp)],
        "gs2": [(gt, "_FWD_GATE_SPLIT", 2)],
        # Streamed weights (large batch): the loops' dots untransposed, the forward's gates
        # in separate products (the loops as they were before both).
        "noswap": [(gt, "_swap_dots", lambda *_a: False)],
        "nojoin": [(gt, "_joint_gates", lambda *_a: False)],
        # The backward's resident gate products chained through one accumulator.
        "chains1": [(gt, "_bwd_chains", lambda *_a: 1)],
        # Batch 1 on 16-wide MMA tiles (as before vector tiles).
        "mma1": [(planner, "_VECTOR_BATCH", 0)],
        # Vector tiles with unsliced chunks.
        "vec1": [(gt, "vector_width", lambda _dt: 1 << 16)],
        "chunk1024": [(gt, "_MAX_CHUNK", 1024)],
        # Batch tiles wider than 32 columns hold single chunks as wide as narrow tiles do.
        "nowidecap": [(gt, "_max_chunk", lambda _bb: gt._MAX_CHUNK)],
        "noxjoin": [(gt, "_XJOIN_TILE", 1 << 30)],
        "nolate": [(gt, "_LATE_TILE", 1 << 30)],
        "hoist": [(gt, "_hoist_weights", _hoisted(("fwd", "bwd")))],
        "hoistf": [(gt, "_hoist_weights", _hoisted(("fwd",)))],
        "nohoist": [(gt, "_hoist_weights", _hoisted(()))],
        **{f"w{w}": [(planner, "_persistent_grid_warps", warps(w)),
                     (planner, "_persistent_grid_bwd_warps", warps(w)),
                     (planner, "_VECTOR_WARPS", w)] for w in (2, 4, 8)},
        **{f"bw{w}": [(planner, "_persistent_grid_bwd_warps", warps(w))] for w in (2, 4, 8)},
        **{f"fw{w}": [(planner, "_persistent_grid_warps", warps(w))] for w in (4, 8)},
        **{f"s{n}": [(gt, "_nsplit", _forced_split(n))] for n in (1, 2, 4, 8)},
    }


# Parts that are plan constraints (tritonrnn.rnn.plan_constraints; the persistent grid unless
# the part names a family), applied where the planner is asked: the timed step's plan and the
# layer's ops.
_CONSTRAINTS = {"bk0": {"block_k": 0}, "bk32": {"block_k": 32}, "bk64": {"block_k": 64},
                "bk128": {"block_k": 128},
                "bb64": {"block_b": 64}, "bh16": {"block_h": 16},
                "bb16": {"block_h": 32, "block_b": 16},
                "bb128": {"block_h": 64, "block_b": 128},
                "bh128": {"block_h": 128, "block_b": 64},
                "stepwise": {"family": "stepwise", "block_h": 32, "block_b": 64, "block_k": 64},
                "sw64": {"family": "stepwise", "block_h": 64, "block_b": 64, "block_k": 64},
                **{f"st{n}": {"num_stages": n} for n in (3, 4, 6, 8)}}
_NO_SWAP = ("full", "bh32", "layer", *_CONSTRAINTS)


def constraints(variant: str) -> dict:
    """The plan constraints a variant's parts ask for ({} for none; the persistent grid
    unless a part names another family)."""
    out = {}
    for part in variant.split(","):
        out.update(_CONSTRAINTS.get(part, {}))
    return {"family": "persistent_grid", **out} if out else {}


def check_variant(variant: str) -> None:
    """Raises ValueError naming the first unknown part of a comma-joined variant."""
    if variant in ("bare4", "bare8"):
        return
    known = swaps()
    for part in variant.split(","):
        if part not in known and part not in _NO_SWAP:
            raise ValueError(f"variant {variant!r}: unknown part {part!r}; expected one of "
                             f"{', '.join([*_NO_SWAP, *known])} (or bare4 / bare8 alone)")


def _apply(variant: str) -> None:
    check_variant(variant)
    table = swaps()
    for part in variant.split(","):
        for module, name, value in table.get(part, ()):
            setattr(module, name, value)


def parse_shapes(text: str, option: str = "--shapes") -> list[tuple[str, int, int]]:
    """"MODE,H,B;..." -> [(mode, H, B), ...]; ValueError naming the option and the item
    otherwise."""
    shapes = []
    for item in text.split(";"):
        parts = item.split(",")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"{option}: expected MODE,H,B items separated by ';', "
                             f"got {item!r}")
        shapes.append((parts[0], int(parts[1]), int(parts[2])))
    return shapes


def _measure(variant: str, shapes=SHAPES, once: bool = False, emit=None) -> list[dict]:
    """The variant's rows, one per shape; emit(row), where given, gets each as soon as it is
    measured (a variant process prints it then: a process cut at its limit keeps them)."""
    from tritonrnn.bench.barrier import _recurrence_inputs
    from tritonrnn.kernels.grid_barrier import run_bare_barriers
    from tritonrnn.kernels.persistent_grid import grid_forward
    from tritonrnn.rnn import planner
    from tritonrnn.rnn.planner import device_properties, plan_constraints, recurrence_choice

    if not variant.startswith("bare"):
        _apply(variant)
    parts = variant.split(",")
    dev = torch.device("cuda")
    props = device_properties(dev)
    rows = []
    for mode, H, B in shapes:
        with plan_constraints(**constraints(variant)):
            lp, _ = recurrence_choice(mode, H, H, 0, torch.bfloat16, B, props)
        for w in ("w2", "w4", "w8"):
            if w in parts:
                lp = replace(lp, num_warps=int(w[1:]))
        if "bh32" in parts:  # (streamed: the stages the planner gives those tiles)
            from tritonrnn.kernels.grid_tiles import grid_programs

            programs = grid_programs(H, H, 0, B, 32, lp.block_b, lp.num_dirs)
            lp = planner._stream_stages(replace(lp, block_h=32, num_stages=0, num_stages_bwd=0,
                                                num_programs=programs, forward_programs=0),
                                        mode, H, H, 0, torch.bfloat16, props)
        if variant.startswith("bare"):
            # (the forward's programs: a split-K backward's launch may take more)
            warps, programs = int(variant[4:]), lp.pass_programs(False)
            fn = lambda n=programs, w=warps: run_bare_barriers(T, n, dev, num_warps=w)  # noqa: E731
        else:
            kw = _recurrence_inputs(mode, H, B, T, torch.bfloat16, dev)
            fn = lambda kw=kw, lp=lp: grid_forward(  # noqa: E731
                *kw.values(), persistent=lp.family == "persistent_grid",
                block_h=lp.block_h, block_b=lp.block_b,
                block_k=lp.block_k, num_warps=lp.num_warps, num_stages=lp.num_stages,
                _max_spin=1 << 20)
        fn()
        torch.cuda.synchronize()
        if once:  # under a profiler: one more launch, nothing timed
            fn()
            torch.cuda.synchronize()
            continue
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        rows.append({"variant": variant, "mode": mode, "H": H, "B": B,
                     # (the forward's, which the step times; the larger pass's: a split-K
                     # backward's launch may take more)
                     "programs": lp.pass_programs(False), "programs_bwd": lp.num_programs,
                     "num_warps": lp.num_warps, "num_warps_bwd": lp.backward_warps,
                     # the backward's kernel: 0 the family's own, 1 / 2 split-K's forms
                     "split_k_bwd": lp.split_k_bwd,
                     "block_b": lp.block_b, "block_h": lp.block_h, "block_k": lp.block_k,
                     "num_stages": lp.num_stages, "num_stages_bwd": lp.backward_stages,
                     "step_us": ms * 1e3 / T})
        if "layer" in parts:
            rows[-1].update(_layer_ms(mode, H, B, constraints(variant)))
        if emit is not None:
            emit(rows[-1])
    return rows


def _layer_ms(mode: str, H: int, B: int, cons: dict | None = None) -> dict:
    """The layer's fwd and bwd (T steps, bf16) through the ops, do_bench medians in ms, under
    the plan constraints `cons` (the ops run on this thread: the constraints hold for both)."""
    from tritonrnn.bench.presets import BenchShape
    from tritonrnn.bench.runners import build_case
    from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop
    from tritonrnn.rnn.planner import plan_constraints

    with plan_constraints(**(cons or {})):
        case = build_case(BenchShape(mode=mode, hidden=H, batch=B, time=T).validated(),
                          torch.device("cuda"))

        def fwd():
            return cudnn_rnn(case.x, case.h0, case.c0, case.params, None, is_training=True,
                             rnn_mode=mode)

        out = fwd()

        def bwd():
            return cudnn_rnn_backprop(case.x, case.h0, case.c0, case.params, None, out.output,
                                      out.output_h, out.output_c if mode == "lstm" else None,
                                      case.dy, case.dhT, case.dcT, out.reserve_space,
                                      out.host_reserved, rnn_mode=mode)

        bwd()
        return {"fwd_ms": triton.testing.do_bench(fwd, warmup=25, rep=100, return_mode="median"),
                "bwd_ms": triton.testing.do_bench(bwd, warmup=25, rep=100, return_mode="median")}


def _layer_once(mode: str, H: int, B: int, T: int = 256) -> None:
    """One layer's forward and backward through the public ops, twice (for a profiler)."""
    from tritonrnn.bench.presets import BenchShape
    from tritonrnn.bench.runners import build_case
    from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop

    case = build_case(BenchShape(mode=mode, hidden=H, batch=B, time=T).validated(),
                      torch.device("cuda"))
    for _ in range(2):
        out = cudnn_rnn(case.x, case.h0, case.c0, case.params, None, is_training=True,
                        rnn_mode=mode)
        cudnn_rnn_backprop(case.x, case.h0, case.c0, case.params, None, out.output,
                           out.output_h, out.output_c if mode == "lstm" else None, case.dy,
                           case.dhT, case.dcT, out.reserve_space, out.host_reserved,
                           rnn_mode=mode)
        torch.cuda.synchronize()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--once", metavar="MODE,H,B",
                    help="launch the full kernel twice for one shape and exit (for ncu)")
    ap.add_argument("--variants", help="variants separated by ';' (default: all)")
    ap.add_argument("--layer", action="store_true",
                    help="with --once: the whole layer through the ops (fwd, then bwd), T=256")
    ap.add_argument("--shapes", metavar="MODE,H,B;...",
                    help="shapes to time (default: " + ";".join(
                        f"{m},{h},{b}" for m, h, b in SHAPES) + ")")
    ap.add_argument("--set", choices=[*SETS, *DECISIONS, "all"],
                    help="a named set of shapes and variants (scripts/gpu_session.sh's "
                         "stages); 'all': every set (with --aot only)")
    ap.add_argument("--aot", action="store_true",
                    help="compile each variant's kernels for sm_90 instead of timing them "
                         "(no GPU; run without TRITON_INTERPRET)")
    return ap


def jobs(args) -> list[tuple[list[tuple[str, int, int]], list[str]]]:
    """[(shapes, variants), ...] to run: the named set's jobs (--set all: every set's), else the
    --shapes / --variants of `resolve`."""
    if not args.set:
        return [resolve(args)]
    if args.shapes or args.variants or args.variant or args.once:
        raise ValueError("--set: takes its shapes and variants from the set; expected no "
                         "--shapes, --variants, --variant or --once with it")
    if args.set == "all" and not args.aot:
        raise ValueError("--set all: expected --aot with it (a timed run takes one set per "
                         "device command)")
    names = [*SETS, *DECISIONS] if args.set == "all" else [args.set]
    return [resolve(argparse.Namespace(once=None, shapes=shapes, variant=None,
                                       variants=variants))
            for name in names for shapes, variants in set_jobs(name)]


def runs(todo, merge: bool) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """The variant processes to start, in order: (variant, shapes). merge (--aot, where the
    order does not matter): one process per variant, over the union of its shapes in all the
    jobs. Otherwise in job order: each job's variants over those of its shapes that no earlier
    process ran them on (a decision's baseline shared with an earlier one is timed once)."""
    if merge:
        merged: dict[str, list] = {}
        for shapes, variants in todo:
            for v in variants:
                have = merged.setdefault(v, [])
                have += [sh for sh in shapes if sh not in have]
        return list(merged.items())
    out: list[tuple[str, list]] = []
    done: set[tuple[str, tuple[str, int, int]]] = set()
    for shapes, variants in todo:
        for v in variants:
            new = [sh for sh in shapes if (v, sh) not in done]
            done.update((v, sh) for sh in new)
            if new:
                out.append((v, new))
    return out


def resolve(args) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(shapes, variants) the parsed arguments ask for; ValueError naming a bad shape or
    variant part (--once: one shape)."""
    if args.once:
        shapes = parse_shapes(args.once, "--once")
        if len(shapes) != 1:
            raise ValueError(f"--once: expected one MODE,H,B, got {args.once!r}")
    else:
        shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    if args.variant or args.once:
        variants = [args.variant or "full"]
    else:
        variants = args.variants.split(";") if args.variants else VARIANTS
    for v in variants:
        check_variant(v)
    return shapes, variants


def _aot_rows(variant: str, shapes) -> list[dict]:
    """The variant's forward and backward kernels for each shape, compiled for sm_90 in this
    process (the variant applied first): one row per shape and pass."""
    from tritonrnn.bench.aot import AotShape, _interpreted_process, aot_reports

    if variant.startswith("bare"):
        return []  # the bare barrier: nothing of the recurrence to compile
    _apply(variant)
    if _interpreted_process():
        # aot_reports would compile in a fresh process, without this variant's swaps.
        raise RuntimeError("--aot: the kernels were imported under TRITON_INTERPRET=1; run "
                           "without it")
    cons = constraints(variant)
    if "bh32" in variant.split(","):
        cons = {"family": "persistent_grid", **cons, "block_h": 32}
    reports = aot_reports([(AotShape(mode=m, hidden=H, batch=B), cons or None)
                           for m, H, B in shapes])
    rows = []
    for (mode, H, B), rep in zip(shapes, reports, strict=True):
        plan = rep["plan"]
        for k in rep["kernels"]:
            rows.append({"variant": variant, "mode": mode, "H": H, "B": B, "phase": k["phase"],
                         "triton": rep["triton"], "family": plan["family"],
                         "block_b": plan["block_b"], "block_h": plan["block_h"],
                         "block_k": plan["block_k"], "programs": k["programs"],
                         "num_warps": k["num_warps"], "shared": k["shared"], "regs": k["regs"],
                         "spill_bytes": k["stack"] + k["local"], "fits": k["fits"],
                         "error": k["error"], **k["profile"]})
    return rows


def _aot_line(row: dict) -> str:
    head = (f"{row['variant']:<26} {row['mode']} H{row['H']} B{row['B']} {row['phase']:<8} "
            f"p{row['programs']} w{row['num_warps']}")
    if row["error"]:
        return f"{head}: ERROR {row['error']}"
    return (f"{head}: smem {row['shared']} regs {row['regs']} spill {row['spill_bytes']} "
            f"{'fits' if row['fits'] else 'DOES NOT FIT'} | step loop {row['instructions']} "
            f"instr, MMA {row['MMA']}, LDSM {row['LDSM']}, LDL {row['LDL']}, BAR {row['BAR']}")


def baseline(variant: str) -> str:
    """The variant a decision's verdict compares `variant` with: the planner's plan
    (`layer`), or for a variant under `nosplitk` (first: `_grid_backward`) the plan with the
    grid family's own backward (`nosplitk,layer`, itself against the plan)."""
    if variant.startswith("nosplitk,") and variant != "nosplitk,layer":
        return "nosplitk,layer"
    return "layer"


def _time_line(row: dict, plan: dict | None = None) -> str:
    """A timed row as a line; with `plan` (the same shape's row of the variant's `baseline`:
    `layer`, the planner's plan, or `nosplitk,layer`), the variant's layer fwd + bwd against
    it: a decision's verdict."""
    layer = (f"  layer fwd {row['fwd_ms']:.2f} ms bwd {row['bwd_ms']:.2f} ms"
             if "fwd_ms" in row else "")
    if plan and "fwd_ms" in row and "fwd_ms" in plan and row is not plan:
        ratio = (row["fwd_ms"] + row["bwd_ms"]) / (plan["fwd_ms"] + plan["bwd_ms"])
        against = "the plan's" if plan["variant"] == "layer" else f"{plan['variant']}'s"
        layer += f" = {ratio:.2f}x {against} fwd+bwd"
    return (f"{row['variant']:<40} {row['mode']} H{row['H']} B{row['B']} p{row['programs']} "
            f"w{row['num_warps']}: {row['step_us']:.2f} us/step{layer}")


def run_variant(cmd: list[str], limit: float, on_row) -> tuple[int, bool, list[str]]:
    """Runs one variant process, passing on_row each JSON row it prints, as it prints it;
    kills it after `limit` seconds, and on the way out (this process stopped). Returns (exit
    code, killed by the limit, its stderr's last line)."""
    killed = threading.Event()
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)

        def kill():
            killed.set()
            proc.kill()

        timer = threading.Timer(limit, kill)
        timer.start()
        try:
            for line in proc.stdout:
                if line.startswith("{"):
                    on_row(json.loads(line))
            rc = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return rc, killed.is_set(), err.read().strip().splitlines()[-1:]


def main() -> int:
    ap = build_parser()
    args = ap.parse_args()
    # Checked before any GPU time is spent: each variant otherwise fails in its own process.
    try:
        todo = jobs(args)
    except ValueError as e:
        ap.error(str(e))
    if args.aot and args.once:
        ap.error("--aot: compiles the variants' kernels; expected no --once with it")
    if args.aot and os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("--aot: compiles for a GPU; run without TRITON_INTERPRET=1")
    shapes, variants = todo[0]
    if args.once and args.layer:
        _layer_once(*shapes[0])
        return 0
    if args.once:
        _measure(variants[0], shapes, once=True)
        return 0
    if args.variant:
        def emit(row):
            print(json.dumps(row), flush=True)

        if args.aot:
            for row in _aot_rows(args.variant, shapes):
                emit(row)
        else:
            _measure(args.variant, shapes, emit=emit)
        return 0
    # A time box (gpu_session.sh's `timeout`) stops this process with SIGTERM: exit through
    # the finally clauses, which stop the variant process running (it would hold the GPU
    # through the next step).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # Each variant in its own process (its swaps must precede the first compile).
    rows, failed = [], []
    # The JSON is tagged as bench reports are: the device (the CPU that compiled, for --aot),
    # commit and versions, and the command.
    from tritonrnn.bench.harness import environment

    gpu = torch.cuda.is_available() and not args.aot
    header = {"environment": environment(torch.device("cuda" if gpu else "cpu")),
              "command": [Path(sys.argv[0]).name, *sys.argv[1:]]}
    # (baseline, mode, H, B) -> the baseline's row (`layer`: the planner's plan; `nosplitk,
    # layer`: the plan with the grid's own backward, `_grid_backward`'s jobs)
    plans: dict[tuple, dict] = {}
    for v, shapes in runs(todo, merge=args.aot):
        cmd = [sys.executable, __file__, "--variant", v,
               "--shapes", ";".join(f"{m},{h},{b}" for m, h, b in shapes)]
        if args.aot:
            cmd.append("--aot")
        limit = 120 * len(shapes) if args.aot else 240

        def take(row, v=v):
            rows.append(row)
            shape = row["mode"], row["H"], row["B"]
            if v in ("layer", "nosplitk,layer"):
                plans[(v, *shape)] = row
            print(_aot_line(row) if args.aot else
                  _time_line(row, plans.get((baseline(v), *shape))), flush=True)
            if args.out:  # after every row: a run cut short keeps what it finished (the
                # file replaced whole: a SIGTERM mid-write leaves the rows before it)
                name = "step_ablation_aot.json" if args.aot else "step_ablation.json"
                write_json_atomic(args.out / name, {**header, "rows": rows}, sort_keys=False)

        rc, killed, why = run_variant(cmd, limit, take)
        if killed:  # a hung variant costs its limit, not the set
            failed.append(v)
            print(f"{v}: killed after {limit} s (its rows until then are kept)", flush=True)
        elif rc != 0:
            failed.append(v)
            print(f"{v}: rc {rc}: {why}", flush=True)
    if args.aot:
        errors = [r for r in rows if r["error"]]
        misfits = [r for r in rows if not r["error"] and not r["fits"]]
        version = rows[0]["triton"] if rows else "?"
        print(f"{len(rows)} kernels compiled for sm_90 (Triton {version}): {len(errors)} "
              f"failed, {len(misfits)} do not fit (spills, shared memory, "
              f"registers or co-residency), {len(failed)} variant processes failed", flush=True)
        return 1 if errors or failed else 0
    if failed:
        print(f"{len(failed)} variant processes failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
