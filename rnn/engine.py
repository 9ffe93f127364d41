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
[L*D, B, C] in the caller's batch order and permuted to sorted order around each recurrence
(`_sorted` / `_unsorted`: no copy for a batch already in order). The caller may hand in the
buffer the last layer's output (`y_out`) or the input gradient (`dx_out`) is written to: of a
dense batch, the rows of the padded tensor it returns (`padded_buffer`), which then needs no
unpacking copy.

A unidirectional stack may instead run as a layer pipeline (rnn/pipeline.py decides when):
each layer's recurrence over time chunks (`packing.window`), layer l on chunk k while layer
l-1 runs chunk k+1. Same results and the same reserve (written chunk by chunk); see
`_forward_pipelined` / `_backward_pipelined`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

import torch

from ..kernels.buffers import poisoned, scratch
from . import dropout as dropout_mod
from . import pipeline as pipeline_mod
from . import reference
from . import reserve as reserve_mod
from .config import RNNConfig
from .packing import PackInfo, padded, prev_rows, window
from .params import LayerParams, layer_views
from .planner import backward_writes_over_preacts

# Uninitialised workspace; NaN-filled when TRITONRNN_POISON=1 (tests set it), so a kernel
# that forgets a write fails the comparison instead of reading stale zeros.
new_buffer = scratch


