"""Host-side rules of the persistent-grid and stepwise launches: which compile-time options a
launch takes from its shape and tiles, and what it holds on chip.

`kernels/persistent_grid.py` holds the kernels and their launchers, and its docstring says how
the kernels work; this module holds what the launchers and the planner (rnn/planner.py) ask of
a shape before any launch:

- the reduction's chunks and K splits (`_ksplit`, `_nsplit`, `_bwd_chains`, `_gate_split`),
  vector tiles (`vector_tiles`, `vector_width`) and the step loop's layout choices
  (`_joint_gates`, `_mask_in_loop`, `_paired_chunks`, `_paired_gates`, `_joined_sums`,
  `_swap_dots`, `_fold_dy`, `_xjoin`, `_late_loads`), each with the sm_90 compile counts and
  GPU timings behind it;
- weights held in registers (`Hoist`, `hoist_pass`);
- the formulas the planner fits plans with: `grid_programs`, `grid_onchip_bytes`,
  `stream_stage_bytes`, `grid_vector_bytes`;
- the kernel switches (TRITONRNN_FWD_* / TRITONRNN_BWD_PAIRED_GATES*, read once, when this
  module is imported; kernels/NOTES.md lists them with what each restores).
"""

from __future__ import annotations

import enum
import os

import torch
import triton
import triton.language as tl

from . import cells

# The software-pipeline depth Triton gives a loop when the launch names none (its num_stages
# on sm_80 / sm_90): the streamed loops' buffers, `stream_stage_bytes`, of a launch with
# num_stages = 0. A launch's num_stages changes only the streamed weights' loops (block_k >
# 0; the resident kernels have no loop that loads), so the launchers refuse it elsewhere.
DEFAULT_STAGES = 3


_DOT_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _pad(n: int) -> int:
    return max(16, triton.next_power_of_2(max(n, 1)))


# Resident reductions are cut so that no chunk is wider than this where two chunks can do it
# (`_ksplit`). Each chunk's dot operand (the exchange rows [chunk, block_b]) is loaded into
# registers whole: a [1024, 32] bf16 operand is 128 registers per thread at 4 warps, and the
# sm_90 compiles of Triton 3.6 (`tritonrnn aot`, bf16, 4 warps) spilled: LSTM H=1024 B=64
# forward 360 B per thread (81 local loads per step), backward 1264 B (356); GRU H=1024 B=64
# 312 / 1184 B. With 512 + 512: 72 / 80 B (13 / 19 local loads per step) and 24 / 40 B, the
# step loops 10-30% fewer instructions, 32 KiB less shared memory per program (the staged
# operand halves), and LSTM H=1024 B=16 backward 24 B -> none. Same MMA count. Not yet
# timed on a GPU (`scripts/step_ablation.py` variant `chunk1024` restores the single chunk).
# The limit is for batch tiles of up to 32 columns; wider tiles scale it down (`_max_chunk`).
_MAX_CHUNK = 512


