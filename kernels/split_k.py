"""Split-K backward recurrence (an experiment: a plan runs it only where asked to).

The persistent grid's backward gives each program a hidden slice of R^T that spans every gate,
so each program reads the whole of its batch tile's dph from L2 every step (and at B >= 256,
where the weights stream, its R^T slice too). Here the reduction over the G*H gate rows is
split across programs as well:

    program (unit block ub of U units, K block kb of KB gate rows, batch tile bt of BB rows)
    phase A: partial[kb][bt, ub] = dph_{s+1}[bt, kb] @ R[kb, ub]   (R block resident, fp32)
             grid barrier (phase B's own inputs load while the other programs arrive)
    phase B: its cell slice (US units of ub, batch tile bt): dh = dy_s + the NK partials + the
             carried direct term, the cell's backward, dpre_s stored
             grid barrier

so a program keeps a [KB, U] block of R on chip and reads only its K range of dph: at LSTM
H=1024 B=256 (U = 128, KB = 512, BB = 128, 128 programs) about a third of the streamed grid's
bytes per step, at B = 64 (U = 64) a quarter of the resident grid's; for two grid barriers a
step instead of one (kernels/NOTES.md, "A split-K backward").
`scripts/split_k_probe.py` times it against the library's backward and cuDNN's.

A second form, `one_barrier=True` (`_split_k1_bwd_kernel`, small batches): a K block is all
gates of KB / G units, and each program of a K block runs those units' cells itself
(redundantly with the K block's other programs), so dpre never crosses programs and a step
meets one grid barrier, for H * BB fp32 partials read by every program (kernels/NOTES.md).
Its programs of a K block all read its cells' pre-activations, so each stores its share of
a step's gradients one iteration late, once every one of them has read that step's: the
gradients may then be written over the pre-activations, as the backend does
(`rnn.planner.backward_writes_over_preacts`). A plan's backward runs either form where its
`split_k_bwd` says so (`rnn.planner.LayerPlan`): forced with `plan_constraints(split_k_bwd=...)`,
kept by a tuning entry, or, where neither names it, as the switches TRITONRNN_BWD_SPLIT_K and
TRITONRNN_BWD_SPLIT_K1 give it (`switched_form`; both off by default, untimed).

The contract is `rnn.reference.recurrence_backward`'s for one direction without a projection:
every cell, variable lengths (packed rows, the batch sorted by length), per-sequence reversal.
Under TRITON_INTERPRET=1 (or persistent=False) each phase of each step is its own launch and
the carries go through global memory between launches: the same kernel code, no barrier. A
single program's persistent launch runs every step in one launch there too, barrier included
(it never waits for another program). The products take their operands (dph or the gate
gradients, and R) in the tensors' dtype on a GPU, with fp32 accumulation; the interpreter
runs them in fp32 (DOT_DT, as the grid kernels do: its bf16 tl.dot is wrong).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..rnn.packing import PackInfo
from ..rnn.reference import check_backward_preacts, check_shapes
from . import cells
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
from .grid_tiles import _DOT_DTYPES, _env_on_off, grid_smem_budget
from .persistent_cta import check_device
from .persistent_grid import (
    _COUNTER_LIMIT,
    _matrix_shape,
    _mm,
    _step_rows,
    _steps_in_one_launch,
    _store_gates,
    check_dtypes,
)

# TRITONRNN_BWD_SPLIT_K=on (read at import; the ablation variant `splitk` sets it): the planner
# gives a persistent-grid or stepwise plan's backward without a projection this kernel where
# `split_k_tiles` finds co-resident tiles and the plan's choice does not say otherwise
# (`switched_form`). Off by default: untimed.
_BWD_SPLIT_K = _env_on_off("TRITONRNN_BWD_SPLIT_K")
# TRITONRNN_BWD_SPLIT_K1=on (the ablation variant `splitk1`): the same for the one-barrier
# form where `split_k1_tiles` has tiles (B <= 32), ahead of the two-barrier form where both
# switches are on. Off by default: untimed.
_BWD_SPLIT_K1 = _env_on_off("TRITONRNN_BWD_SPLIT_K1")


@triton.jit
def _product(DPH, rows, act, kb, r0, r1, r2, r3, BB: tl.constexpr, U: tl.constexpr,
             KC: tl.constexpr, G: tl.constexpr, H: tl.constexpr, SPLIT: tl.constexpr,
             DOT_DT: tl.constexpr, FP32_DOT: tl.constexpr):
    """Phase A's [BB, U] partial: the rows' dph over this program's K block (rows not active:
    zeros; cast to DOT_DT, as the R chunks r0..r3 are) times its resident R block, in SPLIT
    independent accumulators (shorter chains of MMAs each waiting for the one before)."""
    kk = tl.arange(0, KC)
    a = DPH + rows[:, None] * (G * H) + kb * (4 * KC) + kk[None, :]
    m = act[:, None]
    acc = _mm(tl.load(a, mask=m, other=0.0).to(DOT_DT), r0, FP32_DOT)
    if SPLIT == 4:
        acc1 = _mm(tl.load(a + KC, mask=m, other=0.0).to(DOT_DT), r1, FP32_DOT)
        acc2 = _mm(tl.load(a + 2 * KC, mask=m, other=0.0).to(DOT_DT), r2, FP32_DOT)
        acc3 = _mm(tl.load(a + 3 * KC, mask=m, other=0.0).to(DOT_DT), r3, FP32_DOT)
        acc = (acc + acc1) + (acc2 + acc3)
    elif SPLIT == 2:
        acc = _mm(tl.load(a + KC, mask=m, other=0.0).to(DOT_DT), r1, FP32_DOT, acc)
        acc2 = _mm(tl.load(a + 2 * KC, mask=m, other=0.0).to(DOT_DT), r2, FP32_DOT)
        acc = acc + _mm(tl.load(a + 3 * KC, mask=m, other=0.0).to(DOT_DT), r3, FP32_DOT, acc2)
    else:
        acc = _mm(tl.load(a + KC, mask=m, other=0.0).to(DOT_DT), r1, FP32_DOT, acc)
        acc = _mm(tl.load(a + 2 * KC, mask=m, other=0.0).to(DOT_DT), r2, FP32_DOT, acc)
        acc = _mm(tl.load(a + 3 * KC, mask=m, other=0.0).to(DOT_DT), r3, FP32_DOT, acc)
    return acc


@triton.jit
def _gate(PTR, rows, su, m, k: tl.constexpr, G: tl.constexpr, H: tl.constexpr):
    """Gate k's [BB, US] slice of a [N, G*H] tensor's rows, in fp32 (zeros past G)."""
    if k < G:
        return tl.load(PTR + rows[:, None] * (G * H) + k * H + su[None, :], mask=m,
                       other=0.0).to(tl.float32)
    else:
        return tl.zeros(m.shape, dtype=tl.float32)


@triton.jit
def _cell_inputs(PREX, PREH, Y, HPREV, CSEQ, CPREV, DY, rows, su, m, CELL: tl.constexpr,
                 G: tl.constexpr, H: tl.constexpr):
    """Phase B's inputs of the rows' cell slice, in fp32: dy, the pre-activations' input and
    recurrent sides (LSTM, GRU; else dy in their place, unread), y, h_{t-1}, c_t and c_{t-1}
    (LSTM; else y, unread)."""
    at = rows[:, None] * H + su[None, :]
    dy = tl.load(DY + at, mask=m, other=0.0).to(tl.float32)
    if CELL <= 1:
        x0 = _gate(PREX, rows, su, m, 0, G, H)
        x1 = _gate(PREX, rows, su, m, 1, G, H)
        x2 = _gate(PREX, rows, su, m, 2, G, H)
        x3 = _gate(PREX, rows, su, m, 3, G, H)
        h0 = _gate(PREH, rows, su, m, 0, G, H)
        h1 = _gate(PREH, rows, su, m, 1, G, H)
        h2 = _gate(PREH, rows, su, m, 2, G, H)
        h3 = _gate(PREH, rows, su, m, 3, G, H)
    else:
        x0, x1, x2, x3, h0, h1, h2, h3 = dy, dy, dy, dy, dy, dy, dy, dy
    y = tl.load(Y + at, mask=m, other=0.0).to(tl.float32)
    hp = tl.load(HPREV + at, mask=m, other=0.0).to(tl.float32)
    if CELL == 0:
        c = tl.load(CSEQ + at, mask=m, other=0.0).to(tl.float32)
        cp = tl.load(CPREV + at, mask=m, other=0.0).to(tl.float32)
    else:
        c, cp = y, y
    return dy, x0, x1, x2, x3, h0, h1, h2, h3, y, hp, c, cp


@triton.jit
def _program_block(LENS, B, NU: tl.constexpr, NK: tl.constexpr, U: tl.constexpr,
                   BB: tl.constexpr):
    """This program's unit block ub, K block kb and batch tile (rows jb, their mask, int64
    rows, lengths) and its unit block's columns."""
    pid = tl.program_id(0)
    ub = pid % NU
    jb = pid // (NU * NK) * BB + tl.arange(0, BB)
    b_ok = jb < B
    lens = tl.load(LENS + jb, mask=b_ok, other=0)
    return ub, (pid // NU) % NK, jb, b_ok, jb.to(tl.int64), lens, ub * U + tl.arange(0, U)


@triton.jit
def _store_dpre(DPX, DPH, rows, units, m, dx0, dx1, dx2, dx3, dh2, CELL: tl.constexpr,
                G: tl.constexpr, H: tl.constexpr):
    """The cells' gate gradients of the rows' `units`, where m: dpre_x's G gates and GRU's
    h side (dpre_h: the n gate's is dh2, times r)."""
    g_at = rows[:, None] * (G * H) + units[None, :]
    _store_gates(DPX, g_at, H, m, dx0, dx1, dx2, dx3, G)
    if CELL == 1:
        _store_gates(DPH, g_at, H, m, dx0, dx1, dh2, dh2, 3)


@triton.jit(do_not_specialize=["B", "S", "q_begin", "q_end", "do_a", "do_b", "max_spin"])
def _split_k_bwd_kernel(
    PREX, PREH, R, Y, HPREV, CSEQ, CPREV, DY, OFFS, LENS,
    DPX, DPH, DH0, DC0, PART, HC, DCC, SYNC,
    B, S, q_begin, q_end, do_a, do_b, max_spin,
    CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, U: tl.constexpr,
    KC: tl.constexpr, BB: tl.constexpr, NK: tl.constexpr, US: tl.constexpr,
    SPLIT: tl.constexpr, REVERSE: tl.constexpr, DOT_DT: tl.constexpr, FP32_DOT: tl.constexpr,
    BARRIER: tl.constexpr,
):
    """Backward iterations q in [q_begin, q_end) of q = 0..S: phase A of q multiplies the dph
    of step s + 1 = S - q, phase B runs the cell of step s = S - 1 - q, and at q = S writes
    dh0 / dc0. DPH is dpre_h for GRU, else dpre_x (what multiplies R). PART [NK, Bpad, H]
    fp32: the partials; HC / DCC [Bpad, H] fp32: the carried direct term of dh (dhT until a
    row's last step) and dc, read at the start of a launch and written at its end.
    do_a / do_b: run phase A / B (both on a GPU; one per launch without a barrier).
    DOT_DT: the products' operand dtype (`split_k_backward`)."""
    NU: tl.constexpr = H // U
    KB: tl.constexpr = 4 * KC
    ub, kb, jb, b_ok, jb64, lens, cols = _program_block(LENS, B, NU, NK, U, BB)
    kk = tl.arange(0, KC)
    # The resident R block [KB, U] as four [KC, U] chunks.
    r_at = R + (kb * KB + kk)[:, None] * H + cols[None, :]
    r0 = tl.load(r_at).to(DOT_DT)
    r1 = tl.load(r_at + KC * H).to(DOT_DT)
    r2 = tl.load(r_at + 2 * KC * H).to(DOT_DT)
    r3 = tl.load(r_at + 3 * KC * H).to(DOT_DT)
    # This program's cell slice: US units of its unit block (none where kb * US >= U).
    su = ub * U + kb * US + tl.arange(0, US)
    own = b_ok[:, None] & (kb * US + tl.arange(0, US) < U)[None, :]
    state = jb64[:, None] * H + su[None, :]
    hc = tl.load(HC + state, mask=own, other=0.0)
    dcc = tl.load(DCC + state, mask=own, other=0.0)
    nprog = tl.num_programs(0)
    bpad = nprog // (NU * NK) * BB  # PART's batch rows
    failed = q_begin * 0
    q = q_begin
    while (q < q_end) & (failed == 0):
        s = S - 1 - q
        if do_a != 0:
            act_n, rows_n = _step_rows(OFFS, lens, jb64, b_ok, s + 1, 0, REVERSE, 1)
            acc = _product(DPH, rows_n, act_n, kb, r0, r1, r2, r3, BB, U, KC, G, H, SPLIT,
                           DOT_DT, FP32_DOT)
            tl.store(PART + (kb * bpad + jb64)[:, None] * H + cols[None, :], acc)
            if BARRIER:
                grid_arrive(SYNC)
        act, rows = _step_rows(OFFS, lens, jb64, b_ok, s, 0, REVERSE, 1)
        m = act[:, None] & own
        # Phase B's own inputs, loaded while the other programs arrive.
        dh, x0, x1, x2, x3, h0, h1, h2, h3, y, hp, c, cp = _cell_inputs(
            PREX, PREH, Y, HPREV, CSEQ, CPREV, DY, rows, su, m, CELL, G, H)
        if BARRIER:  # (on a GPU every program runs both phases)
            failed = grid_wait(SYNC, (2 * (q - q_begin) + 1) * nprog, max_spin)
        run_b = (do_b != 0) & (failed == 0)
        if NK * US > U:  # some programs of the unit block have no cell slice
            run_b = run_b & (kb * US < U)
        if run_b:
            part = hc
            for k in tl.static_range(NK):
                part += tl.load(PART + (k * bpad + jb64)[:, None] * H + su[None, :])
            if s >= 0:
                dx0, dx1, dx2, dx3, dh2, direct, dcp, _m = cells.cell_backward(
                    CELL, x0, x1, x2, x3, h0, h1, h2, h3, dh + part, y, hp, c, cp, dcc)
                _store_dpre(DPX, DPH, rows, su, m, dx0, dx1, dx2, dx3, dh2, CELL, G, H)
                hc = tl.where(m, direct, hc)
                dcc = tl.where(m, dcp, dcc)
            else:  # q = S: the carries into step -1 are dh0, dc0
                tl.store(DH0 + state, part.to(DH0.dtype.element_ty), mask=own)
                if CELL == 0:
                    tl.store(DC0 + state, dcc.to(DC0.dtype.element_ty), mask=own)
        if BARRIER:  # (a program that failed phase A's wait sees the error flag here)
            grid_arrive(SYNC)
            failed = failed | grid_wait(SYNC, (2 * (q - q_begin) + 2) * nprog, max_spin)
        q += 1
    tl.store(HC + state, hc, mask=own)
    tl.store(DCC + state, dcc, mask=own)


@triton.jit
def _r_gate(R, ku, cols, k: tl.constexpr, G: tl.constexpr, H: tl.constexpr,
            DOT_DT: tl.constexpr):
    """Gate k's rows of the K block's units in R, columns `cols`: [KU, U] in DOT_DT (gate 0's
    rows past G: never multiplied)."""
    return tl.load(R + ((k if k < G else 0) * H + ku)[:, None] * H + cols[None, :]).to(DOT_DT)


@triton.jit
def _held_load(HELD, state, hs, m, CELL: tl.constexpr, G: tl.constexpr):
    """The gate gradients a launch left in HELD (`_split_k1_bwd_kernel`; slots of hs elements:
    dpre_x's G gates, then GRU's dpre_h n gate): (g0, g1, g2, g3, gn) where m, else zeros; a
    gate the cell lacks is g0 again."""
    g0 = tl.load(HELD + state, mask=m, other=0.0)
    g1, g2, g3, gn = g0, g0, g0, g0
    if G > 1:
        g1 = tl.load(HELD + hs + state, mask=m, other=0.0)
        g2 = tl.load(HELD + 2 * hs + state, mask=m, other=0.0)
    if G > 3:
        g3 = tl.load(HELD + 3 * hs + state, mask=m, other=0.0)
    if CELL == 1:
        gn = tl.load(HELD + G * hs + state, mask=m, other=0.0)
    return g0, g1, g2, g3, gn


@triton.jit
def _held_store(HELD, state, hs, m, g0, g1, g2, g3, gn, CELL: tl.constexpr, G: tl.constexpr):
    """`_held_load`'s inverse."""
    _store_gates(HELD, state, hs, m, g0, g1, g2, g3, G)
    if CELL == 1:
        tl.store(HELD + G * hs + state, gn, mask=m)


@triton.jit
def _store_held(DPX, DPH, OFFS, lens, jb64, b_ok, s, units, mine, g0, g1, g2, g3, gn,
                CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, REVERSE: tl.constexpr):
    """`_store_dpre` of gradients held since step s (their rows and mask found again, rather
    than carried across the step loop in registers)."""
    act, rows = _step_rows(OFFS, lens, jb64, b_ok, s, 0, REVERSE, 1)
    _store_dpre(DPX, DPH, rows, units, act[:, None] & mine, g0, g1, g2, g3, gn, CELL, G, H)


@triton.jit(do_not_specialize=["B", "S", "q_begin", "q_end", "max_spin"])
def _split_k1_bwd_kernel(
    PREX, PREH, R, Y, HPREV, CSEQ, CPREV, DY, OFFS, LENS,
    DPX, DPH, DH0, DC0, PART, HC, DCC, HELD, SYNC,
    B, S, q_begin, q_end, max_spin,
    CELL: tl.constexpr, G: tl.constexpr, H: tl.constexpr, U: tl.constexpr,
    KU: tl.constexpr, BB: tl.constexpr, NK: tl.constexpr, REVERSE: tl.constexpr,
    DOT_DT: tl.constexpr, FP32_DOT: tl.constexpr, BARRIER: tl.constexpr,
):
    """The one-barrier form (`split_k_backward(one_barrier=True)`): iterations q in
    [q_begin, q_end) of q = 0..S. Program (ub, kb, bt) runs the cells of its K block's KU
    units (kb) for its batch tile, redundantly with the other unit blocks of that K block:
    dh = dy + the carried direct term + the NK partials of iteration q - 1 (slot q % 2 of
    PART [2, NK, Bpad, H] fp32; zeros at q = 0), the cell's backward, then the product of
    the resulting gate gradients (h side: all G gates of the KU units) with its R block
    [G x KU, U] into its partial, slot (q + 1) % 2, and one grid barrier. It stores its
    share of the K block's dpre (units kk with kk * NU // KU == ub) one iteration late, and
    at q = S its share of dh0 / dc0. HC / DCC [2, Bpad, H]: the carries at launch boundaries
    (every program of a K block holds the same values; each stores its share).

    Why late: dpre_x / dpre_h may be pre_x / pre_h (the backend writes the gradients over
    the pre-activations), and every program of a K block reads a step's pre-activations of
    its units, consuming them before its barrier arrival of that step. So a program keeps
    its share of step s's gradients in registers until it is past the next iteration's
    wait, by when every program has arrived after reading them, and stores them after that
    iteration's arrival (off its fence's path). A launch ending before q = S leaves them in
    HELD [G (+1: GRU's dpre_h n gate), Bpad, H] of dpre_x's dtype, and the next launch, whose
    start is the barrier, stores them."""
    NU: tl.constexpr = H // U
    ub, kb, jb, b_ok, jb64, lens, cols = _program_block(LENS, B, NU, NK, U, BB)
    kk = tl.arange(0, KU)
    ku = kb * KU + kk
    r0 = _r_gate(R, ku, cols, 0, G, H, DOT_DT)
    r1 = _r_gate(R, ku, cols, 1, G, H, DOT_DT)
    r2 = _r_gate(R, ku, cols, 2, G, H, DOT_DT)
    r3 = _r_gate(R, ku, cols, 3, G, H, DOT_DT)
    own = b_ok[:, None] & (kk >= 0)[None, :]
    mine = own & ((kk * NU) // KU == ub)[None, :]  # this program's share of the stores
    state = jb64[:, None] * H + ku[None, :]
    nprog = tl.num_programs(0)
    bpad = nprog // (NU * NK) * BB  # PART's batch rows
    slot = NK * bpad * H
    # The carries: slot q_begin % 2 in, q_end % 2 out (a K block's programs all read them at
    # the start of a launch, and a stepwise launch's programs run in any order).
    c_in = (q_begin % 2).to(tl.int64) * bpad * H + state
    hc = tl.load(HC + c_in, mask=own, other=0.0)
    dcc = tl.load(DCC + c_in, mask=own, other=0.0)
    # The gradients held from iteration q_begin - 1, of step S - q_begin (none at q_begin = 0:
    # no row is active at step S).
    act, _rows = _step_rows(OFFS, lens, jb64, b_ok, S - q_begin, 0, REVERSE, 1)
    hs = bpad.to(tl.int64) * H  # a HELD slot
    g0, g1, g2, g3, gn = _held_load(HELD, state, hs, act[:, None] & mine, CELL, G)
    act, rows = _step_rows(OFFS, lens, jb64, b_ok, S - 1 - q_begin, 0, REVERSE, 1)
    m = act[:, None] & own
    dy, x0, x1, x2, x3, h0, h1, h2, h3, y, hp, c, cp = _cell_inputs(
        PREX, PREH, Y, HPREV, CSEQ, CPREV, DY, rows, ku, m, CELL, G, H)
    failed = q_begin * 0
    q = q_begin
    while (q < q_end) & (failed == 0):
        s = S - 1 - q
        # Nested: the constexpr test must compile the barrier out entirely (interpreter).
        if BARRIER:  # noqa: SIM102 (iteration q - 1's partials, every program's, are stored)
            if q > q_begin:
                failed = grid_wait(SYNC, (q - q_begin) * nprog, max_spin)
        part = hc
        if q > 0:
            src = PART + (q % 2).to(tl.int64) * slot + jb64[:, None] * H + ku[None, :]
            for k in tl.static_range(NK):
                part += tl.load(src + k * bpad * H)
        if s >= 0:
            dx0, dx1, dx2, dx3, dh2, direct, dcp, _m = cells.cell_backward(
                CELL, x0, x1, x2, x3, h0, h1, h2, h3, dy + part, y, hp, c, cp, dcc)
            # The product with R: the h side's gate gradients, zero on rows not active, in
            # the products' operand dtype.
            acc = _mm(tl.where(m, dx0, 0.0).to(DOT_DT), r0, FP32_DOT)
            if G > 1:
                acc = _mm(tl.where(m, dx1, 0.0).to(DOT_DT), r1, FP32_DOT, acc)
                acc = _mm(tl.where(m, dh2, 0.0).to(DOT_DT), r2, FP32_DOT, acc)
            if G > 3:
                acc = _mm(tl.where(m, dx3, 0.0).to(DOT_DT), r3, FP32_DOT, acc)
            dst = PART + ((q + 1) % 2).to(tl.int64) * slot + kb * bpad * H
            tl.store(dst + jb64[:, None] * H + cols[None, :], acc)
            if BARRIER:
                grid_arrive(SYNC)
            # Work nobody waits for: this program's share of step s + 1's gradients (every
            # program has read that step's pre-activations: this iteration's wait is over),
            # the next step's inputs.
            _store_held(DPX, DPH, OFFS, lens, jb64, b_ok, s + 1, ku, mine, g0, g1, g2, g3, gn,
                        CELL, G, H, REVERSE)
            dt = DPX.dtype.element_ty
            g0, g1, g2, g3, gn = dx0.to(dt), dx1.to(dt), dx2.to(dt), dx3.to(dt), dh2.to(dt)
            hc = tl.where(m, direct, hc)
            dcc = tl.where(m, dcp, dcc)
            act, rows = _step_rows(OFFS, lens, jb64, b_ok, s - 1, 0, REVERSE, 1)
            m = act[:, None] & own
            dy, x0, x1, x2, x3, h0, h1, h2, h3, y, hp, c, cp = _cell_inputs(
                PREX, PREH, Y, HPREV, CSEQ, CPREV, DY, rows, ku, m, CELL, G, H)
        else:  # q = S: the carries into step -1 are dh0, dc0
            tl.store(DH0 + state, part.to(DH0.dtype.element_ty), mask=mine)
            if CELL == 0:
                tl.store(DC0 + state, dcc.to(DC0.dtype.element_ty), mask=mine)
        q += 1
    c_out = (q_end % 2).to(tl.int64) * bpad * H + state
    tl.store(HC + c_out, hc, mask=mine)
    tl.store(DCC + c_out, dcc, mask=mine)
    # The gradients still held: step 0's after q = S (the wait of q = S is over), stored;
    # else step S - q_end's, left in HELD for the next launch.
    if q_end > S:
        _store_held(DPX, DPH, OFFS, lens, jb64, b_ok, 0, ku, mine, g0, g1, g2, g3, gn, CELL,
                    G, H, REVERSE)
    else:
        act, _rows = _step_rows(OFFS, lens, jb64, b_ok, S - q_end, 0, REVERSE, 1)
        _held_store(HELD, state, hs, act[:, None] & mine, g0, g1, g2, g3, gn, CELL, G)


def split(U: int, BB: int) -> int:
    """Independent accumulators of phase A's product: 4 for [BB, U] tiles of up to 1024
    elements, 2 up to 4096, else 1 (a [128, 128] fp32 accumulator is 64 registers a thread on
    8 warps already)."""
    return 4 if BB * U <= 1024 else 2 if BB * U <= 4096 else 1


def tiles(cell: str, H: int, B: int, U: int, KB: int, BB: int,
          one_barrier: bool = False) -> tuple[int, int, int]:
    """(programs, NK K blocks, US cell units per program); ValueError naming what does not
    divide or is not a power of two. one_barrier: a K block is all G gates of KB / G units
    (a power of two, at least 16), whose cells each of its programs runs (US = KB / G)."""
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    pow2 = all(v > 0 and v & (v - 1) == 0 for v in (U, KB // G if one_barrier else KB, BB))
    if one_barrier:
        ku = KB // G
        if not pow2 or KB % G or H % U or H % ku or ku < 16 or U < 16 or BB < 16:
            raise ValueError(f"split_k: expected powers of two units | H (>= 16), kblock = "
                             f"{G} * a power of two >= 16 dividing H, and btile >= 16, got "
                             f"cell {cell!r}, H={H}, units={U}, kblock={KB}, btile={BB}")
        nk = H // ku
        return (H // U) * nk * triton.cdiv(max(B, 1), BB), nk, ku
    if not pow2 or H % U or (G * H) % KB or KB < 64 or BB < 16:
        raise ValueError(f"split_k: expected powers of two units | H, 64 <= kblock | G*H and "
                         f"btile >= 16, got cell {cell!r}, H={H}, units={U}, kblock={KB}, "
                         f"btile={BB}")
    nk = G * H // KB
    return (H // U) * nk * triton.cdiv(max(B, 1), BB), nk, triton.next_power_of_2(-(-U // nk))


# The R block a program keeps (bytes), and the largest batch tile.
_R_BLOCK = 128 * 1024
_MAX_BTILE = 128


def onchip_bytes(units: int, kblock: int, btile: int, dtype: torch.dtype,
                 one_barrier: bool = False) -> int:
    """Shared memory of a program on these tiles: its R block [KB, U] in the dtype, and the
    two-barrier form's two staged chunks of its dph K range ([BB, KB / 4] each), or the
    one-barrier form's fp32 partial [BB, U] staged for its store. Equal to the sm_90 bf16
    compiles (Triton 3.6, 8 warps) at LSTM H=1024 B=256 128 x 512 x 128 (196608 B), B=16 64
    x 512 x 16 (73728), GRU H=1536 B=16 128 x 512 x 16 (139264), one barrier LSTM H=1024
    B=16 256 x 128 x 16 (81920), GRU H=1024 B=16 256 x 96 x 16 (65536); above the compiles'
    86016 at B=64 (64 x 512 x 64: 98304)."""
    e = dtype.itemsize
    staged = 4 * units * btile if one_barrier else kblock * btile * e // 2
    return kblock * units * e + staged


@functools.cache  # (the backend asks at each backward call, per direction)
def split_k_tiles(cell: str, H: int, B: int, dtype: torch.dtype,
                  props) -> tuple[int, int, int] | None:
    """(units, kblock, btile) of the split-K backward for a layer on a device (`props`: the
    planner's DeviceProperties, its sm_count and smem_per_program), or None where no tiling
    is co-resident on its SMs within a grid program's shared-memory budget
    (`grid_smem_budget`): the batch tile the
    batch's power of two up to _MAX_BTILE, then of the unit blocks and K blocks whose R
    block stays within _R_BLOCK (and, with the staged dph chunks and the partials, within
    smem) and whose programs fit the SMs, the one that moves the fewest bytes per program
    and step: its K range of dph (KB * BB), its fp32 partial written and the partials of
    its cell slice read (2 * 4 * U * BB), its dpre written (G * US * BB); ties to the larger
    K block (fewer partials). LSTM bf16 on 132 SMs: H=1024 B=256 128 x 512 x 128 (128
    programs), B=64 64 x 512 x 64, B=16 64 x 512 x 16; H=768 B=256 128 x 512 x 128 (72).
    Untimed (scripts/split_k_probe.py)."""
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    e = dtype.itemsize
    sm_count, smem = props.sm_count, grid_smem_budget(props.smem_per_program)
    bb = min(_MAX_BTILE, max(16, triton.next_power_of_2(max(B, 1))))
    best = None
    for U in (16, 32, 64, 128, 256):
        for KB in (64, 128, 256, 512, 1024, 2048):
            try:
                programs, nk, us = tiles(cell, H, B, U, KB, bb)
            except ValueError:
                continue
            # (a [BB, U] fp32 accumulator of 64 registers a thread on 8 warps at most)
            if (programs > sm_count or KB * U * e > _R_BLOCK
                    or onchip_bytes(U, KB, bb, dtype) > smem or bb * U > 128 * 128):
                continue
            moved = KB * bb * e + 8 * U * bb + G * us * bb * e
            key = (moved, -KB)
            if best is None or key < best[0]:
                best = (key, (U, KB, bb))
    return None if best is None else best[1]


# The one-barrier form's cell tile [BB, KU] (elements): a program holds its cells' 13 inputs
# across the wait; the sm_90 compiles (Triton 3.6, LSTM H=1024, 8 warps) of [64, 64] spilled
# (134 local loads per step), [16, 64] did not.
_CELL_TILE = 2048
# The largest batch the one-barrier form takes: at B = 64 (LSTM H=1024, 256 x 128 x 64, the
# rule's tiles without this cap) its step loop spilled (4 local loads, 2 stores per step) and
# ran 2181 instructions against 949 at B = 16.
ONE_BARRIER_BATCH = 32


@functools.cache
def split_k1_tiles(cell: str, H: int, B: int, dtype: torch.dtype,
                   props) -> tuple[int, int, int] | None:
    """(units, kblock, btile) of the one-barrier form (`split_k_backward(one_barrier=True)`)
    on a device, or None (always past ONE_BARRIER_BATCH): the batch tile the batch's power
    of two (every program reads H * btile fp32 partials a step, whatever its tiles), then
    of the unit blocks and K blocks (kblock = G x K-block units) whose R block stays within
    _R_BLOCK and smem, whose cell tile [BB, KU] within _CELL_TILE and whose programs fit the
    SMs, the most programs (the least product each), then the smallest cell tile (the cell
    work every program of a K block repeats: the sm_90 compiles' step loops, Triton 3.6,
    LSTM H=1024 B=16 128 x 256 x 16 -> 256 x 128 x 16 949 -> 723 instructions, B=32 1784
    -> 1158, H=768 B=16 937 -> 724, GRU H=1024 B=16 769 -> 628), then the fewest bytes of
    its partial stored (4 * U * BB, before the barrier's fence), ties to fewer units. LSTM
    bf16 on 132 SMs: H=1024 B=16 256 x 128 x 16 (K blocks of 32 units, 128 programs), B=32
    256 x 128 x 32. Untimed (scripts/split_k_probe.py --one-barrier times these and the
    larger cell tiles the rule chose before)."""
    if B > ONE_BARRIER_BATCH:
        return None
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    e = dtype.itemsize
    sm_count, smem = props.sm_count, grid_smem_budget(props.smem_per_program)
    bb = max(16, triton.next_power_of_2(max(B, 1)))
    best = None
    for U in (16, 32, 64, 128, 256):
        for ku in (16, 32, 64, 128, 256):
            try:
                programs, _, _ = tiles(cell, H, B, U, G * ku, bb, one_barrier=True)
            except ValueError:
                continue
            block = G * ku * U * e
            if (programs > sm_count or block > _R_BLOCK or bb * U > 128 * 128
                    or onchip_bytes(U, G * ku, bb, dtype, one_barrier=True) > smem
                    or ku * bb > _CELL_TILE):
                continue
            key = (-programs, ku * bb, U * bb, U)
            if best is None or key < best[0]:
                best = (key, (U, G * ku, bb))
    return None if best is None else best[1]


class SplitK(NamedTuple):
    """A split-K backward's launch: `split_k_backward`'s units, kblock, btile and
    one_barrier (also `workspace`'s last four arguments, in that order)."""

    units: int
    kblock: int
    btile: int
    one_barrier: bool

    def describe(self) -> str:
        """The tiles in a few words, for messages and `Plan.explain`."""
        form = FORM_NAMES[ONE_BARRIER if self.one_barrier else TWO_BARRIERS]
        return f"{self.units} x {self.kblock} x {self.btile}, {form}"


# A plan's split_k_bwd (`rnn.planner.LayerPlan`): the grid barriers a step of the split-K
# backward that runs its backward, 0 for the family's own backward.
ONE_BARRIER, TWO_BARRIERS = 1, 2
FORM_NAMES = {ONE_BARRIER: "one barrier", TWO_BARRIERS: "two barriers"}
# The backward's warps where a plan does not name them: the sm_90 compiles above are of 8.
NUM_WARPS = 8


def form_tiles(form: int, cell: str, H: int, B: int, dtype: torch.dtype,
               props) -> SplitK | None:
    """The launch of the split-K backward in `form` (ONE_BARRIER: `split_k1_tiles`,
    TWO_BARRIERS: `split_k_tiles`) for a layer on a device, or None where that rule has no
    tiles."""
    rule = {ONE_BARRIER: split_k1_tiles, TWO_BARRIERS: split_k_tiles}[form]
    t = rule(cell, H, B, dtype, props)
    return None if t is None else SplitK(*t, one_barrier=form == ONE_BARRIER)


def switched_form(cell: str, H: int, B: int, dtype: torch.dtype, props) -> int:
    """The form the switches give a backward that the plan's choice does not name (a grid
    family's, without a projection: the planner asks only for those): ONE_BARRIER where its
    switch (_BWD_SPLIT_K1) is on and `split_k1_tiles` has tiles, else TWO_BARRIERS where its
    switch (_BWD_SPLIT_K) is on and `split_k_tiles` has tiles, else 0."""
    for form, on in ((ONE_BARRIER, _BWD_SPLIT_K1), (TWO_BARRIERS, _BWD_SPLIT_K)):
        if on and form_tiles(form, cell, H, B, dtype, props) is not None:
            return form
    return 0


def footprint(cell: str, H: int, B: int, dtype: torch.dtype, launch: SplitK) -> tuple[int, int]:
    """(programs, shared-memory bytes per program) of a launch at batch B."""
    programs, _, _ = tiles(cell, H, B, *launch)
    return programs, onchip_bytes(*launch[:3], dtype, launch.one_barrier)


def workspace(cell: str, H: int, B: int, U: int, KB: int, BB: int,
              one_barrier: bool = False, *, persistent: bool = True,
              on_gpu: bool = True) -> dict[str, tuple]:
    """The workspace `split_k_backward` allocates per call, by name: the fp32 partials
    [NK, Bpad, H] and the fp32 carries of dh's direct term and of dc [Bpad, H] each, Bpad the
    batch rounded up to the batch tile (the kernel's programs cover whole tiles); one_barrier:
    two slots of each ([2, ...]: iteration q reads one and writes the other), and "held"
    [G (+1 for GRU), Bpad, H] in dpre_x's dtype, the gate gradients a launch leaves for the
    next to store (`_split_k1_bwd_kernel`), where the steps take several launches (not
    `_steps_in_one_launch(persistent, on_gpu, programs)`: one launch leaves nothing)."""
    programs, nk, _ = tiles(cell, H, B, U, KB, BB, one_barrier)
    bpad = triton.cdiv(max(B, 1), BB) * BB
    two = (2,) if one_barrier else ()
    out = {"partials": (*two, nk, bpad, H), "dh_carry": (*two, bpad, H),
           "dc_carry": (*two, bpad, H)}
    if one_barrier and not _steps_in_one_launch(persistent, on_gpu, programs):
        G = cells.NUM_GATES[cells.CELL_IDS[cell]]
        out["held"] = (G + (cell == "gru"), bpad, H)
    return out


def _check_layer(cell, pre_x, pre_h, R, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info, dpre_x,
                 dpre_h, dh0, dc0) -> tuple[int, int, int]:
    """(cell id, G, H) of a split-K backward's arguments; ValueError naming the first that is
    not what the contract asks for: every tensor of dy's dtype, one the grid kernels take
    (`persistent_grid.check_dtypes`), on dy's device, as info's index tensors, and a GPU
    unless interpreting (`persistent_cta.check_device`), then the shapes."""
    cid = cells.CELL_IDS.get(cell)
    if cid is None:
        raise ValueError(f"cell: expected one of {list(cells.CELL_IDS)}, got {cell!r}")
    named = [("dy", dy), ("pre_x", pre_x), ("pre_h", pre_h), ("R", R), ("y", y),
             ("h_prev", h_prev), ("c_seq", c_seq), ("c_prev", c_prev), ("dhT", dhT),
             ("dcT", dcT), ("dpre_x", dpre_x), ("dpre_h", dpre_h), ("dh0", dh0), ("dc0", dc0)]
    check_dtypes(named)
    check_device(named, info)
    G = cells.NUM_GATES[cid]
    GH, H = _matrix_shape("R", R, f"[{G} * H, H] for cell {cell!r}")
    if GH != G * H:
        raise ValueError(f"R: expected shape [{G} * H, H] for cell {cell!r}, got {list(R.shape)}")
    B, N = info.B, info.N
    check_backward_preacts(cell, pre_x, pre_h, (N, GH))
    expect = {"y": (y, (N, H)), "h_prev": (h_prev, (N, H)), "dy": (dy, (N, H)),
              "dhT": (dhT, (B, H)), "dh0": (dh0, (B, H)), "dpre_x": (dpre_x, (N, GH))}
    if cid == cells.CELL_LSTM:
        expect.update(c_seq=(c_seq, (N, H)), c_prev=(c_prev, (N, H)), dcT=(dcT, (B, H)),
                      dc0=(dc0, (B, H)))
    if cid == cells.CELL_GRU:
        expect["dpre_h"] = (dpre_h, (N, GH))
    check_shapes(expect)
    return cid, G, H


def split_k_backward(
    cell: str,
    pre_x: torch.Tensor | None,
    pre_h: torch.Tensor | None,
    R: torch.Tensor,
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
    *,
    units: int,
    kblock: int,
    btile: int,
    num_warps: int = 8,
    persistent: bool = True,
    one_barrier: bool = False,
    _max_spin: int = DEFAULT_MAX_SPIN,
    _barrier_extra: int = 0,
) -> None:
    """Backward recurrence of one layer/direction without a projection, the contract of
    `rnn.reference.recurrence_backward` (writes dpre_x [N, G*H], dpre_h [N, G*H] (GRU), dh0
    [B, H], dc0 [B, H] (LSTM) in place). units / kblock / btile: U, KB, BB of the module
    docstring (`tiles`). persistent (a GPU): one launch, every program co-resident; else
    (and in the interpreter) two launches per step (one_barrier: one). No atomics on
    results. one_barrier: `_split_k1_bwd_kernel`, a K block all gates of kblock / G units
    whose cells its programs run redundantly, one grid barrier a step. `_max_spin` /
    `_barrier_extra` are test hooks for the barrier's timeout path (as the grid launchers':
    the counter starts `_barrier_extra` arrivals short of the targets)."""
    cid, G, H = _check_layer(cell, pre_x, pre_h, R, y, h_prev, c_seq, c_prev, dy, dhT, dcT,
                             info, dpre_x, dpre_h, dh0, dc0)
    B, S = info.B, info.max_len
    programs, nk, us = tiles(cell, H, B, units, kblock, btile, one_barrier)
    dev = dy.device
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    # One launch for all steps on a GPU, and in the interpreter where a single program's
    # barrier never waits for another (the in-kernel step loop and the barrier's targets,
    # covered by the interpreter tests too).
    whole_launch = _steps_in_one_launch(persistent, not interp, programs)
    barriers = S if one_barrier else 2 * (S + 1)
    if whole_launch and barriers * programs > _COUNTER_LIMIT:
        # The barrier counter is an int32 that one launch never resets: a run this long
        # (some 8 million steps on 132 programs) takes a launch per step, without barriers,
        # and the one-barrier form's HELD buffer with it.
        whole_launch = False
    if persistent and not interp:
        poll_earlier_launches(dev)  # an earlier launch's known failure first, as the grid's do
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        if programs > sms:
            raise ValueError(f"split_k: {programs} programs cannot all be resident on {sms} "
                             f"SMs (units={units}, kblock={kblock}, btile={btile})")
    ws = workspace(cell, H, B, units, kblock, btile, one_barrier, persistent=whole_launch,
                   on_gpu=not interp)
    part = scratch(ws["partials"], dtype=torch.float32, device=dev)
    hc = torch.zeros(ws["dh_carry"], dtype=torch.float32, device=dev)
    (hc[0] if one_barrier else hc)[:B] = dhT
    dcc = torch.zeros(ws["dc_carry"], dtype=torch.float32, device=dev)
    if dcT is not None:
        (dcc[0] if one_barrier else dcc)[:B] = dcT
    sync = torch.zeros(1, 2, dtype=torch.int32, device=dev)
    if _barrier_extra:  # a fill on the device (an assigned scalar would be a host copy)
        sync[0, 0].fill_(-_barrier_extra)
    # The kernel reads and writes rows of stride H / G*H: strided inputs are copied, strided
    # outputs written through contiguous stand-ins and copied back.
    pre_x, pre_h, R, y, h_prev, c_seq, c_prev, dy = (
        t.contiguous() if t is not None else None
        for t in (pre_x, pre_h, R, y, h_prev, c_seq, c_prev, dy))
    outs = [o for o in (dpre_x, dpre_h, dh0, dc0) if o is not None and not o.is_contiguous()]
    stand_in = {id(o): scratch(o.shape, dtype=o.dtype, device=o.device) for o in outs}
    dpx, dph_, dh0_, dc0_ = (stand_in.get(id(o), o) if o is not None else None
                             for o in (dpre_x, dpre_h, dh0, dc0))
    dph = dph_ if cid == cells.CELL_GRU else dpx
    args = (pre_x if pre_x is not None else dy, pre_h if pre_h is not None else dy, R, y,
            h_prev, c_seq if c_seq is not None else y, c_prev if c_prev is not None else y, dy,
            info.offsets, info.lengths_sorted, dpx,
            dph, dh0_, dc0_ if dc0_ is not None else dh0_, part, hc, dcc,
            # HELD: a launch that runs every step reads and writes none of it (dpx stands in).
            *((scratch(ws["held"], dtype=dpx.dtype, device=dev) if "held" in ws else dpx,)
              if one_barrier else ()),
            sync, B, S)
    grid = (programs,)
    # The products' operand dtype: the tensors' on a GPU (the casts to it compile to nothing),
    # fp32 in the interpreter, whose bf16 tl.dot is wrong (as the grid launchers',
    # `persistent_grid._launch_setup`).
    dot_dt = tl.float32 if interp else _DOT_DTYPES[dy.dtype]
    common = dict(CELL=cid, G=G, H=H, U=units, BB=btile, NK=nk, REVERSE=reverse,
                  DOT_DT=dot_dt, FP32_DOT=dot_dt == tl.float32, num_warps=num_warps,
                  **FP_FUSION)
    if one_barrier:  # (q_begin, q_end) alone; one launch per step without the barrier
        kernel, meta, whole, per_step = _split_k1_bwd_kernel, dict(KU=us), (), ((),)
    else:  # then which phases run: both, or one per launch without the barrier
        kernel, meta = _split_k_bwd_kernel, dict(KC=kblock // 4, US=us, SPLIT=split(units, btile))
        whole, per_step = (1, 1), ((1, 0), (0, 1))
    with torch.cuda.device_of(dy):  # Triton launches on the current device: the tensors'
        if whole_launch:
            options = cooperative_launch_options() if not interp else {}
            kernel[grid](*args, 0, S + 1, *whole, _max_spin, BARRIER=1,
                         **common, **meta, **options)
            check_flags(sync, "split_k_backward")
        else:
            for q in range(S + 1):
                for phases in per_step:
                    kernel[grid](*args, q, q + 1, *phases, _max_spin, BARRIER=0, **common,
                                 **meta)
    for o in outs:
        o.copy_(stand_in[id(o)])
