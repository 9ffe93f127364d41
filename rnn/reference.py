"""Pure-PyTorch reference recurrences: the oracle of every kernel, never the fast path.

Two functions with the same contract as every recurrence backend (kernels/ implements the
same signatures with Triton):

- `recurrence_forward`: the sequential part of one layer and direction. The input-side
  pre-activations xg = W x + bW are precomputed for all steps by one GEMM.
- `recurrence_backward`: the reverse-time sequential part. The pre-activations of every step
  are recomputed beforehand by GEMMs, because every h_{t-1} is known after the forward; only
  dh and dc travel sequentially. Each cell takes only what its derivative reads
  (`backward_preacts`): LSTM and GRU the input and recurrent sides, tanh and relu none
  (their derivatives follow from the output h_t).

Tensors indexed by batch (h0, c0, hT, cT, dhT, dcT, dh0, dc0) are in the packed layout's sorted
order; tensors indexed by packed row are [N, ...] in `packing.PackInfo` row order. Internals
run in float32 (float64 for float64 inputs); results are cast when stored.

The per-cell pointwise math below (`cell_forward`, `cell_backward`) is the readable statement
of the equations in the spec; the Triton helpers in kernels/cells.py mirror it.
"""

from __future__ import annotations

import torch

from .packing import PackInfo


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def backward_preacts(cell: str) -> tuple[bool, bool]:
    """Which recomputed pre-activations a backward recurrence of `cell` reads: (pre_x, pre_h).
    LSTM and GRU both (pre_x = W x + bW, pre_h = R h + bR); tanh / relu neither (the
    derivative from the output: 1 - h_t^2, h_t > 0)."""
    gated = cell in ("lstm", "gru")
    return gated, gated


def check_shapes(expect: dict, cell: str | None = None) -> None:
    """ValueError naming the first of `expect` ({name: (tensor or None, shape)}) that is not
    a tensor of its shape: the launchers' check of what their kernels address by the layer's
    sizes (`cell`, where given, is named in the message)."""
    for name, (x, shape) in expect.items():
        if x is None or tuple(x.shape) != tuple(shape):
            what = f" for cell {cell!r}" if cell is not None else ""
            raise ValueError(f"{name}: expected shape {list(shape)}{what}, got "
                             f"{None if x is None else list(x.shape)}")


def check_backward_preacts(cell: str, pre_x, pre_h, shape: tuple[int, int]) -> None:
    """ValueError naming pre_x / pre_h where it is not what `backward_preacts` asks for
    `cell`: a tensor of `shape`, or None."""
    for name, x, wanted in zip(("pre_x", "pre_h"), (pre_x, pre_h), backward_preacts(cell),
                               strict=True):
        if wanted and x is None:
            raise ValueError(f"{name}: expected a [{shape[0]}, {shape[1]}] tensor for cell "
                             f"{cell!r}, got None")
        if wanted and tuple(x.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {list(shape)} for cell {cell!r}, got "
                             f"{list(x.shape)}")
        if not wanted and x is not None:
            raise ValueError(f"{name}: expected None for cell {cell!r} (its derivative follows "
                             f"from y), got a tensor of shape {list(x.shape)}")


def step_rows(info: PackInfo, s: int, reverse: bool) -> torch.Tensor:
    """Packed rows visited at step s (active sorted rows 0..batch_sizes[s]-1)."""
    n = info.batch_sizes[s]
    j = torch.arange(n, device=info.perm.device)
    if reverse:
        t = info.lengths_sorted[:n].long() - 1 - s
        return info.offsets.long()[t] + j
    return info.offsets[s].long() + j