def _max_chunk(block_b: int) -> int:
    """Widest single resident chunk for batch tiles of block_b columns: _MAX_CHUNK up to 32
    columns, then narrower in proportion, so that a chunk's dot operand [chunk, block_b]
    (loaded into registers whole) stays within _MAX_CHUNK x 32 elements. At 16 x 64 tiles
    (LSTM H=512 B=256, 8 warps) the sm_90 backward (Triton 3.6) spilled 72 B per thread, 17
    local loads per step, with K = 512 in one chunk; as 256 + 256 it spills nothing, its step
    loop 1588 -> 1410 instructions (forward 1017 -> 978) and 32 KiB less shared memory per
    program (131072 -> 98304 B). Not yet timed on a GPU."""
    return max(16, _MAX_CHUNK * 32 // max(block_b, 32))


# The largest dot operand [chunk, block_b] of a resident chunk (elements) that the planner
# keeps resident (`resident_operands_fit`): a 1024-column chunk at 16-column tiles, 512 at 32,
# 256 at 64.
_RESIDENT_OPERAND = 512 * 32


def resident_operands_fit(H: int, Hout: int, block_b: int) -> bool:
    """Whether every resident chunk's dot operand [chunk, block_b] stays within
    _RESIDENT_OPERAND elements, in both passes' reductions (over Hout: R in the forward, Pw^T
    in the backward; over H: R^T in the backward, Pw in the forward). `_ksplit` holds a
    reduction in two chunks and halves a single one only once, so wide batch tiles at large
    H keep chunks of 512 or 1024 columns, each loaded into registers whole. Where the
    persistent grid's first co-resident tiles fail this, the planner streams their weights
    (`rnn.planner._grid_fit`). The sm_90 compiles (Triton 3.6, bf16) of the 66 H100 plans
    this changed (cells, H 768-2048, B 32-512, projections, pair launches): 56 had local
    loads in their step loops, e.g. (forward + backward, per step) rnn_tanh H=1536 B=64 at
    16 x 64 tiles 1097, GRU H=768 B=256 (32 x 64) 335, LSTM H=768 B=128 (16 x 64) 40; now 64
    have none and 2 fewer (LSTM H=768 P=384 B=256 pair 96 -> 30, H=1024 P=512 B=64 pair 36 ->
    9); 63 run fewer step-loop instructions (LSTM H=768 B=128 3251 -> 2001). Streamed, each
    batch tile reads the weights from L2 every step. Not yet timed on a GPU."""
    return all(max(_ksplit(K, 0, block_b)) * block_b <= _RESIDENT_OPERAND for K in (H, Hout))


def _ksplit(K: int, block_k: int = 0, block_b: int = 16) -> tuple[int, int]:
    """Chunks (KA, KB) of a reduction of length K, for batch tiles of block_b columns.

    block_k > 0 (streamed weights): chunks of block_k, read every step (KA = block_k, KB = 0).
    Resident weights: two power-of-two chunks, KA = the largest power of two <= K and
    KB = pad(K - KA), whenever that is shorter than one padded chunk pad(K): 768 = 512 + 256
    and 1536 = 1024 + 512 exactly, where pad(K) would hold 1024 and 2048 (tiles are powers of
    two). The padding left is at most 1/5 of K, against up to 1/2 for one chunk. A single
    chunk wider than `_max_chunk(block_b)` is halved (1024 = 512 + 512, and 512 = 256 + 256
    at 64-column tiles): the same bytes, half the registers for each chunk's operand."""
    if block_k:
        return block_k, 0
    ka = max(16, 1 << (max(K, 1).bit_length() - 1))
    rest = K - ka
    if rest > 0:
        kb = _pad(rest)
        if ka + kb < _pad(K):
            return ka, kb
    whole = _pad(K)
    return (whole // 2, whole // 2) if whole > _max_chunk(block_b) else (whole, 0)


def vector_tiles(block_b: int) -> bool:
    """Whether batch tiles of block_b run the resident products on the FMA units (`_vdot`):
    tiles narrower than an MMA's 16 columns (block_b in 1, 2, 4; resident weights only)."""
    return block_b < 16


def vector_width(dot_dt: tl.dtype) -> int:
    """Columns of one slice of a vector tile's resident weight chunk (`_vgates`): what one
    warp row holds at 16-byte vectors (256 bf16 / fp16, 128 fp32). Triton lays a wider
    [rows, K] tile over several warps along K, so each gate's reduction went through shared
    memory with its barriers; in slices of this width the sums over a slice stay in a warp.
    With the gates reduced together (`_vgates`, `_vgate_sum`), the sm_90 compiles (Triton
    3.6, bf16, B = 1) of the step loops went from 42 to 15 bar.sync and 624 to 559
    instructions (LSTM H=768 forward; backward 52 -> 15, 868 -> 698), 46 -> 18 and 847 -> 667
    at H=1024 (backward 56 -> 18, 1060 -> 816), no spills. The slices of a 512-column chunk
    still meet across 2 warps (Triton lays the slice axis over warps): 3 of those barriers,
    none since the slices are added by halves (`_ksum`: 18 -> 12 at LSTM H=1024)."""
    return 32 * 16 // (dot_dt.primitive_bitwidth // 8)


def _nsplit(ka: int, kb: int, num_warps: int, bm: int, bb: int,
            max_split: int = 32) -> int:
    """Split-K factor S of a [bm, K] @ [K, bb] product whose reduction is held in chunks
    (ka, kb).

    A plain dot spreads its warps over the [bm, bb] output in 16 x 8 MMA tiles; an output
    with fewer tiles than warps leaves the extra warps computing copies of the same result
    (bm = bb = 16: 2 tiles, so 8 warps run every MMA 4 times over and each warp the whole
    chain). Then the reduction is split instead: S = num_warps slices of K, the batch
    dimension of a 3-D dot (Triton places its warps along it), partial sums added at the end.
    Each slice keeps at least the 16 columns an MMA needs (S smaller where the chunks are
    short). S = 1: the plain dot, and vector tiles (bb < 16, FMA products). `max_split` caps
    S (see `_gate_split`)."""
    if vector_tiles(bb) or (bm // 16) * (bb // 8) >= num_warps:
        return 1
    return max(1, min(num_warps, max_split, ka // 16, kb // 16 if kb else ka // 16))


# The smallest tile (block_h * block_b elements) whose forward starts its streamed joint
# product from the prefetched input-side tiles (`_xjoin`).
_XJOIN_TILE = 64 * 64
# The smallest tile of a gated cell whose backward loads a sub-step's inputs after its product
# rather than before the barrier's wait (`_late_loads`).
_LATE_TILE = 128 * 64

# The forward's gate dots split K at most this many ways: one slice per warp on up to 8
# warps, so no warp computes copies (Triton lays S slices over more warps than S as copies:
# at S = 2 on 4 warps every warp issued twice the MMAs and ldmatrix read twice the weights).
# Nothing caps it for the reduction's sake since the slices are added by halves (`_ksum`);
# while tl.sum added them (a cross-warp reduction, 32-way bank-conflicted stores in Nsight
# Compute on an H100) the cap was 2. The sm_90 compiles (Triton 3.6, bf16), forward step
# loop per warp: 16 x 16 tiles on 4 warps, S = 2 -> 4, LSTM H=768 B=16 832 -> 696
# instructions, 192 -> 96 mma.sync, 120 -> 60 ldmatrix, no spills; on 8 warps, S = 4 -> 8,
# LSTM H=768 B=16 696 / 96 -> 483 / 48 (instructions / mma.sync), H=1024 757 / 128 -> 508 /
# 64, GRU H=1024 637 / 96 -> 447 / 48, no spills. An H200 timed S <= 2 (step_ablation `gs2`)
# 1.06x and 1.05x the layer time at the anchor and at LSTM H=1024 B=16.
_FWD_GATE_SPLIT = 8


def _bwd_chains(bo: int, bb: int, S: int, num_warps: int, G: int, K: int) -> int:
    """Independent MMA chains of the backward's resident gate products (CHAINS, `_bwd_carry`;
    K = the reduction held on chip, both chunks): 1 (the G gates chained through one
    accumulator) or 4 (one per gate, added in-thread at the end).

    An MMA waits for the one before it in its chain (~30 cycles on an H100) while a warp
    issues an independent one every few cycles, so a warp needs several chains in flight. A
    warp with at most 2 MMA tiles of the [bo, bb] output (K split in S slices over the warps)
    has only 2 chains of G * K / (16 * S) MMAs: LSTM H=768 B=16 (4 warps, S = 4) 2 chains of
    48; one accumulator per gate makes them 8 of 12 (the sm_90 compile, Triton 3.6: no
    spills; GRU H=1536 B=16: 72 -> 24, 12 local loads per step). Chains of 16 or fewer (LSTM
    H=256) keep one: they gain little, and the compiles of more accumulators keep a few
    values in local memory (LSTM H=256: 4 in-loop loads with 4 accumulators on Triton 3.6, an
    8 B save/restore with 2 accumulators on 3.9). With 4 tiles per warp (16 x 32 tiles, 8
    warps, S = 8) the chains already overlap, and more accumulators spill (LSTM H=1024 B=64:
    6 local loads per step). Not yet timed on a GPU (step_ablation variant `chains1` restores
    one chain)."""
    tiles = max(1, (bo // 16) * (bb // 8) * S // num_warps)
    if tiles > 2 or G == 1 or vector_tiles(bb):
        return 1
    return 4 if G * K // (16 * S) > 16 else 1


def _joint_gates(cell: str, block_k: int = 0, block_b: int = 16) -> bool:
    """Whether the forward uses the joint gate dot (GATES = 1): with streamed weights
    (block_k > 0) for gated cells, and for one-gate cells where the dot is swapped
    (`_swap_dots`: one path for both).

    The joint tile turns the loop's four [block_h, block_k] @ [block_k, block_b] products
    per chunk into one [4 * block_h, block_k] product: one MMA chain and one
    software-pipelined load per chunk, and M = 4 * block_h >= 64 makes it a Hopper wgmma.
    The weights are read from L2 either way, so the joint tile holds nothing on chip.
    Resident weights keep one dot per gate: a resident joint tile (an experiment, removed on
    2026-11-28, kernels/NOTES.md) timed even with them on 4 warps and spilled."""
    gated = cells.NUM_GATES[cells.CELL_IDS[cell]] > 1
    return bool(block_k) and (gated or _swap_dots(block_k, block_b))


def _env_on_off(var: str, default: bool = False) -> bool:
    """An on / off switch from the environment (unset or empty: `default`); anything else
    raises, naming the variable."""
    raw = os.environ.get(var, "").strip() or ("on" if default else "off")
    if raw not in ("on", "off"):
        raise ValueError(f"{var}: expected on or off, got {raw!r}")
    return raw == "on"


# The forward's gate pre-activations formed as one joined tensor on MMA tiles (`_gate_sums`):
# one layout conversion from the products' reduction to the cell's tiles instead of one per
# gate. The sm_90 compiles (Triton 3.6, bf16, forward step loop per warp, per-gate sums ->
# joined): LSTM H=768 B=16 27 -> 21 BAR.SYNC, 97 -> 73 STS, 1093 -> 1023 instructions; GRU
# H=1024 B=16 25 -> 21, 93 -> 77, 985 -> 946; GRU H=1536 B=16 25 -> 21, 101 -> 85, 1279 ->
# 1234; 16 x 32 tiles (LSTM H=1024 B=64) 20 -> 17, 53 -> 41, 1411 -> 1406 (GRU H=768 B=64:
# 168 -> 252 registers, no spill); no spills anywhere. Vector tiles (B = 1) keep per-gate sums:
# their gates are joined already (LSTM H=512 B=1 480 -> 493 instructions joined again). With
# hoisted weights (`_hoist_weights`, LSTM H=256 B=16) Triton 3.6's loop grows instead, 713 ->
# 736 instructions (25 -> 19 BAR.SYNC), while the unhoisted one shrinks 764 -> 696 (3.9:
# hoisted 527 -> 500, unhoisted 604 -> 555). Not yet timed on a GPU: `scripts/step_ablation.py`
# variant `nosums` restores per-gate sums, as does TRITONRNN_FWD_JOINED_SUMS=off in the
# environment of a process that imports this module (read once, here).
_FWD_JOINED_SUMS = _env_on_off("TRITONRNN_FWD_JOINED_SUMS", default=True)

# The forward's active-row mask formed in its step loop (`_mask_in_loop`, MASK_IN_LOOP); the
# ablation variant `carrymask` and TRITONRNN_FWD_MASK_IN_LOOP=off (read at import) carry the
# prefetch's copy over instead.
_FWD_MASK_IN_LOOP = _env_on_off("TRITONRNN_FWD_MASK_IN_LOOP", default=True)


def _mask_in_loop(block_h: int, block_b: int) -> bool:
    """MASK_IN_LOOP: the forward step loop forms its active-row mask at the top of each
    iteration (lens > s: lens is 0 past B) instead of using the copy that the previous
    iteration's prefetch (`_fwd_loads`) carried over. Triton 3.6 keeps that loop-carried
    1-D mask in a layout of its own, and converting it to the tiles' (through shared memory,
    two bar.sync) sat between the cell and the publication of h.
    On MMA tiles below _XJOIN_TILE elements. The sm_90 compiles (Triton 3.6, bf16 and fp16)
    of the planner's forwards in the grid, targets, fp16, large-batch, varlen, stack,
    pipeline, small-batch, gru and anchor presets, step loop per warp: 2 BAR.SYNC fewer
    (8 with a projection: LSTM H=1024 P=512 B=32 39 -> 31, 1184 -> 1143 instructions), up
    to 2% fewer instructions (the anchor 1023 -> 1016, LSTM H=256 B=16 736 -> 721), GRU
    H=1024 B=16 the exception (946 -> 952), no new spill. Triton 3.9's compiles had no such
    conversion there. Not on vector tiles (none to remove; 6-8 instructions more per step)
    nor on tiles of _XJOIN_TILE elements and more (Triton 3.6's sm_80 forward of LSTM
    H=1024 B=256, 64 x 64, then spilled).
    The backward keeps its carried mask: formed in its loop it saved 2 BAR.SYNC per Triton
    3.6 step loop too, but spilled where nothing did (Triton 3.9: GRU H=1024 B=64 at 16 x
    32, 1 local load per step; 3.6: the 128 x 64 and huge-batch stepwise tiles) and GRU
    H=1536 B=16 reloaded 10-19 spilled values per step instead of 9, wherever in the
    iteration the mask was formed. Not yet timed on a GPU."""
    return (_FWD_MASK_IN_LOOP and not vector_tiles(block_b)
            and block_h * block_b < _XJOIN_TILE)


# The per-gate forward's two resident chunks loaded together (`_paired_chunks`, PAIR); the
# ablation variant `nopair` and TRITONRNN_FWD_PAIRED_CHUNKS=off (read at import) load each
# where its dots use it.
_FWD_PAIRED_CHUNKS = _env_on_off("TRITONRNN_FWD_PAIRED_CHUNKS", default=True)


def _paired_chunks(block_b: int) -> int:
    """PAIR: the per-gate forward (`_fwd_pre_split`) loads both chunks of a resident
    reduction held in two (H = 768, 1024 and GRU's 1536 at 16- and 32-wide tiles) before
    either product, so a step waits for one L2 round trip of h after the grid barrier
    instead of two in a row (the compilers do not move the second chunk's load across the
    first one's staging barrier), and stages them together: 2 BAR.SYNC fewer, the second
    chunk's shared memory added (`grid_onchip_bytes`). The sm_90 compiles (Triton 3.6, bf16
    and fp16) of the planner's forwards with two chunks over ten bench presets, step loop
    per warp: 2 BAR.SYNC fewer, instructions -2% to +0.2%, registers equal or fewer (GRU
    H=1024 B=16 250 -> 166, H=1536 255 -> 168, LSTM H=1024 B=16 253 -> 172), no spill;
    8 to 32 KiB more shared memory per program (the anchor 114688 -> 122880 B, LSTM H=1024
    B=64 163840 -> 196608). MMA tiles up to 32 columns: at 64 the chunks are narrowed to
    bound the operand's registers and shared memory (`_max_chunk`), and both at once would
    take as much as one unnarrowed (tanh H=1536 B=64's resident forward 245760 B, past an
    H100's 225280). An H200 timed the forward without it (`nopair`) at 1.02x the anchor's
    time and 0.99x LSTM H=1024 B=16's (`kernels/NOTES.md`, switches).
    On the planner's 8-warp hoisted forwards the sm_90 compiles (Triton 3.6) of PAIR are the
    code without it: Triton's ReorderInstructions pass moves each dot operand's staging
    (local_alloc) to just after its source's definition, so the first chunk's staging and
    its two BAR.SYNC land between the two loads whatever the source order (the anchor's
    SASS: h's first chunk, 4 LDG.128 per thread, BAR, STS, BAR, then the second's 2). Forcing
    the order (the second chunk loaded first and passed through a select after the first's
    load, so that all 6 loads preceded the first barrier) was timed on an H200 and removed:
    1.00 to 1.01x the layer's time (kernels/NOTES.md, "Where a step's time goes").
    Returns 0 (apart) or 1 (together)."""
    return int(_FWD_PAIRED_CHUNKS and 16 <= block_b <= 32)


# The backward's carry product with its gates' dph operands loaded ahead (`_paired_gates`,
# PAIRG): on by default since the H200 runs of 2026-11-26 (third session); off with
# TRITONRNN_BWD_PAIRED_GATES=off (read at import) or the ablation variant `nopairg`.
_BWD_PAIRED_GATES = _env_on_off("TRITONRNN_BWD_PAIRED_GATES", default=True)
# PAIRG on 16 x 32 tiles too (the B = 32 and 64 plans): an experiment, off unless
# TRITONRNN_BWD_PAIRED_GATES_WIDE=on (read at import) or the ablation variant `pairg32`.
_BWD_PAIRED_GATES_WIDE = _env_on_off("TRITONRNN_BWD_PAIRED_GATES_WIDE")


def _paired_gates(block_k: int, block_b: int) -> bool:
    """PAIRG (on by default): the backward's resident carry product
    (`_bwd_carry`) loads each gate's two dph chunks together and the next gate's before this
    gate's products, on 16-wide MMA tiles. Loaded where its dots use them, each chunk's load
    is issued after the previous chunk's staging barrier: the anchor's backward step waits
    for 8 L2 round trips of dph in a row (4 gates x 512 + 256). The sm_90 compiles (Triton
    3.6, bf16), step loop per warp, off -> on: the anchor's loads go out in two groups
    (gates 0-1, then 2-3), 33 -> 21 BAR.SYNC (30 -> 18 since `_ksum`'s halves), 1107 -> 1106
    instructions, 16 B saved around the loop, shared memory 114688 -> 147456 B (two gates'
    operands staged at once, as `grid_onchip_bytes` counts); LSTM H=1024 B=16 33 -> 21,
    147456 -> 196608 B; GRU H=1024 B=16 29 -> 21, 114688 -> 163840 B; no spill in the loop
    (Triton 3.4 spills the paired anchor: 5 local loads per step). Timed on an H200
    (Triton 3.6, 2026-11-26, bench/results/step-ablation-nvidia-h200-2026-11-26-decide-
    halves.json), whole-layer backward, apart -> paired, 4 warps: the anchor 6.44 -> 5.59 ms
    (-13%), LSTM H=1024 B=16 7.41 -> 7.11 ms (-4%); on 8 warps 6.18 -> 5.90 and 7.02 ->
    7.07. The default since. Where the larger footprint does not fit the device, the launch
    keeps the gates apart (`grid_pairs_gates`): GRU H=1536 B=16's paired backward would need
    245760 B, past an H100's 225280."""
    return _BWD_PAIRED_GATES and not block_k and (
        block_b == 16 or (block_b == 32 and _BWD_PAIRED_GATES_WIDE))


# Shared memory the compiler needs beside what `grid_onchip_bytes` counts (barrier scratch,
# staging): a grid program may count on the device's per-block opt-in limit less this.
SMEM_SLACK = 7 * 1024


def grid_smem_budget(smem_per_program: int) -> int:
    """Bytes of shared memory a grid-family program's counted footprint may take on a device
    that allows smem_per_program per block (opt-in): that less SMEM_SLACK."""
    return smem_per_program - SMEM_SLACK


def grid_pairs_gates(cell: str, H: int, Hout: int, P: int, dtype: torch.dtype, block_h: int,
                     block_b: int, block_k: int = 0, smem_limit: int | None = None,
                     num_warps: int = 8) -> bool:
    """Whether a backward on these tiles runs PAIRG: `_paired_gates`, and its shared memory
    with two gates' operands staged at once within smem_limit bytes per program (None: no
    limit). The planner decides it with its budget for the device (`LayerPlan.pair_gates`),
    so turning PAIRG on never costs a shape its plan: where the paired backward does not fit,
    the gates stay apart and the plan's footprint is the unpaired one (`grid_onchip_bytes`)."""
    if not _paired_gates(block_k, block_b):
        return False
    return smem_limit is None or _grid_bwd_bytes(
        cell, H, Hout, P, dtype, block_h, block_b, num_warps, True) <= smem_limit


def launch_pairs_gates(pair_gates: bool | None, cell: str, H: int, Hout: int, P: int,
                       dtype: torch.dtype, block_h: int, block_b: int, block_k: int,
                       num_warps: int, smem_per_block: int | None) -> bool:
    """PAIRG of a backward launch: as asked (`pair_gates`, a plan's), where `_paired_gates`
    applies; None (a direct call, no plan): `grid_pairs_gates` within the device's
    `grid_smem_budget` (smem_per_block: its opt-in limit per block; None, the interpreter:
    no limit), so that a direct call never asks for more shared memory than a plan would."""
    if pair_gates is None:
        limit = None if smem_per_block is None else grid_smem_budget(smem_per_block)
        return grid_pairs_gates(cell, H, Hout, P, dtype, block_h, block_b, block_k, limit,
                                num_warps)
    return bool(pair_gates) and _paired_gates(block_k, block_b)


def _joined_sums(block_b: int) -> bool:
    """SUMS, the forward's joined gate sums (`_gate_sums`): MMA tiles while _FWD_JOINED_SUMS
    is on."""
    return _FWD_JOINED_SUMS and not vector_tiles(block_b)


# Resident MMA weights held in registers for all steps (HOIST). The kernels' step loops
# form their resident products inside runtime branches (a batch tile whose rows have all
# finished skips them), and that keeps the compiler from hoisting the weights' shared ->
# register load out of the loop: every step reads the whole slice from shared memory
# (ldmatrix). HOIST drops those branches (a finished tile's products are formed and masked
# out: in a persistent launch no step gets shorter by skipping them, the barrier waits for
# the busiest program anyway), and the compiler then keeps the weights in registers. The
# sm_90 compiles (Triton 3.6, bf16; step loop instructions / ldmatrix per warp, forward ;
# backward, branches -> HOIST):
#   LSTM H=256 B=16 (4 warps, the planner's; 256 B of weights per thread): 489 / 32 ->
#     461 / 16 ; 762 / 32 -> 710 / 16, no spills (Triton 3.9: 8 / 16 B saved around the
#     loop, none in it)
#   GRU H=256 B=16 (256 / 192 B): 413 / 32 -> 386 / 16 ; 609 / 24 -> 596 / 12, no spills
#   rnn_tanh H=1024 B=16 (256 B): 522 / 64 -> 488 / 32 ; 521 / 32 -> 478 / 16, no spills
#   rnn_relu H=512 B=64 (four 16 x 16 batch tiles, 128 B): 382 / 32 -> 354 / 16 ; 454 / 16
#     -> 444 / 8
#   LSTM H=768 B=16 (8 warps, 384 B): 547 / 48 -> 512 / 24 ; 753 / 48 -> 740 / 24, the
#     backward saves 16 B around the loop; on 4 warps (the planner's, 768 B) both spill,
#     280 / 632 B
#   LSTM H=512 / 1024, GRU H=1024, B=16 (8 warps, 256 to 512 B): no local memory in the
#     step loop; LSTM H=512 on 4 warps (512 B): the backward spills 272 B (64 local loads
#     per step)
#   B=64 (16 x 32 tiles, 8 warps, 384 / 512 B): the forwards fit (LSTM H=768 920 / 72 ->
#     888 / 48), the backwards spill (LSTM H=768 104 B, 26 local loads per step; H=1024
#     392 B)
#   Batch tiles of 32 (4 warps): rnn_tanh H=768 B=64 (192 B) forward 344 B spilled, 68 local
#     stores per step; H=1024 (256 B) 2648 B at 32 registers, 424 local loads per step
# What is left in ldmatrix is h's (dph's) operand, which every gate's warp reads. So the
# planner's launches hoist with 16-wide batch tiles where a pass's weights take at most
# _HOIST_THREAD_BYTES per thread (every such compile above fits with the same warps, and
# does less), and on 8 warps up to _HOIST_8WARP_THREAD_BYTES (the 8-warp compiles above,
# 256 to 512 B, keep no local memory in the loop). The planner runs a 16 x 16 pass on 8
# warps, hoisted, where its weights fit that and not the 4-warp budget
# (`rnn.planner._persistent_grid_warps`, `_persistent_grid_bwd_warps`): an H200 timed both
# faster than 4 warps unhoisted at every shape it tried (T = 1024, layer times in ms): the
# forward (2026-11-26, `scripts/step_ablation.py` variant `fw8,hoistf`) LSTM H=512 B=16
# 2.88 -> 2.80, H=768 3.24 -> 3.13, H=1024 3.83 -> 3.34, GRU H=1024 3.34 -> 3.15; the
# backward with its paired gates (2026-11-27, `hoist,bw8` against the 4-warp plan) LSTM
# H=512 4.62 -> 4.14, H=768 5.55 -> 5.13, H=1024 7.08 -> 6.07, GRU H=1024 5.59 -> 5.05
# (on 8 warps unhoisted, `bw8`: 4.15 and 5.53; the session before 5.56 -> 5.85 at the
# anchor). A projection's two
# phases alternate in a runtime branch of the step loop, so HOIST changes nothing there and
# is not used. Stepwise launches (one step each, and more programs than SMs, where a
# skipped tile does shorten the launch) keep the branches.
# TRITONRNN_HOIST_WEIGHTS: "auto" (default, the rule), "off", or the passes to hoist
# whatever their size ("fwd", "bwd", "fwd,bwd").
# Where a pass's slice is past the 8-warp budget, its first resident chunk (`_ksplit`: 1024
# of GRU H=1408 / 1536's reduction) may still stay in registers on 8 warps while the second
# chunk's products keep their runtime branch and read their weights from shared memory each
# step (Hoist.FIRST: the kernels' HOIST_FIRST): up to _HOIST_FIRST_THREAD_BYTES of the first
# chunk per thread. The sm_90 compiles (bf16, B=16, 16 x 16 tiles, 8 warps; step loop
# instructions / ldmatrix per warp, Triton 3.6 ; 3.9): GRU H=1536 forward, the plan's 4
# warps unhoisted 809 / 96, 8 warps unhoisted 517 / 48, the first chunk (384 B) hoisted 503
# / 24, no local memory, 246 registers ; 462 / 24 (all of it, 576 B, hoisted: 509 / 12 ;
# 451 / 12 with 2 local loads per step); GRU H=1536 backward 8 warps unhoisted 764 / 72,
# first chunk hoisted 781 / 48, 255 registers, no local memory ; 740 / 48 (all of it: 33
# local loads per step); GRU H=1408 forward 501 / 24 ; 457 / 24, no local memory. LSTM's
# first chunk past H=1024 is 512 B, and LSTM H=1152 / 1280's forward spilled with it
# hoisted (6 / 9 local loads per step on Triton 3.6). Not yet timed on a GPU.
_HOIST_THREAD_BYTES = 256
_HOIST_8WARP_THREAD_BYTES = 512
_HOIST_FIRST_THREAD_BYTES = 384
_HOIST_PASSES = ("fwd", "bwd")


class Hoist(enum.IntEnum):
    """What HOIST keeps in registers: nothing, the whole resident slice, or its first chunk
    (the kernels' HOIST and HOIST_FIRST). ALL is 1, so it compares equal to True."""

    NONE = 0
    ALL = 1
    FIRST = 2


def hoist_budget(pass_name: str, num_warps: int) -> int:
    """Bytes of weights per thread that a launch of `pass_name` ("fwd" / "bwd") on num_warps
    warps holds in registers by default (HOIST): _HOIST_8WARP_THREAD_BYTES on 8 warps, else
    _HOIST_THREAD_BYTES (the same for both passes since the 2026-11-27 H200 timings)."""
    if pass_name not in _HOIST_PASSES:
        raise ValueError(f"hoist_budget: pass_name expected one of {_HOIST_PASSES}, "
                         f"got {pass_name!r}")
    return _HOIST_8WARP_THREAD_BYTES if num_warps == 8 else _HOIST_THREAD_BYTES


def weight_thread_bytes(rows: int, ka: int, kb: int, dtype: torch.dtype,
                        num_warps: int) -> int:
    """Bytes of a resident weight slice [rows, ka + kb] (chunks as held, padding included)
    per thread of a program of num_warps warps: what HOIST keeps in registers."""
    return rows * (ka + kb) * dtype.itemsize // (32 * num_warps)


def _env_passes(var: str) -> str | set[str]:
    """A per-pass switch from the environment: "auto" (unset or empty), "off", or the set of
    passes (_HOIST_PASSES) that a comma list names; anything else raises, naming the
    variable."""
    raw = os.environ.get(var, "").strip() or "auto"
    asked = {p.strip() for p in raw.split(",") if p.strip()}
    if raw not in ("auto", "off") and not (asked and asked <= set(_HOIST_PASSES)):
        raise ValueError(f"{var}: expected auto, off or a comma list of "
                         f"{', '.join(_HOIST_PASSES)}, got {raw!r}")
    return raw if raw in ("auto", "off") else asked


def hoist_tiles(block_k: int, block_b: int, persistent: bool, proj: int = 0) -> bool:
    """Whether HOIST applies to a launch at all: resident MMA tiles (vector tiles hold their
    weights in registers already; streamed ones read them every step) of a persistent launch
    without a projection."""
    return not block_k and not vector_tiles(block_b) and persistent and not proj


def _hoist_weights(pass_name: str, block_k: int, block_b: int, persistent: bool = True,
                   proj: int = 0, thread_bytes: int = 0, num_warps: int = 4,
                   first_bytes: int = 0) -> Hoist:
    """HOIST for a launch of `pass_name` ("fwd" / "bwd") where it applies (`hoist_tiles`):
    by default `_hoist_by_default` (thread_bytes: the whole slice's `weight_thread_bytes`
    on num_warps warps, first_bytes: its first chunk's where it has two, else 0), else as
    TRITONRNN_HOIST_WEIGHTS says (Hoist.ALL for the passes it names)."""
    asked = _env_passes("TRITONRNN_HOIST_WEIGHTS")
    if asked == "auto":
        return _hoist_by_default(pass_name, block_k, block_b, persistent, proj, thread_bytes,
                                 num_warps, first_bytes)
    if asked == "off" or not hoist_tiles(block_k, block_b, persistent, proj):
        return Hoist.NONE
    return Hoist.ALL if pass_name in asked else Hoist.NONE


def _hoist_by_default(pass_name: str, block_k: int, block_b: int, persistent: bool, proj: int,
                      thread_bytes: int, num_warps: int, first_bytes: int = 0) -> Hoist:
    """HOIST's default rule where it applies (`hoist_tiles`): 16-wide batch tiles whose
    weights take at most `hoist_budget` bytes per thread (Hoist.ALL), else, on 8 warps, whose
    first of two chunks takes at most _HOIST_FIRST_THREAD_BYTES (Hoist.FIRST)."""
    if block_b != 16 or not hoist_tiles(block_k, block_b, persistent, proj):
        return Hoist.NONE
    if thread_bytes <= hoist_budget(pass_name, num_warps):
        return Hoist.ALL
    if num_warps == 8 and 0 < first_bytes <= _HOIST_FIRST_THREAD_BYTES:
        return Hoist.FIRST
    return Hoist.NONE


def _hoist_constexprs(hoist: Hoist) -> dict[str, bool]:
    """The kernels' HOIST and HOIST_FIRST for a launch's `hoist_pass`."""
    return dict(HOIST=bool(hoist), HOIST_FIRST=hoist == Hoist.FIRST)


def hoist_pass(pass_name: str, cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
               block_h: int, block_b: int, block_k: int, num_warps: int, persistent: bool,
               by_default: bool = False) -> Hoist:
    """What a launch of `pass_name` ("fwd" / "bwd") of this shape and plan holds in
    registers by HOIST (`_hoist_weights`; by_default: by the default rule, whatever
    TRITONRNN_HOIST_WEIGHTS says; falsy: nothing): the resident slice (HOIST applies to
    resident tiles only, `hoist_tiles`) is the forward's G gates' R rows over Hout, or the
    backward's R columns over H."""
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    if pass_name == "fwd":
        rows, (ka, kb) = G * block_h, _ksplit(Hout, block_k, block_b)
    else:
        rows, (ka, kb) = G * _block_o(H, P, block_h), _ksplit(H, block_k, block_b)
    thread_bytes = weight_thread_bytes(rows, ka, kb, dtype, num_warps)
    first_bytes = weight_thread_bytes(rows, ka, 0, dtype, num_warps) if kb else 0
    if by_default:  # (not through _hoist_weights, which the ablation variants replace)
        return _hoist_by_default(pass_name, block_k, block_b, persistent, P, thread_bytes,
                                 num_warps, first_bytes)
    return _hoist_weights(pass_name, block_k, block_b, persistent, P, thread_bytes, num_warps,
                          first_bytes)


def _swap_dots(block_k: int, block_b: int) -> bool:
    """Whether the streamed dots are formed transposed (SWAP, `_dot_w3`): [batch, K] @
    [K, rows], so that a batch tile of 64 or more is the MMA's M dimension. Hopper's wgmma
    needs M to be a multiple of 64; the backward's [block_o = 32, K] @ [K, 64] of a large
    batch (64 x 32 tiles) would otherwise run mma.sync (sm_90 compiles, Triton 3.6, LSTM
    H=768 B=256). Batch tiles >= 64 have one MMA tile per warp without split K (S = 1), the
    only case the swapped loop serves."""
    return bool(block_k) and block_b >= 64


def _fold_dy(block_k: int, block_b: int) -> bool:
    """Whether the backward adds dy to its carry after the barrier's wait (FOLD_DY,
    `_bwd_fold`) rather than to the carry product's result: everywhere but on resident
    tiles of 64 columns, whose sm_90 compile on Triton 3.9 then spilled in its step loop
    (LSTM H=512 B=256, 16 x 64 tiles, 8 warps: 32 B, 4 local loads per step; none without
    it; Triton 3.6 spills neither way). Elsewhere on Triton 3.9 it took registers and
    instructions off (LSTM H=1024 B=16 188 -> 154 registers, 1205 -> 1162 instructions; H=256
    B=256 822 -> 774) and the spills off GRU H=1536 B=16 (6 local loads per step), but put
    one local load per step into GRU H=512 B=128 (16 x 32 tiles)."""
    return bool(block_k) or block_b < 64


def _xjoin(cell: str, block_k: int, block_h: int, block_b: int) -> bool:
    """Whether the forward's prefetched input-side gate tiles are the starting value of its
    streamed joint product (XJOIN, `_joint_x_t`) rather than tiles of their own added after
    it: for gated cells where that product is formed transposed (`_swap_dots`) on tiles of
    at least _XJOIN_TILE elements. The prefetched tiles wait across the barrier and the
    whole product beside its accumulator, and on large tiles that spills. The sm_90
    compiles (Triton 3.6, bf16, 8 warps), bytes spilled per thread and local loads per
    step, without -> with XJOIN: LSTM H=1024 B=1024 at the planner's 128 x 64 tiles 1088 B,
    244 -> 464 B, 77; at 64 x 128 tiles 952 B, 252 -> 240 B, 41; GRU H=1024 B=1024 (128 x
    64) 608 B, 114 -> 336 B, 64; 64 x 64 tiles (LSTM H=1024 B=512, H=1536 B=256, H=512
    B=1024) 24-96 B, 4-20 -> none, the step loop 3-4% longer. Below, it costs instructions
    and saves no spill (LSTM H=1024 B=256, 32 x 64 tiles: 1490 -> 1593), and so does the one
    tile of a one-gate cell (tanh H=1024 B=1024: 1528 -> 2184, no spills either way).
    Not yet timed on a GPU."""
    gated = cells.NUM_GATES[cells.CELL_IDS[cell]] > 1
    return gated and _swap_dots(block_k, block_b) and block_h * block_b >= _XJOIN_TILE


def _late_loads(cell: str, block_h: int, block_b: int) -> bool:
    """Whether the backward's sub-steps load their own inputs (the reserve's gate tiles, the
    cell's state tiles, dy) after their product (LATE) instead of having the previous
    sub-step prefetch them before the barrier's wait: for gated cells on tiles of at least
    _LATE_TILE elements. Prefetched, those tiles (LSTM: 8 gate tiles, c_t, c_{t-1}, dy) wait
    across the wait and the carry product beside its accumulator, and at 128 x 64 they
    outnumber the registers. The sm_90 compiles of the 128 x 64 backwards (the planner's at
    B = 1024 before `planner._grid_batch_tiles`; Triton 3.6, bf16, 8 warps; stack bytes per
    thread, local loads per step, step-loop instructions), prefetched -> LATE: LSTM H=1024
    B=1024 1312 B, 476, 5935 -> 320 B, 73, 4691 (the spilled 336 KB per program outgrew L1;
    80 KB now fit); H=768 B=1024 1368 B, 508 -> 312 B, 70; H=1024 P=512 B=1024 1792 B, 586
    -> 848 B, 191, 6087 -> 5316; GRU H=1024 B=1024 376 B, 85, 3379 -> 112 B, 19, 3201; fp16
    LSTM H=1024 888 B, 365 -> 352 B, 82; Triton 3.9 LSTM H=1024 126 -> 78, P=512 336 -> 115
    local loads per step. The planner's 64 x 128 tiles likewise: LSTM H=1024 B=1024 1320 B,
    494, 5953 -> 296 B, 70, 4694; GRU 368 B, 86 -> 88 B, 15. The
    price: the loads' latency is no longer hidden behind the wait. Where nothing spills it
    saves 2-5% of the instructions but exposes that latency, and at some smaller tiles it
    spilled where the prefetch did not (LSTM H=1024 B=64, 16 x 32 tiles: 7 local loads per
    step; GRU H=1536 B=16, 16 x 16: 9 -> 17); one-gate cells spill neither way at 128 x 64
    and gain nothing (tanh H=1024 B=1024: 1226 -> 1236 instructions). Not yet timed on a
    GPU (step_ablation's `nolate`)."""
    gated = cells.NUM_GATES[cells.CELL_IDS[cell]] > 1
    return gated and block_h * block_b >= _LATE_TILE


def _gate_split(ka: int, kb: int, num_warps: int, bm: int, bb: int) -> int:
    """Split-K factor of the forward's gate dots (R's slice @ h): `_nsplit` capped at
    _FWD_GATE_SPLIT."""
    return _nsplit(ka, kb, num_warps, bm, bb, _FWD_GATE_SPLIT)


def _block_o(H: int, P: int, block_h: int) -> int:
    """Output-slice width: block_h without a projection, else enough for NH programs."""
    if P == 0:
        return block_h
    return _pad(triton.cdiv(P, triton.cdiv(H, block_h)))


def grid_programs(H: int, Hout: int, P: int, B: int, block_h: int, block_b: int,
                  num_dirs: int = 1) -> int:
    """Programs one launch uses: cdiv(H, block_h) hidden slices x cdiv(B, block_b) batch tiles
    per direction, times num_dirs (2 when both directions of a bidirectional layer share the
    launch, `grid_forward_pair`).

    A persistent launch needs them all co-resident: the planner checks this is <= SM count.
    (Hout and P do not change it: the output slices are spread over the hidden programs.)"""
    return triton.cdiv(H, block_h) * triton.cdiv(B, block_b) * num_dirs


def grid_onchip_bytes(cell: str, H: int, Hout: int, P: int, dtype: torch.dtype, block_h: int,
                      block_b: int, block_k: int = 0, num_warps: int = 8,
                      fwd_warps: int | None = None, smem_limit: int | None = None,
                      stages: int = DEFAULT_STAGES, stages_bwd: int | None = None,
                      backward: bool = True) -> int:
    """Per-program shared-memory bytes of the larger direction (num_warps: the backward's
    warps, whose split-K scratch grows with them; fwd_warps: the forward's, whose split-K
    scratch grows with them; default num_warps; smem_limit: the
    budget within which the backward pairs its gates, `grid_pairs_gates`; stages /
    stages_bwd: the streamed loops' pipeline depth in the forward / backward, the launch's
    num_stages, default stages; backward=False: the forward's alone, for a plan whose
    backward is another kernel's, `kernels.split_k`).

    Resident weights (block_k = 0): the weight slice, kept for all steps, plus per step the
    larger of the dot operand staged from the exchange (in the dtype: the per-gate forward
    stages both chunks at once, `_paired_chunks`, the other dots one chunk at a time) and
    the fp32 scratch of the split-K reduction (`_nsplit`; both are dead outside their phase,
    so the compiler overlaps them).
    The reductions are split as `_ksplit` does: RF = sum(_ksplit(Hout)) (R in the forward,
    Pw^T in the backward), RB = sum(_ksplit(H)) (R^T in the backward, Pw in the forward),
    KF / KB = their first (largest) chunks. With e = dtype bytes, BO = output-slice width,
    S_x = `_nsplit` of a dot with output rows x (the forward's at fwd_warps), S'_bh =
    `_gate_split` (the forward's gate dots, S <= 8), G4 = 4 for a
    gated cell (the forward sums its gates together) else 1:
      forward  = e*(G*bh*RF + [P] BO*RB) + max(e*bb*KF', [P] e*bb*KB, 4*S'_bh*G4*bh*bb,
                                              [P] 4*S_BO*BO*bb)
    (KF' = RF where `_paired_chunks`, else KF)
      backward = e*(G*BO*RB + [P] bh*RF) + max(e*bb*KB, [P] e*bb*KF, 4*S_BO*BO*bb,
                                              [P] 4*S_bh*bh*bb)
    Equal to the `shared` bytes of the sm_90 bf16 compiles of Triton 3.6 (the larger of the
    two directions) for LSTM H 256 (block_b 32) / 768 / 1024 (with and without P=256), GRU
    512 / 1536 (rechecked after the forward's split cap: LSTM H=256 bb=32 and GRU H=512 with
    8 warps, LSTM H=768 with 4; and with the slices added by halves, S'_bh = 4: LSTM H=256
    bb=32 with 8 and 4 forward warps).
    Streamed weights (block_k = K > 0): each pass's software pipeline, one buffer per stage
    (the launch's num_stages: `stream_stage_bytes`, stages and stages_bwd) of one chunk's
    weight tile [rows, K] and exchange tile [K, bb] in the dtype, for the pass's widest dot
    (rows: the forward's joint gate tile GP*bh, GP = 4 for a gated cell else 1, and with a
    projection BO; the backward's BO, with a projection bh), or the forward dot's split-K
    scratch (4*S*rows*bb, one-gate cells at small batch) if larger:
      max(stages * K*e*(rows_f + bb), stages_bwd * K*e*(rows_b + bb), scratch)
    Equal to the sm_90 bf16 compiles of Triton 3.6 at the default 3 stages for the joint /
    swapped loops (LSTM H=768 B=256 64 x 32 tiles, K = 64 and 128; GRU H=1024; rnn_tanh
    H=2048; 16 x 16 and 16 x 32 tiles at K = 64), and at 4, 6, 8, 12 and 16 stages for
    LSTM H=768 / 1024 and GRU H=1024 at B=256 and LSTM H=512 B=512 (32 x 64 tiles); the
    other unswapped loops of batch tiles below 64 (the backward's, and a one-gate cell's
    forward) take a buffer less (`tests/test_aot.py`, the streamed loops' stages).
    Vector tiles (block_b < 16) keep their weights in registers (`grid_vector_bytes`) and
    stage nothing: their shared memory is the compiler's reduction scratch, 64 to 256 B in
    the sm_90 compiles (Triton 3.6: LSTM H 512..1024, GRU 1024, block_b 1, 2, 4), counted
    as 1 KiB.
    """
    if vector_tiles(block_b):
        return 1024
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    e = dtype.itemsize
    bh, bb = block_h, block_b
    BO = _block_o(H, P, block_h)
    if block_k:
        scratch_f = 0
        if not _joint_gates(cell, block_k, bb):  # one gate, split K
            S = _gate_split(block_k, 0, num_warps, bh, bb)
            scratch_f = 4 * S * bh * bb if S > 1 else 0
        per_stage = [stream_stage_bytes(cell, H, P, dtype, bh, bb, block_k, p)
                     for p in ("fwd", "bwd")]
        bwd = (stages_bwd or stages) * per_stage[1] if backward else 0
        return max(stages * per_stage[0], bwd, scratch_f)
    (KF, kf2), (KB, kb2) = _ksplit(Hout, 0, bb), _ksplit(H, 0, bb)
    RF, RB = KF + kf2, KB + kb2
    proj = P > 0

    g4 = 4 if G > 1 else 1
    fw = num_warps if fwd_warps is None else fwd_warps
    # Per gate, both chunks' operands staged at once where `_paired_chunks`.
    stage_f = max(e * bb * (RF if _paired_chunks(bb) else KF),
                  _split_scratch(KF, kf2, fw, bh, bb, g4, _gate_split))
    if proj:
        stage_f = max(stage_f, e * bb * KB, _split_scratch(KB, kb2, fw, BO, bb))
    fwd = e * (G * bh * RF + (BO * RB if proj else 0)) + stage_f
    if not backward:
        return fwd
    paired = grid_pairs_gates(cell, H, Hout, P, dtype, bh, bb, block_k, smem_limit, num_warps)
    return max(fwd, _grid_bwd_bytes(cell, H, Hout, P, dtype, bh, bb, num_warps, paired))


def stream_stage_bytes(cell: str, H: int, P: int, dtype: torch.dtype, block_h: int,
                       block_b: int, block_k: int, pass_name: str) -> int:
    """Shared-memory bytes of one stage of a pass's streamed loop (block_k > 0): one chunk's
    weight tile [rows, block_k] and exchange tile [block_k, block_b] in the dtype, rows those
    of the pass's widest dot (`grid_onchip_bytes`). A launch's num_stages buffers that many
    chunks, num_stages - 1 of them in flight while the MMAs read one."""
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    e = dtype.itemsize
    BO = _block_o(H, P, block_h)
    if pass_name == "fwd":
        rows = (4 if G > 1 else 1) * block_h
        rows = max(rows, BO) if P else rows
    else:
        rows = max(BO, block_h) if P else BO
    return block_k * e * (rows + block_b)


def _grid_bwd_bytes(cell: str, H: int, Hout: int, P: int, dtype: torch.dtype, bh: int, bb: int,
                    num_warps: int, paired: bool) -> int:
    """The resident backward's part of `grid_onchip_bytes` (MMA tiles): it stages one chunk at
    a time, or two gates' chunks at once (paired, `grid_pairs_gates`)."""
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    e = dtype.itemsize
    BO = _block_o(H, P, bh)
    (KF, kf2), (KB, kb2) = _ksplit(Hout, 0, bb), _ksplit(H, 0, bb)
    RF, RB = KF + kf2, KB + kb2

    stage = max(e * bb * (min(G, 2) * RB if paired else KB),
                _split_scratch(KB, kb2, num_warps, BO, bb))
    if P:
        stage = max(stage, e * bb * KF, _split_scratch(KF, kf2, num_warps, bh, bb))
    return e * (G * BO * RB + (bh * RF if P else 0)) + stage


def _split_scratch(ka: int, kb: int, num_warps: int, rows: int, bb: int, gates: int = 1,
                   split=None) -> int:
    """Bytes of a split-K product's partial sums, [S, gates * rows, bb] fp32 (0 unsplit).
    split: the slice rule (`_gate_split` for the forward's gate dots), default `_nsplit`,
    looked up at the call, so that an ablation's swapped rule reaches these bytes too."""
    S = (split or _nsplit)(ka, kb, num_warps, rows, bb)
    return 4 * S * gates * rows * bb if S > 1 else 0


def grid_vector_bytes(cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
                      block_h: int) -> int:
    """Weight bytes one vector-tile program (`vector_tiles`) holds in registers for all steps,
    the larger direction: forward G*block_h*Hout (R's rows) + BO*H (Pw's rows), backward
    BO*G*H (R^T's columns) + block_h*P (Pw^T's), times the dtype's bytes (BO: the output
    slice, `_block_o`). The planner divides it by the program's threads for its register
    budget (`rnn.planner._vector_fit`)."""
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    e = dtype.itemsize
    BO = _block_o(H, P, block_h)
    fwd = G * block_h * Hout + (BO * H if P else 0)
    bwd = BO * G * H + (block_h * P if P else 0)
    return e * max(fwd, bwd)
