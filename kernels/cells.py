"""Pointwise cell math shared by every recurrent kernel family.

One source of truth for the activations and the per-cell forward/backward pointwise math,
mirroring rnn/reference.py (`cell_forward`, `cell_backward`). The cell is a constexpr:

    CELL_LSTM = 0, CELL_GRU = 1, CELL_TANH = 2, CELL_RELU = 3

Gates are passed as separate [BLOCK_B, BLOCK_H] tensors in the spec's gate order (LSTM i, f, g,
o; GRU r, z, n). For cells with fewer gates, the unused arguments may be any tensor of the
right shape (they are not read); unused results are returned as zeros.

`x*` are the input-side pre-activations (W x + bW) and `h*` the recurrent side (R h + bR),
kept apart because GRU's n gate multiplies only the recurrent side by r.
"""

from __future__ import annotations

import triton
import triton.language as tl

CELL_LSTM = 0
CELL_GRU = 1
CELL_TANH = 2
CELL_RELU = 3
CELL_IDS = {"lstm": CELL_LSTM, "gru": CELL_GRU, "rnn_tanh": CELL_TANH, "rnn_relu": CELL_RELU}
NUM_GATES = {CELL_LSTM: 4, CELL_GRU: 3, CELL_TANH: 1, CELL_RELU: 1}


@triton.jit
def sigmoid(x):
    # exp(-x) overflows to inf for x < -88 in fp32, and 1 / inf = 0: the correct limit.
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tanh(x):
    # Built on e^{-2|x|} <= 1, so it never forms inf / inf (the NaN of (1-e^-2x)/(1+e^-2x)
    # at x < -44) and is exact in the saturated range.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def cell_forward(CELL: tl.constexpr, x0, x1, x2, x3, h0, h1, h2, h3, h_prev, c_prev):
    """One step. Returns (m, c_new): m is the cell output before any projection; c_new is
    the new cell state (LSTM) or zeros."""
    zero = tl.zeros_like(h0)
    if CELL == 0:
        i = sigmoid(x0 + h0)
        f = sigmoid(x1 + h1)
        g = tanh(x2 + h2)
        o = sigmoid(x3 + h3)
        c_new = f * c_prev + i * g
        m = o * tanh(c_new)
    elif CELL == 1:
        r = sigmoid(x0 + h0)
        z = sigmoid(x1 + h1)
        n = tanh(x2 + r * h2)
        m = (1.0 - z) * n + z * h_prev
        c_new = zero
    elif CELL == 2:
        m = tanh(x0 + h0)
        c_new = zero
    else:
        # NaN stays NaN, as torch.relu (tl.maximum's default returns the other operand).
        m = tl.maximum(x0 + h0, 0.0, propagate_nan=tl.PropagateNan.ALL)
        c_new = zero
    return m, c_new


@triton.jit
def cell_backward(CELL: tl.constexpr, x0, x1, x2, x3, h0, h1, h2, h3, dm, h_new, h_prev, c,
                  c_prev, dc_in):
    """Backward of one step.

    x*, h*: the gate pre-activations' input and recurrent sides (LSTM, GRU; unread by tanh /
    relu, as `rnn.reference.backward_preacts` says).
    dm: gradient on the cell output m; h_new: the step's output h_t (used by tanh/relu);
    c, c_prev, dc_in: c_t, c_{t-1} and the carried gradient on c_t (LSTM).
    Returns (dx0, dx1, dx2, dx3, dh2, direct, dc_prev, m):
      dx* gradients of the x-side pre-activations; the h-side gradients equal dx* except
      GRU's n gate, whose h-side gradient is dh2 (= dx2 * r; equal to dx2 for other cells);
      direct: the part of dh_{t-1} that bypasses R (GRU's z * dm), else zeros;
      dc_prev: the gradient carried to c_{t-1} (LSTM), else zeros;
      m: o * tanh(c_t) (LSTM; the projection's input), else zeros.
    """
    zero = tl.zeros_like(dm)
    if CELL == 0:
        i = sigmoid(x0 + h0)
        f = sigmoid(x1 + h1)
        g = tanh(x2 + h2)
        o = sigmoid(x3 + h3)
        tc = tanh(c)
        dc = dc_in + dm * o * (1.0 - tc * tc)
        dx0 = dc * g * i * (1.0 - i)
        dx1 = dc * c_prev * f * (1.0 - f)
        dx2 = dc * i * (1.0 - g * g)
        dx3 = dm * tc * o * (1.0 - o)
        return dx0, dx1, dx2, dx3, dx2, zero, dc * f, o * tc
    elif CELL == 1:
        r = sigmoid(x0 + h0)
        z = sigmoid(x1 + h1)
        n = tanh(x2 + r * h2)
        dpn = dm * (1.0 - z) * (1.0 - n * n)
        dpr = dpn * h2 * r * (1.0 - r)
        dpz = dm * (h_prev - n) * z * (1.0 - z)
        return dpr, dpz, dpn, zero, dpn * r, dm * z, zero, zero
    elif CELL == 2:
        d = dm * (1.0 - h_new * h_new)
        return d, zero, zero, zero, zero, zero, zero, zero
    else:  # relu: h_t > 0 exactly where the pre-activation was; a NaN h_t passes dm on,
        # as torch's relu backward (zero only where h_t <= 0)
        d = tl.where(h_new <= 0.0, 0.0, dm)
        return d, zero, zero, zero, zero, zero, zero, zero