def padded_buffer(info: PackInfo, C: int, dtype: torch.dtype, device: torch.device,
                  time_major: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """`packing.padded`'s (out, rows), the rows poisoned as `new_buffer`'s: for a dense
    batch, the rows to hand `forward` as y_out or `backward` as dx_out."""
    out, rows = padded(info, C, dtype, device, time_major)
    poisoned(rows)
    return out, rows


def _sorted(t: torch.Tensor, info: PackInfo) -> torch.Tensor:
    """A [L*D, B, C] state in sorted batch order, contiguous (t itself where it already is:
    read only)."""
    return t.contiguous() if info.in_order else t.index_select(1, info.perm)


def _unsorted(t: torch.Tensor, info: PackInfo) -> torch.Tensor:
    """A [L*D, B, C] state the engine made, back in the caller's batch order."""
    return t if info.in_order else t.index_select(1, info.inv_perm)


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


def _at(t, i):
    """t[i], or None for an absent (None) workspace."""
    return t[i] if t is not None else None


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


def _backward_preacts(cfg: RNNConfig, lp: LayerParams, x: torch.Tensor, h_prev: torch.Tensor,
                      pre_x: torch.Tensor | None, pre_h: torch.Tensor | None) -> None:
    """The recomputed pre-activations a backward recurrence reads, for all the rows given
    (`reference.backward_preacts`): the gated cells' pre_x <- W x + bW and pre_h <- R h + bR,
    tanh / relu nothing (their derivatives follow from the layer output)."""
    if pre_x is not None:
        _input_preact(cfg, lp, x, pre_x)
        torch.addmm(lp.bR, h_prev, lp.R.t(), out=pre_h)


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


def _forward_inputs(cfg, info, dtype, dev, params, h0, c0, training, y_out, reuse=False):
    """What every forward starts from: the parameter views, the initial states in sorted batch
    order and the (poisoned) final-state outputs, the reserve (training: allocated, with its
    c_seq and layer-output views; inference: empty) and every layer's packed output
    [N, D*Hout] (the inner ones in the reserve when training, the last y_out when given).
    reuse (inference, layers run one after another): the inner outputs alternate between two
    buffers, as layer l reads only layer l-1's; the layer pipeline, whose layers run
    concurrently, keeps them all."""
    L, D, Hout, lstm = cfg.num_layers, cfg.num_dirs, cfg.out_size, cfg.is_lstm
    h0s = _sorted(h0, info)
    c0s = _sorted(c0, info) if lstm else None
    if training:
        layout = reserve_mod.reserve_layout(cfg, info, dtype)
        reserve, host_reserved = reserve_mod.allocate(layout, dev)
        c_views, y_views = reserve_mod.views(reserve, layout)
    else:
        reserve = torch.empty(0, dtype=torch.uint8, device=dev)
        host_reserved = torch.empty(0, dtype=torch.int8)
        c_views = []
        inner = [new_buffer(info.N, D * Hout, dtype=dtype, device=dev)
                 for _ in range(min(L - 1, 2) if reuse else L - 1)]
        y_views = [inner[i % len(inner)] for i in range(L - 1)]
    if y_out is None:
        y_out = new_buffer(info.N, D * Hout, dtype=dtype, device=dev)
    ys = [*y_views, y_out]
    return (layer_views(cfg, params), h0s, c0s, poison_like(h0s),
            poison_like(c0s) if lstm else None, reserve, host_reserved, c_views, ys)


def forward(
    cfg: RNNConfig,
    rec: Recurrence,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    params: torch.Tensor,
    info: PackInfo,
    training: bool,
    y_out: torch.Tensor | None = None,
) -> ForwardResult:
    """Runs the whole stack. x: [N, I] packed (only read); h0: [L*D, B, Hout]; c0:
    [L*D, B, H] or None; y_out: where to write the last layer's packed output ([N, D*Hout],
    contiguous; the result's y), or None for a new buffer."""
    pipe = pipeline_mod.plan_pipeline(cfg, rec, info, x.dtype, x.device)
    if pipe is not None:
        return _forward_pipelined(cfg, rec, x, h0, c0, params, info, training, pipe, y_out)
    L, D, Hout = cfg.num_layers, cfg.num_dirs, cfg.out_size
    dtype, dev = x.dtype, x.device
    lstm = cfg.is_lstm
    (views, h0s, c0s, hTs, cTs, reserve, host_reserved, c_views,
     ys) = _forward_inputs(cfg, info, dtype, dev, params, h0, c0, training, y_out, reuse=True)
    # The input pre-activations [N, G*H] of each direction in flight, reused by every layer:
    # both directions' ([2, N, G*H]) when the backend runs them in one call.
    paired = pairs_directions(rec, D)
    xg = new_buffer(2 if paired else 1, info.N, cfg.num_gates * cfg.num_units, dtype=dtype,
                    device=dev)
    drop = L > 1 and training and cfg.dropout > 0  # the inter-layer dropout's workspace
    dropped = new_buffer(info.N, D * Hout, dtype=dtype, device=dev) if drop else None
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
    hT = _unsorted(hTs, info)
    cT = _unsorted(cTs, info) if lstm else None
    return ForwardResult(ys[-1], hT, cT, reserve, host_reserved)


@dataclass
class BackwardResult:
    dx: torch.Tensor  # [N, I] packed
    dh0: torch.Tensor  # [L*D, B, Hout]
    dc0: torch.Tensor | None  # [L*D, B, H]
    dparams: torch.Tensor  # like params


def _backward_inputs(cfg, info, dtype, reserve, y_last, params, h0, c0, dhT, dcT):
    """What every backward starts from: the reserve's c_seq and layer-output views, all layer
    outputs, the parameter views and zeroed gradient views, the states and their gradients
    in sorted batch order, and the (poisoned) dh0/dc0 outputs."""
    lstm = cfg.is_lstm
    layout = reserve_mod.reserve_layout(cfg, info, dtype)
    c_views, y_views = reserve_mod.views(reserve, layout)
    dparams = torch.zeros_like(params)
    h0s = _sorted(h0, info)
    c0s = _sorted(c0, info) if lstm else None
    return (c_views, [*y_views, y_last], layer_views(cfg, params), dparams,
            layer_views(cfg, dparams), h0s, c0s, _sorted(dhT, info),
            _sorted(dcT, info) if lstm else None, poison_like(h0s),
            poison_like(c0s) if lstm else None)


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
    dx_out: torch.Tensor | None = None,
) -> BackwardResult:
    """Gradients of the whole stack from the reserve.

    x: [N, I] packed input; y_last/dy_last: [N, D*Hout] packed output and its gradient;
    dhT/dcT: [L*D, B, ...] gradients of the final states (caller's batch order); all of
    them, and the reserve, only read. dx_out: where to write the input gradient ([N, I],
    contiguous; the result's dx), or None for a workspace."""
    pipe = pipeline_mod.plan_pipeline(cfg, rec, info, x.dtype, x.device, backward=True)
    if pipe is not None:
        return _backward_pipelined(cfg, rec, x, h0, c0, params, info, y_last, dy_last, dhT,
                                   dcT, reserve, pipe, dx_out)
    L, D, Hout, H, G = cfg.num_layers, cfg.num_dirs, cfg.out_size, cfg.num_units, cfg.num_gates
    N, dtype, dev = info.N, x.dtype, x.device
    lstm = cfg.is_lstm
    (c_views, ys, views, dparams, dviews, h0s, c0s, dhTs, dcTs, dh0s,
     dc0s) = _backward_inputs(cfg, info, dtype, reserve, y_last, params, h0, c0, dhT, dcT)
    prev = [prev_rows(info, reverse=bool(d)) for d in range(D)]
    # Workspaces allocated once and reused by every layer and direction (GEMMs write with
    # out=); dx/dy ping-pong between two buffers as the gradient walks down the stack. The
    # per-recurrence ones are [W, N, C]: W = 2 (one half per direction) when the backend runs
    # both directions in one call, else 1.
    buf = lambda *shape: new_buffer(*shape, dtype=dtype, device=dev)  # noqa: E731
    paired = pairs_directions(rec, D)
    W = 2 if paired else 1
    wants_x, wants_h = reference.backward_preacts(cfg.rnn_mode)
    pre_x = buf(W, N, G * H) if wants_x else None
    pre_h = buf(W, N, G * H) if wants_h else None
    h_prev = buf(W, N, Hout)
    c_prev = buf(W, N, H) if lstm else None
    # The gradients written over the pre-activations they are computed from, where the
    # planner's rule allows (`planner.backward_writes_over_preacts`).
    over = backward_writes_over_preacts(cfg.rnn_mode)
    dpre_x = pre_x if over else buf(W, N, G * H)
    dpre_h = None
    if cfg.rnn_mode == "gru":
        dpre_h = pre_h if over else buf(W, N, G * H)
    proj = cfg.num_proj > 0
    dh_total = buf(W, N, Hout) if proj else None
    m_seq = buf(W, N, H) if proj else None
    width = max(cfg.input_size, D * Hout)
    pingpong = (buf(N * width), buf(N * width) if L > 1 else None)  # layer l uses [l % 2]
    acc = torch.float32 if dtype != torch.float64 else None
    dropped = buf(N, D * Hout) if L > 1 and cfg.dropout > 0 else None

    def recompute(p, d, w, xl):
        """Slot w of the pre-activation workspaces <- direction d's (pseudo-layer p)."""
        lp = views[p]
        y_dir = ys[p // D][:, d * Hout : (d + 1) * Hout]
        torch.index_select(torch.cat([h0s[p], y_dir]), 0, prev[d], out=h_prev[w])
        _backward_preacts(cfg, lp, xl, h_prev[w], _at(pre_x, w), _at(pre_h, w))
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
        if layer == 0 and dx_out is not None:
            dx = dx_out
        else:
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
                    cfg.rnn_mode, _at(pre_x, 0), _at(pre_h, 0), views[p].R, views[p].Pw,
                    ys[layer][:, d * Hout : (d + 1) * Hout], h_prev[0],
                    c_views[p] if lstm else None, _at(c_prev, 0), dy_dirs[d], dhTs[p],
                    dcTs[p] if lstm else None, info, d == 1, dpre_x[0], _at(dpre_h, 0),
                    dh0s[p], dc0s[p] if lstm else None, _at(dh_total, 0), _at(m_seq, 0),
                )
                gradients(p, d, 0, xl, dx)
        if layer > 0 and cfg.dropout > 0:
            dropout_mod.apply_packed(dx, info, cfg.dropout, cfg.seed, cfg.seed2, layer - 1,
                                     out=dx)
        dy = dx
    dh0 = _unsorted(dh0s, info)
    dc0 = _unsorted(dc0s, info) if lstm else None
    return BackwardResult(dx, dh0, dc0, dparams)


