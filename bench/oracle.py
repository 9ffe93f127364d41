"""torch.nn as the oracle: module <-> flat params, float64 runs, and the error tolerances.

torch.nn.LSTM / GRU / RNN compute exactly the spec's equations with the same gate orders
(weight_ih = W, weight_hh = R, bias_ih = bW, bias_hh = bR, weight_hr = P_w), so a float64 copy
of a module, run with cuDNN disabled, is an implementation independent of tritonrnn. `check`
and `bench` both build their weights through `params_from_torch`, so the two share one
mapping between torch's state dicts and the canonical flat buffer (rnn/params.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from tritonrnn.rnn import canonical_to_params, params_to_canonical
from tritonrnn.rnn.config import GATES

_TORCH_MODES = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}


def make_torch_rnn(
    rnn_mode: str,
    input_size: int,
    num_units: int,
    *,
    num_layers: int = 1,
    bidirectional: bool = False,
    num_proj: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> nn.RNNBase:
    """The torch.nn module computing `rnn_mode` (time-major, torch's default initialisation)."""
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, dtype=dtype, device=device)
    if rnn_mode == "lstm":
        return nn.LSTM(input_size, num_units, proj_size=num_proj, **kw)
    if rnn_mode == "gru":
        return nn.GRU(input_size, num_units, **kw)
    nonlinearity = {"rnn_tanh": "tanh", "rnn_relu": "relu"}[rnn_mode]
    return nn.RNN(input_size, num_units, nonlinearity=nonlinearity, **kw)


def params_attributes(module: nn.RNNBase) -> dict:
    """The keyword arguments of params_size / canonical_to_params describing a module."""
    return dict(
        rnn_mode=_TORCH_MODES[module.mode],
        num_layers=module.num_layers,
        num_units=module.hidden_size,
        input_size=module.input_size,
        direction="bidirectional" if module.bidirectional else "unidirectional",
        num_proj=getattr(module, "proj_size", 0),
    )


def op_attributes(module: nn.RNNBase) -> dict:
    """The attributes of cudnn_rnn / cudnn_rnn_backprop for a module (sizes come from the
    tensors' shapes)."""
    a = params_attributes(module)
    return {k: a[k] for k in ("rnn_mode", "direction", "num_proj")}


def _canonical_names(module: nn.RNNBase):
    """Yields (layer, suffix) for every pseudo-layer in canonical order (forward first)."""
    for layer in range(module.num_layers):
        for suffix in ("", "_reverse") if module.bidirectional else ("",):
            yield layer, suffix


def params_from_torch(
    module: nn.RNNBase, tensors: Mapping[str, torch.Tensor] | None = None
) -> torch.Tensor:
    """tritonrnn's flat params buffer from a torch.nn RNN's parameters (or from a dict with
    the same names, e.g. their gradients). Shape [params_size(...)], dtype of the tensors."""
    attrs = params_attributes(module)
    G = GATES[attrs["rnn_mode"]]
    if tensors is None:
        tensors = dict(module.named_parameters())
    weights: list[torch.Tensor] = []
    biases: list[torch.Tensor] = []
    for layer, sfx in _canonical_names(module):
        weights += list(tensors[f"weight_ih_l{layer}{sfx}"].chunk(G, 0))
        weights += list(tensors[f"weight_hh_l{layer}{sfx}"].chunk(G, 0))
        if attrs["num_proj"]:
            weights.append(tensors[f"weight_hr_l{layer}{sfx}"])
        biases += list(tensors[f"bias_ih_l{layer}{sfx}"].chunk(G, 0))
        biases += list(tensors[f"bias_hh_l{layer}{sfx}"].chunk(G, 0))
    return canonical_to_params([w.detach() for w in weights], [b.detach() for b in biases],
                               **attrs)


@torch.no_grad()
def load_params_into_torch(module: nn.RNNBase, params: torch.Tensor) -> None:
    """The inverse of `params_from_torch`: copies a flat buffer into the module's weights."""
    attrs = params_attributes(module)
    weights, biases = params_to_canonical(params, **attrs)
    G = GATES[attrs["rnn_mode"]]
    named = dict(module.named_parameters())
    w, b = iter(weights), iter(biases)
    for layer, sfx in _canonical_names(module):
        named[f"weight_ih_l{layer}{sfx}"].copy_(torch.cat([next(w) for _ in range(G)]))
        named[f"weight_hh_l{layer}{sfx}"].copy_(torch.cat([next(w) for _ in range(G)]))
        if attrs["num_proj"]:
            named[f"weight_hr_l{layer}{sfx}"].copy_(next(w))
        named[f"bias_ih_l{layer}{sfx}"].copy_(torch.cat([next(b) for _ in range(G)]))
        named[f"bias_hh_l{layer}{sfx}"].copy_(torch.cat([next(b) for _ in range(G)]))


