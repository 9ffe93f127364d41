"""Multi-program recurrent kernels: the persistent-grid and stepwise families.

One kernel per direction of computation (`_grid_fwd_kernel`, `_grid_bwd_kernel`) serves both
families. The kernel runs the sub-steps [u_begin, u_end) of the recurrence given as runtime
arguments:

- persistent-grid (GPU): one launch runs every sub-step; the programs stay resident and meet
  at an in-kernel grid barrier (kernels/grid_barrier.py) after each sub-step's publish.
- stepwise, and persistent under TRITON_INTERPRET=1 (programs run one after another, so a
  barrier would deadlock): one launch per sub-step, the barrier compiled out (BARRIER is a
  constexpr). The launch boundary is the barrier; the math is the same code. A persistent
  launch of one program per direction is the exception: its barrier never waits for another
  program, so the interpreter runs it as the GPU does, one launch with the barrier compiled
  in (`_steps_in_one_launch`): the barrier's targets and the step loop's carries are tested
  without a GPU.

Contract: exactly rnn/reference.py's `recurrence_forward` / `recurrence_backward` (packed rows,
sorted batch order, per-sequence reversal, outputs written in place).

Bidirectional layers (`grid_forward_pair` / `grid_backward_pair`): the same kernels with
NUM_DIRS = 2 and a second grid axis for the direction, so both directions share every launch
(persistent: one launch in all; stepwise: one per sub-step). Direction d's programs address its
tensors at element offsets from direction 0's (`persistent_cta.direction_offsets`), its own
half of each stacked workspace, and d = 1 runs reversed in time. The directions never exchange
data, so each has its own barrier counter and waits only for its own programs; a persistent
pair needs both directions' programs co-resident (2 * grid_programs <= SM count).

Work split (G gates, H units, Hout = P with a projection else H, B batch)
--------------------------------------------------------------------------
The grid is NH x NB programs, NH = cdiv(H, BLOCK_H) hidden slices times NB = cdiv(B, BLOCK_B)
batch tiles. Program (p, b) owns
- the hidden slice hs = [p*BLOCK_H, (p+1)*BLOCK_H) of every gate (gate rows k*H + hs), and
- the output slice os = [p*BLOCK_O, (p+1)*BLOCK_O) of Hout: os = hs without a projection;
  with one, BLOCK_O = max(16, next_pow2(cdiv(P, NH))) so the NH programs cover the P outputs
  (programs past P own an empty slice),
- the batch rows [b*BLOCK_B, (b+1)*BLOCK_B).
Tiles are hidden-major, [units, batch]: the weight slice is the dot's A operand (M = units,
K = reduction); the batch is the N dimension, so a batch of 16 is a full MMA tile.

Weights: resident or streamed (block_k)
  block_k = 0: the slice is loaded once per launch and kept on chip (shared memory, see
  Formulas). Tiles must be powers of two, so the reduction K is held in two power-of-two
  chunks (`_ksplit`: 768 = 512 + 256, 1536 = 1024 + 512) rather than one padded tile
  (1024, 2048): a third less shared memory at H = 768, and what lets GRU H = 1536 fit; a
  single chunk wider than 512 is halved (1024 = 512 + 512) to bound the registers of its
  dot operand.
  block_k > 0: the slice is read from global memory (L2-resident across steps) in chunks of
  block_k columns inside every step: any H fits, at the cost of an L2 read of the weights
  per step. The planner uses it where a resident slice does not fit. Each streamed product is
  one software-pipelined loop over its chunks: the forward's gates joined in one
  [GP * block_h, block_k] tile (`_joint_gates`), the backward's gates in one loop over all
  G*H rows of R (they are contiguous), and with batch tiles of 64 or more the product formed
  transposed, the batch as the MMA's M dimension (`_swap_dots`): every such loop is then a
  Hopper wgmma (sm_90 compiles, Triton 3.6; per-gate [32, 64] products were mma.sync).
A batch tile whose rows have all finished (sorted lengths: from step max(len in tile) on)
skips its matmuls and only carries its state over.

Vector tiles (`vector_tiles`: block_b in 1, 2, 4, resident weights, block_h >= 8): a batch
narrower than an MMA tile runs the resident products on the FMA units (`_vdot`): the weight
slice is held in registers for all steps (never in shared memory), and each batch column's
operand is loaded from the exchange straight into the weights' register layout, [rows, K]
with K contiguous (the backward reads transposed copies of R and Pw so that its weights are
contiguous along the reduction too). An MMA tile would compute 15/16 padding at B = 1, stage
h (dph) in shared memory and read the whole weight slice from shared memory every step. The
resident chunks are held in slices one warp row wide (`vector_width`), so the reductions over
K are warp shuffles; the forward reduces its gates' partial sums as one joined tensor and the
backward adds its gates' products before reducing once (`_vgates`, `_vgate_sum`).

Split K (`_nsplit`): a plain tl.dot spreads the program's warps over its [rows, batch] output
in 16 x 8 MMA tiles, so a 16 x 16 gate tile (block_h = block_b = 16, the small-batch case)
has 2 tiles for 8 warps: the other warps compute copies, and every warp issues the whole
K / 16-long MMA chain of every gate (LSTM H = 768: 384 mma.sync per warp per step, the
largest item of the step in the sm_90 compiles). Such dots cut the reduction into S slices
instead, the batch dimension of a 3-D dot (Triton puts its warps along it): each warp runs
1/S of the MMAs and reads 1/S of the weights and of h from shared memory, and the S partial
sums are added once per step (the forward joins its gates into one sum): the slice axis is
moved last and halved with tl.split, the halves added in-thread, one layout conversion
(`_ksum`; tl.sum's cross-warp reduction cost more shared-memory traffic and barriers, and
an H200 timed it 1.28x slower). Output tiles with at least one MMA tile per warp keep the
plain dot (S = 1). With fewer slices than warps the extra warps would compute copies again,
so the forward's gate dots split one slice per warp (`_FWD_GATE_SPLIT`).

Forward, per step s (rows: sorted j with len_j > s; row = offsets[t] + j, t = s or len_j-1-s):
  phase 0: pre_k = R[k*H + hs, :] @ h_{s-1}^T + bR  (h_{s-1}: all Hout of the batch tile from
           the exchange buffer), cell pointwise on the own slice; c and the own slice of h
           kept in registers.
           No projection: publish h = m (own slice) to the state buffer and y.
           Projection: publish m (own slice) to the m buffer; barrier;
  phase 1: h[os] = Pw[os, :] @ m^T, publish h (own slice) to the state buffer and y.
  barrier.
  On chip per program: R rows [G, BLOCK_H, Hout] (+ bR slice) and, with a projection,
  Pw rows [BLOCK_O, H].
Backward, per step s in reverse order (dh_carry: gradient on h_s from step s+1):
  phase A: dh_carry[os] = sum_k R[k*H + :, os]^T @ dph_{s+1,k}^T (+ GRU's direct term, own
           slice, kept from phase B) for rows active at s+1; dh = dy[row, os] + dh_carry.
           Projection: publish dh (own out slice) and write dh_total; barrier;
  phase B: dm[hs] = Pw[:, hs]^T @ dh^T (projection) or dm = dh; cell backward on the own
           slice; write dpre_x/dpre_h/m_seq; publish dph (own slice, all gates) to the
           ping-pong dph buffer; dc kept in registers.
  barrier. After step 0 a final phase A forms dh0 = dh_carry.
  On chip per program: R columns [G, H, BLOCK_O] (as [BLOCK_O, H] tiles) and, with a
  projection, Pw columns [P, BLOCK_H].
Barriers per step: 1 without a projection, 2 with one (both are true data dependencies; the
ping-pong h / dph buffers make the single barrier sufficient: a program can only overwrite a
buffer after the barrier that follows every read of it).
Each barrier is split (`grid_arrive` / `grid_wait`): a sub-step publishes its exchange slice
and arrives; then, while the other programs arrive, it writes the outputs no program reads
in this launch (y, c_seq, hT, dpre_x, dpre_h, m_seq, dh_total) and loads what the next
sub-step reads that no program writes (`_fwd_loads` / `_bwd_loads`: packed rows, the
input-side gate tiles, the reserve tiles, dy); only then it waits. Those loads and stores
are off the per-step chain (barrier -> exchange read -> dots -> cell -> publish), and the
release fence no longer waits for them.

Workspaces (allocated per call; states fp32, exchanges in the tensors' dtype, e bytes; bytes
per direction, times D for a pair launch):
  forward  h exchange [2, B, Hout] (2e*B*Hout), h state [B, Hout] (4*B*Hout),
           c state [B, H] (4*B*H, LSTM), m exchange [B, H] (e*B*H, projection), sync int32 [2]
  backward dph exchange [2, B, G*H] (2e*B*G*H), dh_carry [B, Hout] (4*B*Hout), dc [B, H]
           (4*B*H, LSTM), dh exchange [B, P] (e*B*P, projection), sync int32 [2]
Stepwise launches load the h / c / dh_carry / dc state tiles at launch start and store them at
launch end (so they live in global memory between steps); the persistent launch does the same
once, keeping them in registers for all T steps.
Exchange buffers (what other programs read, only ever as a dot operand) hold the tensors'
dtype: the dot rounds its operand to that dtype anyway, so the results are the same as with
fp32 buffers, and the staged operand and its registers are halved in bf16. With the split-K
dots that removed the spills of the sm_90 backward compiles (Triton 3.6: LSTM H=1024 255
registers + 112 B spill -> 190, none; GRU H=1536 255 + 112 B -> 188, none). The states
(h, c, dh_carry, dc) stay fp32. (Before split K, bf16 exchanges had spilled instead.)

Formulas (for the planner; in `kernels/grid_tiles.py`, with the rules that pick each launch's
compile-time options from its shape and tiles: `_ksplit`, `_nsplit`, `Hoist`, ...)
  grid_programs      = cdiv(H, block_h) * cdiv(B, block_b) * D        (<= SM count to persist;
                       D = 2 for a bidirectional pair launch, else 1)
  grid_onchip_bytes  = shared memory per program (resident or streamed weights; see the
                       function for the formula, which matches the sm_90 compiles)
  The weights stay in shared memory for all steps and are read into registers for each
  step's dots (an L2 round trip costs far more than that read); their load sits inside a
  runtime branch on purpose (see `_fwd_cell_phase`), except where a pass's slice is small
  enough to stay in registers (HOIST, `_hoist_weights`: the branches go, the compiler keeps
  the weights in registers, and the step reads half the ldmatrix; TRITONRNN_HOIST_WEIGHTS
  overrides the rule), or where its first resident chunk is (HOIST_FIRST, `Hoist.FIRST`:
  only the second chunk's products keep their branch, and their weights shared memory).

Precision: loads in the tensors' dtype, fp32 math, states and workspaces, stores cast. tl.dot
takes operands in the weights' dtype with fp32 accumulation on GPU (input_precision="ieee" for
fp32); under the interpreter the operands are upcast to fp32 (its bf16 dot is wrong).
float64 is refused (the backend routes it to the reference).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..rnn.packing import PackInfo
from ..rnn.reference import check_backward_preacts, check_shapes
from . import cells, grid_tiles
from .buffers import scratch
from .compile_options import FP_FUSION
from .grid_barrier import (
    DEFAULT_MAX_SPIN,
    check_flags,
    cooperative_launch_options,
    grid_arrive,
    grid_wait,
    poll_earlier_launches,
)
from .persistent_cta import (
    BACKWARD_TENSORS,
    FORWARD_TENSORS,
    check_device,
    direction_offsets,
    split_pair,
)

# --------------------------------------------------------------------------------------------
# Shared tile helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _mm(a, b, FP32_DOT: tl.constexpr, acc=None):
    """[S, M, K] @ [S, K, N] (+ acc) -> [S, M, N] with fp32 accumulation; fp32 operands in
    IEEE precision (no tf32). (Vector tiles, batch tiles narrower than an MMA, use `_vdot`.)"""
    if FP32_DOT:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _zacc(S: tl.constexpr, BM: tl.constexpr, BB: tl.constexpr):
    """Zero split-K accumulator: [S, BM, BB] fp32, or [BM, BB] when S == 1 (a plain dot)."""
    if S == 1:
        return tl.zeros([BM, BB], tl.float32)
    else:
        return tl.zeros([S, BM, BB], tl.float32)


@triton.jit
def _sum2(a, b):
    """a + b as an in-thread sum of the joined pair: two products stay independent MMA chains
    (Triton folds `x + dot(p, q)` into dot(p, q, acc=x), which would chain them)."""
    return tl.sum(tl.join(a, b), axis=-1)


@triton.jit
def _sum4(a, b, c, d):
    """a + b + c + d as in-thread sums of joined tensors (`_sum2`): four independent chains."""
    return _sum2(_sum2(a, b), _sum2(c, d))


@triton.jit
def _ksum(acc, S: tl.constexpr):
    """The product from a split-K accumulator [S, M, N]: the S partial sums added, or acc
    itself when S == 1. S = 2, 4 or 8: the slice axis is moved last and halved by tl.split,
    the halves added in-thread, one layout conversion through shared memory (the forward's
    joined gates likewise, `_fwd_pre_split`; vector tiles' 2 slices, `_vq`, `_vgate_sum`).
    Any other S (16 warps) is added by tl.sum.

    tl.sum over the slice axis, which Triton lays across warps, is a cross-warp reduction
    whose result takes another conversion to the cell's layout; the halves replaced it. The
    sm_90 compiles of seven bench presets' plans (47 of 74 kernels changed), step loop per
    warp, tl.sum -> halves (with the forward's gate dots then split one slice per warp,
    `_FWD_GATE_SPLIT`):
      Triton 3.6: forwards -26 to -34% instructions (the anchor 1014 -> 696), 17 -> 14
        BAR.SYNC (31 -> 23 with a projection), mma.sync halved on 16 x 16 tiles (192 -> 96);
        backwards -4 to -17%, 3 BAR.SYNC fewer; five spilling loops clean.
      Triton 3.9: forwards -2 to -18%, 29 -> 13 BAR.SYNC; backwards -3 to -14%.
      Vector tiles (B = 1): 3 to 6 BAR.SYNC fewer (LSTM H=1024 18 -> 12).
    An H200 timed tl.sum (with 2 forward slices) at 1.28x the halves' layer time at the
    anchor and at LSTM H=1024 B=16 (third session of 2026-11-26), and the tl.sum path was
    removed (kernels/NOTES.md)."""
    if S == 1:
        return acc
    elif S == 2:
        lo, hi = tl.split(tl.permute(acc, (1, 2, 0)))
        return lo + hi
    elif S == 4:
        lo, hi = tl.split(tl.permute(tl.reshape(acc, [2, 2, acc.shape[1], acc.shape[2]]),
                                     (2, 3, 0, 1)))
        lo, hi = tl.split(lo + hi)
        return lo + hi
    elif S == 8:
        lo, hi = tl.split(tl.permute(tl.reshape(acc, [2, 2, 2, acc.shape[1], acc.shape[2]]),
                                     (3, 4, 0, 1, 2)))
        lo, hi = tl.split(lo + hi)
        lo, hi = tl.split(lo + hi)
        return lo + hi
    else:
        return tl.sum(acc, axis=0)


@triton.jit
def _tile(W, a_idx, a_ok, a_stride, b_stride, k0, KC: tl.constexpr, K: tl.constexpr,
          S: tl.constexpr, DT: tl.constexpr):
    """Split-K weight tile [S, BM, KC // S] cast to DT: tile[s, i, c] = W[a_idx[i] * a_stride +
    (k0 + s * KC // S + c) * b_stride], zero past the reduction length K; [BM, KC] when
    S == 1."""
    if S == 1:
        kk = (k0 + tl.arange(0, KC)[None, :]).to(tl.int64)
        ptr = W + a_idx[:, None].to(tl.int64) * a_stride + kk * b_stride
        return tl.load(ptr, mask=a_ok[:, None] & (kk < K), other=0.0).to(DT)
    else:
        kk = (k0 + tl.arange(0, S)[:, None, None] * (KC // S)
              + tl.arange(0, KC // S)[None, None, :]).to(tl.int64)
        ptr = W + a_idx[None, :, None].to(tl.int64) * a_stride + kk * b_stride
        return tl.load(ptr, mask=a_ok[None, :, None] & (kk < K), other=0.0).to(DT)


@triton.jit
def _wchunk(W, a_idx, a_ok, a_stride, b_stride, k0: tl.constexpr, KC: tl.constexpr,
            K: tl.constexpr, k: tl.constexpr, G: tl.constexpr, RESIDENT: tl.constexpr,
            DT: tl.constexpr, BM: tl.constexpr, S: tl.constexpr, VW: tl.constexpr = 0):
    """A resident weight chunk of gate k (`_tile`: columns k0 .. k0 + KC, split S ways), or
    a placeholder that is never read (streamed weights, a gate the cell lacks, an empty chunk
    KC == 0; the compiler drops it). Vector tiles (VW > 0) hold the chunk in slices of VW
    columns (`vector_width`) instead."""
    SC: tl.constexpr = KC // VW if VW > 0 and KC > VW else S
    if RESIDENT:
        if k < G:
            if KC > 0:
                return _tile(W, a_idx, a_ok, a_stride, b_stride, k0, KC, K, SC, DT)
            else:
                return _zacc(SC, BM, 16).to(DT)
        else:
            return _zacc(SC, BM, 16).to(DT)
    else:
        return _zacc(SC, BM, 16).to(DT)


@triton.jit
def _kptrs(X, x_row, jb64, x_ok, k0, KC: tl.constexpr, K: tl.constexpr, S: tl.constexpr):
    """(pointers, mask) of the split-K operand `_kpart` reads."""
    if S == 1:
        kk = k0 + tl.arange(0, KC)[:, None]
        return X + jb64[None, :] * x_row + kk, (kk < K) & x_ok[None, :]
    else:
        kk = (k0 + tl.arange(0, S)[:, None, None] * (KC // S)
              + tl.arange(0, KC // S)[None, :, None])
        return X + jb64[None, None, :] * x_row + kk, (kk < K) & x_ok[None, None, :]


@triton.jit
def _kpart(X, x_row, jb64, x_ok, k0, KC: tl.constexpr, K: tl.constexpr, S: tl.constexpr,
           DT: tl.constexpr):
    """Split-K dot operand [S, KC // S, batch] of an exchange buffer [B, x_row], cast to
    the dot dtype DT: tile[s, c, j] = X[jb[j], k0 + s * KC // S + c], zero past K and for
    masked batch columns; [KC, batch] when S == 1."""
    ptr, ok = _kptrs(X, x_row, jb64, x_ok, k0, KC, K, S)
    return tl.load(ptr, mask=ok, other=0.0, cache_modifier=".cg").to(DT)


@triton.jit
def _tile_t(W, a_idx, a_ok, a_stride, b_stride, k0, KC: tl.constexpr, K: tl.constexpr,
            DT: tl.constexpr):
    """`_tile` transposed ([KC, BM], S = 1): tile[c, i] = W[a_idx[i] * a_stride + (k0 + c) *
    b_stride], zero past K."""
    kk = (k0 + tl.arange(0, KC)[:, None]).to(tl.int64)
    ptr = W + a_idx[None, :].to(tl.int64) * a_stride + kk * b_stride
    return tl.load(ptr, mask=a_ok[None, :] & (kk < K), other=0.0).to(DT)


@triton.jit
def _kpart_t(X, x_row, jb64, x_ok, k0, KC: tl.constexpr, K: tl.constexpr, DT: tl.constexpr):
    """`_kpart` transposed ([batch, KC], S = 1): tile[j, c] = X[jb[j], k0 + c]."""
    kk = k0 + tl.arange(0, KC)[None, :]
    return tl.load(X + jb64[:, None] * x_row + kk, mask=(kk < K) & x_ok[:, None], other=0.0,
                   cache_modifier=".cg").to(DT)


@triton.jit
def _vcol(jb64, x_ok, b: tl.constexpr, BB: tl.constexpr):
    """Batch column b of a vector tile: (its exchange row jb[b], x_ok[b] as 0 or 1), int
    scalars, or [1, 1, 1] tensors for a one-column tile (no reduction needed to pick it)."""
    if BB == 1:
        jb = tl.reshape(jb64, [1, 1, 1])
        ok = tl.reshape(x_ok.to(tl.int32), [1, 1, 1])
    else:
        sel = tl.arange(0, BB) == b
        jb = tl.sum(tl.where(sel, jb64, 0), axis=0)
        ok = tl.sum(tl.where(sel & x_ok, 1, 0), axis=0)
    return jb, ok


@triton.jit
def _vx(X, x_row, jb, ok, k0, S: tl.constexpr, BM: tl.constexpr, KW: tl.constexpr,
        K: tl.constexpr, DT: tl.constexpr):
    """One batch column of an exchange buffer as a vector tile's operand: the [S, BM, KW]
    tile x[s, i, c] = X[jb, k0 + s * KW + c] (every row i the same), cast to DT and held in
    fp32, zero past K and for a masked column. Loaded broadcast straight into the weights'
    register layout (same shape, KW contiguous), so neither operand passes through shared
    memory; the repeated addresses are served by L2 (.cg: the exchange changes every step)."""
    ptr, m = _vxptrs(X, x_row, jb, ok, k0, S, BM, KW, K)
    x = tl.load(ptr, mask=m, other=0.0, cache_modifier=".cg")
    return x.to(DT).to(tl.float32)


@triton.jit
def _vxptrs(X, x_row, jb, ok, k0, S: tl.constexpr, BM: tl.constexpr, KW: tl.constexpr,
            K: tl.constexpr):
    """(pointers, mask) of the operand `_vx` loads."""
    kk = (k0 + tl.arange(0, S)[:, None, None] * KW + tl.arange(0, KW)[None, None, :]
          + tl.zeros([1, BM, 1], tl.int32))
    # As a tensor: the interpreter mis-types a scalar bool & a mask.
    return X + jb * x_row + kk, (kk < K) & ((kk * 0 + ok) > 0)


@triton.jit
def _v3(w):
    """A vector tile's weight chunk as [S, BM, KW] slices (`_tile` gives [BM, KC] for one)."""
    if len(w.shape) == 2:
        return w[None, :, :]
    else:
        return w


@triton.jit
def _vgates(w0, w1, w2, w3, X, x_row, jb64, x_ok, k0, K: tl.constexpr, G: tl.constexpr,
            DT: tl.constexpr, BB: tl.constexpr):
    """Vector tiles (`vector_tiles`): w_k @ X[jb, k0 : k0 + KC]^T for the cell's gates (G is
    1, 3 or 4) on the FMA units, one batch column at a time, summed in fp32 (the products of
    bf16 / fp16 operands are exact): [BM, BB, 2, 2] fp32 with gate g at [..., g % 2, g // 2]
    (zeros for missing gates; `_vsplit` takes them apart).

    The weight chunks w_k are [S, BM, KW] (KC = S * KW columns in slices of `vector_width`,
    `_tile`) or [BM, KC] (one slice): a warp holds whole slice rows, so the sums over KW are
    warp shuffles; the gates' partial sums over the S slices are joined and reduced, and
    later converted, as one tensor, not one per gate (each a round through shared memory);
    2 slices by halves (`_ksum`). Each column's operand is loaded once for
    all gates. The weights stay in registers across
    steps (no dot operand is staged in shared memory)."""
    v0 = _v3(w0)
    S: tl.constexpr = v0.shape[0]
    BM: tl.constexpr = v0.shape[1]
    KW: tl.constexpr = v0.shape[2]
    sel_b = tl.arange(0, BB)[None, :, None, None]
    acc = tl.zeros([BM, BB, 2, 2], tl.float32)
    for b in tl.static_range(BB):
        jb, ok = _vcol(jb64, x_ok, b, BB)
        x = _vx(X, x_row, jb, ok, k0, S, BM, KW, K, DT)
        acc = tl.where(sel_b == b, _vq(w0, w1, w2, w3, x, G)[:, None, :, :], acc)
    return acc


@triton.jit
def _vq(w0, w1, w2, w3, x, G: tl.constexpr):
    """One batch column of `_vgates`: the gates' products with that column's operand x
    ([S, BM, KW] fp32, `_vx`), [BM, 2, 2] fp32 with gate g at [:, g % 2, g // 2]."""
    r0 = tl.sum(_v3(w0).to(tl.float32) * x, axis=2)
    r1 = tl.zeros_like(r0)
    r2 = r1
    r3 = r1
    if G > 1:
        r1 = tl.sum(_v3(w1).to(tl.float32) * x, axis=2)
        r2 = tl.sum(_v3(w2).to(tl.float32) * x, axis=2)
    if G > 3:
        r3 = tl.sum(_v3(w3).to(tl.float32) * x, axis=2)
    t = tl.join(tl.join(r0, r1), tl.join(r2, r3))  # [S, BM, 2, 2]
    if t.shape[0] == 2:
        lo, hi = tl.split(tl.permute(t, (1, 2, 3, 0)))
        return lo + hi
    return tl.sum(t, axis=0)


@triton.jit
def _vsplit(acc):
    """The four [BM, BB] gate tiles of a `_vgates` result."""
    t01, t23 = tl.split(acc)
    p0, p1 = tl.split(t01)
    p2, p3 = tl.split(t23)
    return p0, p1, p2, p3


@triton.jit
def _vgate_sum(w0, w1, w2, w3, X, x_row, jb64, x_ok, k0, K: tl.constexpr, G: tl.constexpr,
               DT: tl.constexpr, BB: tl.constexpr):
    """Vector tiles: sum over the G gates of w_k @ X[jb, k * K + k0 : ...]^T -> [BM, BB] fp32,
    gate k's operand at column offset k * K of X's rows (the backward's dph exchange): the
    gates' products are added elementwise and reduced once (slices as in `_vgates`)."""
    v0 = _v3(w0)
    S: tl.constexpr = v0.shape[0]
    BM: tl.constexpr = v0.shape[1]
    KW: tl.constexpr = v0.shape[2]
    sel_b = tl.arange(0, BB)[None, :]
    acc = tl.zeros([BM, BB], tl.float32)
    for b in tl.static_range(BB):
        jb, ok = _vcol(jb64, x_ok, b, BB)
        prod = v0.to(tl.float32) * _vx(X, x_row, jb, ok, k0, S, BM, KW, K, DT)
        if G > 1:
            prod += _v3(w1).to(tl.float32) * _vx(X + K, x_row, jb, ok, k0, S, BM, KW, K, DT)
            prod += _v3(w2).to(tl.float32) * _vx(X + 2 * K, x_row, jb, ok, k0, S, BM, KW, K,
                                                 DT)
        if G > 3:
            prod += _v3(w3).to(tl.float32) * _vx(X + 3 * K, x_row, jb, ok, k0, S, BM, KW, K,
                                                 DT)
        q = tl.sum(prod, axis=2)  # [S, BM]
        if S == 2:
            lo, hi = tl.split(tl.permute(q, (1, 0)))
            q = lo + hi
        else:
            q = tl.sum(q, axis=0)
        acc = tl.where(sel_b == b, q[:, None], acc)
    return acc


@triton.jit
def _vdot(w, X, x_row, jb64, x_ok, k0, K: tl.constexpr, DT: tl.constexpr, BB: tl.constexpr):
    """One weight chunk on the FMA units (`_vgate_sum` of one gate):
    w @ X[jb, k0 : k0 + KC]^T -> [BM, BB] fp32."""
    return _vgate_sum(w, w, w, w, X, x_row, jb64, x_ok, k0, K, 1, DT, BB)


@triton.jit
def _dot_w3(acc, W, a_idx, a_ok, a_stride, b_stride, wa, wb, X, x_row, jb64, x_ok,
            K: tl.constexpr, KA: tl.constexpr, KB: tl.constexpr, RESIDENT: tl.constexpr,
            S: tl.constexpr, DOT_DT: tl.constexpr, FP32_DOT: tl.constexpr,
            SWAP: tl.constexpr = False, tile_b=True):
    """acc[s, i, j] += the part s of sum_k W[a_idx[i], k] * X[jb[j], k] over k < K ([S, BM, BB]
    fp32; summing over s gives the product, `tl.sum(acc, axis=0)`).

    Split K: the reduction is cut into S slices, the dot's batch dimension, so the program's
    warps each run 1/S of the MMAs (a [16, K] @ [K, 16] dot would otherwise keep one warp
    busy and the others computing copies of its result).
    RESIDENT: from the on-chip chunks wa (k < KA) and wb (KA <= k < KA + KB, absent when KB is
    0; its product formed where tile_b, `_fwd_pre_split`). Streamed: W's chunks of width KA
    are read from global memory (L2) here, every call.
    SWAP (streamed, S = 1): the product is formed transposed, [batch, K] @ [K, rows], and
    turned once at the end: the batch tile becomes the MMA's M dimension, so a batch tile of
    64 makes the loop a Hopper wgmma (M a multiple of 64) where 32 rows would be mma.sync."""
    if RESIDENT and acc.shape[-1] < 16:  # vector tiles (S = 1; slices from the chunk's shape)
        acc += _vdot(wa, X, x_row, jb64, x_ok, 0, K, DOT_DT, acc.shape[-1])
        if KB > 0:
            acc += _vdot(wb, X, x_row, jb64, x_ok, KA, K, DOT_DT, acc.shape[-1])
    elif RESIDENT:
        acc += _mm(wa, _kpart(X, x_row, jb64, x_ok, 0, KA, K, S, DOT_DT), FP32_DOT)
        if KB > 0 and tile_b:
            acc += _mm(wb, _kpart(X, x_row, jb64, x_ok, KA, KB, K, S, DOT_DT), FP32_DOT)
    elif SWAP and S == 1:
        acc_t = tl.zeros([acc.shape[1], acc.shape[0]], tl.float32)
        acc += tl.trans(_dot_t(acc_t, W, a_idx, a_ok, a_stride, b_stride, X, x_row, jb64,
                               x_ok, K, KA, DOT_DT, FP32_DOT))
    else:
        for k0 in range(0, K, KA):
            w = _tile(W, a_idx, a_ok, a_stride, b_stride, k0, KA, K, S, DOT_DT)
            acc += _mm(w, _kpart(X, x_row, jb64, x_ok, k0, KA, K, S, DOT_DT), FP32_DOT)
    return acc


@triton.jit
def _dot_t(acc_t, W, a_idx, a_ok, a_stride, b_stride, X, x_row, jb64, x_ok, K: tl.constexpr,
           KA: tl.constexpr, DOT_DT: tl.constexpr, FP32_DOT: tl.constexpr):
    """acc_t[j, i] += sum_k X[jb[j], k] * W[a_idx[i], k] over k < K, streamed in chunks of KA
    columns ([BB, BM] fp32): the transposed product of `_dot_w3` (SWAP)."""
    for k0 in range(0, K, KA):
        acc_t += _mm(_kpart_t(X, x_row, jb64, x_ok, k0, KA, K, DOT_DT),
                     _tile_t(W, a_idx, a_ok, a_stride, b_stride, k0, KA, K, DOT_DT), FP32_DOT)
    return acc_t


@triton.jit
def _dot_w(W, a_idx, a_ok, a_stride, b_stride, wa, wb, X, x_row, jb64, x_ok,
           K: tl.constexpr, KA: tl.constexpr, KB: tl.constexpr, RESIDENT: tl.constexpr,
           S: tl.constexpr, DOT_DT: tl.constexpr, FP32_DOT: tl.constexpr, BM: tl.constexpr,
           BB: tl.constexpr, SWAP: tl.constexpr = False):
    """acc[i, j] = sum_k W[a_idx[i], k] * X[jb[j], k] over k < K, [BM, BB] fp32 (`_dot_w3`)."""
    acc = _dot_w3(_zacc(S, BM, BB), W, a_idx, a_ok, a_stride, b_stride, wa, wb, X, x_row,
                  jb64, x_ok, K, KA, KB, RESIDENT, S, DOT_DT, FP32_DOT, SWAP)
    return _ksum(acc, S)


@triton.jit
def _load_rows(ptr, stride, rows, cols, mask):
    """[units, batch] tile of a packed [N, C] tensor: tile[h, j] = ptr[rows[j], cols[h]]."""
    return tl.load(ptr + rows[None, :] * stride + cols[:, None], mask=mask, other=0.0).to(
        tl.float32)


@triton.jit
def _store_rows(ptr, stride, rows, cols, val, mask):
    tl.store(ptr + rows[None, :] * stride + cols[:, None], val.to(ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _load_gate(ptr, stride, rows, hs, mask, k: tl.constexpr, G: tl.constexpr,
               H: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    """Gate k's [units, batch] tile of a packed [N, G*H] tensor, zeros for missing gates."""
    if k < G:
        return _load_rows(ptr, stride, rows, k * H + hs, mask)
    else:
        return tl.zeros([BH, BB], tl.float32)


@triton.jit
def _store_gate(ptr, stride, rows, hs, val, mask, k: tl.constexpr, G: tl.constexpr,
                H: tl.constexpr):
    if k < G:
        _store_rows(ptr, stride, rows, k * H + hs, val, mask)


@triton.jit
def _store_gates(PTR, at, step, m, g0, g1, g2, g3, G: tl.constexpr):
    """Gate k's tile g_k stored at PTR + at + k * step for the G gates, where m, in PTR's
    dtype (the backward's dph exchange; `kernels.split_k`'s dpre and held gradients)."""
    ty = PTR.dtype.element_ty
    tl.store(PTR + at, g0.to(ty), mask=m)
    if G > 1:
        tl.store(PTR + at + step, g1.to(ty), mask=m)
        tl.store(PTR + at + 2 * step, g2.to(ty), mask=m)
    if G > 3:
        tl.store(PTR + at + 3 * step, g3.to(ty), mask=m)


@triton.jit
def _program_tile(pid, LENS, B, H: tl.constexpr, HOUT: tl.constexpr, NH: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_B: tl.constexpr):
    """Program pid's tile of a grid launch (NH hidden slices, then batch tiles): its hidden
    units hs and output units os_ (HOUT: h's width) with their masks, its batch rows jb (jb64)
    with theirs, the rows' lengths and tile_len, the steps during which the tile has work."""
    p = pid % NH
    hs = p * BLOCK_H + tl.arange(0, BLOCK_H)
    os_ = p * BLOCK_O + tl.arange(0, BLOCK_O)
    jb = (pid // NH) * BLOCK_B + tl.arange(0, BLOCK_B)
    b_ok = jb < B
    lens = tl.load(LENS + jb, mask=b_ok, other=0)
    return hs, hs < H, os_, os_ < HOUT, jb, b_ok, jb.to(tl.int64), lens, tl.max(lens, axis=0)


@triton.jit
def _step_rows(OFFS, lens, jb64, b_ok, s, rev, REVERSE: tl.constexpr, NUM_DIRS: tl.constexpr):
    """Active mask and packed rows (int64) of the batch tile at step s. One direction: REVERSE
    (constexpr); two: the program's direction rev (0 or 1, runtime) selects the reversal."""
    sv = lens * 0 + s  # as a tensor: the interpreter mis-types `scalar >= 0` in a mask
    act = b_ok & (lens > sv) & (sv >= 0)  # s = -1 is the backward's final carry update
    if NUM_DIRS == 2:
        t = sv + rev * (lens - 1 - 2 * sv)
    elif REVERSE:
        t = lens - 1 - sv
    else:
        t = sv
    rows = tl.load(OFFS + t, mask=act, other=0).to(tl.int64) + jb64
    return act, rows


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _acc_gates(a0, a1, a2, a3, w0, w1, w2, w3, x, G: tl.constexpr, FP32_DOT: tl.constexpr):
    """a_k += w_k @ x (split-K, [S, BH, BB]) for the cell's gates (G is 1, 3 or 4)."""
    a0 += _mm(w0, x, FP32_DOT)
    if G > 1:
        a1 += _mm(w1, x, FP32_DOT)
        a2 += _mm(w2, x, FP32_DOT)
    if G > 3:
        a3 += _mm(w3, x, FP32_DOT)
    return a0, a1, a2, a3


@triton.jit
def _joint_rows(hs, h_ok, G: tl.constexpr, H: tl.constexpr, GP: tl.constexpr,
                BH: tl.constexpr):
    """Rows of R for the joint gate tile [GP * BH, K] (GATES = 1): row g * BH + i is gate g's
    unit hs[i], i.e. R row g * H + hs[i]; gates g >= G (GRU's padding to GP = 4) masked."""
    g = tl.arange(0, GP)[:, None]
    idx = tl.reshape(g * H + hs[None, :], [GP * BH])
    ok = tl.reshape((g < G) & h_ok[None, :], [GP * BH])
    return idx, ok


@triton.jit
def _joint_x_t(XG, s_xg, rows, hs, h_ok, m, GX: tl.constexpr, H: tl.constexpr,
               GP: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    """Input-side gate tiles laid out as the transposed joint product (`_joint_rows`),
    [BB, GP * BH] fp32: entry [j, g * BH + i] = XG[rows[j], g * H + hs[i]] for the gates
    g < GX, zero for the others and for rows outside the mask m (XJOIN). Loaded as
    [BB, GP, BH] so that each gate's hs run stays contiguous and the loads vectorize; through
    the flat `_joint_rows` index the sm_90 compile (LSTM H=1024 B=1024, 128 x 64 tiles)
    issued 142 global loads per step instead of 24-26."""
    g = tl.arange(0, GP)[None, :, None]
    ptr = XG + rows[:, None, None] * s_xg + g * H + hs[None, None, :]
    ok = m[:, None, None] & (g < GX) & h_ok[None, None, :]
    return tl.reshape(tl.load(ptr, mask=ok, other=0.0).to(tl.float32), [BB, GP * BH])


@triton.jit
def _split_gates(acc, GP: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    """The four [BH, BB] gate tiles of a joint product acc [GP * BH, BB] (GP = 4), or acc and
    three zero tiles (GP = 1: one gate)."""
    if GP == 1:
        p0 = acc
        p1 = tl.zeros([BH, BB], tl.float32)
        p2 = p1
        p3 = p1
    else:
        t = tl.reshape(tl.permute(tl.reshape(acc, [2, 2, BH, BB]), (2, 3, 0, 1)),
                       [BH, BB, 2, 2])
        even, odd = tl.split(t)  # last axis: gate % 2
        p0, p2 = tl.split(even)
        p1, p3 = tl.split(odd)
    return p0, p1, p2, p3


@triton.jit
def _fwd_pre(R, s_r, hs, h_ok, src, jb64, b_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3,
             G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr, KA: tl.constexpr,
             KB: tl.constexpr, RESIDENT: tl.constexpr, S: tl.constexpr, DOT_DT: tl.constexpr,
             FP32_DOT: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr,
             GATES: tl.constexpr = 0, GP: tl.constexpr = 4, SWAP: tl.constexpr = False,
             PAIR: tl.constexpr = False, tile_b=True):
    """Recurrent pre-activations R_k[hs, :] @ h^T of the gate slots, [BH, BB] fp32 each
    (zeros for gates the cell lacks); h is read from the exchange slot src [B, HOUT] once per
    chunk and shared by the gates. Split K into S slices as in `_dot_w3`.
    GATES (`_joint_gates`) says how the gates' products are formed: 0 one dot per gate
    (`_fwd_pre_split`); 1 (streamed weights, S = 1) one [GP * BH, K] @ [K, BB] dot for all
    gates (GP = 1 for a one-gate cell), then the gates are split out of it: no cross-warp
    reduction. SWAP: the streamed dot formed transposed (`_dot_w3`).
    PAIR (`_paired_chunks`): the per-gate dots load both chunks of h before either product.
    tile_b: as in `_fwd_pre_split`."""
    if GATES == 1:
        ja, jok = _joint_rows(hs, h_ok, G, H, GP, BH)
        acc = _dot_w(R, ja, jok, s_r, 1, wa0, wb0, src, HOUT, jb64, b_ok, HOUT, KA, KB,
                     RESIDENT, 1, DOT_DT, FP32_DOT, GP * BH, BB, SWAP)
        p0, p1, p2, p3 = _split_gates(acc, GP, BH, BB)
    else:
        p0, p1, p2, p3 = _fwd_pre_split(R, s_r, hs, h_ok, src, jb64, b_ok, wa0, wa1, wa2, wa3,
                                        wb0, wb1, wb2, wb3, G, H, HOUT, KA, KB, RESIDENT, S,
                                        DOT_DT, FP32_DOT, BH, BB, PAIR, tile_b)
    return p0, p1, p2, p3


@triton.jit
def _fwd_pre_split(R, s_r, hs, h_ok, src, jb64, b_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3,
                   G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr, KA: tl.constexpr,
                   KB: tl.constexpr, RESIDENT: tl.constexpr, S: tl.constexpr,
                   DOT_DT: tl.constexpr, FP32_DOT: tl.constexpr, BH: tl.constexpr,
                   BB: tl.constexpr, PAIR: tl.constexpr = False,
                   tile_b=True):
    """`_fwd_pre` with one dot per gate, K split into S slices. A resident reduction's two
    chunks are two MMA chains per gate, added in-thread (`_sum2`): shorter dependency chains
    (LSTM H=768 B=16: 24 -> 16 MMAs), and the sm_90 compiles of the 16 x 32 tiles no longer
    spill (Triton 3.6, LSTM H=1024 B=64: 72 B, 13 local loads per step -> none; GRU 24 B ->
    none).
    PAIR (`_paired_chunks`): both chunks' operands are loaded before either product. Loaded
    where its dots use it, the second chunk's load is issued after the first chunk's staging
    barrier (the compilers do not move a load across bar.sync), so each step waits for two
    L2 round trips in a row right after the grid barrier. Together: one round trip, one
    staging (2 BAR.SYNC fewer), and shared memory for both chunks at once
    (`grid_onchip_bytes`). (The H200 ablation `l1load`, 2026-11-26, meant to price that
    round trip, could not: the barrier's acquire invalidates L1 every step, CCTL.IVALL, so
    its L1-cached loads went to L2 as well.)
    tile_b: whether the second resident chunk's products are formed (a runtime condition
    where HOIST holds only the first chunk in registers, `Hoist.FIRST`)."""
    a0 = _zacc(S, BH, BB)
    a1 = a0
    a2 = a0
    a3 = a0
    if RESIDENT and BB < 16:  # vector tiles (S = 1): one operand load per chunk and column,
        # the gates' sums joined (one reduction and one layout conversion for all gates)
        if G == 1:
            a0 = _vdot(wa0, src, HOUT, jb64, b_ok, 0, HOUT, DOT_DT, BB)
            if KB > 0:
                a0 += _vdot(wb0, src, HOUT, jb64, b_ok, KA, HOUT, DOT_DT, BB)
        else:
            q = _vgates(wa0, wa1, wa2, wa3, src, HOUT, jb64, b_ok, 0, HOUT, G, DOT_DT, BB)
            if KB > 0:
                q += _vgates(wb0, wb1, wb2, wb3, src, HOUT, jb64, b_ok, KA, HOUT, G, DOT_DT,
                             BB)
            a0, a1, a2, a3 = _vsplit(q)
    elif RESIDENT:
        xa = _kpart(src, HOUT, jb64, b_ok, 0, KA, HOUT, S, DOT_DT)
        if PAIR and KB > 0:
            xb = _kpart(src, HOUT, jb64, b_ok, KA, KB, HOUT, S, DOT_DT)
        a0, a1, a2, a3 = _acc_gates(a0, a1, a2, a3, wa0, wa1, wa2, wa3, xa, G, FP32_DOT)
        if KB > 0:
            if not PAIR:
                xb = _kpart(src, HOUT, jb64, b_ok, KA, KB, HOUT, S, DOT_DT)
            z = _zacc(S, BH, BB)
            b0, b1, b2, b3 = z, z, z, z
            if tile_b:
                b0, b1, b2, b3 = _acc_gates(z, z, z, z, wb0, wb1, wb2, wb3, xb, G, FP32_DOT)
            a0 = _sum2(a0, b0)
            if G > 1:
                a1 = _sum2(a1, b1)
                a2 = _sum2(a2, b2)
            if G > 3:
                a3 = _sum2(a3, b3)
    else:
        for k0 in range(0, HOUT, KA):
            xk = _kpart(src, HOUT, jb64, b_ok, k0, KA, HOUT, S, DOT_DT)
            a0 += _mm(_tile(R, hs, h_ok, s_r, 1, k0, KA, HOUT, S, DOT_DT), xk, FP32_DOT)
            if G > 1:
                a1 += _mm(_tile(R + H * s_r, hs, h_ok, s_r, 1, k0, KA, HOUT, S, DOT_DT), xk,
                          FP32_DOT)
                a2 += _mm(_tile(R + 2 * H * s_r, hs, h_ok, s_r, 1, k0, KA, HOUT, S, DOT_DT),
                          xk, FP32_DOT)
            if G > 3:
                a3 += _mm(_tile(R + 3 * H * s_r, hs, h_ok, s_r, 1, k0, KA, HOUT, S, DOT_DT),
                          xk, FP32_DOT)
    # The S partial sums meet here, all gates at once (join / split only regroup registers),
    # by halves as `_ksum` adds them (S = 2, 4 or 8: `_gate_split` caps S at 8). Gates the
    # cell lacks stay zero.
    if S == 1:
        p0, p1, p2, p3 = a0, a1, a2, a3
    elif G > 1:
        t = tl.join(tl.join(a0, a1), tl.join(a2, a3))  # [S, BH, BB, 2, 2]
        if S == 2:
            lo, hi = tl.split(tl.permute(t, (1, 2, 3, 4, 0)))
            t01, t23 = tl.split(lo + hi)
        elif S == 4:
            lo, hi = tl.split(tl.permute(tl.reshape(t, [2, 2, BH, BB, 2, 2]),
                                         (2, 3, 4, 5, 0, 1)))
            lo, hi = tl.split(lo + hi)
            t01, t23 = tl.split(lo + hi)
        else:
            tl.static_assert(S == 8, "the forward's gate dots split at most 8 ways")
            lo, hi = tl.split(tl.permute(tl.reshape(t, [2, 2, 2, BH, BB, 2, 2]),
                                         (3, 4, 5, 6, 0, 1, 2)))
            lo, hi = tl.split(lo + hi)
            lo, hi = tl.split(lo + hi)
            t01, t23 = tl.split(lo + hi)
        p0, p1 = tl.split(t01)
        p2, p3 = tl.split(t23)
    else:
        p0 = _ksum(a0, S)
        p1 = tl.zeros([BH, BB], tl.float32)
        p2 = p1
        p3 = p1
    return p0, p1, p2, p3


@triton.jit
def _gate_b(BR, hs, h_ok, k: tl.constexpr, G: tl.constexpr, H: tl.constexpr,
            BH: tl.constexpr):
    """Gate k's recurrent bias slice bR[k*H + hs] in fp32, zeros for missing gates."""
    if k < G:
        return tl.load(BR + k * H + hs, mask=h_ok, other=0.0).to(tl.float32)
    else:
        return tl.zeros([BH], tl.float32)


@triton.jit
def _gate_sums(p0, p1, p2, p3, x0, x1, x2, x3, b0, b1, b2, b3, G: tl.constexpr,
               JOINED: tl.constexpr):
    """The forward's gate pre-activations: the recurrent products p_k plus their biases b_k
    and, where the cell adds them, the input-side tiles x_k (LSTM all four gates, GRU r and
    z; GRU's n keeps x_n apart, n = tanh(x_n + r * (p_n + b_n))). Returns (p0 .. p3,
    x0 .. x3) with the folded x_k zero, for `cells.cell_forward`.
    JOINED (`_joined_sums`): a gated cell's sums formed as one [BH, BB, 2, 2] tensor. The
    products arrive in their reduction's layout and the cell runs in the loads' (x_k, c, h),
    so one layout conversion carries the four gate tiles over where separate sums took one
    per gate. Else each gate's p_k + b_k, the x_k left to the cell."""
    if G == 1 or not JOINED:
        return (p0 + b0[:, None], p1 + b1[:, None], p2 + b2[:, None], p3 + b3[:, None], x0, x1,
                x2, x3)
    zero = tl.zeros_like(x0)
    if G == 4:
        xj = tl.join(tl.join(x0 + b0[:, None], x1 + b1[:, None]),
                     tl.join(x2 + b2[:, None], x3 + b3[:, None]))
        n_x = zero
    else:
        xj = tl.join(tl.join(x0 + b0[:, None], x1 + b1[:, None]),
                     tl.join(zero + b2[:, None], zero))
        n_x = x2
    s01, s23 = tl.split(tl.join(tl.join(p0, p1), tl.join(p2, p3)) + xj)
    p0, p1 = tl.split(s01)
    p2, p3 = tl.split(s23)
    return p0, p1, p2, p3, zero, zero, n_x, zero


@triton.jit
def _arrive(SYNC, u, u_end, BARRIER: tl.constexpr):
    """Arrival at the barrier that ends sub-step u (a launch's last sub-step has none)."""
    # Nested: the constexpr test must compile the barrier out entirely (interpreter).
    if BARRIER > 0:  # noqa: SIM102
        if u + 1 < u_end:
            grid_arrive(SYNC)


@triton.jit
def _fwd_loads(XG, s_xg, OFFS, lens, jb64, b_ok, hs, h_ok, u, u_end, rev,
               G: tl.constexpr, H: tl.constexpr, NPH: tl.constexpr, REVERSE: tl.constexpr,
               NUM_DIRS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr,
               XJOIN: tl.constexpr = False, GP: tl.constexpr = 4):
    """What sub-step u reads that no other program writes: its active mask, packed rows and,
    in a cell phase, the input-side gate tiles x_k = XG[rows, k*H + hs]. The kernel loads
    them for u + 1 between its arrival and its wait (see `grid_arrive`): their latency hides
    behind the barrier instead of following the step's matmuls. Nothing is loaded past the
    launch's last sub-step (u >= u_end).
    XJOIN: x0 is the transposed joint tile of the gates whose input side is added to the
    recurrent one (`_joint_x_t`: all but GRU's n gate, which stays x2), the others zero."""
    live = (lens * 0 + u) < u_end
    act, rows = _step_rows(OFFS, lens, jb64, b_ok & live, u // NPH, rev, REVERSE, NUM_DIRS)
    cell_act = act & ((lens * 0 + u) % NPH == 0)
    m2 = h_ok[:, None] & cell_act[None, :]
    if XJOIN:
        zero = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)
        x1 = zero
        x3 = zero
        if G == 3:  # GRU: n = tanh(x_n + r * (R_n h + b_n)) keeps x_n apart
            x0 = _joint_x_t(XG, s_xg, rows, hs, h_ok, cell_act, 2, H, GP, BLOCK_H, BLOCK_B)
            x2 = _load_gate(XG, s_xg, rows, hs, m2, 2, G, H, BLOCK_H, BLOCK_B)
        else:
            x0 = _joint_x_t(XG, s_xg, rows, hs, h_ok, cell_act, G, H, GP, BLOCK_H, BLOCK_B)
            x2 = zero
    else:
        x0 = _load_gate(XG, s_xg, rows, hs, m2, 0, G, H, BLOCK_H, BLOCK_B)
        x1 = _load_gate(XG, s_xg, rows, hs, m2, 1, G, H, BLOCK_H, BLOCK_B)
        x2 = _load_gate(XG, s_xg, rows, hs, m2, 2, G, H, BLOCK_H, BLOCK_B)
        x3 = _load_gate(XG, s_xg, rows, hs, m2, 3, G, H, BLOCK_H, BLOCK_B)
    return act, rows, x0, x1, x2, x3


@triton.jit
def _fwd_cell_phase(
    x0, x1, x2, x3, Y, s_y, CSEQ, s_cseq, HT, s_ht, R, s_r, MX, src, dst, SYNC, u, u_end,
    rows, act, jb64, b_ok, hs, h_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3, b0, b1, b2, b3,
    c, h_own, is_last, tile_on,
    CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr, P: tl.constexpr,
    HAS_CSEQ: tl.constexpr, KA: tl.constexpr, KB: tl.constexpr, RESIDENT: tl.constexpr,
    S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr, DOT_DT: tl.constexpr,
    FP32_DOT: tl.constexpr, BARRIER: tl.constexpr, GATES: tl.constexpr, GP: tl.constexpr,
    SWAP: tl.constexpr = False, XJOIN: tl.constexpr = False, BR=0,
    SUMS: tl.constexpr = False, PAIR: tl.constexpr = False,
    tile_b=True,
):
    """Phase 0: gates and cell of the own hidden slice (x_k: the prefetched input-side gate
    tiles); publishes h (no projection) or m, arrives at the barrier, then writes the outputs
    nobody in the launch reads. Returns the carried (c, h_own).
    XJOIN (streamed joint product formed transposed, `_xjoin`): x0 (`_fwd_loads`) plus the
    recurrent biases BR of the joint tile's rows is the product's starting value."""
    # A batch tile whose rows have all finished skips the matmuls (it only carries its state
    # over). The runtime branch also keeps the compiler from hoisting the weights' shared ->
    # register load out of the step loop, which spills once the slice outgrows registers
    # (HOIST: tile_on is the constant True, no branch, `_hoist_weights`).
    if XJOIN:
        ja, jok = _joint_rows(hs, h_ok, G, H, GP, BLOCK_H)  # R's rows of the joint tile
        # The joint bias is read per step (L1): held in registers it spilled more (sm_90,
        # LSTM H=1024 B=1024, 64 x 128 tiles: 67 instead of 41 local loads per step).
        acc_t = x0 + tl.load(BR + ja, mask=jok, other=0.0).to(tl.float32)[None, :]
        if tile_on:
            acc_t = _dot_t(acc_t, R, ja, jok, s_r, 1, src, HOUT, jb64, b_ok, HOUT, KA, DOT_DT,
                           FP32_DOT)
        p0, p1, p2, p3 = _split_gates(tl.trans(acc_t), GP, BLOCK_H, BLOCK_B)
        x0 = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)  # now in p0 .. p3 (GRU's x2 is not)
    elif tile_on:
        p0, p1, p2, p3 = _fwd_pre(R, s_r, hs, h_ok, src, jb64, b_ok, wa0, wa1, wa2, wa3, wb0,
                                  wb1, wb2, wb3, G, H, HOUT, KA, KB, RESIDENT, S, DOT_DT,
                                  FP32_DOT, BLOCK_H, BLOCK_B, GATES, GP, SWAP, PAIR,
                                  tile_b)
        p0, p1, p2, p3, x0, x1, x2, x3 = _gate_sums(p0, p1, p2, p3, x0, x1, x2, x3, b0, b1,
                                                    b2, b3, G, SUMS)
    else:
        p0 = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)
        p1 = p0
        p2 = p0
        p3 = p0
    m2 = h_ok[:, None] & act[None, :]
    if P == 0:
        h_old = h_own  # the own slice of h_{s-1}: GRU's z * h term
    else:
        h_old = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)  # projection is LSTM-only
    m, c_new = cells.cell_forward(CELL, x0, x1, x2, x3, p0, p1, p2, p3, h_old, c)
    if CELL == 0:
        c = tl.where(act[None, :], c_new, c)
    at = jb64[None, :] * HOUT + hs[:, None]
    if P == 0:
        h_own = tl.where(act[None, :], m, h_own)
        # Only active rows are published: a finished row's column of the next step's dot is
        # never used (the column is masked out of every result), so stale data there is safe.
        tl.store(dst + at, m.to(dst.dtype.element_ty), mask=m2)
    else:
        tl.store(MX + jb64[None, :] * H + hs[:, None], m.to(MX.dtype.element_ty), mask=m2)
    _arrive(SYNC, u, u_end, BARRIER)
    if CELL == 0 and HAS_CSEQ:
        _store_rows(CSEQ, s_cseq, rows, hs, c_new, m2)
    if P == 0:
        _store_rows(Y, s_y, rows, hs, m, m2)
        tl.store(HT + jb64[None, :] * s_ht + hs[:, None], h_own.to(HT.dtype.element_ty),
                 mask=h_ok[:, None] & b_ok[None, :] & is_last[None, :])
    return c, h_own


@triton.jit
def _fwd_proj_phase(
    Y, s_y, HT, s_ht, PW, s_pw, MX, dst, SYNC, u, u_end, rows, act, jb64, b_ok, os_, o_ok,
    pwa, pwb, h_own, is_last, tile_on, H: tl.constexpr, HOUT: tl.constexpr, KA: tl.constexpr,
    KB: tl.constexpr, RESIDENT: tl.constexpr, S: tl.constexpr, DOT_DT: tl.constexpr,
    FP32_DOT: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_B: tl.constexpr,
    BARRIER: tl.constexpr, SWAP: tl.constexpr = False,
):
    """Phase 1 (projection): h[os] = Pw[os, :] @ m^T for the own output slice; publishes h,
    arrives, then writes y / hT. Returns the carried h_own."""
    if tile_on:
        hp = _dot_w(PW, os_, o_ok, s_pw, 1, pwa, pwb, MX, H, jb64, act, H, KA, KB, RESIDENT,
                    S, DOT_DT, FP32_DOT, BLOCK_O, BLOCK_B, SWAP)
    else:
        hp = tl.zeros([BLOCK_O, BLOCK_B], tl.float32)
    mo = o_ok[:, None] & act[None, :]
    h_own = tl.where(act[None, :], hp, h_own)
    tl.store(dst + jb64[None, :] * HOUT + os_[:, None], hp.to(dst.dtype.element_ty), mask=mo)
    _arrive(SYNC, u, u_end, BARRIER)
    _store_rows(Y, s_y, rows, os_, hp, mo)
    tl.store(HT + jb64[None, :] * s_ht + os_[:, None], h_own.to(HT.dtype.element_ty),
             mask=o_ok[:, None] & b_ok[None, :] & is_last[None, :])
    return h_own


@triton.jit(do_not_specialize=["B", "n_sub", "u_begin", "u_end", "max_spin", "sync_extra"])
def _grid_fwd_kernel(
    XG, s_xg, R, s_r, BR, PW, s_pw, Y, s_y, CSEQ, s_cseq, HT, s_ht, CT, s_ct,
    LENS, OFFS, HST, XWS, CWS, MWS, SYNC,
    B, n_sub, u_begin, u_end, max_spin, sync_extra,
    dir_xg, dir_r, dir_br, dir_pw, dir_y, dir_cseq, dir_ht, dir_ct,
    CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr, P: tl.constexpr,
    REVERSE: tl.constexpr, NUM_DIRS: tl.constexpr, HAS_CSEQ: tl.constexpr,
    NPH: tl.constexpr, NH: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_B: tl.constexpr,
    RESIDENT: tl.constexpr, RKA: tl.constexpr, RKB: tl.constexpr, PKA: tl.constexpr,
    PKB: tl.constexpr, RS: tl.constexpr, PS: tl.constexpr, DOT_DT: tl.constexpr,
    FP32_DOT: tl.constexpr, BARRIER: tl.constexpr, GATES: tl.constexpr = 0,
    GP: tl.constexpr = 4, SWAP: tl.constexpr = False, VW: tl.constexpr = 0,
    HOIST: tl.constexpr = False, XJOIN: tl.constexpr = False, SUMS: tl.constexpr = False,
    MASK_IN_LOOP: tl.constexpr = False, PAIR: tl.constexpr = False,
    HOIST_FIRST: tl.constexpr = False,
):
    """Sub-steps [u_begin, u_end) of the forward; sub-step u is step u // NPH, phase u % NPH.

    Per direction: HST: fp32 [B, HOUT] h state at launch boundaries (each program keeps its
    own slice in registers in between); XWS: [2, B, HOUT] ping-pong h exchange in the
    tensors' dtype (h_{s-1} in slot s % 2); CWS: fp32 [B, H] c state (LSTM); MWS: [B, H] m
    exchange in the tensors' dtype (projection); SYNC: int32 [2] barrier counter, error flag.
    Weights: RESIDENT: R's reduction (HOUT) in on-chip chunks of RKA + RKB columns, Pw's (H)
    in PKA + PKB; streamed: read in chunks of RKA (PKA) columns every step.
    NUM_DIRS = 2: grid axis 1 is the direction; direction 1 (reversed in time) reads its
    tensors at element offsets dir_* and its workspaces, stacked [2, ...], one direction
    further; each direction meets at its own barrier (they share no data).
    """
    pid = tl.program_id(0)
    rev = 0
    if NUM_DIRS == 2:
        rev = tl.program_id(1)
        d64 = rev.to(tl.int64)
        XG += d64 * dir_xg
        R += d64 * dir_r
        BR += d64 * dir_br
        PW += d64 * dir_pw
        Y += d64 * dir_y
        CSEQ += d64 * dir_cseq
        HT += d64 * dir_ht
        CT += d64 * dir_ct
        HST += d64 * B * HOUT
        XWS += d64 * 2 * B * HOUT
        CWS += d64 * B * H
        MWS += d64 * B * H
        SYNC += rev * 2
    hs, h_ok, os_, o_ok, jb, b_ok, jb64, lens, tile_len = _program_tile(
        pid, LENS, B, H, HOUT, NH, BLOCK_H, BLOCK_O, BLOCK_B)

    # The program's weight slice, loaded once per launch and kept on chip (RESIDENT).
    # (Placeholders where the weights stream, the joint gate dot's too: GATES = 1.)
    wa0 = _wchunk(R, hs, h_ok, s_r, 1, 0, RKA, HOUT, 0, G, RESIDENT, DOT_DT, BLOCK_H, RS, VW)
    wa1 = _wchunk(R + H * s_r, hs, h_ok, s_r, 1, 0, RKA, HOUT, 1, G, RESIDENT, DOT_DT,
                  BLOCK_H, RS, VW)
    wa2 = _wchunk(R + 2 * H * s_r, hs, h_ok, s_r, 1, 0, RKA, HOUT, 2, G, RESIDENT, DOT_DT,
                  BLOCK_H, RS, VW)
    wa3 = _wchunk(R + 3 * H * s_r, hs, h_ok, s_r, 1, 0, RKA, HOUT, 3, G, RESIDENT, DOT_DT,
                  BLOCK_H, RS, VW)
    wb0 = _wchunk(R, hs, h_ok, s_r, 1, RKA, RKB, HOUT, 0, G, RESIDENT, DOT_DT, BLOCK_H, RS, VW)
    wb1 = _wchunk(R + H * s_r, hs, h_ok, s_r, 1, RKA, RKB, HOUT, 1, G, RESIDENT, DOT_DT,
                  BLOCK_H, RS, VW)
    wb2 = _wchunk(R + 2 * H * s_r, hs, h_ok, s_r, 1, RKA, RKB, HOUT, 2, G, RESIDENT,
                  DOT_DT, BLOCK_H, RS, VW)
    wb3 = _wchunk(R + 3 * H * s_r, hs, h_ok, s_r, 1, RKA, RKB, HOUT, 3, G, RESIDENT,
                  DOT_DT, BLOCK_H, RS, VW)
    b0 = _gate_b(BR, hs, h_ok, 0, G, H, BLOCK_H)
    b1 = _gate_b(BR, hs, h_ok, 1, G, H, BLOCK_H)
    b2 = _gate_b(BR, hs, h_ok, 2, G, H, BLOCK_H)
    b3 = _gate_b(BR, hs, h_ok, 3, G, H, BLOCK_H)
    pwa = _wchunk(PW, os_, o_ok, s_pw, 1, 0, PKA, H, 0, (P > 0) * 1, RESIDENT, DOT_DT, BLOCK_O,
                  PS, VW)
    pwb = _wchunk(PW, os_, o_ok, s_pw, 1, PKA, PKB, H, 0, (P > 0) * 1, RESIDENT, DOT_DT,
                  BLOCK_O, PS, VW)

    keep_o = o_ok[:, None] & b_ok[None, :]
    h_at = jb64[None, :] * HOUT + os_[:, None]
    h_own = tl.load(HST + h_at, mask=keep_o, other=0.0)
    keep_h = h_ok[:, None] & b_ok[None, :]
    c_at = jb64[None, :] * H + hs[:, None]
    if CELL == 0:
        c = tl.load(CWS + c_at, mask=keep_h, other=0.0)
    else:
        c = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)

    # Sub-step u's own inputs are loaded ahead (by the previous iteration, after its arrival).
    act, rows, x0, x1, x2, x3 = _fwd_loads(XG, s_xg, OFFS, lens, jb64, b_ok, hs, h_ok, u_begin,
                                           u_end, rev, G, H, NPH, REVERSE, NUM_DIRS, BLOCK_H,
                                           BLOCK_B, XJOIN, GP)
    failed = u_begin * 0
    u = u_begin
    while (u < u_end) & (failed == 0):
        s = u // NPH
        if MASK_IN_LOOP:  # `_mask_in_loop`; lens is 0 past B, and s >= 0 here
            act = lens > (lens * 0 + s)
        src = XWS + (s % 2).to(tl.int64) * B * HOUT
        dst = XWS + ((s + 1) % 2).to(tl.int64) * B * HOUT
        # Per batch column (a scalar bool & a mask is mis-typed by the interpreter).
        is_last = (jb * 0 + u) == n_sub - 1
        tile_b = True  # whether the second resident chunk's products are formed (in tile_on)
        if HOIST:  # no runtime branch around the dots: their weights stay in registers
            tile_on = True
            if HOIST_FIRST:  # ... but the second chunk's, which stays in shared memory
                tile_b = s < tile_len
        else:
            tile_on = s < tile_len
        # Every sub-step but the launch's last arrives exactly once, inside its phase.
        if NPH == 1:
            c, h_own = _fwd_cell_phase(
                x0, x1, x2, x3, Y, s_y, CSEQ, s_cseq, HT, s_ht, R, s_r, MWS, src, dst, SYNC, u,
                u_end, rows, act, jb64, b_ok, hs, h_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3,
                b0, b1, b2, b3, c, h_own, is_last, tile_on, CELL, G, H, HOUT, P, HAS_CSEQ, RKA,
                RKB, RESIDENT, RS, BLOCK_H, BLOCK_B, DOT_DT, FP32_DOT, BARRIER, GATES, GP, SWAP,
                XJOIN, BR, SUMS, PAIR, tile_b)
        else:
            if u % NPH == 0:
                c, _ = _fwd_cell_phase(
                    x0, x1, x2, x3, Y, s_y, CSEQ, s_cseq, HT, s_ht, R, s_r, MWS, src, dst, SYNC,
                    u, u_end, rows, act, jb64, b_ok, hs, h_ok, wa0, wa1, wa2, wa3, wb0, wb1,
                    wb2, wb3, b0, b1, b2, b3, c, h_own, is_last, tile_on, CELL, G, H, HOUT, P,
                    HAS_CSEQ, RKA, RKB, RESIDENT, RS, BLOCK_H, BLOCK_B, DOT_DT, FP32_DOT,
                    BARRIER, GATES, GP, SWAP, XJOIN=XJOIN, BR=BR, SUMS=SUMS, PAIR=PAIR)
            else:
                h_own = _fwd_proj_phase(
                    Y, s_y, HT, s_ht, PW, s_pw, MWS, dst, SYNC, u, u_end, rows, act, jb64, b_ok,
                    os_, o_ok, pwa, pwb, h_own, is_last, tile_on, H, HOUT, PKA, PKB, RESIDENT, PS,
                    DOT_DT, FP32_DOT, BLOCK_O, BLOCK_B, BARRIER, SWAP)
        act, rows, x0, x1, x2, x3 = _fwd_loads(XG, s_xg, OFFS, lens, jb64, b_ok, hs, h_ok,
                                               u + 1, u_end, rev, G, H, NPH, REVERSE, NUM_DIRS,
                                               BLOCK_H, BLOCK_B, XJOIN, GP)
        # Nested: the constexpr test must compile the barrier out entirely (interpreter).
        if BARRIER == 1:  # noqa: SIM102
            if u + 1 < u_end:
                failed = grid_wait(SYNC, (u - u_begin + 1) * tl.num_programs(0) + sync_extra,
                                   max_spin)
        u += 1

    tl.store(HST + h_at, h_own, mask=keep_o)
    if CELL == 0:
        tl.store(CWS + c_at, c, mask=keep_h)
        done = (jb * 0 + u_end) == n_sub
        tl.store(CT + jb64[None, :] * s_ct + hs[:, None], c.to(CT.dtype.element_ty),
                 mask=keep_h & done[None, :])


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


@triton.jit
def _bwd_carry(carry, R, s_r, os_, o_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3, src, jb64,
               act1, G: tl.constexpr, H: tl.constexpr, KA: tl.constexpr, KB: tl.constexpr,
               RESIDENT: tl.constexpr, S: tl.constexpr, DOT_DT: tl.constexpr,
               FP32_DOT: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_B: tl.constexpr,
               SWAP: tl.constexpr = False, CHAINS: tl.constexpr = 4, PAIRG: tl.constexpr = False,
               tile_b=True):
    """dh_carry[os] += sum_k dph_{s+1,k} @ R[k*H + :, os] for the rows active at step s+1.

    src: the dph exchange slot [B, G*H] of step s+1; carry already holds GRU's direct term.
    Resident weights: the gates' products in CHAINS split-K accumulators (`_bwd_chains`: 1
    or 4 independent MMA chains), added in-thread, then one cross-warp reduction. Streamed
    weights: the gates' R rows (and dph columns) are contiguous, so one loop runs over all
    G*H of them (one software pipeline per step instead of one per gate).
    PAIRG (`_paired_gates`, the default): each gate's two chunks loaded together, the next
    gate's before this gate's products. tile_b: whether the second resident chunk's products
    are formed (`_fwd_pre_split`)."""
    if not RESIDENT:
        acc = _dot_w3(_zacc(S, BLOCK_O, BLOCK_B), R, os_, o_ok, 1, s_r, wa0, wb0, src, G * H,
                      jb64, act1, G * H, KA, KB, RESIDENT, S, DOT_DT, FP32_DOT, SWAP)
        return tl.where(act1[None, :], carry + _ksum(acc, S), carry)
    if BLOCK_B < 16:  # vector tiles: the gates' products summed before one reduction
        acc = _vgate_sum(wa0, wa1, wa2, wa3, src, G * H, jb64, act1, 0, H, G, DOT_DT, BLOCK_B)
        if KB > 0:
            acc += _vgate_sum(wb0, wb1, wb2, wb3, src, G * H, jb64, act1, KA, H, G, DOT_DT,
                              BLOCK_B)
        return tl.where(act1[None, :], carry + acc, carry)
    z = _zacc(S, BLOCK_O, BLOCK_B)
    if PAIRG:  # `_paired_gates`: the operands loaded ahead of their products
        xa0, xb0 = _bwd_operand(src, G, H, jb64, act1, KA, KB, S, DOT_DT)
        if G > 1:
            xa1, xb1 = _bwd_operand(src + H, G, H, jb64, act1, KA, KB, S, DOT_DT)
        acc = _bwd_gate_mm(z, wa0, wb0, xa0, xb0, KB, FP32_DOT, tile_b)
        if G > 1:
            t1 = _bwd_gate_mm(z if CHAINS == 4 else acc, wa1, wb1, xa1, xb1, KB, FP32_DOT,
                              tile_b)
            xa2, xb2 = _bwd_operand(src + 2 * H, G, H, jb64, act1, KA, KB, S, DOT_DT)
            if G > 3:
                xa3, xb3 = _bwd_operand(src + 3 * H, G, H, jb64, act1, KA, KB, S, DOT_DT)
            t2 = _bwd_gate_mm(z if CHAINS == 4 else t1, wa2, wb2, xa2, xb2, KB, FP32_DOT,
                              tile_b)
            t3 = z if CHAINS == 4 else t2
            if G > 3:
                t3 = _bwd_gate_mm(t3, wa3, wb3, xa3, xb3, KB, FP32_DOT, tile_b)
            acc = _sum4(acc, t1, t2, t3) if CHAINS == 4 else t3
        return tl.where(act1[None, :], carry + _ksum(acc, S), carry)
    acc = _dot_w3(z, R, os_, o_ok, 1, s_r, wa0, wb0, src, G * H, jb64, act1, H, KA, KB,
                  RESIDENT, S, DOT_DT, FP32_DOT, tile_b=tile_b)
    if G > 1:
        # CHAINS == 4: each gate's product starts from zero (its own chain); 1: from the
        # previous gate's.
        t1 = _dot_w3(z if CHAINS == 4 else acc, R + H * s_r, os_, o_ok, 1, s_r, wa1, wb1,
                     src + H, G * H, jb64, act1, H, KA, KB, RESIDENT, S, DOT_DT, FP32_DOT,
                     tile_b=tile_b)
        t2 = _dot_w3(z if CHAINS == 4 else t1, R + 2 * H * s_r, os_, o_ok, 1, s_r, wa2, wb2,
                     src + 2 * H, G * H, jb64, act1, H, KA, KB, RESIDENT, S, DOT_DT, FP32_DOT,
                     tile_b=tile_b)
        t3 = z if CHAINS == 4 else t2  # GRU: no fourth gate
        if G > 3:
            t3 = _dot_w3(t3, R + 3 * H * s_r, os_, o_ok, 1, s_r, wa3, wb3, src + 3 * H, G * H,
                         jb64, act1, H, KA, KB, RESIDENT, S, DOT_DT, FP32_DOT, tile_b=tile_b)
        acc = _sum4(acc, t1, t2, t3) if CHAINS == 4 else t3
    return tl.where(act1[None, :], carry + _ksum(acc, S), carry)


@triton.jit
def _bwd_operand(src, G: tl.constexpr, H: tl.constexpr, jb64, act1, KA: tl.constexpr,
                 KB: tl.constexpr, S: tl.constexpr, DOT_DT: tl.constexpr):
    """One gate's dph operand chunks (`_kpart`) of the carry product, both loaded."""
    xa = _kpart(src, G * H, jb64, act1, 0, KA, H, S, DOT_DT)
    xb = xa
    if KB > 0:
        xb = _kpart(src, G * H, jb64, act1, KA, KB, H, S, DOT_DT)
    return xa, xb


@triton.jit
def _bwd_gate_mm(acc, wa, wb, xa, xb, KB: tl.constexpr, FP32_DOT: tl.constexpr, tile_b=True):
    acc += _mm(wa, xa, FP32_DOT)
    if KB > 0 and tile_b:
        acc += _mm(wb, xb, FP32_DOT)
    return acc


@triton.jit
def _bwd_rows(OFFS, lens, jb64, b_ok, u, u_end, S, rev, NPH: tl.constexpr,
              REVERSE: tl.constexpr, NUM_DIRS: tl.constexpr):
    """Active mask and packed rows of backward sub-step u (step S-1-u//NPH; none past
    u_end)."""
    live = (lens * 0 + u) < u_end
    return _step_rows(OFFS, lens, jb64, b_ok & live, S - 1 - u // NPH, rev, REVERSE, NUM_DIRS)


@triton.jit
def _bwd_loads(PREX, s_px, PREH, s_ph, Y, s_y, HPREV, s_hp, CSEQ, s_cs, CPREV, s_cp, DY, s_dy,
               OFFS, lens, jb64, b_ok, hs, h_ok, os_, o_ok, u, u_end, S, rev,
               CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, NPH: tl.constexpr,
               REVERSE: tl.constexpr, NUM_DIRS: tl.constexpr, BLOCK_H: tl.constexpr,
               BLOCK_B: tl.constexpr):
    """What backward sub-step u reads that no other program writes (loaded ahead, as in
    `_fwd_loads`): active mask and rows of step s = S-1-u//NPH; dy[rows, os] where the
    sub-step forms dh (phase A, or the only phase); in the cell phase the reserve tiles:
    pre-activations x_k (input side), q_k (recurrent side) of the gated cells and the
    cell's extra pair e0, e1 (LSTM c_t, c_{t-1}; GRU h_{t-1}; tanh / relu h_t, from which
    their derivatives follow: they read no pre-activation)."""
    act, rows = _bwd_rows(OFFS, lens, jb64, b_ok, u, u_end, S, rev, NPH, REVERSE, NUM_DIRS)
    phase = (lens * 0 + u) % NPH
    dy = _load_rows(DY, s_dy, rows, os_, o_ok[:, None] & (act & (phase == 0))[None, :])
    m2 = h_ok[:, None] & (act & (phase == NPH - 1))[None, :]
    e0 = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)
    e1 = e0
    x0, x1, x2, x3 = e0, e0, e0, e0
    q0, q1, q2, q3 = e0, e0, e0, e0
    if CELL <= 1:
        x0 = _load_gate(PREX, s_px, rows, hs, m2, 0, G, H, BLOCK_H, BLOCK_B)
        x1 = _load_gate(PREX, s_px, rows, hs, m2, 1, G, H, BLOCK_H, BLOCK_B)
        x2 = _load_gate(PREX, s_px, rows, hs, m2, 2, G, H, BLOCK_H, BLOCK_B)
        x3 = _load_gate(PREX, s_px, rows, hs, m2, 3, G, H, BLOCK_H, BLOCK_B)
        q0 = _load_gate(PREH, s_ph, rows, hs, m2, 0, G, H, BLOCK_H, BLOCK_B)
        q1 = _load_gate(PREH, s_ph, rows, hs, m2, 1, G, H, BLOCK_H, BLOCK_B)
        q2 = _load_gate(PREH, s_ph, rows, hs, m2, 2, G, H, BLOCK_H, BLOCK_B)
        q3 = _load_gate(PREH, s_ph, rows, hs, m2, 3, G, H, BLOCK_H, BLOCK_B)
    if CELL == 0:
        e0 = _load_rows(CSEQ, s_cs, rows, hs, m2)
        e1 = _load_rows(CPREV, s_cp, rows, hs, m2)
    if CELL == 1:
        e0 = _load_rows(HPREV, s_hp, rows, hs, m2)
    if CELL >= 2:
        e0 = _load_rows(Y, s_y, rows, hs, m2)
    return act, rows, dy, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1


@triton.jit
def _bwd_fold(carry, dy, NPH: tl.constexpr, FOLD_DY: tl.constexpr):
    """dy of the next sub-step added to the carry once the barrier's wait is over (dm = dy +
    carry; one phase; FOLD_DY, `_fold_dy`): one tile fewer live across the step's carry
    product, and, added after the wait, it does not hold the wait until its load lands.
    The sm_90 compiles (Triton 3.6, bf16) of the planner's backward step loops: LSTM H=768
    B=16 1151 -> 1107 instructions, H=1024 B=16 1223 -> 1199, H=1024 B=64 1285 -> 1233,
    H=256 B=256 852 -> 827 (206 -> 128 registers); GRU H=1536 B=16 12 -> 9 local loads per
    step; no new local load in any step loop (the fp16 LSTM H=1024 B=64 one now saves 16 B
    around it); at B=1024 (128 x 64 tiles) 488 -> 476 local loads per step (H=1024), 492 ->
    508 (H=768). Folding each gate's two sides x_k + q_k as well (all a cell but GRU reads
    of them), before the wait, spilled where nothing did (LSTM H=1024 B=64: 40 B, 5 local
    loads per step). Not yet timed on a GPU."""
    if NPH == 1 and FOLD_DY:
        carry += dy
    return carry


@triton.jit
def _bwd_cell_phase(
    dm, carry, dc, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1, DPREX, s_dpx, DPREH, s_dph, MSEQ,
    s_ms, dst, SYNC, u, u_end, rows, act, jb64, hs, h_ok,
    CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, P: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr, BARRIER: tl.constexpr,
):
    """Phase B: cell backward of the own hidden slice from the prefetched reserve tiles
    (`_bwd_loads`); publishes dph to dst ([B, G*H]), arrives at the barrier, then writes
    dpre_x / dpre_h / m_seq.
    Returns the carried (dh_carry, dc): dc updated, GRU's direct term as the carry's
    restart."""
    m2 = h_ok[:, None] & act[None, :]
    zero = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)
    h_new = zero
    h_prev = zero
    c = zero
    c_prev = zero
    if CELL == 0:
        c = e0
        c_prev = e1
    if CELL == 1:
        h_prev = e0
    if CELL >= 2:
        h_new = e0
    dx0, dx1, dx2, dx3, dh2, direct, dcp, m = cells.cell_backward(
        CELL, x0, x1, x2, x3, q0, q1, q2, q3, dm, h_new, h_prev, c, c_prev, dc)
    # Publish the h-side gradient (dh2 is the n gate's h side for GRU, = dx2 otherwise).
    _store_gates(dst, jb64[None, :] * (G * H) + hs[:, None], H, m2, dx0, dx1, dh2, dx3, G)
    _arrive(SYNC, u, u_end, BARRIER)
    _store_gate(DPREX, s_dpx, rows, hs, dx0, m2, 0, G, H)
    _store_gate(DPREX, s_dpx, rows, hs, dx1, m2, 1, G, H)
    _store_gate(DPREX, s_dpx, rows, hs, dx2, m2, 2, G, H)
    _store_gate(DPREX, s_dpx, rows, hs, dx3, m2, 3, G, H)
    if CELL == 1:
        _store_gate(DPREH, s_dph, rows, hs, dx0, m2, 0, G, H)
        _store_gate(DPREH, s_dph, rows, hs, dx1, m2, 1, G, H)
        _store_gate(DPREH, s_dph, rows, hs, dh2, m2, 2, G, H)
    if P > 0:
        _store_rows(MSEQ, s_ms, rows, hs, m, m2)
    if CELL == 0:
        dc = tl.where(act[None, :], dcp, dc)
    # The carry of an active row restarts from the part of dh_{s-1} that bypasses R.
    if P == 0:
        carry = tl.where(act[None, :], direct, carry)
    else:
        carry = tl.where(act[None, :], 0.0, carry)
    return carry, dc


@triton.jit(do_not_specialize=["B", "S", "n_sub", "u_begin", "u_end", "max_spin",
                               "sync_extra"])
def _grid_bwd_kernel(
    PREX, s_px, PREH, s_ph, R, s_r, PW, s_pw, Y, s_y, HPREV, s_hp, CSEQ, s_cs, CPREV, s_cp,
    DY, s_dy, DH0, s_dh0, DC0, s_dc0, DPREX, s_dpx, DPREH, s_dph, DHTOT, s_dht, MSEQ, s_ms,
    LENS, OFFS, DPHWS, CARRYWS, DCWS, DHWS, SYNC,
    B, S, n_sub, u_begin, u_end, max_spin, sync_extra,
    dir_px, dir_ph, dir_r, dir_pw, dir_y, dir_hp, dir_cs, dir_cp, dir_dy, dir_dh0, dir_dc0,
    dir_dpx, dir_dph, dir_dht, dir_ms,
    CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr, P: tl.constexpr,
    REVERSE: tl.constexpr, NUM_DIRS: tl.constexpr, NPH: tl.constexpr, NH: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_B: tl.constexpr,
    RESIDENT: tl.constexpr, RKA: tl.constexpr, RKB: tl.constexpr, PKA: tl.constexpr,
    PKB: tl.constexpr, RS: tl.constexpr, PS: tl.constexpr, DOT_DT: tl.constexpr,
    FP32_DOT: tl.constexpr, BARRIER: tl.constexpr, SWAP: tl.constexpr = False,
    CHAINS: tl.constexpr = 4, WT: tl.constexpr = False, VW: tl.constexpr = 0,
    FOLD_DY: tl.constexpr = False,
    HOIST: tl.constexpr = False, LATE: tl.constexpr = False, PAIRG: tl.constexpr = False,
    HOIST_FIRST: tl.constexpr = False,
):
    """Sub-steps [u_begin, u_end) of the backward, n_sub = NPH * S + 1: sub-step u is
    processing index q = u // NPH (step s = S-1-q), phase u % NPH; q == S is the final
    carry update that writes dh0.

    Per direction: DPHWS: [2, B, G*H] ping-pong dph exchange in the tensors' dtype (step with
    index q in slot q % 2); CARRYWS: fp32 [B, HOUT] dh_carry state; DCWS: fp32 [B, H] dc state
    (LSTM); DHWS: [B, P] dh exchange in the tensors' dtype (projection); SYNC: int32 [2]
    barrier counter, error flag. Weights: R^T's reduction (H) in chunks RKA + RKB, Pw^T's (HOUT) in
    PKA + PKB, resident or streamed as in the forward. WT (vector tiles): R and PW are the
    transposes of R and Pw ([HOUT, G*H] and [H, P], row strides s_r and s_pw), contiguous
    along the reduction as `_vdot` loads its operand, and the resident chunks are read from
    them.
    NUM_DIRS = 2: as in the forward (direction axis, dir_* offsets, stacked workspaces, one
    barrier each). LATE (`_late_loads`): a sub-step loads its own inputs after its product
    instead of the previous sub-step before the barrier's wait, so they are not live across
    the product.
    """
    pid = tl.program_id(0)
    dph_size = B.to(tl.int64) * (G * H)  # (int64: B * G * H may pass 2**31)
    rev = 0
    if NUM_DIRS == 2:
        rev = tl.program_id(1)
        d64 = rev.to(tl.int64)
        PREX += d64 * dir_px
        PREH += d64 * dir_ph
        R += d64 * dir_r
        PW += d64 * dir_pw
        Y += d64 * dir_y
        HPREV += d64 * dir_hp
        CSEQ += d64 * dir_cs
        CPREV += d64 * dir_cp
        DY += d64 * dir_dy
        DH0 += d64 * dir_dh0
        DC0 += d64 * dir_dc0
        DPREX += d64 * dir_dpx
        DPREH += d64 * dir_dph
        DHTOT += d64 * dir_dht
        MSEQ += d64 * dir_ms
        DPHWS += d64 * 2 * dph_size
        CARRYWS += d64 * B * HOUT
        DCWS += d64 * B * H
        DHWS += d64 * B * P
        SYNC += rev * 2
    hs, h_ok, os_, o_ok, jb, b_ok, jb64, lens, tile_len = _program_tile(
        pid, LENS, B, H, HOUT, NH, BLOCK_H, BLOCK_O, BLOCK_B)

    # R columns of the own output slice, as [BLOCK_O, H] chunks per gate: tile[o, i] =
    # R[k*H + i, os[o]]; with a projection also Pw columns: tile[h, i] = Pw[i, hs[h]].
    # Gate k's resident R^T chunks: tile[o, i] = R[k*H + i, os[o]] (or RT[os[o], k*H + i]).
    if WT:
        r_sa = s_r
        r_sb = 1
        r_gate = H
        pw_sa = s_pw
        pw_sb = 1
    else:
        r_sa = 1
        r_sb = s_r
        r_gate = H * s_r
        pw_sa = 1
        pw_sb = s_pw
    wa0 = _wchunk(R, os_, o_ok, r_sa, r_sb, 0, RKA, H, 0, G, RESIDENT, DOT_DT, BLOCK_O, RS, VW)
    wa1 = _wchunk(R + r_gate, os_, o_ok, r_sa, r_sb, 0, RKA, H, 1, G, RESIDENT, DOT_DT, BLOCK_O,
                  RS, VW)
    wa2 = _wchunk(R + 2 * r_gate, os_, o_ok, r_sa, r_sb, 0, RKA, H, 2, G, RESIDENT, DOT_DT,
                  BLOCK_O, RS, VW)
    wa3 = _wchunk(R + 3 * r_gate, os_, o_ok, r_sa, r_sb, 0, RKA, H, 3, G, RESIDENT, DOT_DT,
                  BLOCK_O, RS, VW)
    wb0 = _wchunk(R, os_, o_ok, r_sa, r_sb, RKA, RKB, H, 0, G, RESIDENT, DOT_DT, BLOCK_O, RS,
                  VW)
    wb1 = _wchunk(R + r_gate, os_, o_ok, r_sa, r_sb, RKA, RKB, H, 1, G, RESIDENT, DOT_DT,
                  BLOCK_O, RS, VW)
    wb2 = _wchunk(R + 2 * r_gate, os_, o_ok, r_sa, r_sb, RKA, RKB, H, 2, G, RESIDENT, DOT_DT,
                  BLOCK_O, RS, VW)
    wb3 = _wchunk(R + 3 * r_gate, os_, o_ok, r_sa, r_sb, RKA, RKB, H, 3, G, RESIDENT, DOT_DT,
                  BLOCK_O, RS, VW)
    pwa = _wchunk(PW, hs, h_ok, pw_sa, pw_sb, 0, PKA, HOUT, 0, (P > 0) * 1, RESIDENT, DOT_DT,
                  BLOCK_H, PS, VW)
    pwb = _wchunk(PW, hs, h_ok, pw_sa, pw_sb, PKA, PKB, HOUT, 0, (P > 0) * 1, RESIDENT, DOT_DT,
                  BLOCK_H, PS, VW)

    keep_o = o_ok[:, None] & b_ok[None, :]
    keep_h = h_ok[:, None] & b_ok[None, :]
    carry_at = jb64[None, :] * HOUT + os_[:, None]
    dc_at = jb64[None, :] * H + hs[:, None]
    carry = tl.load(CARRYWS + carry_at, mask=keep_o, other=0.0)
    if CELL == 0:
        dc = tl.load(DCWS + dc_at, mask=keep_h, other=0.0)
    else:
        dc = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)

    # Sub-step u's own inputs are loaded ahead (by the previous iteration, after its arrival),
    # or, LATE (`_late_loads`), by the sub-step itself once its product is formed: the carry
    # product (one phase, phase A) or Pw^T's (phase B, whose rows and mask come first).
    if not LATE:
        act, rows, dy, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1 = _bwd_loads(
            PREX, s_px, PREH, s_ph, Y, s_y, HPREV, s_hp, CSEQ, s_cs, CPREV, s_cp, DY, s_dy,
            OFFS, lens, jb64, b_ok, hs, h_ok, os_, o_ok, u_begin, u_end, S, rev, CELL, G, H,
            NPH, REVERSE, NUM_DIRS, BLOCK_H, BLOCK_B)
        carry = _bwd_fold(carry, dy, NPH, FOLD_DY)
    failed = u_begin * 0
    u = u_begin
    while (u < u_end) & (failed == 0):
        q = u // NPH
        s = S - 1 - q
        act1 = b_ok & (lens > s + 1)
        # Whether the tile has rows active at s + 1 (a carry to form; always, where HOIST
        # keeps the dots out of runtime branches: act1 masks the carry then).
        carry_b = True  # whether the second resident chunk's products are formed
        if HOIST:
            carry_on = True
            tile_on = True
            if HOIST_FIRST:  # as the forward's tile_b
                carry_b = (q > 0) & (s + 1 < tile_len)
        else:
            carry_on = (q > 0) & (s + 1 < tile_len)
            tile_on = s < tile_len
        dph_src = DPHWS + ((q + 1) % 2).to(tl.int64) * dph_size  # written at index q - 1
        dph_dst = DPHWS + (q % 2).to(tl.int64) * dph_size
        # Every sub-step but the last (q == S, which writes dh0) arrives exactly once.
        if NPH == 1:
            if carry_on:
                carry = _bwd_carry(carry, R, s_r, os_, o_ok, wa0, wa1, wa2, wa3, wb0, wb1,
                                   wb2, wb3, dph_src, jb64, act1, G, H, RKA, RKB, RESIDENT, RS,
                                   DOT_DT, FP32_DOT, BLOCK_O, BLOCK_B, SWAP, CHAINS, PAIRG,
                                   carry_b)
            if LATE:
                act, rows, dy, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1 = _bwd_loads(
                    PREX, s_px, PREH, s_ph, Y, s_y, HPREV, s_hp, CSEQ, s_cs, CPREV, s_cp, DY,
                    s_dy, OFFS, lens, jb64, b_ok, hs, h_ok, os_, o_ok, u, u_end, S, rev, CELL,
                    G, H, NPH, REVERSE, NUM_DIRS, BLOCK_H, BLOCK_B)
                carry = _bwd_fold(carry, dy, NPH, FOLD_DY)
            if q < S:
                if FOLD_DY:  # dy is in the carry already
                    dm = carry
                else:
                    dm = dy + carry
                carry, dc = _bwd_cell_phase(
                    dm, carry, dc, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1, DPREX, s_dpx,
                    DPREH, s_dph, MSEQ, s_ms, dph_dst, SYNC, u, u_end, rows, act, jb64, hs,
                    h_ok, CELL, G, H, P, BLOCK_H, BLOCK_B, BARRIER)
            else:
                tl.store(DH0 + jb64[None, :] * s_dh0 + os_[:, None],
                         carry.to(DH0.dtype.element_ty), mask=keep_o)
        else:
            if u % NPH == 0:
                if carry_on:
                    carry = _bwd_carry(carry, R, s_r, os_, o_ok, wa0, wa1, wa2, wa3, wb0, wb1,
                                       wb2, wb3, dph_src, jb64, act1, G, H, RKA, RKB, RESIDENT,
                                       RS, DOT_DT, FP32_DOT, BLOCK_O, BLOCK_B, SWAP, CHAINS, PAIRG)
                if LATE:
                    act, rows, dy, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1 = _bwd_loads(
                        PREX, s_px, PREH, s_ph, Y, s_y, HPREV, s_hp, CSEQ, s_cs, CPREV, s_cp, DY,
                        s_dy, OFFS, lens, jb64, b_ok, hs, h_ok, os_, o_ok, u, u_end, S, rev, CELL,
                        G, H, NPH, REVERSE, NUM_DIRS, BLOCK_H, BLOCK_B)
                if q < S:
                    mo = o_ok[:, None] & act[None, :]
                    dh = dy + carry
                    tl.store(DHWS + jb64[None, :] * HOUT + os_[:, None],
                             dh.to(DHWS.dtype.element_ty), mask=mo)
                    _arrive(SYNC, u, u_end, BARRIER)
                    _store_rows(DHTOT, s_dht, rows, os_, dh, mo)
                else:
                    tl.store(DH0 + jb64[None, :] * s_dh0 + os_[:, None],
                             carry.to(DH0.dtype.element_ty), mask=keep_o)
            else:
                if LATE:  # Pw^T's product needs the rows' mask before the loads
                    act, rows = _bwd_rows(OFFS, lens, jb64, b_ok, u, u_end, S, rev, NPH,
                                          REVERSE, NUM_DIRS)
                if tile_on:
                    dm = _dot_w(PW, hs, h_ok, 1, s_pw, pwa, pwb, DHWS, HOUT, jb64, act, HOUT,
                                PKA, PKB, RESIDENT, PS, DOT_DT, FP32_DOT, BLOCK_H, BLOCK_B, SWAP)
                else:
                    dm = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)
                if LATE:
                    act, rows, dy, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1 = _bwd_loads(
                        PREX, s_px, PREH, s_ph, Y, s_y, HPREV, s_hp, CSEQ, s_cs, CPREV, s_cp, DY,
                        s_dy, OFFS, lens, jb64, b_ok, hs, h_ok, os_, o_ok, u, u_end, S, rev, CELL,
                        G, H, NPH, REVERSE, NUM_DIRS, BLOCK_H, BLOCK_B)
                carry, dc = _bwd_cell_phase(
                    dm, carry, dc, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1, DPREX, s_dpx, DPREH,
                    s_dph, MSEQ, s_ms, dph_dst, SYNC, u, u_end, rows, act, jb64, hs, h_ok,
                    CELL, G, H, P, BLOCK_H, BLOCK_B, BARRIER)
        if not LATE:
            act, rows, dy, x0, x1, x2, x3, q0, q1, q2, q3, e0, e1 = _bwd_loads(
                PREX, s_px, PREH, s_ph, Y, s_y, HPREV, s_hp, CSEQ, s_cs, CPREV, s_cp, DY, s_dy,
                OFFS, lens, jb64, b_ok, hs, h_ok, os_, o_ok, u + 1, u_end, S, rev, CELL, G, H,
                NPH, REVERSE, NUM_DIRS, BLOCK_H, BLOCK_B)
        # Nested: the constexpr test must compile the barrier out entirely (interpreter).
        if BARRIER == 1:  # noqa: SIM102
            if u + 1 < u_end:
                failed = grid_wait(SYNC, (u - u_begin + 1) * tl.num_programs(0) + sync_extra,
                                   max_spin)
        if not LATE:
            carry = _bwd_fold(carry, dy, NPH, FOLD_DY)
        u += 1

    tl.store(CARRYWS + carry_at, carry, mask=keep_o)
    if CELL == 0:
        tl.store(DCWS + dc_at, dc, mask=keep_h)
        done = (jb * 0 + u_end) == n_sub
        tl.store(DC0 + jb64[None, :] * s_dc0 + hs[:, None], dc.to(DC0.dtype.element_ty),
                 mask=keep_h & done[None, :])


# --------------------------------------------------------------------------------------------
# Host side: the launchers (each launch's options from `grid_tiles`)
# --------------------------------------------------------------------------------------------


def check_coresident(programs: int, sm_count: int) -> None:
    """Refuses a persistent launch that cannot have every program resident at once (the grid
    barrier would wait forever for programs that never start)."""
    if programs > sm_count:
        raise ValueError(
            f"persistent-grid launch needs all {programs} programs co-resident (one per SM), "
            f"but the device has {sm_count} SMs; use larger block_h/block_b or "
            "persistent=False (stepwise)"
        )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# The grid barrier's counter is an int32 that a launch never resets (`grid_wait`'s target for
# sub-step u is (u - u_begin + 1) * programs): a persistent launch covers at most
# _COUNTER_LIMIT // programs - 1 sub-steps, so that no arrival count or target wraps (a
# wrapped target would let a wait pass early: a silent race). A longer run (about 16 million
# sub-steps at 132 programs) is split into launches and the launchers zero the counter
# between them; states and exchange slots carry over as between the interpreter's one-step
# launches.
_COUNTER_LIMIT = 2**31 - 1


def _steps_in_one_launch(persistent: bool, on_gpu: bool, programs: int) -> bool:
    """Whether one launch runs several (sub-)steps, its programs meeting at the grid barrier
    between them: a persistent launch on a GPU, or one of a single program (per direction),
    whose barrier never waits for another program, so the interpreter runs it too. Else one
    launch per (sub-)step, the barrier compiled out (the interpreter would deadlock at it)."""
    return persistent and (on_gpu or programs == 1)


def _launch_ranges(n_sub: int, persistent: bool, on_gpu: bool, programs: int):
    """Sub-step ranges, one per launch (`_steps_in_one_launch`). A persistent launch covers
    at most _COUNTER_LIMIT // programs - 1 sub-steps."""
    if _steps_in_one_launch(persistent, on_gpu, programs):
        per = max(1, _COUNTER_LIMIT // programs - 1)
        if n_sub <= per:
            return [(0, n_sub)]
        return [(u, min(u + per, n_sub)) for u in range(0, n_sub, per)]
    return [(u, u + 1) for u in range(n_sub)]


def check_dtypes(name_tensors: list[tuple[str, torch.Tensor | None]]) -> torch.dtype:
    """The dtype of a launch's tensors (name_tensors: (name, tensor or None) pairs; None is
    an absent optional tensor): the first tensor's, which must be one the grid kernels take
    and every other tensor's too; ValueError naming the first that is not a tensor or not of
    that dtype."""
    for name, t in name_tensors:
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    first = next(((n, t) for n, t in name_tensors if t is not None), None)
    if first is None:
        raise ValueError(f"{name_tensors[0][0]}: expected a tensor, got None")
    anchor_name, anchor = first
    dtype = anchor.dtype
    if dtype not in grid_tiles._DOT_DTYPES:
        raise ValueError(
            f"{anchor_name}: expected dtype float32, float16 or bfloat16 (the grid kernels'), "
            f"got {dtype}" + (" (float64 runs on the reference backend)"
                              if dtype == torch.float64 else ""))
    for name, t in name_tensors:
        if t is not None and t.dtype != dtype:
            raise ValueError(f"{name}: expected dtype {dtype} ({anchor_name}'s), got {t.dtype}")
    return dtype


def _matrix_shape(name: str, t: torch.Tensor | None, expected: str) -> tuple[int, int]:
    """(rows, columns) of a 2-D tensor argument; ValueError naming it where it is absent or
    of another rank (`expected`: the shape wanted, in words), before its shape is unpacked
    (which would fail with "not enough values to unpack", naming nothing)."""
    if t is None or t.dim() != 2:
        got = "None" if t is None else f"shape {list(t.shape)}"
        raise ValueError(f"{name}: expected a 2-D tensor {expected}, got {got}")
    return t.shape[0], t.shape[1]


def _check_common(name_tensors, cell, info, block_h, block_b, block_k, num_warps,
                  num_stages=0):
    """(dtype, device, on a GPU) of a launch; ValueError naming the first argument that is
    not what the kernels take. The first tensor given sets the dtype and the device (the
    backward's pre_x is absent for tanh / relu)."""
    if cell not in cells.CELL_IDS:
        raise ValueError(f"cell: expected one of {sorted(cells.CELL_IDS)}, got {cell!r}")
    dtype = check_dtypes(name_tensors)
    for name, v in (("block_h", block_h), ("block_b", block_b)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if grid_tiles.vector_tiles(block_b):  # FMA products of resident weights
        if block_k:
            raise ValueError(f"block_b < 16 (vector tiles) needs resident weights (block_k = 0), "
                             f"got block_k = {block_k}")
        if block_b > 4 or block_h < 8:
            raise ValueError(f"vector tiles (block_b < 16) take block_b in 1, 2, 4 and "
                             f"block_h >= 8, got block_b = {block_b}, block_h = {block_h}")
    elif block_h < 16:
        raise ValueError(f"block_h must be >= 16 with MMA tiles (block_b >= 16), got {block_h}")
    if block_k != 0 and (block_k < 16 or block_k & (block_k - 1)):
        raise ValueError(
            f"block_k must be 0 (resident weights) or a power of two >= 16, got {block_k}")
    if num_warps < 1 or num_warps & (num_warps - 1):
        raise ValueError(f"num_warps must be a power of two, got {num_warps}")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 0:
        raise ValueError(f"num_stages must be an int >= 0 (0: Triton's default, "
                         f"{grid_tiles.DEFAULT_STAGES}), got {num_stages!r}")
    if num_stages and not block_k:
        raise ValueError(f"num_stages applies to streamed weights (block_k > 0): expected 0 "
                         f"with resident weights (block_k = 0), got num_stages = {num_stages}")
    return dtype, check_device(name_tensors, info), not _interpreting()


def _stages_option(num_stages: int) -> dict:
    """The kernel launch's num_stages option: none at 0 (Triton's default, DEFAULT_STAGES)."""
    return {"num_stages": num_stages} if num_stages else {}


def _check_shape(name, t, shape):
    check_shapes({name: (t, shape)})


def _inp(t):
    """Input with unit column stride (row strides are passed to the kernel)."""
    if t is None or t.dim() < 2 or t.stride(-1) == 1 or t.numel() == 0:
        return t
    return t.contiguous()


class _Outs:
    """Outputs written in place; ones without unit column stride go through a temporary."""

    def __init__(self):
        self._back = []

    def __call__(self, t):
        if t is None or t.stride(-1) == 1 or t.numel() == 0:
            return t
        buf = scratch(t.shape, dtype=t.dtype, device=t.device)
        self._back.append((t, buf))
        return buf

    def finish(self):
        for t, buf in self._back:
            t.copy_(buf)


def _launch_setup(dev, on_gpu, persistent, programs, num_dirs, n_sub, dtype, count_arrivals):
    """(BARRIER, DOT_DT, launch ranges). `programs` is one direction's grid (the group that
    meets at a barrier); a persistent launch needs programs * num_dirs co-resident.

    BARRIER (constexpr): 1 = grid barrier (a launch of several sub-steps,
    `_steps_in_one_launch`: persistent on a GPU, or of one program per direction), 0 = none
    (one launch per sub-step: stepwise, and the interpreter's several programs), 2 = the
    `_count_arrivals` test hook: one launch of every sub-step whose programs only count their
    arrivals and never wait (safe in the interpreter; the outputs are garbage, the counter
    must read (n_sub - 1) * programs per direction)."""
    dot_dt = tl.float32 if not on_gpu else grid_tiles._DOT_DTYPES[dtype]
    if count_arrivals:
        return 2, dot_dt, [(0, n_sub)]
    barrier = int(_steps_in_one_launch(persistent, on_gpu, programs))
    if barrier and on_gpu:
        poll_earlier_launches(dev)
        check_coresident(programs * num_dirs,
                         torch.cuda.get_device_properties(dev).multi_processor_count)
    return barrier, dot_dt, _launch_ranges(n_sub, persistent, on_gpu, programs)


def grid_forward(
    cell: str,
    xg: torch.Tensor,
    R: torch.Tensor,
    bR: torch.Tensor,
    Pw: torch.Tensor | None,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    info: PackInfo,
    reverse: bool,
    y: torch.Tensor,
    c_seq: torch.Tensor | None,
    hT: torch.Tensor,
    cT: torch.Tensor | None,
    *,
    persistent: bool,
    block_h: int = 32,
    block_b: int = 16,
    block_k: int = 0,
    num_warps: int = 4,
    num_stages: int = 0,
    _max_spin: int = DEFAULT_MAX_SPIN,
    _barrier_extra: int = 0,
    _count_arrivals: bool = False,
) -> torch.Tensor | None:
    """Forward recurrence of one layer/direction, the contract of
    `rnn.reference.recurrence_forward` (writes y [N, Hout], c_seq [N, H], hT [B, Hout],
    cT [B, H] in place).

    persistent=True: one launch with a grid barrier per sub-step on GPU (refused when the grid
    exceeds the SM count); persistent=False: one launch per step (and per projection phase).
    `_max_spin` / `_barrier_extra` are test hooks for the barrier's timeout path;
    `_count_arrivals` (test hook, see `_launch_setup`) returns the int32 [D, 2] barrier counters
    of one launch that only counts arrivals (None otherwise)."""
    t = dict(xg=xg, R=R, bR=bR, Pw=Pw, h0=h0, c0=c0, y=y, c_seq=c_seq, hT=hT, cT=cT)
    return _forward(cell, t, info, reverse, None, persistent, block_h, block_b, block_k,
                    num_warps, num_stages, _max_spin, _barrier_extra, _count_arrivals)


def grid_forward_pair(
    cell: str, xg, R, bR, Pw, h0, c0, info: PackInfo, y, c_seq, hT, cT, *,
    persistent: bool, block_h: int = 32, block_b: int = 16, block_k: int = 0,
    num_warps: int = 4, num_stages: int = 0,
    _max_spin: int = DEFAULT_MAX_SPIN, _barrier_extra: int = 0, _count_arrivals: bool = False,
) -> torch.Tensor | None:
    """Both directions of a bidirectional layer in the same launches: grid
    [grid_programs(...), 2], grid axis 1 = direction (1: reversed in time), so persistent=True
    is one launch in all on GPU and persistent=False one launch per sub-step for both.

    Every tensor argument is a pair (direction 0, direction 1) with `grid_forward`'s shapes,
    or None where both are absent; each direction gets exactly `grid_forward`'s result. The
    directions share no data: each meets at its own barrier, so a persistent launch needs
    2 * grid_programs(...) co-resident programs (refused with ValueError beyond the SM
    count). Pairs that are not base + offset (`direction_offsets`) run per direction."""
    pairs = dict(xg=xg, R=R, bR=bR, Pw=Pw, h0=h0, c0=c0, y=y, c_seq=c_seq, hT=hT, cT=cT)
    dirs = direction_offsets(pairs, contiguous=("bR",), outputs=FORWARD_TENSORS[6:])
    if dirs is None or info.max_len == 0:
        counts = [
            grid_forward(cell, info=info, reverse=d == 1, persistent=persistent,
                         block_h=block_h, block_b=block_b, block_k=block_k,
                         num_warps=num_warps, num_stages=num_stages, _max_spin=_max_spin,
                         _barrier_extra=_barrier_extra, _count_arrivals=_count_arrivals,
                         **{k: split_pair(k, v)[d] for k, v in pairs.items()})
            for d in range(2)]
        return None if counts[0] is None else torch.cat(counts)
    first = {k: split_pair(k, v)[0] for k, v in pairs.items()}
    return _forward(cell, first, info, False, dirs, persistent, block_h, block_b, block_k,
                    num_warps, num_stages, _max_spin, _barrier_extra, _count_arrivals)


def _transposed(w: torch.Tensor, off: int | None) -> tuple[torch.Tensor, int]:
    """A weight matrix [rows, cols] transposed into a new contiguous [cols, rows] (for a pair:
    both directions' transposes stacked, `off` elements apart in the original): (direction
    0's transpose, direction 1's element offset from it, 0 for one direction)."""
    t = _both(w, off).transpose(1, 2).contiguous()
    return t[0], (t[0].numel() if off is not None else 0)


def _both(t: torch.Tensor, off: int | None) -> torch.Tensor:
    """The [D, ...] stack of a state: t itself (off None: one direction), or t and the
    same-shaped tensor `off` elements after it (a view when off >= 0)."""
    if off is None:
        return t.unsqueeze(0)
    if off >= 0:
        return t.as_strided((2, *t.shape), (off, *t.stride()), t.storage_offset())
    return torch.stack((t, t.as_strided(t.shape, t.stride(), t.storage_offset() + off)))


def _forward(cell, t, info, reverse, dirs, persistent, block_h, block_b, block_k, num_warps,
             num_stages, max_spin, barrier_extra, count_arrivals) -> torch.Tensor | None:
    """Launches for direction `reverse` (dirs None) or both directions (dirs: offsets)."""
    xg, R, bR, Pw, h0, c0, y, c_seq, hT, cT = (t[k] for k in FORWARD_TENSORS)
    cid = cells.CELL_IDS.get(cell)
    dtype, dev, on_gpu = _check_common([(k, t[k]) for k in FORWARD_TENSORS], cell, info,
                                       block_h, block_b, block_k, num_warps, num_stages)
    G = cells.NUM_GATES[cid]
    lstm = cid == cells.CELL_LSTM
    GH, Hout = _matrix_shape("R", R, f"[{G} * H, Hout] for cell {cell!r}")
    H = GH // G
    P = Pw.shape[0] if Pw is not None else 0
    if P and not lstm:
        raise ValueError(f"a projection (Pw) is LSTM-only, got cell {cell!r}")
    B, N, S = info.B, info.N, info.max_len
    _check_shape("R", R, (G * H, P or H))
    _check_shape("xg", xg, (N, G * H))
    _check_shape("bR", bR, (G * H,))
    if P:
        _check_shape("Pw", Pw, (P, H))
    _check_shape("h0", h0, (B, Hout))
    _check_shape("y", y, (N, Hout))
    _check_shape("hT", hT, (B, Hout))
    if lstm:
        _check_shape("c0", c0, (B, H))
        _check_shape("cT", cT, (B, H))
        if c_seq is not None:
            _check_shape("c_seq", c_seq, (N, H))
    if S == 0:
        hT.copy_(h0)
        if lstm:
            cT.copy_(c0)
        return

    # A pair has unit column strides (direction_offsets): no temporaries, no copies.
    outs = _Outs()
    y_, hT_ = outs(y), outs(hT)
    cT_ = outs(cT) if lstm else None
    c_seq_ = outs(c_seq) if lstm else None
    xg_, R_, Pw_, bR = _inp(xg), _inp(R), _inp(Pw), bR.contiguous()

    nd = 1 if dirs is None else 2
    off = dirs or {}
    nph = 2 if P else 1
    n_sub = nph * S
    programs = grid_tiles.grid_programs(H, Hout, P, B, block_h, block_b)
    barrier, dot_dt, ranges = _launch_setup(dev, on_gpu, persistent, programs, nd, n_sub,
                                            dtype, count_arrivals)
    f32 = dict(dtype=torch.float32, device=dev)  # states; exchanges in dtype (module docstring)
    h_st = scratch(nd, B, Hout, **f32)
    h_st.copy_(_both(h0, off.get("h0")))
    x_ws = scratch(nd, 2, B, Hout, dtype=dtype, device=dev)
    x_ws[:, 0].copy_(h_st)
    c_ws = scratch(nd, B, H, **f32) if lstm else h_st
    if lstm:
        c_ws.copy_(_both(c0, off.get("c0")))
    m_ws = scratch(nd, B, H, dtype=dtype, device=dev) if P else x_ws
    sync = torch.zeros(nd, 2, dtype=torch.int32, device=dev)
    rka, rkb = grid_tiles._ksplit(Hout, block_k, block_b)
    pka, pkb = grid_tiles._ksplit(H, block_k, block_b) if P else (16, 0)
    gates = int(grid_tiles._joint_gates(cell, block_k, block_b))
    r_split = 1 if gates else grid_tiles._gate_split(  # the RS
        rka, rkb, num_warps, block_h, block_b)
    swap = grid_tiles._swap_dots(block_k, block_b)
    hoist = grid_tiles.hoist_pass("fwd", cell, H, Hout, P, dtype, block_h, block_b, block_k,
                                  num_warps, persistent)
    dirs = dirs or dict.fromkeys(FORWARD_TENSORS, 0)
    dummy = h_st
    c_seq_arg = c_seq_ if c_seq_ is not None else dummy
    with torch.cuda.device_of(y):  # launch on the tensors' GPU, not the current one
        for u0, u1 in ranges:
            if u0 and barrier == 1:
                sync[:, 0].zero_()  # a new launch's barrier counts from 0 (`_launch_ranges`)
            _grid_fwd_kernel[(programs, nd)](
                xg_, xg_.stride(0), R_, R_.stride(0), bR, Pw_ if P else dummy,
                Pw_.stride(0) if P else 0, y_, y_.stride(0), c_seq_arg, c_seq_arg.stride(0),
                hT_, hT_.stride(0), cT_ if lstm else dummy, cT_.stride(0) if lstm else 0,
                info.lengths_sorted, info.offsets, h_st, x_ws, c_ws, m_ws, sync,
                B, n_sub, u0, u1, max_spin, barrier_extra,
                *(dirs[k] for k in ("xg", "R", "bR", "Pw", "y", "c_seq", "hT", "cT")),
                CELL=cid, G=G, H=H, HOUT=Hout, P=P, REVERSE=bool(reverse), NUM_DIRS=nd,
                HAS_CSEQ=c_seq_ is not None, NPH=nph, NH=triton.cdiv(H, block_h),
                BLOCK_H=block_h, BLOCK_O=grid_tiles._block_o(H, P, block_h), BLOCK_B=block_b,
                RESIDENT=block_k == 0, RKA=rka, RKB=rkb, PKA=pka, PKB=pkb,
                RS=r_split,
                PS=grid_tiles._nsplit(pka, pkb, num_warps, grid_tiles._block_o(H, P, block_h),
                                      block_b), DOT_DT=dot_dt,
                FP32_DOT=dot_dt == tl.float32, BARRIER=barrier, GATES=gates,
                GP=4 if G > 1 else 1, SWAP=swap, **grid_tiles._hoist_constexprs(hoist),
                XJOIN=grid_tiles._xjoin(cell, block_k, block_h, block_b),
                SUMS=grid_tiles._joined_sums(block_b),
                MASK_IN_LOOP=grid_tiles._mask_in_loop(block_h, block_b),
                PAIR=grid_tiles._paired_chunks(block_b),
                VW=grid_tiles.vector_width(dot_dt) if grid_tiles.vector_tiles(block_b) else 0,
                num_warps=num_warps, **_stages_option(num_stages), **FP_FUSION,
                **(cooperative_launch_options() if barrier == 1 and on_gpu else {}),
            )
    if barrier == 1:
        check_flags(sync, "grid_forward")
    outs.finish()
    return sync if count_arrivals else None


def grid_backward(
    cell: str,
    pre_x: torch.Tensor | None,
    pre_h: torch.Tensor | None,
    R: torch.Tensor,
    Pw: torch.Tensor | None,
    y: torch.Tensor,
    h_prev: torch.Tensor,
    c_seq: torch.Tensor | None,
    c_prev: torch.Tensor | None,
    dy: torch.Tensor,
    dhT: torch.Tensor,
    dcT: torch.Tensor | None,
    info: PackInfo,
    reverse: bool,
    dpre_x: torch.Tensor,
    dpre_h: torch.Tensor | None,
    dh0: torch.Tensor,
    dc0: torch.Tensor | None,
    dh_total: torch.Tensor | None,
    m_seq: torch.Tensor | None,
    *,
    persistent: bool,
    block_h: int = 32,
    block_b: int = 16,
    block_k: int = 0,
    num_warps: int = 4,
    num_stages: int = 0,
    pair_gates: bool | None = None,
    _max_spin: int = DEFAULT_MAX_SPIN,
    _barrier_extra: int = 0,
    _count_arrivals: bool = False,
) -> torch.Tensor | None:
    """Backward recurrence of one layer/direction, the contract of
    `rnn.reference.recurrence_backward` (writes dpre_x [N, G*H], dpre_h [N, G*H] (GRU),
    dh0 [B, Hout], dc0 [B, H] (LSTM), dh_total [N, P] and m_seq [N, H] (projection) in place).
    No atomics on results: bit-identical run to run.
    pair_gates: the plan's `grid_pairs_gates` (False keeps the gates apart where
    `_paired_gates` would pair them; None: `launch_pairs_gates` decides within this
    device's shared memory)."""
    t = dict(pre_x=pre_x, pre_h=pre_h, R=R, Pw=Pw, y=y, h_prev=h_prev, c_seq=c_seq,
             c_prev=c_prev, dy=dy, dhT=dhT, dcT=dcT, dpre_x=dpre_x, dpre_h=dpre_h, dh0=dh0,
             dc0=dc0, dh_total=dh_total, m_seq=m_seq)
    return _backward(cell, t, info, reverse, None, persistent, block_h, block_b, block_k,
                     num_warps, num_stages, pair_gates, _max_spin, _barrier_extra,
                     _count_arrivals)


def grid_backward_pair(
    cell: str, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info: PackInfo,
    dpre_x, dpre_h, dh0, dc0, dh_total, m_seq, *,
    persistent: bool, block_h: int = 32, block_b: int = 16, block_k: int = 0,
    num_warps: int = 4, num_stages: int = 0, pair_gates: bool | None = None,
    _max_spin: int = DEFAULT_MAX_SPIN, _barrier_extra: int = 0, _count_arrivals: bool = False,
) -> torch.Tensor | None:
    """Both directions' backward in the same launches; pairs, grid and barriers as in
    `grid_forward_pair`, shapes and results per direction those of `grid_backward`."""
    pairs = dict(pre_x=pre_x, pre_h=pre_h, R=R, Pw=Pw, y=y, h_prev=h_prev, c_seq=c_seq,
                 c_prev=c_prev, dy=dy, dhT=dhT, dcT=dcT, dpre_x=dpre_x, dpre_h=dpre_h, dh0=dh0,
                 dc0=dc0, dh_total=dh_total, m_seq=m_seq)
    dirs = direction_offsets(pairs, outputs=BACKWARD_TENSORS[11:])
    if dirs is None or info.max_len == 0:
        counts = [
            grid_backward(cell, info=info, reverse=d == 1, persistent=persistent,
                          block_h=block_h, block_b=block_b, block_k=block_k,
                          num_warps=num_warps, num_stages=num_stages,
                          pair_gates=pair_gates, _max_spin=_max_spin,
                          _barrier_extra=_barrier_extra, _count_arrivals=_count_arrivals,
                          **{k: split_pair(k, v)[d] for k, v in pairs.items()})
            for d in range(2)]
        return None if counts[0] is None else torch.cat(counts)
    first = {k: split_pair(k, v)[0] for k, v in pairs.items()}
    return _backward(cell, first, info, False, dirs, persistent, block_h, block_b, block_k,
                     num_warps, num_stages, pair_gates, _max_spin, _barrier_extra,
                     _count_arrivals)


def _backward(cell, t, info, reverse, dirs, persistent, block_h, block_b, block_k, num_warps,
              num_stages, pair_gates, max_spin, barrier_extra,
              count_arrivals) -> torch.Tensor | None:
    """Launches for direction `reverse` (dirs None) or both directions (dirs: offsets)."""
    (pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, dpre_x, dpre_h, dh0, dc0,
     dh_total, m_seq) = (t[k] for k in BACKWARD_TENSORS)
    cid = cells.CELL_IDS.get(cell)
    dtype, dev, on_gpu = _check_common([(k, t[k]) for k in BACKWARD_TENSORS], cell, info,
                                       block_h, block_b, block_k, num_warps, num_stages)
    G = cells.NUM_GATES[cid]
    lstm, gru = cid == cells.CELL_LSTM, cid == cells.CELL_GRU
    GH, Hout = _matrix_shape("R", R, f"[{G} * H, Hout] for cell {cell!r}")
    H = GH // G
    P = Pw.shape[0] if Pw is not None else 0
    if P and not lstm:
        raise ValueError(f"a projection (Pw) is LSTM-only, got cell {cell!r}")
    B, N, S = info.B, info.N, info.max_len
    _check_shape("R", R, (G * H, P or H))
    check_backward_preacts(cell, pre_x, pre_h, (N, G * H))
    _check_shape("dpre_x", dpre_x, (N, G * H))
    for name, x in (("y", y), ("h_prev", h_prev), ("dy", dy)):
        _check_shape(name, x, (N, Hout))
    _check_shape("dhT", dhT, (B, Hout))
    _check_shape("dh0", dh0, (B, Hout))
    if gru:
        _check_shape("dpre_h", dpre_h, (N, G * H))
    if lstm:
        for name, x in (("c_seq", c_seq), ("c_prev", c_prev)):
            _check_shape(name, x, (N, H))
        _check_shape("dcT", dcT, (B, H))
        _check_shape("dc0", dc0, (B, H))
    if P:
        _check_shape("Pw", Pw, (P, H))
        _check_shape("dh_total", dh_total, (N, P))
        _check_shape("m_seq", m_seq, (N, H))
    direct = pair_gates is None and on_gpu  # no plan: the device's memory decides
    pair_gates = grid_tiles.launch_pairs_gates(
        pair_gates, cell, H, Hout, P, dtype, block_h, block_b, block_k, num_warps,
        torch.cuda.get_device_properties(dev).shared_memory_per_block_optin if direct
        else None)
    if S == 0:
        dh0.copy_(dhT)
        if lstm:
            dc0.copy_(dcT)
        return

    outs = _Outs()
    dpre_x_, dh0_ = outs(dpre_x), outs(dh0)
    dpre_h_ = outs(dpre_h) if gru else None
    dc0_ = outs(dc0) if lstm else None
    dh_total_, m_seq_ = (outs(dh_total), outs(m_seq)) if P else (None, None)
    pre_x_, pre_h_, R_, Pw_, y_, h_prev_, dy_ = (
        _inp(x) for x in (pre_x, pre_h, R, Pw, y, h_prev, dy))
    c_seq_, c_prev_ = (_inp(c_seq), _inp(c_prev)) if lstm else (None, None)

    nd = 1 if dirs is None else 2
    off = dirs or {}
    # Vector tiles read the weights from their transposes (WT; one copy per call), contiguous
    # along the reduction.
    dir_w = {}
    wt = grid_tiles.vector_tiles(block_b)
    w_ptr, pw_ptr = R_, Pw_
    if wt:
        w_ptr, dir_w["R"] = _transposed(R_, off.get("R"))
        if P:
            pw_ptr, dir_w["Pw"] = _transposed(Pw_, off.get("Pw"))
    nph = 2 if P else 1
    n_sub = nph * S + 1
    programs = grid_tiles.grid_programs(H, Hout, P, B, block_h, block_b)
    barrier, dot_dt, ranges = _launch_setup(dev, on_gpu, persistent, programs, nd, n_sub,
                                            dtype, count_arrivals)
    f32 = dict(dtype=torch.float32, device=dev)  # states; exchanges in dtype (module docstring)
    dph_ws = scratch(nd, 2, B, G * H, dtype=dtype, device=dev)
    carry_ws = scratch(nd, B, Hout, **f32)
    carry_ws.copy_(_both(dhT, off.get("dhT")))
    dc_ws = scratch(nd, B, H, **f32) if lstm else carry_ws
    if lstm:
        dc_ws.copy_(_both(dcT, off.get("dcT")))
    dh_ws = scratch(nd, B, P, dtype=dtype, device=dev) if P else dph_ws
    sync = torch.zeros(nd, 2, dtype=torch.int32, device=dev)
    rka, rkb = grid_tiles._ksplit(H, block_k, block_b)
    pka, pkb = grid_tiles._ksplit(Hout, block_k, block_b) if P else (16, 0)
    bo = grid_tiles._block_o(H, P, block_h)
    rs = grid_tiles._nsplit(rka, rkb, num_warps, bo, block_b)
    hoist = grid_tiles.hoist_pass("bwd", cell, H, Hout, P, dtype, block_h, block_b, block_k,
                                  num_warps, persistent)
    dirs = {**(dirs or dict.fromkeys(BACKWARD_TENSORS, 0)), **dir_w}
    order = ("pre_x", "pre_h", "R", "Pw", "y", "h_prev", "c_seq", "c_prev", "dy", "dh0", "dc0",
             "dpre_x", "dpre_h", "dh_total", "m_seq")

    def arg(x):  # (pointer, row stride) of an optional row-indexed tensor
        return (x, x.stride(0)) if x is not None else (carry_ws, 0)

    with torch.cuda.device_of(dy):  # launch on the tensors' GPU, not the current one
        for u0, u1 in ranges:
            if u0 and barrier == 1:
                sync[:, 0].zero_()  # a new launch's barrier counts from 0 (`_launch_ranges`)
            _grid_bwd_kernel[(programs, nd)](
                *arg(pre_x_), *arg(pre_h_), *arg(w_ptr), *arg(pw_ptr if P else None), *arg(y_),
                *arg(h_prev_), *arg(c_seq_), *arg(c_prev_), *arg(dy_), *arg(dh0_), *arg(dc0_),
                *arg(dpre_x_), *arg(dpre_h_), *arg(dh_total_), *arg(m_seq_),
                info.lengths_sorted, info.offsets, dph_ws, carry_ws, dc_ws, dh_ws, sync,
                B, S, n_sub, u0, u1, max_spin, barrier_extra,
                *(dirs[k] for k in order),
                CELL=cid, G=G, H=H, HOUT=Hout, P=P, REVERSE=bool(reverse), NUM_DIRS=nd,
                NPH=nph, NH=triton.cdiv(H, block_h), BLOCK_H=block_h,
                BLOCK_O=bo, BLOCK_B=block_b, RESIDENT=block_k == 0,
                RKA=rka, RKB=rkb, PKA=pka, PKB=pkb, RS=rs,
                PS=grid_tiles._nsplit(pka, pkb, num_warps, block_h, block_b), DOT_DT=dot_dt,
                FP32_DOT=dot_dt == tl.float32, BARRIER=barrier,
                SWAP=grid_tiles._swap_dots(block_k, block_b),
                CHAINS=grid_tiles._bwd_chains(bo, block_b, rs, num_warps, G, rka + rkb), WT=wt,
                FOLD_DY=grid_tiles._fold_dy(block_k, block_b),
                LATE=grid_tiles._late_loads(cell, block_h, block_b),
                PAIRG=pair_gates,
                **grid_tiles._hoist_constexprs(hoist),
                VW=grid_tiles.vector_width(dot_dt) if wt else 0, num_warps=num_warps,
                **_stages_option(num_stages), **FP_FUSION,
                **(cooperative_launch_options() if barrier == 1 and on_gpu else {}),
            )
    if barrier == 1:
        check_flags(sync, "grid_backward")
    outs.finish()
    return sync if count_arrivals else None
