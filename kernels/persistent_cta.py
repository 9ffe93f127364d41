"""Persistent-CTA recurrent kernels: one program per batch tile, all of R on chip for all steps.

Each program owns `BLOCK_B` consecutive rows of the length-sorted batch. Before the time loop it
loads the recurrent weights R (all G gates), bR and, with an LSTM projection, Pw once and keeps
them on chip; the states (forward h, c; backward the carried dh, dc) live in registers across
steps. Programs never talk to each other, so there is no grid barrier and no atomic, and every
result is bit-identical from run to run.

Both launchers have exactly the contract of `rnn.reference.recurrence_forward` /
`recurrence_backward` (sorted batch order for batch-indexed tensors, packed rows for the rest,
per-sequence reversal in the reverse direction, outputs written in place), plus tile keywords.

Bidirectional layers: `cta_forward_pair` / `cta_backward_pair` run both directions in one
launch, grid [cdiv(B, BLOCK_B), 2]. The same kernels with NUM_DIRS = 2: program (b, d) works on
direction d, whose tensors are direction 0's at element offsets (`direction_offsets`: halves of
one workspace, adjacent state slices, two weight views into one params buffer), and reverses
time when d = 1 (a runtime select instead of the REVERSE constexpr). Per direction the
arithmetic is unchanged, so a pair gives the per-direction launches' results bit for bit.

Per-step cost inside a program: G dots [BLOCK_B, Hout] x [Hout, H] (forward) or
[BLOCK_B, H] x [H, Hout] (backward), plus one [H, P] / [P, H] dot with a projection. The family
is only worth it while the weights fit one SM; `cta_onchip_bytes` gives the footprint the
planner compares against the SM's budget.

Layouts of the on-chip tiles (padded to powers of two >= 16 and masked, so any size works):

    forward   R_k^T  [BLOCK_HO, BLOCK_H]  (ph_k = h @ R_k^T)     Pw^T [BLOCK_H, BLOCK_HO]
    backward  R_k    [BLOCK_H, BLOCK_HO]  (dh += dph_k @ R_k)    Pw   [BLOCK_HO, BLOCK_H]

with R_k = R[k*H:(k+1)*H, :] and BLOCK_HO the padded Hout (= P with a projection).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tritonrnn.rnn.packing import PackInfo
from tritonrnn.rnn.reference import check_backward_preacts, check_shapes

from . import cells
from .compile_options import FP_FUSION

_HALF = (torch.float16, torch.bfloat16)
_SUPPORTED = (torch.float32, *_HALF)


# ----------------------------------------------------------------------------------------------
# Small @triton.jit helpers: gate tiles, gate dots, gate loads/stores. Gates k >= G return
# zeros and cost nothing (constexpr branches), so one kernel body serves 1, 3 and 4 gates.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _gate_weight(R, K: tl.constexpr, G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr,
                 TRANS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HO: tl.constexpr,
                 UPCAST: tl.constexpr):
    """Gate K's recurrent tile of R [G*H, HOUT] (row-major, contiguous): R_K^T [BLOCK_HO, BLOCK_H]
    if TRANS else R_K [BLOCK_H, BLOCK_HO]; zeros in the padding. UPCAST: fp32 (interpreter)."""
    if TRANS:
        i = tl.arange(0, BLOCK_HO)[:, None]  # Hout index
        j = tl.arange(0, BLOCK_H)[None, :]  # unit index inside gate K
        ptrs = R + (K * H + j) * HOUT + i
        mask = (i < HOUT) & (j < H)
    else:
        i = tl.arange(0, BLOCK_H)[:, None]
        j = tl.arange(0, BLOCK_HO)[None, :]
        ptrs = R + (K * H + i) * HOUT + j
        mask = (i < H) & (j < HOUT)
    if K < G:
        w = tl.load(ptrs, mask=mask, other=0.0)
    else:
        w = tl.zeros(ptrs.shape, R.dtype.element_ty)  # never read: dead code
    if UPCAST:
        w = w.to(tl.float32)
    return w


@triton.jit
def _mm(a, w, acc, IEEE: tl.constexpr):
    """acc + a [M, K] @ w [K, N] with fp32 accumulation (acc: fp32 [M, N] or None).

    Callers round a to the weights' storage dtype (bf16/fp16 operands on the tensor cores);
    under the interpreter w is fp32 and a is upcast again, which reproduces the GPU's exact
    half x half products. IEEE keeps fp32 x fp32 exact instead of tf32."""
    if IEEE:
        out = tl.dot(a.to(w.dtype), w, acc, input_precision="ieee")
    else:
        out = tl.dot(a.to(w.dtype), w, acc)
    return out


@triton.jit
def _gate_mm(a, w, K: tl.constexpr, G: tl.constexpr, IEEE: tl.constexpr,
             BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    if K < G:
        out = _mm(a, w, None, IEEE)
    else:
        out = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    return out


@triton.jit
def _gate_bias(BR, K: tl.constexpr, G: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr):
    """bR of gate K as a [1, BLOCK_H] fp32 row (zeros in the padding and for K >= G)."""
    j = tl.arange(0, BLOCK_H)
    if K < G:
        b = tl.load(BR + K * H + j, mask=j < H, other=0.0).to(tl.float32)
    else:
        b = tl.zeros([BLOCK_H], tl.float32)
    return b[None, :]


@triton.jit
def _gate_load(ptrs, K: tl.constexpr, G: tl.constexpr, H: tl.constexpr, mask,
               BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr):
    """Gate K's columns (K*H + j) of a [N, G*H] row block as fp32; zeros for K >= G."""
    if K < G:
        v = tl.load(ptrs + K * H, mask=mask, other=0.0).to(tl.float32)
    else:
        v = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
    return v


