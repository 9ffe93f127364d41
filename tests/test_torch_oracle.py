"""Configurations whose other tests check the library only against itself, here against
torch.nn in float64 (the independent oracle), every output and every gradient: dropout
between layers (torch.nn layers stacked by hand with the library's mask, which the spec
defines), upstream gradients on one output at a time, and the inference path of a stack.
The reference backend in float64 (tolerance 1e-10) and the Triton backend in float32 (2e-5:
float32 rounding of O(1) values over a few steps, as in the other torch.nn comparisons)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_case, params_from_module, run_torch, torch_oracle

from tritonrnn.rnn import cudnn_rnn
from tritonrnn.rnn import dropout as dmod
from tritonrnn.rnn.packing import make_pack_info

F64 = torch.float64
BACKENDS = {"reference": (F64, 1e-10), "triton": (torch.float32, 2e-5)}


def _close(got, want, tol, what):
    torch.testing.assert_close(got.detach().double(), want.detach(), rtol=tol, atol=tol,
                               msg=lambda m: f"{what}: {m}")


def _layer_of(module, layer: int):
    """Layer `layer` of a torch.nn LSTM or GRU stack as a one-layer module sharing its
    parameters."""
    D = 2 if module.bidirectional else 1
    size_in = D * module.hidden_size if layer else module.input_size
    one = type(module)(size_in, module.hidden_size, bidirectional=module.bidirectional)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        for sfx in ("", "_reverse") if module.bidirectional else ("",):
            setattr(one, f"{name}_l0{sfx}", getattr(module, f"{name}_l{layer}{sfx}"))
    return one


def _stack_with_dropout(module, x, h0, c0, lens, time_major, p, seed, seed2):
    """torch.nn's layers one by one (float64, differentiable); between layers the output
    times the library's keep mask / (1 - p). Length-0 sequences: zero output, state kept."""
    T, B = (x.shape[0], x.shape[1]) if time_major else (x.shape[1], x.shape[0])
    D = 2 if module.bidirectional else 1
    tm = lambda t: t if time_major else t.transpose(0, 1)  # noqa: E731
    info = make_pack_info(lens.tolist(), T, torch.device("cpu"))
    keep = (lens > 0).nonzero().flatten()
    inp, hs, cs = tm(x), [], []
    for layer in range(module.num_layers):
        one = _layer_of(module, layer)
        states = slice(layer * D, (layer + 1) * D)
        h_l = tm(h0)[states]
        c_l = tm(c0)[states] if c0 is not None else None
        o, h, c = run_torch(one, inp.index_select(1, keep), h_l.index_select(1, keep),
                            c_l.index_select(1, keep) if c_l is not None else None,
                            lens[keep], True)
        out = torch.zeros(T, B, o.shape[2], dtype=F64).index_copy(1, keep, o)
        hs.append(h_l.index_copy(1, keep, h))
        if c_l is not None:
            cs.append(c_l.index_copy(1, keep, c))
        if layer < module.num_layers - 1:
            mask = torch.zeros(T * B, out.shape[2], dtype=F64)
            mask[info.padded_index] = dmod.keep_mask(info, out.shape[2], p, seed, seed2,
                                                     layer).double()
            inp = out * mask.view(T, B, -1) / (1 - p)
    return tm(out), tm(torch.cat(hs)), tm(torch.cat(cs)) if cs else None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode, time_major", [("lstm", False), ("gru", True)])
