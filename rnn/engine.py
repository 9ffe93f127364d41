"""The layer engine shared by every backend.

Everything that is not the sequential recurrence lives here, once: packing, the input
projections of all steps as one GEMM, dropout between layers, the reserve space, and in the
backward the pre-activation recomputation and the weight/input gradients as large GEMMs.
A backend supplies only the two sequential pieces, `forward` and `backward`, with the contract
of `rnn.reference.recurrence_forward` / `recurrence_backward` (the reference backend is those
two functions; the Triton backend runs fused kernels chosen by the planner). A backend may also
supply `forward_bidir` / `backward_bidir` (`BidirRecurrence`): both directions of a
bidirectional layer in one call, e.g. one kernel launch with programs split between the
directions. The engine then passes every per-direction tensor as a pair (direction 0,
direction 1) of same-shaped views into one storage: halves of [2, ...] workspaces, adjacent
slices of the [L*D, B, C] states and of the reserve, column halves of the layer output, and
the two pseudo-layers' weight views into the one params buffer (never copied).

All tensors here are time-major and packed ([N, C], see packing.py); batch-indexed states are
[L*D, B, C] in the caller's batch order and permuted to sorted order around each recurrence.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import torch

from . import dropout as dropout_mod
from . import reference
from . import reserve as reserve_mod
from .config import RNNConfig
from .packing import PackInfo, prev_rows
from .params import LayerParams, layer_views


def new_buffer(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Uninitialised workspace; NaN-filled when TRITONRNN_POISON=1 (tests set it), so a
    kernel that forgets a write fails the comparison instead of reading stale zeros."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    if os.environ.get("TRITONRNN_POISON") == "1" and t.is_floating_point():
        t.fill_(float("nan"))
    return t


def poison_like(t: torch.Tensor) -> torch.Tensor:
    return new_buffer(*t.shape, dtype=t.dtype, device=t.device)


class Recurrence(Protocol):
    """The sequential part of one layer and direction (see rnn/reference.py)."""

    def forward(self, cell: str, xg, R, bR, Pw, h0, c0, info, reverse, y, c_seq, hT, cT): ...

    def backward(
        self, cell: str, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info,
        reverse, dpre_x, dpre_h, dh0, dc0, dh_total, m_seq,
    ): ...


class BidirRecurrence(Recurrence, Protocol):
    """Optional extension: both directions of a layer in one call. Every tensor argument is a
    pair (direction 0, direction 1) with the per-direction contract, or None where both are
    absent (Pw, c0, c_seq, cT, ...); direction 1 runs reversed in time."""

    def forward_bidir(self, cell: str, xg, R, bR, Pw, h0, c0, info, y, c_seq, hT, cT): ...

    def backward_bidir(
        self, cell: str, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info,
        dpre_x, dpre_h, dh0, dc0, dh_total, m_seq,
    ): ...


def pairs_directions(rec: object, num_dirs: int) -> bool:
    """Whether the engine hands a bidirectional layer's two directions to one backend call."""
    return (num_dirs == 2 and getattr(rec, "forward_bidir", None) is not None
            and getattr(rec, "backward_bidir", None) is not None)


def _pair(seq, p: int):
    """(seq[p], seq[p + 1]) of a per-pseudo-layer sequence or [2, ...] workspace, or None."""
    return (seq[p], seq[p + 1]) if seq is not None and len(seq) else None


class ReferenceRecurrence:
    """The pure-PyTorch recurrences (rnn/reference.py) as an engine backend."""

    name = "reference"

    def forward(self, *args) -> None:
        reference.recurrence_forward(*args)

    def backward(self, *args) -> None:
        reference.recurrence_backward(*args)


@dataclass
class ForwardResult:
    y: torch.Tensor  # [N, D*Hout] last layer's packed output
    hT: torch.Tensor  # [L*D, B, Hout]
    cT: torch.Tensor | None  # [L*D, B, H]
    reserve: torch.Tensor  # uint8, empty when not training
    host_reserved: torch.Tensor  # int8 header copy, empty when not training


def _input_preact(cfg: RNNConfig, lp: LayerParams, x: torch.Tensor, out: torch.Tensor):
    """out <- W x + bW for all packed rows, [N, G*H] (skip_input: x added to every gate)."""
    if lp.W is None:
        return torch.add(x.repeat(1, cfg.num_gates), lp.bW, out=out)
    return torch.addmm(lp.bW, x, lp.W.t(), out=out)


def _layer_input(cfg, info, layer, x0, ys, training, dropped=None):
    """Input of `layer`: the packed input, or the previous layer's output after dropout
    (fused mask + scale, written into the reusable `dropped` workspace when given)."""
    if layer == 0:
        return x0
    y = ys[layer - 1]
    if training and cfg.dropout > 0:
        return dropout_mod.apply_packed(y, info, cfg.dropout, cfg.seed, cfg.seed2, layer - 1,
                                        out=dropped)
    return y