@triton.jit
def _gate_store(ptrs, K: tl.constexpr, G: tl.constexpr, H: tl.constexpr, v, mask):
    if K < G:
        tl.store(ptrs + K * H, v.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _step_rows(OFFS, lens, s, offs_b, active, rev, REVERSE: tl.constexpr,
               NUM_DIRS: tl.constexpr):
    """int64 packed row of each tile row at step s: offsets[t] + j with t = s (forward) or
    t = len_j - 1 - s (reverse, per-sequence reversal). One direction: REVERSE (constexpr);
    two: the program's direction rev (0 or 1, runtime), t = s + rev * (len_j - 1 - 2s)."""
    if NUM_DIRS == 2:
        t = s + rev * (lens - 1 - 2 * s)
        off = tl.load(OFFS + t, mask=active, other=0)
    elif REVERSE:
        t = lens - 1 - s
        off = tl.load(OFFS + t, mask=active, other=0)
    else:
        off = tl.load(OFFS + s)
    return off.to(tl.int64) + offs_b.to(tl.int64)


@triton.jit
def _loop_steps(lens, HOST_STEPS: tl.constexpr):
    """Steps the batch tile runs: its longest length (the rows are sorted longest first), or
    HOST_STEPS >= 0, a bound the host passes where the interpreter cannot loop up to a
    tensor (`_host_steps`). Steps past a row's length leave it untouched, so a larger bound
    only adds idle steps. The loops name HOST_STEPS in their range() themselves: that
    interpreter turns a constexpr assigned to a variable into a tensor."""
    if HOST_STEPS >= 0:
        return HOST_STEPS
    else:
        return tl.max(lens, axis=0)


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["B"])
def _cta_forward_kernel(
    XG, R, BR, PW, H0, C0, LENS, OFFS, Y, CSEQ, HT, CT,
    B,
    stride_xg, stride_y, stride_cseq, stride_h0, stride_c0, stride_ht, stride_ct,
    dir_xg, dir_r, dir_br, dir_pw, dir_h0, dir_c0, dir_y, dir_cseq, dir_ht, dir_ct,
    H: tl.constexpr, HOUT: tl.constexpr,
    CELL: tl.constexpr, G: tl.constexpr, HAS_PROJ: tl.constexpr, HAS_CSEQ: tl.constexpr,
    REVERSE: tl.constexpr, NUM_DIRS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HO: tl.constexpr,
    HOST_STEPS: tl.constexpr = -1,
):
    IS_LSTM: tl.constexpr = CELL == 0
    pid = tl.program_id(0)
    rev = 0
    if NUM_DIRS == 2:
        # Direction axis: program (b, 1) runs the second direction (reversed in time) on its
        # own tensors, each at an element offset dir_* from the first direction's.
        rev = tl.program_id(1)
        XG += rev * dir_xg
        R += rev * dir_r
        BR += rev * dir_br
        PW += rev * dir_pw
        H0 += rev * dir_h0
        C0 += rev * dir_c0
        Y += rev * dir_y
        CSEQ += rev * dir_cseq
        HT += rev * dir_ht
        CT += rev * dir_ct
    offs_b = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    in_b = offs_b < B
    cols_h = tl.arange(0, BLOCK_H)[None, :]
    cols_o = tl.arange(0, BLOCK_HO)[None, :]
    lens = tl.load(LENS + offs_b, mask=in_b, other=0)
    # Sorted longest first, so the tile's first row bounds its loop; finished tiles stop early.
    n_steps = _loop_steps(lens, HOST_STEPS)

    # On-chip for all steps: R_k^T, bR_k (and Pw^T).
    w0 = _gate_weight(R, 0, G, H, HOUT, True, BLOCK_H, BLOCK_HO, UPCAST)
    w1 = _gate_weight(R, 1, G, H, HOUT, True, BLOCK_H, BLOCK_HO, UPCAST)
    w2 = _gate_weight(R, 2, G, H, HOUT, True, BLOCK_H, BLOCK_HO, UPCAST)
    w3 = _gate_weight(R, 3, G, H, HOUT, True, BLOCK_H, BLOCK_HO, UPCAST)
    b0 = _gate_bias(BR, 0, G, H, BLOCK_H)
    b1 = _gate_bias(BR, 1, G, H, BLOCK_H)
    b2 = _gate_bias(BR, 2, G, H, BLOCK_H)
    b3 = _gate_bias(BR, 3, G, H, BLOCK_H)
    if HAS_PROJ:
        # Pw [HOUT, H] read transposed: tile (i, j) = Pw[j, i].
        pi = tl.arange(0, BLOCK_H)[:, None]
        pw = tl.load(PW + cols_o * H + pi, mask=(pi < H) & (cols_o < HOUT), other=0.0)
        if UPCAST:
            pw = pw.to(tl.float32)

    b64 = offs_b.to(tl.int64)[:, None]
    mask_bo = in_b[:, None] & (cols_o < HOUT)
    mask_bh = in_b[:, None] & (cols_h < H)
    h = tl.load(H0 + b64 * stride_h0 + cols_o, mask=mask_bo, other=0.0).to(tl.float32)
    if IS_LSTM:
        c = tl.load(C0 + b64 * stride_c0 + cols_h, mask=mask_bh, other=0.0).to(tl.float32)
    else:
        c = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)

    for s in range(0, HOST_STEPS if HOST_STEPS >= 0 else n_steps):
        active = lens > s  # false for rows past B too (their lens load as 0)
        rows = _step_rows(OFFS, lens, s, offs_b, active, rev, REVERSE, NUM_DIRS)[:, None]
        act_h = active[:, None] & (cols_h < H)
        act_o = active[:, None] & (cols_o < HOUT)
        xp = XG + rows * stride_xg + cols_h
        x0 = _gate_load(xp, 0, G, H, act_h, BLOCK_B, BLOCK_H)
        x1 = _gate_load(xp, 1, G, H, act_h, BLOCK_B, BLOCK_H)
        x2 = _gate_load(xp, 2, G, H, act_h, BLOCK_B, BLOCK_H)
        x3 = _gate_load(xp, 3, G, H, act_h, BLOCK_B, BLOCK_H)
        h_op = h.to(R.dtype.element_ty)
        p0 = _gate_mm(h_op, w0, 0, G, IEEE, BLOCK_B, BLOCK_H) + b0
        p1 = _gate_mm(h_op, w1, 1, G, IEEE, BLOCK_B, BLOCK_H) + b1
        p2 = _gate_mm(h_op, w2, 2, G, IEEE, BLOCK_B, BLOCK_H) + b2
        p3 = _gate_mm(h_op, w3, 3, G, IEEE, BLOCK_B, BLOCK_H) + b3
        # h is [BLOCK_B, BLOCK_HO]; only GRU reads h_prev, and GRU has Hout == H.
        m, c_new = cells.cell_forward(CELL, x0, x1, x2, x3, p0, p1, p2, p3, h, c)
        if HAS_PROJ:
            h_new = _mm(m.to(PW.dtype.element_ty), pw, None, IEEE)
        else:
            h_new = m
        tl.store(Y + rows * stride_y + cols_o, h_new.to(Y.dtype.element_ty), mask=act_o)
        # Finished rows keep their state, so the final store holds each row's own last step.
        h = tl.where(active[:, None], h_new, h)
        if IS_LSTM:
            if HAS_CSEQ:
                tl.store(CSEQ + rows * stride_cseq + cols_h, c_new.to(CSEQ.dtype.element_ty),
                         mask=act_h)
            c = tl.where(active[:, None], c_new, c)

    tl.store(HT + b64 * stride_ht + cols_o, h.to(HT.dtype.element_ty), mask=mask_bo)
    if IS_LSTM:
        tl.store(CT + b64 * stride_ct + cols_h, c.to(CT.dtype.element_ty), mask=mask_bh)


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["B"])
def _cta_backward_kernel(
    PX, PH, R, PW, Y, HPREV, CSEQ, CPREV, DY, DHT, DCT, LENS, OFFS,
    DPX, DPH, DH0, DC0, DHTOT, MSEQ,
    B,
    stride_px, stride_ph, stride_y, stride_hp, stride_cs, stride_cp, stride_dy,
    stride_dht, stride_dct, stride_dpx, stride_dph, stride_dh0, stride_dc0,
    stride_dhtot, stride_mseq,
    dir_px, dir_ph, dir_r, dir_pw, dir_y, dir_hp, dir_cs, dir_cp, dir_dy, dir_dht, dir_dct,
    dir_dpx, dir_dph, dir_dh0, dir_dc0, dir_dhtot, dir_mseq,
    H: tl.constexpr, HOUT: tl.constexpr,
    CELL: tl.constexpr, G: tl.constexpr, HAS_PROJ: tl.constexpr, REVERSE: tl.constexpr,
    NUM_DIRS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HO: tl.constexpr,
    HOST_STEPS: tl.constexpr = -1,
):
    IS_LSTM: tl.constexpr = CELL == 0
    IS_GRU: tl.constexpr = CELL == 1
    pid = tl.program_id(0)
    rev = 0
    if NUM_DIRS == 2:
        # Direction axis, as in the forward: program (b, 1) runs the second direction.
        rev = tl.program_id(1)
        PX += rev * dir_px
        PH += rev * dir_ph
        R += rev * dir_r
        PW += rev * dir_pw
        Y += rev * dir_y
        HPREV += rev * dir_hp
        CSEQ += rev * dir_cs
        CPREV += rev * dir_cp
        DY += rev * dir_dy
        DHT += rev * dir_dht
        DCT += rev * dir_dct
        DPX += rev * dir_dpx
        DPH += rev * dir_dph
        DH0 += rev * dir_dh0
        DC0 += rev * dir_dc0
        DHTOT += rev * dir_dhtot
        MSEQ += rev * dir_mseq
    offs_b = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    in_b = offs_b < B
    cols_h = tl.arange(0, BLOCK_H)[None, :]
    cols_o = tl.arange(0, BLOCK_HO)[None, :]
    lens = tl.load(LENS + offs_b, mask=in_b, other=0)
    n_steps = _loop_steps(lens, HOST_STEPS)

    # On-chip for all steps: R_k (dh_prev = sum_k dph_k @ R_k) and Pw (dm = dh @ Pw).
    w0 = _gate_weight(R, 0, G, H, HOUT, False, BLOCK_H, BLOCK_HO, UPCAST)
    w1 = _gate_weight(R, 1, G, H, HOUT, False, BLOCK_H, BLOCK_HO, UPCAST)
    w2 = _gate_weight(R, 2, G, H, HOUT, False, BLOCK_H, BLOCK_HO, UPCAST)
    w3 = _gate_weight(R, 3, G, H, HOUT, False, BLOCK_H, BLOCK_HO, UPCAST)
    if HAS_PROJ:
        pi = tl.arange(0, BLOCK_HO)[:, None]
        pw = tl.load(PW + pi * H + cols_h, mask=(pi < HOUT) & (cols_h < H), other=0.0)
        if UPCAST:
            pw = pw.to(tl.float32)

    b64 = offs_b.to(tl.int64)[:, None]
    mask_bo = in_b[:, None] & (cols_o < HOUT)
    mask_bh = in_b[:, None] & (cols_h < H)
    # Reverse time: row j is inactive for s >= len_j, then active down to s = 0. Its carries
    # take dhT/dcT at its first step (s = len_j - 1) and are updated unconditionally: an
    # inactive row has zero carries and loads only zeros, so it computes exact zeros (and
    # rows never mix in a dot). Selecting the input instead of freezing the carried state
    # also avoids an LLVM SLP-vectorizer crash (Triton 3.9, sm_90, fp32 FMA dots).
    dh_T = tl.load(DHT + b64 * stride_dht + cols_o, mask=mask_bo, other=0.0).to(tl.float32)
    dh_carry = tl.zeros([BLOCK_B, BLOCK_HO], tl.float32)
    dc_carry = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
    if IS_LSTM:
        dc_T = tl.load(DCT + b64 * stride_dct + cols_h, mask=mask_bh, other=0.0).to(tl.float32)

    for i in range(0, HOST_STEPS if HOST_STEPS >= 0 else n_steps):
        s = n_steps - 1 - i
        active = lens > s
        rows = _step_rows(OFFS, lens, s, offs_b, active, rev, REVERSE, NUM_DIRS)[:, None]
        act_h = active[:, None] & (cols_h < H)
        act_o = active[:, None] & (cols_o < HOUT)
        dy = tl.load(DY + rows * stride_dy + cols_o, mask=act_o, other=0.0).to(tl.float32)
        first = (lens == s + 1)[:, None]
        dh = dy + tl.where(first, dh_T, dh_carry)
        if HAS_PROJ:
            dm = _mm(dh.to(PW.dtype.element_ty), pw, None, IEEE)
        else:
            dm = dh
        # Only the tensors the cell reads are loaded (the pre-activations' two sides: the
        # gated cells; h_t: tanh / relu; h_{t-1}: GRU; c: LSTM); the others are
        # placeholders of the right shape. Non-LSTM cells have Hout == H.
        zero = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
        x0, x1, x2, x3 = zero, zero, zero, zero
        p0, p1, p2, p3 = zero, zero, zero, zero
        if CELL <= 1:
            xp = PX + rows * stride_px + cols_h
            x0 = _gate_load(xp, 0, G, H, act_h, BLOCK_B, BLOCK_H)
            x1 = _gate_load(xp, 1, G, H, act_h, BLOCK_B, BLOCK_H)
            x2 = _gate_load(xp, 2, G, H, act_h, BLOCK_B, BLOCK_H)
            x3 = _gate_load(xp, 3, G, H, act_h, BLOCK_B, BLOCK_H)
            hp = PH + rows * stride_ph + cols_h
            p0 = _gate_load(hp, 0, G, H, act_h, BLOCK_B, BLOCK_H)
            p1 = _gate_load(hp, 1, G, H, act_h, BLOCK_B, BLOCK_H)
            p2 = _gate_load(hp, 2, G, H, act_h, BLOCK_B, BLOCK_H)
            p3 = _gate_load(hp, 3, G, H, act_h, BLOCK_B, BLOCK_H)
        if CELL >= 2:
            h_new = tl.load(Y + rows * stride_y + cols_o, mask=act_o, other=0.0)
            h_new = h_new.to(tl.float32)
        else:
            h_new = dm
        if IS_GRU:
            h_prev = tl.load(HPREV + rows * stride_hp + cols_o, mask=act_o, other=0.0)
            h_prev = h_prev.to(tl.float32)
        else:
            h_prev = dm
        if IS_LSTM:
            c = tl.load(CSEQ + rows * stride_cs + cols_h, mask=act_h, other=0.0).to(tl.float32)
            c_prev = tl.load(CPREV + rows * stride_cp + cols_h, mask=act_h, other=0.0)
            c_prev = c_prev.to(tl.float32)
            dc_carry = tl.where(first, dc_T, dc_carry)
        else:
            c = dm
            c_prev = dm
        d0, d1, d2, d3, dn, direct, dc_prev, m = cells.cell_backward(
            CELL, x0, x1, x2, x3, p0, p1, p2, p3, dm, h_new, h_prev, c, c_prev, dc_carry
        )
        gx = DPX + rows * stride_dpx + cols_h
        _gate_store(gx, 0, G, H, d0, act_h)
        _gate_store(gx, 1, G, H, d1, act_h)
        _gate_store(gx, 2, G, H, d2, act_h)
        _gate_store(gx, 3, G, H, d3, act_h)
        if IS_GRU:
            gh = DPH + rows * stride_dph + cols_h
            _gate_store(gh, 0, G, H, d0, act_h)
            _gate_store(gh, 1, G, H, d1, act_h)
            _gate_store(gh, 2, G, H, dn, act_h)
        if HAS_PROJ:
            tl.store(DHTOT + rows * stride_dhtot + cols_o, dh.to(DHTOT.dtype.element_ty),
                     mask=act_o)
            tl.store(MSEQ + rows * stride_mseq + cols_h, m.to(MSEQ.dtype.element_ty),
                     mask=act_h)
        # The h-side gradient of gate 2 is dn (GRU: dx2 * r; the other cells: dx2).
        # Accumulated in a fixed order (direct, gates 0..G-1) inside the dots' fp32 accumulator.
        if IS_GRU:
            carry = direct
        else:
            carry = tl.zeros([BLOCK_B, BLOCK_HO], tl.float32)
        odt = R.dtype.element_ty
        carry = _mm(d0.to(odt), w0, carry, IEEE)
        if G > 1:
            carry = _mm(d1.to(odt), w1, carry, IEEE)
            carry = _mm(dn.to(odt), w2, carry, IEEE)
        if G > 3:
            carry = _mm(d3.to(odt), w3, carry, IEEE)
        dh_carry = carry
        if IS_LSTM:
            dc_carry = dc_prev

    # Every row of length >= 1 is active at s = 0; length-0 rows pass dhT/dcT through.
    never = (lens == 0)[:, None]
    dh0 = tl.where(never, dh_T, dh_carry)
    tl.store(DH0 + b64 * stride_dh0 + cols_o, dh0.to(DH0.dtype.element_ty), mask=mask_bo)
    if IS_LSTM:
        dc0 = tl.where(never, dc_T, dc_carry)
        tl.store(DC0 + b64 * stride_dc0 + cols_h, dc0.to(DC0.dtype.element_ty), mask=mask_bh)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------