def test_dropout_between_layers(mode, time_major, backend):
    """Three bidirectional layers, a length-0 sequence: the mask sits after layers 0 and 1
    in the forward and scales their output gradients in the backward."""
    dtype, tol = BACKENDS[backend]
    p, seed, seed2 = 0.4, 11, 12
    module, x, h0, c0, lens = make_case(mode, 3, 4, 3, True, 0, 5, [5, 0, 4, 1], time_major,
                                        seed=4)
    g = torch.Generator().manual_seed(5)
    rnd = lambda t: torch.randn(t.shape, generator=g, dtype=F64)  # noqa: E731
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (x, h0, c0)]
    out, hn, cn = _stack_with_dropout(module, *leaves, lens, time_major, p, seed, seed2)
    dy, dh, dc = rnd(out), rnd(hn), rnd(cn) if cn is not None else None
    loss = (out * dy).sum() + (hn * dh).sum() + ((cn * dc).sum() if cn is not None else 0)
    params_t = list(module.parameters())
    want = torch.autograd.grad(loss, [t for t in leaves if t is not None] + params_t)
    names = [n for n, _ in module.named_parameters()]
    dp_want = params_from_module(module, tensors=dict(zip(names, want[-len(names):],
                                                          strict=True)))
    ours = [t.detach().to(dtype).requires_grad_(True) if t is not None else None
            for t in (x, h0, c0, params_from_module(module))]
    res = cudnn_rnn(*ours, lens, rnn_mode=mode, direction="bidirectional", dropout=p,
                    seed=seed, seed2=seed2, time_major=time_major, backend=backend)
    loss = (res.output * dy.to(dtype)).sum() + (res.output_h * dh.to(dtype)).sum()
    if cn is not None:
        loss = loss + (res.output_c * dc.to(dtype)).sum()
    got = torch.autograd.grad(loss, [t for t in ours if t is not None])
    _close(res.output, out, tol, "output")
    _close(res.output_h, hn, tol, "output_h")
    _close(got[0], want[0], tol, "dx")
    _close(got[1], want[1], tol, "dh0")
    _close(got[-1], dp_want, tol, "dparams")
    if cn is not None:
        _close(res.output_c, cn, tol, "output_c")
        _close(got[2], want[2], tol, "dc0")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode, proj", [("lstm", 3), ("gru", 0)])
def test_gradients_of_one_output_at_a_time(mode, proj, backend):
    """A loss on output alone, output_h alone or output_c alone (autograd gives the op None
    for the others): every input gradient against torch.nn's."""
    dtype, tol = BACKENDS[backend]
    T = 5
    module, x, h0, c0, lens = make_case(mode, 4, 6, 2, True, proj, T, [5, 0, 3, 2], False,
                                        seed=3)
    g = torch.Generator().manual_seed(9)
    Hout = proj or 6
    full = (torch.randn(len(lens), T, 2 * Hout, generator=g, dtype=F64),
            torch.randn(h0.shape, generator=g, dtype=F64),
            torch.randn(c0.shape, generator=g, dtype=F64) if c0 is not None else None)
    for which in range(3 if c0 is not None else 2):
        grads = tuple((t if i == which else torch.zeros_like(t)) if t is not None else None
                      for i, t in enumerate(full))
        want = torch_oracle(module, x, h0, c0, lens, False, grads)
        leaves = [t.to(dtype).requires_grad_(True) if t is not None else None
                  for t in (x, h0, c0, params_from_module(module))]
        res = cudnn_rnn(*leaves, lens, rnn_mode=mode, num_proj=proj, direction="bidirectional",
                        time_major=False, backend=backend)
        out = (res.output, res.output_h, res.output_c)[which]
        got = torch.autograd.grad((out * full[which].to(dtype)).sum(),
                                  [t for t in leaves if t is not None])
        wants = [want["dx"], want["dh0"], *([want["dc0"]] if c0 is not None else []),
                 params_from_module(module, tensors=want["dparams"])]
        for name, a, b in zip(["dx", "dh0", "dc0", "dparams"][: len(got) - 1] + ["dparams"],
                              got, wants, strict=True):
            _close(a, b, tol, f"{name} (loss on output {which})")


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_inference_of_a_stack(mode):
    """is_training=False (the inner layers' outputs alternate between two buffers, no
    reserve) on the Triton backend: three bidirectional layers, every output."""
    module, x, h0, c0, lens = make_case(mode, 3, 17, 3, True, 0, 5, [5, 0, 3, 2], True, seed=2)
    zeros = lambda t: torch.zeros(t.shape, dtype=F64) if t is not None else None  # noqa: E731
    want = torch_oracle(module, x, h0, c0, lens, True,
                        (torch.zeros(5, 4, 34, dtype=F64), zeros(h0), zeros(c0)))
    f32 = lambda t: t.float() if t is not None else None  # noqa: E731
    res = cudnn_rnn(f32(x), f32(h0), f32(c0), f32(params_from_module(module)), lens,
                    rnn_mode=mode, direction="bidirectional", is_training=False,
                    backend="triton")
    assert res.reserve_space.numel() == 0
    for name in ("output", "output_h") + (("output_c",) if c0 is not None else ()):
        _close(getattr(res, name), want[name], 2e-5, name)