# ----------------------------------------------------------------------------- layer pipeline


class _Chunks:
    """The C time chunks of a pipelined run: packed row range and window layout of each."""

    def __init__(self, info: PackInfo, bounds: tuple[int, ...]):
        offsets = [0]
        for n in info.batch_sizes:
            offsets.append(offsets[-1] + n)
        self.rows = [slice(offsets[a], offsets[b]) for a, b in pairwise(bounds)]
        self.windows = [window(info, a, b) for a, b in pairwise(bounds)]
        self.count = len(self.rows)


def _forward_pipelined(cfg: RNNConfig, rec: Recurrence, x, h0, c0, params, info: PackInfo,
                       training: bool, pipe, y_out) -> ForwardResult:
    """`forward` as a layer pipeline (unidirectional, pipe: pipeline.Pipeline with C chunks).

    Chunk k of layer l: dropout of layer l-1's output rows of the chunk, the chunk's input
    projection, the recurrence over the chunk's window from the state the chunk k-1 left.
    Chunk k's rows pass from layer to layer in order (layer l+1 starts chunk k after layer l
    finished it), so one [N, G*H] input-projection buffer and one dropout buffer serve every
    layer in flight, as in the unpipelined loop; only the states between chunks are per layer
    ([L, 2, B, C]: chunk k reads slot (k-1) % 2 and writes k % 2)."""
    L = cfg.num_layers
    dtype, dev, lstm = x.dtype, x.device, cfg.is_lstm
    (views, h0s, c0s, hTs, cTs, reserve, host_reserved, c_views,
     ys) = _forward_inputs(cfg, info, dtype, dev, params, h0, c0, training, y_out)
    # Shapes (and the byte formula) in pipeline.forward_workspaces, which Plan.explain()
    # also reads.
    ws = {name: new_buffer(*shape, dtype=dtype, device=dev) for name, shape in
          pipeline_mod.forward_workspaces(cfg, info.N, info.B, training).items()}
    xg, h_mid, c_mid = ws["xg"], ws["h_mid"], ws.get("c_mid")
    drop = training and cfg.dropout > 0 and L > 1
    dropped = ws.get("dropped")
    chunks = _Chunks(info, pipe.bounds)
    last = chunks.count - 1

    def work(layer: int, k: int, _slot: int) -> None:
        r, win, lp = chunks.rows[k], chunks.windows[k], views[layer]
        if layer == 0:
            xl = x[r]
        elif drop:
            xl = dropout_mod.apply_packed(ys[layer - 1][r], win, cfg.dropout, cfg.seed,
                                          cfg.seed2, layer - 1, out=dropped[r])
        else:
            xl = ys[layer - 1][r]
        _input_preact(cfg, lp, xl, xg[r])
        h_in = h0s[layer] if k == 0 else h_mid[layer, (k - 1) % 2]
        h_out = hTs[layer] if k == last else h_mid[layer, k % 2]
        c_in = c_out = None
        if lstm:
            c_in = c0s[layer] if k == 0 else c_mid[layer, (k - 1) % 2]
            c_out = cTs[layer] if k == last else c_mid[layer, k % 2]
        rec.forward(cfg.rnn_mode, xg[r], lp.R, lp.bR, lp.Pw, h_in, c_in, win, False,
                    ys[layer][r], c_views[layer][r] if c_views else None, h_out, c_out)

    pipeline_mod.run(pipe, dev, range(L), range(chunks.count), work, keep=chunks.windows)
    hT = _unsorted(hTs, info)
    cT = _unsorted(cTs, info) if lstm else None
    return ForwardResult(ys[-1], hT, cT, reserve, host_reserved)