def _block(n: int) -> int:
    """Padded tile size: power of two >= 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(n))


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _interpreter_loops_to_tensors() -> bool:
    """Whether this Triton's interpreter runs `range(0, <tensor>)`. Triton 3.6's converts the
    bound with int() on a one-element array, which NumPy >= 2.4 refuses (newer interpreters
    squeeze it first); compiled kernels are not affected. Probed once per process (the
    probe is local: tools that swap the modules' kernels, `bench/aot.py`, never see it)."""

    @triton.jit
    def probe(LENS, OUT):
        n = 0
        for _ in range(0, tl.max(tl.load(LENS + tl.arange(0, 2)), axis=0)):
            n += 1
        tl.store(OUT, n)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        probe[(1,)](torch.tensor([3, 1], dtype=torch.int32), out)
    except Exception:  # any failure: the host passes the bound
        return False
    return int(out) == 3


def _host_steps(info: PackInfo) -> int:
    """HOST_STEPS for a launch: -1 (the kernel bounds each tile's loop itself) except under an
    interpreter that cannot loop to a tensor, where it is the batch's longest length."""
    if _interpreting() and not _interpreter_loops_to_tensors():
        return info.max_len
    return -1


def _row_stride(name: str, t: torch.Tensor | None) -> int:
    """Row stride of a [rows, C] tensor whose columns are unit-stride (column slices of a wider
    tensor are fine); 0 for an absent tensor."""
    if t is None:
        return 0
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor, got shape {list(t.shape)}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name}: expected unit column stride, got strides {list(t.stride())}")
    return t.stride(0)