def torch_forward(
    module: nn.RNNBase,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    lengths: list[int] | None = None,
):
    """Runs a torch.nn RNN with the spec's variable-length semantics; differentiable.

    x [T, B, I]; h0 [L*D, B, Hout]; c0 [L*D, B, H] (LSTM) or None; lengths [B] host ints or
    None. Returns (y [T, B, D*Hout] with exact zeros at padding, hT, cT or None).
    torch rejects length-0 sequences, so those rows skip the module: their output is 0 and
    their final state is the initial state (the spec's rule).
    """
    lstm = c0 is not None
    if lengths is None:
        y, hn = module(x, (h0, c0) if lstm else h0)
        return (y, *hn) if lstm else (y, hn, None)
    T, B = x.shape[0], x.shape[1]
    rows = [b for b in range(B) if lengths[b] > 0]
    width = module.hidden_size if not getattr(module, "proj_size", 0) else module.proj_size
    y = x.new_zeros(T, B, width * (2 if module.bidirectional else 1))
    if not rows:
        return y, h0, c0
    idx = torch.tensor(rows, device=x.device)
    lens = torch.tensor([lengths[b] for b in rows], dtype=torch.int64)
    packed = nn.utils.rnn.pack_padded_sequence(x.index_select(1, idx), lens,
                                               enforce_sorted=False)
    states = h0.index_select(1, idx)
    if lstm:
        states = (states, c0.index_select(1, idx))
    out, hn = module(packed, states)
    out, _ = nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    y = y.index_copy(1, idx, out)
    if lstm:
        return y, h0.index_copy(1, idx, hn[0]), c0.index_copy(1, idx, hn[1])
    return y, h0.index_copy(1, idx, hn), None


@dataclass
class OracleResult:
    """float64 outputs and gradients of the oracle (None where a mode has no such tensor)."""

    y: torch.Tensor
    hT: torch.Tensor
    cT: torch.Tensor | None
    dx: torch.Tensor | None = None
    dh0: torch.Tensor | None = None
    dc0: torch.Tensor | None = None
    dparams: torch.Tensor | None = None


def oracle(
    module64: nn.RNNBase,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    lengths: list[int] | None,
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None,
) -> OracleResult:
    """float64 forward (and backward when `grads` = (dy, dhT, dcT) is given) of a float64
    torch.nn module with cuDNN off, on the module's device. Inputs are upcast to float64."""
    dev = next(module64.parameters()).device
    f64 = lambda t: None if t is None else t.detach().to(dev, torch.float64).requires_grad_()
    x_, h0_, c0_ = f64(x), f64(h0), f64(c0)
    with torch.backends.cudnn.flags(enabled=False), torch.enable_grad():
        y, hT, cT = torch_forward(module64, x_, h0_, c0_, lengths)
        res = OracleResult(y.detach(), hT.detach(), None if cT is None else cT.detach())
        if grads is None:
            return res
        dy, dhT, dcT = (None if g is None else g.to(dev, torch.float64) for g in grads)
        names, params = zip(*module64.named_parameters(), strict=True)
        outs = [y, hT] + ([cT] if cT is not None else [])
        gouts = [dy, dhT] + ([dcT] if cT is not None else [])
        inputs = [x_, h0_] + ([c0_] if c0_ is not None else [])
        got = torch.autograd.grad(outs, inputs + list(params), gouts, allow_unused=True)
    n_in = len(inputs)
    res.dx, res.dh0 = got[0], got[1]
    res.dc0 = got[2] if c0_ is not None else None
    pgrads = {
        n: g if g is not None else torch.zeros_like(p)
        for n, p, g in zip(names, params, got[n_in:], strict=True)
    }
    res.dparams = params_from_torch(module64, pgrads)
    return res


# ----------------------------------------------------------------------------- tolerances

_UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}


def tolerance(dtype: torch.dtype, *, K: int, steps: int, tf32: bool = False) -> float:
    """Allowed `scaled_error` for results in `dtype` after `steps` sequential cell steps
    whose pre-activations are dot products of length K.

    Derivation (first-order rounding model, Higham & Mary's probabilistic bounds): every
    stored value rounds once with the storage unit roundoff u_s (bf16 2^-8, fp16 2^-11, fp32
    2^-24, fp64 2^-53); every step forms length-K dot products in the compute precision u_c
    (fp64 for fp64 data, else fp32; `tf32`: fp32 GEMMs round their operands to tf32, u = 2^-11,
    as torch does on a GPU under torch.backends.cuda.matmul.allow_tf32).
    Independent rounding errors grow like the square root of their count (sqrt(K) inside a dot
    product, sqrt(steps) along the sequence, since the cells' derivatives are at most 1), so

        tol = 8 * (u_s * sqrt(1 + steps) + u_c * sqrt(K * steps))

    where the factor 8 covers the few pointwise operations per step and keeps the chance of
    a correct kernel exceeding the bound negligible. A wrong kernel is off by O(0.01..1).
    """
    u_s = _UNIT_ROUNDOFF[dtype]
    if dtype == torch.float64:
        u_c = _UNIT_ROUNDOFF[torch.float64]
    elif dtype == torch.float32 and tf32:
        u_c = 2.0**-11
    else:
        u_c = _UNIT_ROUNDOFF[torch.float32]
    return 8.0 * (u_s * math.sqrt(1 + steps) + u_c * math.sqrt(K * steps))


def uses_tf32(device: torch.device) -> bool:
    """Whether float32 GEMMs on `device` run in tf32 (torch's global switch; tritonrnn's
    kernels use IEEE fp32 dots unless asked otherwise)."""
    return device.type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)


def cudnn_uses_tf32(device: torch.device) -> bool:
    """Whether cuDNN's float32 RNNs on `device` may run in tf32: torch asks cuDNN for its
    default math (tensor cores with fp32 -> tf32 conversion on Ampere and later) unless
    torch.backends.cudnn.allow_tf32 is off, and that switch is on by default, unlike the
    GEMM one (`uses_tf32`)."""
    return device.type == "cuda" and bool(torch.backends.cudnn.allow_tf32)


def scaled_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max(1, max |ref|), computed in float64 on the reference's device."""
    if ref.numel() == 0:
        return 0.0
    g = got.detach().to(ref.device, torch.float64)
    if not torch.isfinite(g).all():
        return math.inf
    err = (g - ref).abs().max().item()
    return err / max(1.0, ref.abs().max().item())