def _backward_pipelined(cfg: RNNConfig, rec: Recurrence, x, h0, c0, params, info: PackInfo,
                        y_last, dy_last, dhT, dcT, reserve, pipe, dx_out) -> BackwardResult:
    """`backward` as a layer pipeline: layers from the top, chunks in reverse time order.

    Chunk k of layer l: its recomputed pre-activations, the recurrence backward over the
    chunk's window (dhT/dcT carried from chunk k+1), then the chunk's input-gradient rows
    dpre_x @ W_l (and layer l-1's dropout backward on them): exactly the output-gradient rows
    layer l-1's chunk k needs. Row-partitioned buffers (pre-activations, c_prev, the dy/dx
    buffer rewritten in place as the gradient walks down) are shared by all layers as in the
    forward. The weight gradients stay whole-layer GEMMs after a layer's last chunk, as in
    the unpipelined backward (one GEMM over all N rows with fp32 accumulation, cast once;
    per-chunk partial products would round C times in a half dtype, and torch has no
    portable half-in/fp32-out GEMM to accumulate them exactly). What those GEMMs read
    (dpre_x, dpre_h, h_prev, the layer input after dropout, dh_total, m_seq) is therefore
    private to the layer's stream slot: [W, N, C] with W = pipe.width layers in flight, the
    price of the overlap in memory (W - 1 extra copies of those workspaces)."""
    L, H, G = cfg.num_layers, cfg.num_units, cfg.num_gates
    N, B, dtype, dev = info.N, info.B, x.dtype, x.device
    lstm, gru, proj = cfg.is_lstm, cfg.rnn_mode == "gru", cfg.num_proj > 0
    (c_views, ys, views, dparams, dviews, h0s, c0s, dhTs, dcTs, dh0s,
     dc0s) = _backward_inputs(cfg, info, dtype, reserve, y_last, params, h0, c0, dhT, dcT)
    # Shapes (and the byte formula) in pipeline.backward_workspaces, which Plan.explain()
    # also reads; the SLOT_PRIVATE ones are [W, N, C], W = pipe.width.
    ws = {name: new_buffer(*shape, dtype=dtype, device=dev) for name, shape in
          pipeline_mod.backward_workspaces(cfg, N, B, pipe.width).items()
          if name != "dx" or dx_out is None}
    pre_x, pre_h, c_prev = ws.get("pre_x"), ws.get("pre_h"), ws.get("c_prev")
    dyx = ws.get("dy")
    dx = dx_out if dx_out is not None else ws["dx"]
    h_prev, dpre_x, dpre_h = ws["h_prev"], ws["dpre_x"], ws.get("dpre_h")
    dh_total, m_seq = ws.get("dh_total"), ws.get("m_seq")
    drop = cfg.dropout > 0 and L > 1
    dropped = ws.get("dropped")
    dh_mid, dc_mid = ws["dh_mid"], ws.get("dc_mid")
    acc = torch.float32 if dtype != torch.float64 else None
    # Each row's previous row in the forward direction, as an index into the layer output
    # (rows of step 0, the first batch_sizes[0], take h0 / c0 instead).
    first = info.batch_sizes[0] if info.batch_sizes else 0
    prev_y = prev_rows(info, reverse=False)[first:] - B
    chunks = _Chunks(info, pipe.bounds)
    last = chunks.count - 1

    def previous(out, seq, state0, r) -> None:
        """out[r] <- each row's value at the previous step: seq[previous row], or state0."""
        a = max(r.start, first)
        if a < r.stop:
            torch.index_select(seq, 0, prev_y[a - first : r.stop - first], out=out[a : r.stop])
        if r.start < first:
            out[r.start : first].copy_(state0[r.start : first])

    def layer_input(layer: int, r, win, slot: int):
        if layer == 0:
            return x[r]
        if drop:
            return dropout_mod.apply_packed(ys[layer - 1][r], win, cfg.dropout, cfg.seed,
                                            cfg.seed2, layer - 1, out=dropped[slot][r])
        return ys[layer - 1][r]

    def work(layer: int, k: int, s: int) -> None:
        r, win, lp = chunks.rows[k], chunks.windows[k], views[layer]
        xl = layer_input(layer, r, win, s)
        previous(h_prev[s], ys[layer], h0s[layer], r)
        px, ph = _at(pre_x, r), _at(pre_h, r)
        _backward_preacts(cfg, lp, xl, h_prev[s][r], px, ph)
        if lstm:
            previous(c_prev, c_views[layer], c0s[layer], r)
        dh_in = dhTs[layer] if k == last else dh_mid[layer, (k + 1) % 2]
        dh_out = dh0s[layer] if k == 0 else dh_mid[layer, k % 2]
        dc_in = dc_out = None
        if lstm:
            dc_in = dcTs[layer] if k == last else dc_mid[layer, (k + 1) % 2]
            dc_out = dc0s[layer] if k == 0 else dc_mid[layer, k % 2]
        rec.backward(
            cfg.rnn_mode, px, ph, lp.R, lp.Pw, ys[layer][r], h_prev[s][r],
            c_views[layer][r] if lstm else None, c_prev[r] if lstm else None,
            dy_last[r] if layer == L - 1 else dyx[r], dh_in, dc_in, win, False,
            dpre_x[s][r], dpre_h[s][r] if gru else None, dh_out, dc_out,
            dh_total[s][r] if proj else None, m_seq[s][r] if proj else None,
        )
        # The chunk's input-gradient rows: the output-gradient rows of the layer below
        # (written over the dy rows this chunk has just consumed).
        dst = dx if layer == 0 else dyx
        if lp.W is None:
            dst[r].copy_(dpre_x[s][r].view(-1, G, H).sum(1))
        else:
            torch.mm(dpre_x[s][r], lp.W, out=dst[r])
        if layer > 0 and cfg.dropout > 0:
            dropout_mod.apply_packed(dst[r], win, cfg.dropout, cfg.seed, cfg.seed2, layer - 1,
                                     out=dst[r])

    def finish(layer: int, s: int) -> None:
        """The layer's weight gradients, as the unpipelined backward forms them."""
        lp, dlp = views[layer], dviews[layer]
        dpx = dpre_x[s]
        dph = dpre_h[s] if gru else dpx
        dlp.bW.copy_(dpx.sum(0, dtype=acc))
        dlp.bR.copy_(dph.sum(0, dtype=acc))
        torch.mm(dph.t(), h_prev[s], out=dlp.R)
        if proj:
            torch.mm(dh_total[s].t(), m_seq[s], out=dlp.Pw)
        if lp.W is not None:
            xl = x if layer == 0 else (dropped[s] if drop else ys[layer - 1])
            torch.mm(dpx.t(), xl, out=dlp.W)

    pipeline_mod.run(pipe, dev, range(L - 1, -1, -1), range(last, -1, -1), work, finish,
                     keep=chunks.windows)
    dh0 = _unsorted(dh0s, info)
    dc0 = _unsorted(dc0s, info) if lstm else None
    return BackwardResult(dx, dh0, dc0, dparams)