def check_device(name_tensors: list[tuple[str, torch.Tensor | None]],
                 info: PackInfo | None = None) -> torch.device:
    """The device of a launch's tensors (name_tensors: (name, tensor or None) pairs, at least
    one a tensor; None is an absent optional tensor): the first tensor's, which must be a GPU
    unless TRITON_INTERPRET=1, and that of every other tensor and of info's index tensors;
    ValueError naming the first argument that is not. A kernel addresses every pointer on
    the launch's device: unchecked, a tensor elsewhere reaches Triton's launch, whose errors
    name no argument ("Pointer argument (at 2) cannot be accessed from Triton", "0 active
    drivers")."""
    anchor_name, anchor = next((n, t) for n, t in name_tensors if t is not None)
    dev = anchor.device
    if not _interpreting() and dev.type != "cuda":
        raise ValueError(f"{anchor_name}: expected a CUDA tensor (or TRITON_INTERPRET=1 for "
                         f"the interpreter), got device {dev}")
    for name, t in name_tensors:
        if t is not None and t.device != dev:
            raise ValueError(f"{name}: expected a tensor on {dev} ({anchor_name}'s), got "
                             f"{t.device}")
    if info is not None and info.device != dev:
        raise ValueError(f"info: expected its index tensors on {dev} ({anchor_name}'s), got "
                         f"{info.device}")
    return dev