def cell_forward(cell: str, px: torch.Tensor, ph: torch.Tensor, h: torch.Tensor, c):
    """One step of one cell. px, ph: [n, G*H] pre-activations (x side incl. bW, h side incl.
    bR); h: [n, Hout] previous h; c: [n, H] previous c (LSTM) or None.
    Returns (m, c_new): m is the cell output before projection."""
    if cell == "lstm":
        i, f, g, o = (px + ph).chunk(4, dim=1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c_new = f * c + i * g
        return o * torch.tanh(c_new), c_new
    if cell == "gru":
        xr, xz, xn = px.chunk(3, dim=1)
        hr, hz, hn = ph.chunk(3, dim=1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1 - z) * n + z * h, None
    pre = px + ph
    return (torch.tanh(pre) if cell == "rnn_tanh" else torch.relu(pre)), None


def recurrence_forward(
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
) -> None:
    """Runs one layer/direction forward, writing y [N, Hout], c_seq [N, H] (LSTM; may be None
    when not training), hT [B, Hout] and cT [B, H] (LSTM) in place.

    xg: [N, G*H] input-side pre-activations; R: [G*H, Hout]; bR: [G*H]; Pw: [P, H] or None;
    h0: [B, Hout]; c0: [B, H] or None (sorted batch order)."""
    cdt = compute_dtype(xg.dtype)
    R_, bR_ = R.to(cdt), bR.to(cdt)
    Pw_ = Pw.to(cdt) if Pw is not None else None
    h = h0.to(cdt).clone()
    c = c0.to(cdt).clone() if c0 is not None else None
    for s in range(info.max_len):
        n = info.batch_sizes[s]
        rows = step_rows(info, s, reverse)
        ph = torch.addmm(bR_, h[:n], R_.t())
        m, c_new = cell_forward(cell, xg[rows].to(cdt), ph, h[:n], c[:n] if c is not None else None)
        h_new = m @ Pw_.t() if Pw_ is not None else m
        y[rows] = h_new.to(y.dtype)
        h[:n] = h_new
        if c is not None:
            c[:n] = c_new
            if c_seq is not None:
                c_seq[rows] = c_new.to(c_seq.dtype)
    hT.copy_(h)
    if cT is not None:
        cT.copy_(c)


def cell_backward(
    cell: str,
    px: torch.Tensor | None,
    ph: torch.Tensor | None,
    dh: torch.Tensor,
    h_new: torch.Tensor,
    h_prev: torch.Tensor,
    c: torch.Tensor | None,
    c_prev: torch.Tensor | None,
    dc_in: torch.Tensor | None,
):
    """Backward of one step. px, ph: the step's pre-activations as `backward_preacts` says
    (LSTM, GRU: both sides; tanh / relu: None, unread). dh: [n, H]
    gradient on the cell output m (after the projection's backward); dc_in: carried gradient
    on c_t (LSTM).
    Returns (dpx, dph, dh_prev_direct, dc_prev, m): dpx/dph are the gradients of the x-side and
    h-side pre-activations (the same tensor except for GRU), dh_prev_direct the part of dh_{t-1}
    that bypasses R (GRU's z * dh), dc_prev the gradient carried to c_{t-1}."""
    if cell == "lstm":
        i, f, g, o = (px + ph).chunk(4, dim=1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        tc = torch.tanh(c)
        dc = dc_in + dh * o * (1 - tc * tc)
        dpre = torch.cat(
            [dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g * g),
             dh * tc * o * (1 - o)],
            dim=1,
        )
        return dpre, dpre, None, dc * f, o * tc
    if cell == "gru":
        xr, xz, xn = px.chunk(3, dim=1)
        hr, hz, hn = ph.chunk(3, dim=1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        dpn = dh * (1 - z) * (1 - n * n)
        dpr = dpn * hn * r * (1 - r)
        dpz = dh * (h_prev - n) * z * (1 - z)
        return torch.cat([dpr, dpz, dpn], 1), torch.cat([dpr, dpz, dpn * r], 1), dh * z, None, None
    if cell == "rnn_tanh":
        dpre = dh * (1 - h_new * h_new)
    else:  # relu: h_t > 0 exactly where the pre-activation was; as torch's relu backward,
        # zero only where h_t <= 0 (a NaN h_t passes dh on, an inf dh is not multiplied by 0)
        dpre = torch.where(h_new <= 0, 0.0, dh)
    return dpre, dpre, None, None, None


def recurrence_backward(
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
) -> None:
    """Runs one layer/direction backward in reverse step order, writing in place:
    dpre_x [N, G*H] (gradient of W x + bW), dpre_h [N, G*H] (gradient of R h + bR; GRU only,
    None otherwise because it equals dpre_x), dh0 [B, Hout], dc0 [B, H] (LSTM), and with a
    projection dh_total [N, P] (total gradient on each h_t) and m_seq [N, H] (o * tanh(c_t)),
    from which the caller forms dPw = dh_total^T m_seq.

    pre_x, pre_h: [N, G*H] recomputed pre-activations W x + bW and R h + bR (LSTM, GRU), None
    for tanh / relu (`backward_preacts`); y: [N, Hout] this direction's outputs;
    h_prev: [N, Hout] each row's h_{t-1} (h0 at the first step); c_seq, c_prev: [N, H] (LSTM);
    dy: [N, Hout] gradient arriving at y from the output or the layer above; dhT, dcT: [B, ...]
    gradients of the final states."""
    check_backward_preacts(cell, pre_x, pre_h, (info.N, R.shape[0]))
    cdt = compute_dtype(dy.dtype)
    R_ = R.to(cdt)
    Pw_ = Pw.to(cdt) if Pw is not None else None
    dh_carry = dhT.to(cdt).clone()
    dc_carry = dcT.to(cdt).clone() if dcT is not None else None
    for s in reversed(range(info.max_len)):
        n = info.batch_sizes[s]
        rows = step_rows(info, s, reverse)
        dh = dy[rows].to(cdt) + dh_carry[:n]
        dm = dh @ Pw_ if Pw_ is not None else dh
        dpx, dph, direct, dc_prev, m = cell_backward(
            cell,
            pre_x[rows].to(cdt) if pre_x is not None else None,
            pre_h[rows].to(cdt) if pre_h is not None else None,
            dm,
            y[rows].to(cdt),
            h_prev[rows].to(cdt),
            c_seq[rows].to(cdt) if c_seq is not None else None,
            c_prev[rows].to(cdt) if c_prev is not None else None,
            dc_carry[:n] if dc_carry is not None else None,
        )
        dpre_x[rows] = dpx.to(dpre_x.dtype)
        if dpre_h is not None:
            dpre_h[rows] = dph.to(dpre_h.dtype)
        if dh_total is not None:
            dh_total[rows] = dh.to(dh_total.dtype)
            m_seq[rows] = m.to(m_seq.dtype)
        carry = dph @ R_
        dh_carry[:n] = carry + direct if direct is not None else carry
        if dc_carry is not None:
            dc_carry[:n] = dc_prev
    dh0.copy_(dh_carry)
    if dc0 is not None:
        dc0.copy_(dc_carry)