def forward(
    cfg: RNNConfig,
    rec: Recurrence,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    params: torch.Tensor,
    info: PackInfo,
    training: bool,
) -> ForwardResult:
    """Runs the whole stack. x: [N, I] packed; h0: [L*D, B, Hout]; c0: [L*D, B, H] or None."""
    L, D, Hout = cfg.num_layers, cfg.num_dirs, cfg.out_size
    dtype, dev = x.dtype, x.device
    lstm = cfg.is_lstm
    views = layer_views(cfg, params)
    perm = info.perm
    h0s = h0.index_select(1, perm)
    c0s = c0.index_select(1, perm) if lstm else None
    hTs = poison_like(h0s)
    cTs = poison_like(c0s) if lstm else None
    if training:
        layout = reserve_mod.reserve_layout(cfg, info, dtype)
        reserve, host_reserved = reserve_mod.allocate(layout, dev)
        c_views, y_views = reserve_mod.views(reserve, layout)
    else:
        reserve = torch.empty(0, dtype=torch.uint8, device=dev)
        host_reserved = torch.empty(0, dtype=torch.int8)
        c_views = []
        y_views = [new_buffer(info.N, D * Hout, dtype=dtype, device=dev) for _ in range(L - 1)]
    ys = list(y_views) + [new_buffer(info.N, D * Hout, dtype=dtype, device=dev)]
    # The input pre-activations [N, G*H] of each direction in flight, reused by every layer:
    # both directions' ([2, N, G*H]) when the backend runs them in one call.
    paired = pairs_directions(rec, D)
    xg = new_buffer(2 if paired else 1, info.N, cfg.num_gates * cfg.num_units, dtype=dtype,
                    device=dev)
    dropped = new_buffer(info.N, D * Hout, dtype=dtype, device=dev) if L > 1 else None
    for layer in range(L):
        xl = _layer_input(cfg, info, layer, x, ys, training, dropped)
        y_dirs = [ys[layer][:, d * Hout : (d + 1) * Hout] for d in range(D)]
        if paired:
            p = 2 * layer
            for d in range(2):
                _input_preact(cfg, views[p + d], xl, xg[d])
            rec.forward_bidir(
                cfg.rnn_mode, _pair(xg, 0), (views[p].R, views[p + 1].R),
                (views[p].bR, views[p + 1].bR),
                (views[p].Pw, views[p + 1].Pw) if cfg.num_proj else None,
                _pair(h0s, p), _pair(c0s, p), info, tuple(y_dirs), _pair(c_views, p),
                _pair(hTs, p), _pair(cTs, p),
            )
            continue
        for d in range(D):
            p = layer * D + d
            lp = views[p]
            _input_preact(cfg, lp, xl, xg[0])
            rec.forward(
                cfg.rnn_mode, xg[0], lp.R, lp.bR, lp.Pw, h0s[p], c0s[p] if lstm else None,
                info, d == 1, y_dirs[d], c_views[p] if c_views else None, hTs[p],
                cTs[p] if lstm else None,
            )
    hT = hTs.index_select(1, info.inv_perm)
    cT = cTs.index_select(1, info.inv_perm) if lstm else None
    return ForwardResult(ys[-1], hT, cT, reserve, host_reserved)


@dataclass
class BackwardResult:
    dx: torch.Tensor  # [N, I] packed
    dh0: torch.Tensor  # [L*D, B, Hout]
    dc0: torch.Tensor | None  # [L*D, B, H]
    dparams: torch.Tensor  # like params