def _check_common(cell: str, xg: torch.Tensor, R: torch.Tensor, Pw, block_b: int, others,
                  info: PackInfo, anchor: str = "xg"):
    """xg: the tensor that sets the dtype and device (named `anchor`: the backward's is dy);
    others: the other tensors by name."""
    if cell not in cells.CELL_IDS:
        raise ValueError(f"cell: expected one of {sorted(cells.CELL_IDS)}, got {cell!r}")
    if not isinstance(xg, torch.Tensor) or not isinstance(R, torch.Tensor):
        name, t = (anchor, xg) if not isinstance(xg, torch.Tensor) else ("R", R)
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    if xg.dtype not in _SUPPORTED:
        raise ValueError(
            f"dtype: the persistent-CTA kernels take float32/float16/bfloat16, got {xg.dtype} "
            "(float64 runs on the reference backend)"
        )
    for name, t in others.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
        if t is not None and t.dtype != xg.dtype:
            raise ValueError(f"{name}: expected dtype {xg.dtype}, got {t.dtype}")
    if block_b < 16 or block_b & (block_b - 1):
        raise ValueError(f"block_b: expected a power of two >= 16 (tl.dot), got {block_b}")
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    if R.dim() != 2 or R.shape[0] % G:
        raise ValueError(f"R: expected [{G}*H, Hout] for cell {cell!r}, got {list(R.shape)}")
    if Pw is not None and cell != "lstm":
        raise ValueError(f"Pw: a projection needs cell 'lstm', got {cell!r}")
    check_device([(anchor, xg), *others.items()], info)


def _dot_flags(dtype: torch.dtype, allow_tf32: bool) -> tuple[bool, bool]:
    """(UPCAST, IEEE). The interpreter's bf16 tl.dot is broken: run its dots in fp32."""
    upcast = _interpreting()
    ieee = (upcast or dtype == torch.float32) and not allow_tf32
    return upcast, ieee


def split_pair(name: str, pair) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(direction 0, direction 1) of a pair argument; None stands for (None, None)."""
    if pair is None:
        return None, None
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise ValueError(
            f"{name}: expected a pair (direction 0, direction 1) or None, got {type(pair).__name__}"
        )
    a, b = pair
    if (a is None) != (b is None):
        raise ValueError(f"{name}: expected both directions' tensors or neither, got one None")
    return a, b


def direction_offsets(pairs: dict, contiguous: tuple[str, ...] = (),
                      outputs: tuple[str, ...] = ()) -> dict[str, int] | None:
    """Element offset of direction 1's tensor from direction 0's, per name (0 when absent), or
    None when some pair is not one base pointer plus an offset.

    A pair qualifies when both tensors live in one storage with the same dtype, shape and
    strides and a unit last-dim stride, are contiguous where named in `contiguous`, and are
    not the same memory where named in `outputs` (both directions would write it; other
    overlaps of output pairs are the caller's to avoid). The engine's pairs always qualify
    (halves of one workspace, adjacent slices of the [L*D, B, C] states and of the reserve,
    views into one params buffer: no copy of the weights); the pair launchers run one launch
    per direction otherwise."""
    offs = {}
    for name, pair in pairs.items():
        a, b = split_pair(name, pair)
        if a is None:
            offs[name] = 0
            continue
        off = b.storage_offset() - a.storage_offset()
        if not (
            a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and (a.dim() < 2 or a.stride(-1) == 1)
            and (name not in contiguous or a.is_contiguous())
            and (name not in outputs or off != 0)
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        ):
            return None
        offs[name] = off
    return offs


# The launchers' tensor arguments in signature order (pair launchers: the pairs' names); the
# inputs come first, then the outputs (FORWARD_TENSORS[6:], BACKWARD_TENSORS[11:]).
FORWARD_TENSORS = ("xg", "R", "bR", "Pw", "h0", "c0", "y", "c_seq", "hT", "cT")
BACKWARD_TENSORS = ("pre_x", "pre_h", "R", "Pw", "y", "h_prev", "c_seq", "c_prev", "dy", "dhT",
                    "dcT", "dpre_x", "dpre_h", "dh0", "dc0", "dh_total", "m_seq")


def cta_forward(
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
    block_b: int = 16,
    num_warps: int = 4,
    allow_tf32: bool = False,
) -> None:
    """Persistent-CTA forward of one layer/direction; contract of
    `rnn.reference.recurrence_forward`, writing y [N, Hout], c_seq [N, H] (LSTM, may be None),
    hT [B, Hout] and cT [B, H] (LSTM) in place.

    xg: [N, G*H] input-side pre-activations (W x + bW); R: [G*H, Hout]; bR: [G*H];
    Pw: [P, H] or None (Hout = P); h0: [B, Hout]; c0: [B, H] or None (sorted batch order).
    y may be a column slice of a wider [N, D*Hout] tensor. block_b: batch rows per program
    (power of two >= 16); allow_tf32: tf32 dots for float32 inputs (default: exact fp32).
    """
    t = dict(xg=xg, R=R, bR=bR, Pw=Pw, h0=h0, c0=c0, y=y, c_seq=c_seq, hT=hT, cT=cT)
    _forward(cell, t, info, reverse, None, block_b, num_warps, allow_tf32)


def cta_forward_pair(
    cell: str, xg, R, bR, Pw, h0, c0, info: PackInfo, y, c_seq, hT, cT, *,
    block_b: int = 16, num_warps: int = 4, allow_tf32: bool = False,
) -> None:
    """Both directions of a bidirectional layer in one launch (grid [cdiv(B, block_b), 2]:
    program (b, d) runs batch tile b of direction d; d = 1 runs reversed in time).

    Every tensor argument is a pair (direction 0, direction 1) with `cta_forward`'s shapes, or
    None where both are absent (Pw, c0, c_seq, cT). Each direction gets exactly
    `cta_forward`'s result. Pairs that are not base + offset (`direction_offsets`) run as two
    `cta_forward` launches instead."""
    pairs = dict(xg=xg, R=R, bR=bR, Pw=Pw, h0=h0, c0=c0, y=y, c_seq=c_seq, hT=hT, cT=cT)
    dirs = direction_offsets(pairs, contiguous=("R", "bR", "Pw"), outputs=FORWARD_TENSORS[6:])
    if dirs is None:
        for d in range(2):
            cta_forward(cell, info=info, reverse=d == 1, block_b=block_b, num_warps=num_warps,
                        allow_tf32=allow_tf32, **{k: split_pair(k, v)[d] for k, v in pairs.items()})
        return
    first = {k: split_pair(k, v)[0] for k, v in pairs.items()}
    _forward(cell, first, info, False, dirs, block_b, num_warps, allow_tf32)


def _forward(cell, t, info, reverse, dirs, block_b, num_warps, allow_tf32) -> None:
    """One launch: direction `reverse` (dirs None) or both directions (dirs: offsets)."""
    xg, R, bR, Pw, h0, c0, y, c_seq, hT, cT = (t[k] for k in FORWARD_TENSORS)
    _check_common(cell, xg, R, Pw, block_b, {k: t[k] for k in FORWARD_TENSORS[1:]}, info)
    cid = cells.CELL_IDS[cell]
    G = cells.NUM_GATES[cid]
    H = R.shape[0] // G
    Hout = R.shape[1]
    lstm = cid == cells.CELL_LSTM
    N, B = info.N, info.B
    shapes = dict(xg=(N, G * H), bR=(G * H,), h0=(B, Hout), y=(N, Hout), hT=(B, Hout))
    if Pw is not None:
        shapes["Pw"] = (Hout, H)
    if lstm:
        shapes.update(c0=(B, H), cT=(B, H), **({"c_seq": (N, H)} if c_seq is not None else {}))
    check_shapes({k: (t[k], shape) for k, shape in shapes.items()}, cell)
    if info.B == 0:
        return
    R, bR = R.contiguous(), bR.contiguous()
    Pw = Pw.contiguous() if Pw is not None else None
    upcast, ieee = _dot_flags(xg.dtype, allow_tf32)
    num_dirs = 1 if dirs is None else 2
    dirs = dirs or dict.fromkeys(FORWARD_TENSORS, 0)
    grid = (triton.cdiv(info.B, block_b), num_dirs)
    with torch.cuda.device_of(xg):  # Triton launches on the current device: the tensors'
        _cta_forward_kernel[grid](
            xg, R, bR, Pw if Pw is not None else R, h0, c0 if lstm else h0,
            info.lengths_sorted, info.offsets, y, c_seq if c_seq is not None else y,
            hT, cT if lstm else hT,
            info.B,
            _row_stride("xg", xg), _row_stride("y", y), _row_stride("c_seq", c_seq),
            _row_stride("h0", h0), _row_stride("c0", c0), _row_stride("hT", hT),
            _row_stride("cT", cT),
            *(dirs[k] for k in FORWARD_TENSORS),
            H, Hout,
            CELL=cid, G=G, HAS_PROJ=Pw is not None, HAS_CSEQ=lstm and c_seq is not None,
            REVERSE=bool(reverse), NUM_DIRS=num_dirs, UPCAST=upcast, IEEE=ieee,
            BLOCK_B=block_b, BLOCK_H=_block(H), BLOCK_HO=_block(Hout),
            HOST_STEPS=_host_steps(info), num_warps=num_warps, **FP_FUSION,
        )


def cta_backward(
    cell: str,
    pre_x: torch.Tensor,
    pre_h: torch.Tensor,
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
    block_b: int = 16,
    num_warps: int = 4,
    allow_tf32: bool = False,
) -> None:
    """Persistent-CTA backward of one layer/direction; contract of
    `rnn.reference.recurrence_backward`, writing dpre_x [N, G*H], dpre_h [N, G*H] (GRU only),
    dh0 [B, Hout], dc0 [B, H] (LSTM), and with a projection dh_total [N, P] and m_seq [N, H].

    pre_x, pre_h: [N, G*H] recomputed pre-activations; R: [G*H, Hout]; Pw: [P, H] or None;
    y, h_prev: [N, Hout]; c_seq, c_prev: [N, H] (LSTM); dy: [N, Hout] (may be a column slice of
    a wider tensor, like y); dhT: [B, Hout]; dcT: [B, H] (LSTM).
    """
    t = dict(pre_x=pre_x, pre_h=pre_h, R=R, Pw=Pw, y=y, h_prev=h_prev, c_seq=c_seq,
             c_prev=c_prev, dy=dy, dhT=dhT, dcT=dcT, dpre_x=dpre_x, dpre_h=dpre_h, dh0=dh0,
             dc0=dc0, dh_total=dh_total, m_seq=m_seq)
    _backward(cell, t, info, reverse, None, block_b, num_warps, allow_tf32)


def cta_backward_pair(
    cell: str, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info: PackInfo,
    dpre_x, dpre_h, dh0, dc0, dh_total, m_seq, *,
    block_b: int = 16, num_warps: int = 4, allow_tf32: bool = False,
) -> None:
    """Both directions' backward in one launch; pairs as in `cta_forward_pair`, shapes and
    results per direction those of `cta_backward` (direction 1 reversed in time)."""
    pairs = dict(pre_x=pre_x, pre_h=pre_h, R=R, Pw=Pw, y=y, h_prev=h_prev, c_seq=c_seq,
                 c_prev=c_prev, dy=dy, dhT=dhT, dcT=dcT, dpre_x=dpre_x, dpre_h=dpre_h, dh0=dh0,
                 dc0=dc0, dh_total=dh_total, m_seq=m_seq)
    dirs = direction_offsets(pairs, contiguous=("R", "Pw"), outputs=BACKWARD_TENSORS[11:])
    if dirs is None:
        for d in range(2):
            cta_backward(cell, info=info, reverse=d == 1, block_b=block_b, num_warps=num_warps,
                         allow_tf32=allow_tf32,
                         **{k: split_pair(k, v)[d] for k, v in pairs.items()})
        return
    first = {k: split_pair(k, v)[0] for k, v in pairs.items()}
    _backward(cell, first, info, False, dirs, block_b, num_warps, allow_tf32)


def _backward(cell, t, info, reverse, dirs, block_b, num_warps, allow_tf32) -> None:
    """One launch: direction `reverse` (dirs None) or both directions (dirs: offsets)."""
    (pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, dpre_x, dpre_h, dh0, dc0,
     dh_total, m_seq) = (t[k] for k in BACKWARD_TENSORS)
    _check_common(cell, dy, R, Pw, block_b,
                  {k: t[k] for k in BACKWARD_TENSORS if k != "dy"}, info, anchor="dy")
    cid = cells.CELL_IDS[cell]
    G = cells.NUM_GATES[cid]
    H = R.shape[0] // G
    Hout = R.shape[1]
    check_backward_preacts(cell, pre_x, pre_h, (info.N, G * H))
    lstm = cid == cells.CELL_LSTM
    gru = cid == cells.CELL_GRU
    proj = Pw is not None
    N, B = info.N, info.B
    shapes = dict(dpre_x=(N, G * H), y=(N, Hout), h_prev=(N, Hout), dy=(N, Hout),
                  dhT=(B, Hout), dh0=(B, Hout))
    if gru:
        shapes["dpre_h"] = (N, G * H)
    if lstm:
        shapes.update(c_seq=(N, H), c_prev=(N, H), dcT=(B, H), dc0=(B, H))
    if proj:
        shapes.update(Pw=(Hout, H), dh_total=(N, Hout), m_seq=(N, H))
    check_shapes({k: (t[k], shape) for k, shape in shapes.items()}, cell)
    if info.B == 0:
        return
    R = R.contiguous()
    Pw = Pw.contiguous() if proj else None
    upcast, ieee = _dot_flags(dy.dtype, allow_tf32)
    num_dirs = 1 if dirs is None else 2
    dirs = dirs or dict.fromkeys(BACKWARD_TENSORS, 0)
    grid = (triton.cdiv(info.B, block_b), num_dirs)
    dummy = dy  # stands in for absent tensors; never dereferenced (constexpr branches)
    with torch.cuda.device_of(dy):  # Triton launches on the current device: the tensors'
        _cta_backward_kernel[grid](
            pre_x if pre_x is not None else dummy, pre_h if pre_h is not None else dummy, R,
            Pw if proj else dummy, y, h_prev,
            c_seq if lstm else dummy, c_prev if lstm else dummy, dy, dhT,
            dcT if lstm else dummy, info.lengths_sorted, info.offsets,
            dpre_x, dpre_h if gru else dummy, dh0, dc0 if lstm else dummy,
            dh_total if proj else dummy, m_seq if proj else dummy,
            info.B,
            _row_stride("pre_x", pre_x), _row_stride("pre_h", pre_h), _row_stride("y", y),
            _row_stride("h_prev", h_prev), _row_stride("c_seq", c_seq if lstm else None),
            _row_stride("c_prev", c_prev if lstm else None), _row_stride("dy", dy),
            _row_stride("dhT", dhT), _row_stride("dcT", dcT if lstm else None),
            _row_stride("dpre_x", dpre_x), _row_stride("dpre_h", dpre_h if gru else None),
            _row_stride("dh0", dh0), _row_stride("dc0", dc0 if lstm else None),
            _row_stride("dh_total", dh_total if proj else None),
            _row_stride("m_seq", m_seq if proj else None),
            *(dirs[k] for k in BACKWARD_TENSORS),
            H, Hout,
            CELL=cid, G=G, HAS_PROJ=proj, REVERSE=bool(reverse), NUM_DIRS=num_dirs,
            UPCAST=upcast, IEEE=ieee, BLOCK_B=block_b, BLOCK_H=_block(H), BLOCK_HO=_block(Hout),
            HOST_STEPS=_host_steps(info), num_warps=num_warps, **FP_FUSION,
        )


class CtaFootprint(NamedTuple):
    """On-chip bytes of one program (the larger of the forward and backward kernels)."""

    smem: int  # recurrent weights, resident in shared memory for the whole loop
    regs: int  # fp32 bias, carried states and one step's gate tiles, in registers


def cta_onchip_parts(cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
                     block_b: int) -> CtaFootprint:
    """The footprint split by where it lives (see `cta_onchip_bytes` for the formula).

    Measured by compiling both kernels for sm_90 (Triton 3.9, ptxas register/spill counts;
    block_b=16, num_warps=8), no spills and shared memory within the SM's 227 KB for:
    fp16/bf16 LSTM and GRU up to pad(H) = 128, tanh/relu up to 256; fp32 (exact FMA dots)
    LSTM and GRU up to 64, tanh/relu up to 128. Beyond that the weights outgrow shared memory
    (the persistent-grid family's range). num_warps=4 spills for fp32 and for half at 128.
    """
    if cell not in cells.CELL_IDS:
        raise ValueError(f"cell: expected one of {sorted(cells.CELL_IDS)}, got {cell!r}")
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    BH, BO = _block(H), _block(Hout)
    e = 4 if dtype in (torch.float32, torch.float64) else 2
    weights = (G * BH * BO + (BO * BH if P > 0 else 0)) * e
    bias = G * BH * 4
    states = block_b * (BO + (BH if cell == "lstm" else 0)) * 4
    per_step = 2 * G * block_b * BH * 4
    return CtaFootprint(smem=weights, regs=bias + states + per_step)


def cta_onchip_bytes(cell: str, H: int, Hout: int, P: int, dtype: torch.dtype,
                     block_b: int) -> int:
    """On-chip bytes one program of the larger of the two kernels holds for the whole loop.

    With BH = pad(H), BO = pad(Hout) (powers of two >= 16, the tiles' real sizes), G gates,
    e = weight element size (2 for fp16/bf16, 4 for fp32), BB = block_b:

        weights  = (G * BH * BO + [P > 0] * BO * BH) * e    R_k tiles (+ Pw): shared memory
        bias     = G * BH * 4                              bR (forward), fp32 registers
        states   = BB * (BO + [lstm] * BH) * 4             h, c / dh, dc carries, registers
        per_step = 2 * G * BB * BH * 4                     x- and h-side gate tiles, registers

    total = weights + bias + states + per_step (`cta_onchip_parts` gives weights and the
    register part apart). Compiled for sm_90, the weights' shared-memory allocation is the
    weights exactly (half) or up to ~1.75x them (fp32, whose exact dots run on FMA units and
    stage operands); the compiler's registers are ~3x the register part (temporaries).
    """
    parts = cta_onchip_parts(cell, H, Hout, P, dtype, block_b)
    return parts.smem + parts.regs