def backward(
    cfg: RNNConfig,
    rec: Recurrence,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    params: torch.Tensor,
    info: PackInfo,
    y_last: torch.Tensor,
    dy_last: torch.Tensor,
    dhT: torch.Tensor,
    dcT: torch.Tensor | None,
    reserve: torch.Tensor,
) -> BackwardResult:
    """Gradients of the whole stack from the reserve.

    x: [N, I] packed input; y_last/dy_last: [N, D*Hout] packed output and its gradient;
    dhT/dcT: [L*D, B, ...] gradients of the final states (caller's batch order)."""
    L, D, Hout, H, G = cfg.num_layers, cfg.num_dirs, cfg.out_size, cfg.num_units, cfg.num_gates
    N, dtype, dev = info.N, x.dtype, x.device
    lstm = cfg.is_lstm
    layout = reserve_mod.reserve_layout(cfg, info, dtype)
    c_views, y_views = reserve_mod.views(reserve, layout)
    ys = list(y_views) + [y_last]
    views = layer_views(cfg, params)
    dparams = torch.zeros_like(params)
    dviews = layer_views(cfg, dparams)
    perm = info.perm
    h0s = h0.index_select(1, perm)
    c0s = c0.index_select(1, perm) if lstm else None
    dhTs = dhT.index_select(1, perm)
    dcTs = dcT.index_select(1, perm) if lstm else None
    dh0s = poison_like(h0s)
    dc0s = poison_like(c0s) if lstm else None
    prev = [prev_rows(info, reverse=bool(d)) for d in range(D)]
    # Workspaces allocated once and reused by every layer and direction (GEMMs write with
    # out=); dx/dy ping-pong between two buffers as the gradient walks down the stack. The
    # per-recurrence ones are [W, N, C]: W = 2 (one half per direction) when the backend runs
    # both directions in one call, else 1.
    buf = lambda *shape: new_buffer(*shape, dtype=dtype, device=dev)  # noqa: E731
    paired = pairs_directions(rec, D)
    W = 2 if paired else 1
    pre_x, pre_h, h_prev = buf(W, N, G * H), buf(W, N, G * H), buf(W, N, Hout)
    c_prev = buf(W, N, H) if lstm else None
    dpre_x = buf(W, N, G * H)
    dpre_h = buf(W, N, G * H) if cfg.rnn_mode == "gru" else None
    proj = cfg.num_proj > 0
    dh_total = buf(W, N, Hout) if proj else None
    m_seq = buf(W, N, H) if proj else None
    width = max(cfg.input_size, D * Hout)
    pingpong = (buf(N * width), buf(N * width))
    acc = torch.float32 if dtype != torch.float64 else None
    dropped = buf(N, D * Hout) if L > 1 else None

    def half(t, w):
        return t[w] if t is not None else None

    def recompute(p, d, w, xl):
        """Slot w of the pre-activation workspaces <- direction d's (pseudo-layer p)."""
        lp = views[p]
        y_dir = ys[p // D][:, d * Hout : (d + 1) * Hout]
        torch.index_select(torch.cat([h0s[p], y_dir]), 0, prev[d], out=h_prev[w])
        _input_preact(cfg, lp, xl, pre_x[w])
        torch.addmm(lp.bR, h_prev[w], lp.R.t(), out=pre_h[w])
        if lstm:
            torch.index_select(torch.cat([c0s[p], c_views[p]]), 0, prev[d], out=c_prev[w])

    def gradients(p, d, w, xl, dx):
        """Weight gradients of pseudo-layer p from slot w, and its share of dx."""
        lp, dlp = views[p], dviews[p]
        dpx = dpre_x[w]
        dph = dpre_h[w] if dpre_h is not None else dpx
        # One GEMM each over all N rows (fp32 accumulation inside the GEMM), bias sums
        # accumulated in fp32; each cast once into dparams.
        dlp.bW.copy_(dpx.sum(0, dtype=acc))
        dlp.bR.copy_(dph.sum(0, dtype=acc))
        torch.mm(dph.t(), h_prev[w], out=dlp.R)
        if proj:
            torch.mm(dh_total[w].t(), m_seq[w], out=dlp.Pw)
        # dx: the first direction writes, the second accumulates (no memset).
        if lp.W is None:
            gate_sum = dpx.view(N, G, H).sum(1)
            if d == 0:
                dx.copy_(gate_sum)
            else:
                dx.add_(gate_sum)
        else:
            torch.mm(dpx.t(), xl, out=dlp.W)
            if d == 0:
                torch.mm(dpx, lp.W, out=dx)
            else:
                dx.addmm_(dpx, lp.W)

    dy = dy_last
    for layer in reversed(range(L)):
        xl = _layer_input(cfg, info, layer, x, ys, True, dropped)
        dx = pingpong[layer % 2][: N * xl.shape[1]].view(N, xl.shape[1])
        dy_dirs = [dy[:, d * Hout : (d + 1) * Hout] for d in range(D)]
        if paired:
            p = 2 * layer
            for d in range(2):
                recompute(p + d, d, d, xl)
            rec.backward_bidir(
                cfg.rnn_mode, _pair(pre_x, 0), _pair(pre_h, 0), (views[p].R, views[p + 1].R),
                (views[p].Pw, views[p + 1].Pw) if proj else None,
                (ys[layer][:, :Hout], ys[layer][:, Hout:]), _pair(h_prev, 0),
                _pair(c_views, p) if lstm else None, _pair(c_prev, 0), tuple(dy_dirs),
                _pair(dhTs, p), _pair(dcTs, p), info, _pair(dpre_x, 0), _pair(dpre_h, 0),
                _pair(dh0s, p), _pair(dc0s, p), _pair(dh_total, 0), _pair(m_seq, 0),
            )
            for d in range(2):
                gradients(p + d, d, d, xl, dx)
        else:
            for d in range(D):
                p = layer * D + d
                recompute(p, d, 0, xl)
                rec.backward(
                    cfg.rnn_mode, pre_x[0], pre_h[0], views[p].R, views[p].Pw,
                    ys[layer][:, d * Hout : (d + 1) * Hout], h_prev[0],
                    c_views[p] if lstm else None, half(c_prev, 0), dy_dirs[d], dhTs[p],
                    dcTs[p] if lstm else None, info, d == 1, dpre_x[0], half(dpre_h, 0),
                    dh0s[p], dc0s[p] if lstm else None, half(dh_total, 0), half(m_seq, 0),
                )
                gradients(p, d, 0, xl, dx)
        if layer > 0 and cfg.dropout > 0:
            dropout_mod.apply_packed(dx, info, cfg.dropout, cfg.seed, cfg.seed2, layer - 1,
                                     out=dx)
        dy = dx
    dh0 = dh0s.index_select(1, info.inv_perm)
    dc0 = dc0s.index_select(1, info.inv_perm) if lstm else None
    return BackwardResult(dx, dh0, dc0, dparams)
