"""Op API semantics beyond the torch.nn comparison: params helpers, skip_input, dropout,
the explicit backprop op, the reserve space, inference mode, gradcheck and every error."""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import GATES, compare_with_torch, make_case, params_from_module, torch_oracle

from tritonrnn.rnn import (
    GRU,
    LSTM,
    canonical_to_params,
    cudnn_rnn,
    cudnn_rnn_backprop,
    library,
    params_size,
    params_to_canonical,
)
from tritonrnn.rnn import reserve as reserve_mod
from tritonrnn.rnn.planner import plan_for

MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
F64 = torch.float64


def _inputs(mode, T=5, B=3, I=4, H=4, L=1, D=1, P=0, seed=0, dtype=F64, skip=False):
    g = torch.Generator().manual_seed(seed)
    Hout = P or H
    n = params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=I, num_proj=P,
                    input_mode="skip_input" if skip else "linear_input",
                    direction="bidirectional" if D == 2 else "unidirectional")
    x = torch.randn(T, B, I, generator=g, dtype=dtype)
    h = torch.randn(L * D, B, Hout, generator=g, dtype=dtype)
    c = torch.randn(L * D, B, H, generator=g, dtype=dtype) if mode == "lstm" else None
    p = torch.randn(n, generator=g, dtype=dtype) * 0.5
    return x, h, c, p


# ----------------------------------------------------------------------------- params


@pytest.mark.parametrize("skip", [False, True], ids=["linear", "skip"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("mode", MODES)
def test_params_size_formula(mode, bidirectional, skip):
    I = H = 6
    G, D, L = GATES[mode], 2 if bidirectional else 1, 3
    expect = 0
    for layer in range(L):
        in_w = 0 if (layer == 0 and skip) else (I if layer == 0 else D * H)
        expect += D * (G * H * in_w + G * H * H + 2 * G * H)
    got = params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=I,
                      input_mode="skip_input" if skip else "linear_input",
                      direction="bidirectional" if bidirectional else "unidirectional")
    assert got == expect


def test_params_size_projection():
    H, P, I, L, D = 8, 3, 5, 2, 2
    expect = D * (4 * H * I + 4 * H * P + P * H + 8 * H) + D * (4 * H * D * P + 4 * H * P
                                                               + P * H + 8 * H)
    assert params_size(rnn_mode="lstm", num_layers=L, num_units=H, input_size=I,
                       direction="bidirectional", num_proj=P) == expect


def test_the_closed_form_params_count_is_the_layouts():
    """config.params_count (the overflow check's, before any layout) against params.py's
    layout, over modes, stacks, directions, projections and input modes."""
    import itertools

    from tritonrnn.rnn.config import make_config, params_count
    from tritonrnn.rnn.params import config_params_size

    for mode, L, I, D, P, skip in itertools.product(MODES, (1, 3), (3, 7), (1, 2), (0, 3),
                                                    (False, True)):
        if (P and mode != "lstm") or (skip and I != 7):
            continue
        cfg = make_config(rnn_mode=mode, num_layers=L, num_units=7, input_size=I,
                          input_mode="skip_input" if skip else "linear_input",
                          direction="bidirectional" if D == 2 else "unidirectional",
                          num_proj=P)
        assert params_count(mode, L, 7, 0 if skip else I, D, P) == config_params_size(cfg)


@pytest.mark.parametrize("sizes, match", [
    (dict(num_units=2**31), r"^num_units: expected at most 2147483647 \(TensorFlow's int32 "
                            r"sizes\), got 2147483648$"),
    (dict(num_layers=2**31), r"^num_layers: expected at most 2147483647"),
    (dict(input_size=2**40), r"^input_size: expected at most 2147483647"),
    (dict(num_units=2**30, input_size=2**30),
     r"^num_units, input_size, num_layers: expected a params buffer of at most 2\*\*63 - 1 "
     r"elements, got 9223372045444710400 "),
    (dict(num_units=2**31 - 1, num_layers=2**31 - 1), r"params buffer of at most"),
], ids=["units", "layers", "input", "product", "layers-product"])
def test_params_size_refuses_sizes_past_int32_and_counts_past_int64(sizes, match):
    """Refused before any layout is built: a size of 2**40 returned a count past int64, and
    2**31 layers would have been walked one by one."""
    with pytest.raises(ValueError, match=match):
        params_size(**{**dict(rnn_mode="lstm", num_layers=1, num_units=4, input_size=3),
                       **sizes})


@pytest.mark.parametrize(("mode", "proj"), [(m, 0) for m in MODES] + [("lstm", 2)])
def test_canonical_round_trip(mode, proj):
    kw = dict(rnn_mode=mode, num_layers=2, num_units=5, input_size=3, num_proj=proj,
              direction="bidirectional")
    p = torch.randn(params_size(**kw), dtype=F64)
    w, b = params_to_canonical(p, **kw)
    assert torch.equal(canonical_to_params(w, b, **kw), p)
    # The canonical tensors are views in canonical order: TF's first weight is W_0 of layer 0.
    assert w[0].shape == (5, 3) and w[0].data_ptr() == p.data_ptr()


def _spec_layout(mode, L, D, I, H, P, skip):
    """Shapes of the canonical weights and biases in the spec's order (spec/cudnn_rnn.md,
    "Params"), written out from the spec alone: pseudo-layer p = layer * D + dir, all
    weights first (W_0..W_{G-1}, R_0..R_{G-1}, then P_w), then all biases (bW, bR)."""
    G, Hout = GATES[mode], P or H
    weights, biases = [], []
    for layer in range(L):
        for _ in range(D):
            if not (skip and layer == 0):
                weights += [(H, I if layer == 0 else D * Hout)] * G
            weights += [(H, Hout)] * G + ([(P, H)] if P else [])
            biases += [(H,)] * (2 * G)
    return weights, biases


@pytest.mark.parametrize("skip", [False, True], ids=["linear", "skip"])
@pytest.mark.parametrize("D", [1, 2], ids=["uni", "bi"])
@pytest.mark.parametrize(("mode", "P"), [(m, 0) for m in MODES] + [("lstm", 3)])
def test_params_layout_is_the_specs_at_every_offset(mode, P, D, skip):
    """The flat buffer's absolute layout, not only a round trip: params = 0, 1, 2, ... and
    every canonical tensor must be the next run of those numbers, row-major, in the spec's
    order and shapes (a layout that swapped two tensors of the same shape, or weights and
    biases of a pseudo-layer, would still round-trip)."""
    L, I, H = 2, 5 if not skip else 4, 4
    kw = dict(rnn_mode=mode, num_layers=L, num_units=H, input_size=I, num_proj=P,
              input_mode="skip_input" if skip else "linear_input",
              direction="bidirectional" if D == 2 else "unidirectional")
    shapes_w, shapes_b = _spec_layout(mode, L, D, I, H, P, skip)
    n = params_size(**kw)
    assert n == sum(torch.Size(s).numel() for s in shapes_w + shapes_b)
    flat = torch.arange(n, dtype=F64)
    w, b = params_to_canonical(flat, **kw)
    assert [tuple(t.shape) for t in w] == shapes_w
    assert [tuple(t.shape) for t in b] == shapes_b
    at = 0
    for k, t in enumerate(w + b):
        want = torch.arange(at, at + t.numel(), dtype=F64).view(t.shape)
        assert torch.equal(t, want), f"canonical tensor {k} does not start at offset {at}"
        at += t.numel()
    assert at == n
    # What the kernels read (the engine's per-pseudo-layer views) is those same tensors:
    # W and R the G gate blocks stacked, bW and bR likewise, P_w after R.
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.params import layer_views

    G = GATES[mode]
    w_at = iter(w)
    b_at = iter(b)
    for layer, view in enumerate(layer_views(make_config(**kw), flat)):
        if skip and layer < D:
            assert view.W is None
        else:
            assert torch.equal(view.W, torch.cat([next(w_at) for _ in range(G)]))
        assert torch.equal(view.R, torch.cat([next(w_at) for _ in range(G)]))
        if P:
            assert torch.equal(view.Pw, next(w_at))
        assert torch.equal(view.bW, torch.cat([next(b_at) for _ in range(G)]))
        assert torch.equal(view.bR, torch.cat([next(b_at) for _ in range(G)]))
    assert next(w_at, None) is None and next(b_at, None) is None


def test_params_match_torch_state_dict_layout():
    m, *_ = make_case("gru", 3, 4, 2, True, 0, 5, [5], True)
    p = params_from_module(m)
    w, b = params_to_canonical(p, rnn_mode="gru", num_layers=2, num_units=4, input_size=3,
                               direction="bidirectional")
    assert torch.equal(torch.cat(w[3:6]), m.weight_hh_l0.detach())
    assert torch.equal(torch.cat(b[-3:]), m.bias_hh_l1_reverse.detach())


# ----------------------------------------------------------------------------- skip_input


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("input_mode", ["skip_input", "auto_select"])
@pytest.mark.parametrize("mode", MODES)
def test_skip_input_equals_identity_input_weights(mode, input_mode, backend):
    """skip_input adds x to every gate: the same as linear_input with W_g = identity. Every
    output and gradient against torch.nn's (float64; the Triton backend in float32)."""
    H, T = 4, 5
    dtype, tol = (F64, 1e-10) if backend == "reference" else (torch.float32, 2e-5)
    module, x, h0, c0, lens = make_case(mode, H, H, 2, True, 0, T, [5, 2, 0], True)
    G = GATES[mode]
    with torch.no_grad():
        for sfx in ("l0", "l0_reverse"):
            getattr(module, f"weight_ih_{sfx}").copy_(torch.eye(H, dtype=F64).repeat(G, 1))
    g = torch.Generator().manual_seed(1)
    grads = (torch.randn(T, 3, 2 * H, generator=g, dtype=F64),
             torch.randn(h0.shape, generator=g, dtype=F64),
             torch.randn(h0.shape, generator=g, dtype=F64) if c0 is not None else None)
    want = torch_oracle(module, x, h0, c0, lens, True, grads)
    leaves = [t.to(dtype).requires_grad_(True) if t is not None else None
              for t in (x, h0, c0, params_from_module(module, skip_input=True))]
    res = cudnn_rnn(*leaves, lens, rnn_mode=mode, input_mode=input_mode,
                    direction="bidirectional", backend=backend)
    outs = (res.output, res.output_h, res.output_c)
    loss = sum((o * d.to(dtype)).sum() for o, d in zip(outs, grads, strict=True)
               if d is not None)
    got = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    pairs = {"output": (res.output, want["output"]), "output_h": (res.output_h, want["output_h"]),
             "dx": (got[0], want["dx"]), "dh0": (got[1], want["dh0"]),
             "dparams": (got[-1], params_from_module(module, skip_input=True,
                                                     tensors=want["dparams"]))}
    if c0 is not None:
        pairs["output_c"] = (res.output_c, want["output_c"])
        pairs["dc0"] = (got[2], want["dc0"])
    for name, (a, b) in pairs.items():
        torch.testing.assert_close(a.detach().double(), b, rtol=tol, atol=tol,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_auto_select_with_another_input_size_is_linear_input():
    """auto_select picks linear_input when the input size differs from num_units."""
    module, x, h0, c0, lens = make_case("lstm", 3, 4, 1, False, 0, 5, [5, 2], True)
    p = params_from_module(module)
    got = cudnn_rnn(x, h0, c0, p, lens, input_mode="auto_select", backend="reference")
    want = cudnn_rnn(x, h0, c0, p, lens, input_mode="linear_input", backend="reference")
    for a, b in zip(got[:3], want[:3], strict=True):
        assert torch.equal(a, b)
    grads = (torch.zeros(5, 2, 4, dtype=F64), torch.zeros(h0.shape, dtype=F64),
             torch.zeros(h0.shape, dtype=F64))
    torch.testing.assert_close(got.output, torch_oracle(module, x, h0, c0, lens, True,
                                                        grads)["output"], rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- backprop op


@pytest.mark.parametrize("mode", MODES)
def test_backprop_op_equals_autograd(mode):
    """cudnn_rnn_backprop called directly (TF style) gives what autograd through cudnn_rnn
    gives, from the reserve alone, and fresh (not accumulated) gradients each call."""
    x, h, c, p = _inputs(mode, L=2, D=2, I=4, H=4)
    lens = torch.tensor([5, 0, 3])
    kw = dict(rnn_mode=mode, direction="bidirectional", backend="reference")
    fwd = cudnn_rnn(x, h, c, p, lens, **kw)
    dy = torch.randn_like(fwd.output)
    dh = torch.randn_like(fwd.output_h)
    dc = torch.randn_like(fwd.output_c) if mode == "lstm" else None
    bp = cudnn_rnn_backprop(x, h, c, p, lens, fwd.output, fwd.output_h, fwd.output_c, dy, dh,
                            dc, fwd.reserve_space, fwd.host_reserved, **kw)
    bp2 = cudnn_rnn_backprop(x, h, c, p, lens, fwd.output, fwd.output_h, fwd.output_c, dy, dh,
                             dc, fwd.reserve_space, fwd.host_reserved, **kw)
    leaves = [t.clone().requires_grad_(True) for t in (x, h, p)]
    cc = c.clone().requires_grad_(True) if c is not None else None
    out = cudnn_rnn(leaves[0], leaves[1], cc, leaves[2], lens, **kw)
    loss = (out.output * dy).sum() + (out.output_h * dh).sum()
    if cc is not None:
        loss = loss + (out.output_c * dc).sum()
    ag = torch.autograd.grad(loss, leaves + ([cc] if cc is not None else []))
    assert torch.equal(bp.input_backprop, ag[0])
    assert torch.equal(bp.input_h_backprop, ag[1])
    assert torch.equal(bp.params_backprop, ag[2])
    assert torch.equal(bp.params_backprop, bp2.params_backprop)
    if mode == "lstm":
        assert torch.equal(bp.input_c_backprop, ag[3])
    else:
        assert bp.input_c_backprop.numel() == 0 and fwd.output_c.numel() == 0
    assert bp.input_backprop.shape == x.shape and bp.params_backprop.shape == p.shape


# ----------------------------------------------------------------------------- second order


def _second_order_case(path, mode, seed):
    """(loss, leaves, first-order gradients wanted) for one differentiable path; the wanted
    gradients come from a plain first-order backward on fresh leaves."""
    x, h, c, p = _inputs(mode, L=2, D=2, I=4, H=4, seed=seed)
    lens = torch.tensor([5, 2, 4])
    kw = dict(rnn_mode=mode, direction="bidirectional", backend="reference")
    g = torch.Generator().manual_seed(seed + 1)
    T, B = x.shape[:2]
    w = torch.randn(T, B, 8, generator=g, dtype=F64)

    def run(create_graph):
        if path == "module":
            cls = {"lstm": LSTM, "gru": GRU}[mode]
            torch.manual_seed(seed)
            m = cls(4, 4, num_layers=2, bidirectional=True, dtype=F64, backend="reference")
            xl = x.clone().requires_grad_(True)
            y, _ = m(xl)
            leaves = [xl, *m.parameters()]
        else:
            leaves = [t.clone().requires_grad_(True) for t in (x, h, p)]
            if c is not None:
                leaves.append(c.clone().requires_grad_(True))
            cc = leaves[3] if c is not None else None
            fn = cudnn_rnn if path == "ops" else library.cudnn_rnn
            y = fn(leaves[0], leaves[1], cc, leaves[2], lens, **kw).output
        loss = (y * w).sum()
        return leaves, torch.autograd.grad(loss, leaves, create_graph=create_graph)

    return run


@pytest.mark.parametrize("seed", [0])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("path", ["ops", "library", "module"])
def test_gradient_penalty_raises_instead_of_dropping_the_term(path, mode, seed):
    """create_graph=True gives the same first-order gradients, but a loss built from them (a
    gradient penalty) raises on backward: the backprop op has no gradient (as in TensorFlow),
    and a silently constant gradient would drop the penalty's term from the update."""
    run = _second_order_case(path, mode, seed)
    _, want = run(create_graph=False)
    assert not any(t.requires_grad for t in want)
    leaves, got = run(create_graph=True)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.detach(), b)
    assert all(t.requires_grad for t in got)  # tied to the graph, not constants
    penalty = sum(t.pow(2).sum() for t in got)
    with pytest.raises(RuntimeError, match="CudnnRNNBackpropV3.*not differentiable"):
        penalty.backward()
    assert all(t.grad is None for t in leaves)


@pytest.mark.parametrize("mode", ["lstm", "rnn_tanh"])
def test_explicit_backprop_of_differentiable_tensors_is_first_order_only(mode):
    """cudnn_rnn_backprop on tensors that require grad returns the same values as on plain
    ones, whose differentiation raises; on plain tensors (or under no_grad) no graph."""
    x, h, c, p = _inputs(mode, seed=3)
    kw = dict(rnn_mode=mode, backend="reference")
    fwd = cudnn_rnn(x, h, c, p, None, **kw)
    dy = torch.randn_like(fwd.output)
    dh = torch.randn_like(fwd.output_h)
    dc = torch.randn_like(fwd.output_c) if mode == "lstm" else None
    args = (fwd.output, fwd.output_h, fwd.output_c, dy, dh, dc, fwd.reserve_space,
            fwd.host_reserved)
    plain = cudnn_rnn_backprop(x, h, c, p, None, *args, **kw)
    assert not any(t.requires_grad for t in plain)
    pl = p.clone().requires_grad_(True)
    live = cudnn_rnn_backprop(x, h, c, pl, None, *args, **kw)
    for a, b in zip(live, plain, strict=True):
        assert torch.equal(a.detach(), b)
    with pytest.raises(RuntimeError, match="CudnnRNNBackpropV3.*not differentiable"):
        live.params_backprop.sum().backward()
    with torch.no_grad():
        quiet = cudnn_rnn_backprop(x, h, c, pl, None, *args, **kw)
    assert not any(t.requires_grad for t in quiet)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
@pytest.mark.parametrize("path", ["ops", "library", "module"])
def test_torch_func_transforms_are_refused_by_name(path, transform):
    """Under torch.func.grad/vmap the ops would read wrapped tensors' storage (a cryptic
    failure deep inside): the argument the transform wrapped is named instead."""
    x, h, c, p = _inputs("lstm", seed=5)
    batch = x[None].expand(2, -1, -1, -1)
    if path == "module":
        m = LSTM(4, 4, dtype=F64, backend="reference")
        params = {k: v.detach() for k, v in m.named_parameters()}

        def of_params(ps):
            return torch.func.functional_call(m, ps, (x,))[0].sum()

        def of_input(xx):
            return m(xx)[0]

        args, name = (params, "weight_ih_l0") if transform == "grad" else (batch, "input")
    else:
        fn = cudnn_rnn if path == "ops" else library.cudnn_rnn
        kw = dict(rnn_mode="lstm", backend="reference")

        def of_params(pp):
            return fn(x, h, c, pp, **kw).output.sum()

        def of_input(xx):
            return fn(xx, h, c, p, **kw).output

        args, name = (p, "params") if transform == "grad" else (batch, "input")
    wrapped = torch.func.grad(of_params) if transform == "grad" else torch.func.vmap(of_input)
    with pytest.raises(TypeError, match=rf"^{name}: expected a plain tensor, got one "
                                           r"wrapped by a torch\.func transform"):
        wrapped(args)


# Forward-mode AD: where no input needs a reverse-mode gradient the op runs outside autograd,
# and a dual tensor's tangent was dropped without a word (a frozen module, or trainable
# weights under no_grad: tangent None where torch.nn gives one).
@pytest.mark.parametrize("case", ["ops-input", "library-input", "library-params",
                                  "module-frozen", "module-no-grad"])
def test_forward_mode_tangents_are_refused_by_name(case):
    import torch.autograd.forward_ad as fwAD

    x, h, c, p = _inputs("lstm", seed=6)
    path, what = case.split("-", 1)
    with fwAD.dual_level():
        dual_x = fwAD.make_dual(x, torch.randn_like(x))
        if path == "module":
            m = LSTM(4, 4, dtype=F64, backend="reference")
            if what == "frozen":
                m.requires_grad_(False)
            with torch.no_grad() if what == "no-grad" else contextlib.nullcontext(), \
                    pytest.raises(TypeError, match=r"^input: expected a tensor without a "
                                                      r"forward-mode tangent"):
                m(dual_x)
            return
        fn = cudnn_rnn if path == "ops" else library.cudnn_rnn
        args, name = ((dual_x, h, c, p), "input") if what == "input" else \
            ((x, h, c, fwAD.make_dual(p, torch.randn_like(p))), "params")
        with pytest.raises(TypeError, match=rf"^{name}: expected a tensor without a "
                                               r"forward-mode tangent"):
            fn(*args, rnn_mode="lstm", backend="reference")


def test_batched_gradients_through_the_ops_autograd_are_refused_by_name():
    """autograd.grad(..., is_grads_batched=True) vmaps the backward over the given gradients:
    the ops' backward names them (it failed inside the engine with vmap's alias error). The
    library op's registered autograd composes with it: per-row gradients, as one by one."""
    x, h, c, p = _inputs("lstm", seed=7)
    kw = dict(rnn_mode="lstm", backend="reference")
    pg = p.clone().requires_grad_(True)
    out = cudnn_rnn(x, h, c, pg, **kw).output
    grads = torch.randn(2, *out.shape, dtype=out.dtype)
    with pytest.raises(TypeError, match=r"^output_backprop: expected a plain tensor, got "
                                           r"one wrapped by a torch\.func transform"):
        torch.autograd.grad(out, pg, grads, is_grads_batched=True)
    out = library.cudnn_rnn(x, h, c, pg, **kw).output
    (batched,) = torch.autograd.grad(out, pg, grads, is_grads_batched=True, retain_graph=True)
    for g, row in zip(grads, batched, strict=True):
        torch.testing.assert_close(row, torch.autograd.grad(out, pg, g, retain_graph=True)[0],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", ["ops", "library"])
@pytest.mark.parametrize("used", ["output", "output_h", "output_c"])
def test_a_backward_fills_no_zeros_for_the_reserve(path, used):
    """Gradients the loss does not give stay None (set_materialize_grads(False)): autograd
    filled a reserve-sized zero tensor (and the host header's) on every backward, which the
    backward ignores. Those it needs are zeros where not given: the gradients equal the
    explicit backprop's with zero gradients for the unused outputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Fills(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ in ("zeros", "zeros_like", "zero_", "fill_",
                                                 "new_zeros", "full", "full_like"):
                self.sizes.append((out.numel(), out.dtype))
            return out

    x, h, c, p = _inputs("lstm", seed=8)
    pg = p.clone().requires_grad_(True)
    fn = cudnn_rnn if path == "ops" else library.cudnn_rnn
    kw = dict(rnn_mode="lstm", backend="reference")
    out = fn(x, h, c, pg, **kw)
    fills = Fills()
    with fills:
        (got,) = torch.autograd.grad(getattr(out, used).sum(), pg)
    reserve = (out.reserve_space.numel(), out.reserve_space.dtype)
    host = (out.host_reserved.numel(), out.host_reserved.dtype)
    assert reserve not in fills.sizes and host not in fills.sizes
    grads = [torch.ones_like(t) if name == used else torch.zeros_like(t)
             for name, t in (("output", out.output), ("output_h", out.output_h),
                             ("output_c", out.output_c))]
    want = cudnn_rnn_backprop(x, h, c, p, None, out.output.detach(), out.output_h.detach(),
                              out.output_c.detach(), *grads, out.reserve_space,
                              out.host_reserved, **kw).params_backprop
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _strided_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values in a non-contiguous view (every other element of a buffer twice as long)."""
    out = torch.zeros(2 * t.numel(), dtype=t.dtype)[::2].view(t.shape)
    out.copy_(t)
    assert not out.is_contiguous()
    return out


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("mode, case", [
    ("lstm", "batch_major"), ("gru", "batch_major"),
    ("lstm", "all_lengths_0"), ("rnn_tanh", "all_lengths_0"),
    ("lstm", "strided_params"), ("rnn_relu", "strided_params"),
])
def test_explicit_backprop_against_the_float64_oracle(mode, case, backend):
    """cudnn_rnn_backprop called TF style, from the reserve alone, against torch.nn in
    float64, in the cases the spec states and the autograd tests do not reach: batch-major
    tensors (the states really batch-major, [B, L*D, Hout]), every length 0 (every state
    passes through, every output and input gradient 0) and params as a strided view.
    backend="triton" runs the kernels (the interpreter on the CPU) in float32."""
    T, lens_list = 4, [0, 0, 0] if case == "all_lengths_0" else [3, 4, 1]
    time_major = case != "batch_major"
    module, x, h0, c0, lens = make_case(mode, 3, 5, 2, True, 0, T, lens_list, time_major)
    params = params_from_module(module)
    g = torch.Generator().manual_seed(7)
    dy = torch.randn(*x.shape[:2], 2 * 5, generator=g, dtype=F64)
    dh = torch.randn(h0.shape, generator=g, dtype=F64)
    dc = torch.randn(c0.shape, generator=g, dtype=F64) if c0 is not None else None
    want = torch_oracle(module, x, h0, c0, lens, time_major, (dy, dh, dc))
    dt, tol = (torch.float32, 2e-5) if backend == "triton" else (F64, 1e-10)
    cast = lambda t: None if t is None else t.to(dt)  # noqa: E731
    p = _strided_copy(cast(params)) if case == "strided_params" else cast(params)
    kw = dict(rnn_mode=mode, direction="bidirectional", time_major=time_major,
              backend=backend)
    fwd = cudnn_rnn(cast(x), cast(h0), cast(c0), p, lens, **kw)
    bp = cudnn_rnn_backprop(cast(x), cast(h0), cast(c0), p, lens, fwd.output, fwd.output_h,
                            fwd.output_c, cast(dy), cast(dh), cast(dc), fwd.reserve_space,
                            fwd.host_reserved, **kw)
    close = lambda got, exp: torch.testing.assert_close(  # noqa: E731
        got.double(), exp, rtol=tol, atol=tol)
    close(fwd.output, want["output"])
    close(fwd.output_h, want["output_h"])
    close(bp.input_backprop, want["dx"])
    close(bp.input_h_backprop, want["dh0"])
    close(bp.params_backprop, params_from_module(module, tensors=want["dparams"]))
    if mode == "lstm":
        close(fwd.output_c, want["output_c"])
        close(bp.input_c_backprop, want["dc0"])
    else:
        assert fwd.output_c.numel() == 0 and bp.input_c_backprop.numel() == 0
    if case == "all_lengths_0":
        assert torch.equal(fwd.output, torch.zeros_like(fwd.output))
        assert torch.equal(bp.input_backprop, torch.zeros_like(bp.input_backprop))
        assert torch.equal(fwd.output_h, cast(h0)) and torch.equal(bp.input_h_backprop,
                                                                  cast(dh))
    assert bp.params_backprop.shape == p.shape


@pytest.mark.parametrize("lengths", [[6, 1, 0, 4], [6, 6, 6, 6]], ids=["varlen", "full"])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_reserve_size_within_budget(mode, lengths):
    """Reserve bytes = header + N*D*(L*H [lstm] + (L-1)*H) elements; N = sum(lengths). The
    planner's reserve (what it budgets for T x B) is that at full lengths, and above it with
    shorter ones."""
    L, D, H = 3, 2, 4
    x, h, c, p = _inputs(mode, T=6, B=4, L=L, D=D, H=H)
    lens = torch.tensor(lengths)
    N = int(lens.sum())
    fwd = cudnn_rnn(x, h, c, p, lens, rnn_mode=mode, direction="bidirectional",
                    backend="reference")
    elems = N * D * ((L if mode == "lstm" else 0) * H + (L - 1) * H)
    assert fwd.reserve_space.numel() == reserve_mod.PAYLOAD_OFFSET + elems * 8
    assert fwd.reserve_space.dtype == torch.uint8 and fwd.host_reserved.numel() == 64
    planned = plan_for(rnn_mode=mode, input_size=x.shape[-1], num_units=H, num_layers=L,
                       direction="bidirectional", batch=4, max_time=6, dtype=x.dtype,
                       device_properties="h100").reserve_bytes
    if N == 6 * 4:
        assert planned == fwd.reserve_space.numel()
    else:
        assert planned > fwd.reserve_space.numel()


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_batch_major_final_states_edited_in_place_before_backward(mode, backend):
    """Batch-major final states are the caller's own tensors, not views of the op's
    time-major ones: editing them in place before the backward (torch.nn allows it for h_n
    and c_n) works, and the gradients are the time-major call's with the same edit, and
    both are those of the same edit made out of place (a fault both layouts shared would
    pass the first comparison alone)."""
    dtype = F64 if backend == "reference" else torch.float32
    x, h, c, p = _inputs(mode, T=4, B=3, L=2, seed=7, dtype=dtype)
    lens = torch.tensor([4, 1, 3])
    grads = []
    for time_major, in_place in ((True, True), (False, True), (True, False)):
        tm = (lambda t: t) if time_major else (lambda t: t.transpose(0, 1).contiguous())
        leaves = [t.clone().requires_grad_() for t in (x, h, c, p) if t is not None]
        xs, hs, *rest = leaves
        cs = rest[0] if c is not None else None
        res = cudnn_rnn(tm(xs), tm(hs), tm(cs) if cs is not None else None, rest[-1], lens,
                        rnn_mode=mode, time_major=time_major, backend=backend)
        states = [res.output_h] + ([res.output_c] if c is not None else [])
        if in_place:
            for st in states:
                st.mul_(2.0)
        else:
            states = [2.0 * st for st in states]
        loss = (res.output * res.output).sum() + sum((st * st).sum() for st in states)
        grads.append(torch.autograd.grad(loss, leaves))
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12 if dtype == F64 else 1e-5,
                                       atol=1e-12 if dtype == F64 else 1e-5)


def _a_reserve_layout(device="cpu"):
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.packing import make_pack_info

    cfg = make_config(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3, dropout=0.5,
                      seed=2**40 + 7, seed2=-3)
    info = make_pack_info([5, 0, 3], 5, torch.device(device))
    return reserve_mod.reserve_layout(cfg, info, torch.float32)


def test_a_reserve_header_written_during_a_capture_is_the_same_bytes(monkeypatch):
    """Under a CUDA graph capture the header is written by device fills (a host copy would
    be replayed from a buffer the capture does not keep): the same 64 bytes as the copy,
    fingerprint and all (a dropout call's, past int32), and host_reserved the same."""
    layout = _a_reserve_layout()
    reserve, host = reserve_mod.allocate(layout, torch.device("cpu"))
    monkeypatch.setattr(reserve_mod, "capturing", lambda device: True)
    filled, filled_host = reserve_mod.allocate(layout, torch.device("cpu"))
    assert torch.equal(filled[:reserve_mod.HEADER_BYTES], reserve[:reserve_mod.HEADER_BYTES])
    assert torch.equal(filled[:reserve_mod.HEADER_BYTES].view(torch.int8), host)
    assert torch.equal(filled_host, host)
    assert torch.equal(filled[reserve_mod.HEADER_BYTES:reserve_mod.PAYLOAD_OFFSET],
                       torch.zeros(reserve_mod.PAYLOAD_OFFSET - reserve_mod.HEADER_BYTES,
                                   dtype=torch.uint8))
    assert int(host.view(torch.int64)[0]) == reserve_mod.MAGIC
    assert int(host.view(torch.int64)[2]) == layout.fingerprint


@pytest.mark.gpu
def test_a_reserve_is_allocated_without_a_host_sync():
    """A GPU copies the header from pinned memory: no stream sync (from pageable memory the
    copy may wait for the stream), and the bytes are the host's."""
    layout = _a_reserve_layout("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        reserve, host = reserve_mod.allocate(layout, torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(reserve[:reserve_mod.HEADER_BYTES].cpu().view(torch.int8), host)


def test_inference_mode_keeps_no_reserve_and_backprop_says_so():
    x, h, c, p = _inputs("lstm")
    fwd = cudnn_rnn(x, h, c, p, rnn_mode="lstm", is_training=False, backend="reference")
    train = cudnn_rnn(x, h, c, p, rnn_mode="lstm", backend="reference")
    assert fwd.reserve_space.numel() == 0
    assert torch.equal(fwd.output, train.output)
    with pytest.raises(ValueError, match="is_training=False"):
        cudnn_rnn_backprop(x, h, c, p, None, fwd.output, fwd.output_h, fwd.output_c,
                           fwd.output, fwd.output_h, fwd.output_c, fwd.reserve_space,
                           fwd.host_reserved, rnn_mode="lstm", backend="reference")
    xs = x.clone().requires_grad_(True)
    out = cudnn_rnn(xs, h, c, p, rnn_mode="lstm", is_training=False, backend="reference")
    with pytest.raises(ValueError, match="is_training"):
        out.output.sum().backward()


def test_params_helpers_take_tensorflows_dropout_attributes():
    """TensorFlow's params ops carry dropout, seed and seed2 too: taken, checked as the RNN
    ops check them, and without effect on the layout."""
    kw = dict(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3, num_proj=2)
    tf = dict(dropout=0.5, seed=7, seed2=-3)
    n = params_size(**kw)
    assert params_size(**kw, **tf) == n
    p = torch.randn(n, dtype=F64)
    w, b = params_to_canonical(p, **kw, **tf)
    assert all(torch.equal(x, y) for x, y in zip(w + b, sum(params_to_canonical(p, **kw), []),
                                                  strict=True))
    assert torch.equal(canonical_to_params(w, b, **kw, **tf), p)
    with pytest.raises(ValueError, match=r"dropout: expected a float in \[0, 1\), got 1.5"):
        params_size(**kw, dropout=1.5)
    with pytest.raises(TypeError, match=r"seed2: expected an int, got str '1'"):
        params_to_canonical(p, **kw, seed2="1")


@pytest.mark.parametrize("L, dropout", [(1, 0.5), (2, 0.0)])
def test_reserve_ignores_seeds_where_no_mask_is_applied(L, dropout):
    """Without a dropout mask (dropout = 0, or one layer) the seeds change nothing: a backprop
    given other seeds takes the reserve and gives the same gradients. With a mask it is
    another forward, and the reserve is rejected."""
    x, h, c, p = _inputs("lstm", L=L)
    fwd = cudnn_rnn(x, h, c, p, rnn_mode="lstm", dropout=dropout, seed=1, seed2=2,
                    backend="reference")
    args = (x, h, c, p, None, fwd.output, fwd.output_h, fwd.output_c, fwd.output,
            fwd.output_h, fwd.output_c, fwd.reserve_space, fwd.host_reserved)
    want = cudnn_rnn_backprop(*args, rnn_mode="lstm", dropout=dropout, seed=1, seed2=2,
                              backend="reference")
    got = cudnn_rnn_backprop(*args, rnn_mode="lstm", dropout=dropout, seed=7, seed2=8,
                             backend="reference")
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    x, h, c, p = _inputs("lstm", L=2)
    fwd = cudnn_rnn(x, h, c, p, rnn_mode="lstm", dropout=0.5, seed=1, backend="reference")
    args = (x, h, c, p, None, fwd.output, fwd.output_h, fwd.output_c, fwd.output,
            fwd.output_h, fwd.output_c, fwd.reserve_space, fwd.host_reserved)
    with pytest.raises(ValueError, match="host_reserved: .*it is from another forward"):
        cudnn_rnn_backprop(*args, rnn_mode="lstm", dropout=0.5, seed=2, backend="reference")


def test_reserve_from_another_configuration_is_rejected():
    x, h, c, p = _inputs("lstm", B=3)
    a = cudnn_rnn(x, h, c, p, torch.tensor([5, 4, 3]), rnn_mode="lstm", backend="reference")
    b = cudnn_rnn(x, h, c, p, torch.tensor([5, 3, 4]), rnn_mode="lstm", backend="reference")
    args = (x, h, c, p, torch.tensor([5, 4, 3]), a.output, a.output_h, a.output_c, a.output,
            a.output_h, a.output_c)
    # Same size, other lengths: caught by the header (host copy and device copy).
    fields = [b.host_reserved.view(torch.int64)[i].item() for i in (2, 3, 4)]
    mine = a.host_reserved.view(torch.int64)[2].item()
    got = (rf"got fingerprint {fields[0]} \(version 1, N={fields[1]}, {fields[2]} payload "
           r"elements\): it is from another forward")
    expected = rf"expected the header of a forward .*\(fingerprint {mine}, version 1, N=12,"
    with pytest.raises(ValueError, match=rf"host_reserved: {expected}.*{got}"):
        cudnn_rnn_backprop(*args, b.reserve_space, b.host_reserved, backend="reference")
    with pytest.raises(ValueError, match=rf"reserve_space: {expected}.*{got}"):
        cudnn_rnn_backprop(*args, b.reserve_space, None, backend="reference")
    with pytest.raises(ValueError, match="host_reserved: .*got no valid header"):
        cudnn_rnn_backprop(*args, a.reserve_space, torch.zeros_like(a.host_reserved),
                           backend="reference")
    # The header's bytes as uint8 are the same header; read back, they give the same gradients.
    want = cudnn_rnn_backprop(*args, a.reserve_space, a.host_reserved, backend="reference")
    got = cudnn_rnn_backprop(*args, a.reserve_space, a.host_reserved.view(torch.uint8),
                             backend="reference")
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    with pytest.raises(ValueError, match="bytes"):
        cudnn_rnn_backprop(*args, a.reserve_space[:-8], None, backend="reference")
    with pytest.raises(TypeError, match="uint8"):
        cudnn_rnn_backprop(*args, a.reserve_space.float(), None, backend="reference")
    with pytest.raises(ValueError, match=r"1-D uint8 tensor from cudnn_rnn, got torch.uint8 "
                                         r"of shape \[2, "):  # a bad rank is a ValueError
        cudnn_rnn_backprop(*args, a.reserve_space.view(2, -1), None, backend="reference")
    # An empty tensor of another dtype is not an is_training=False reserve: the dtype is named.
    with pytest.raises(TypeError, match=r"1-D uint8 tensor from cudnn_rnn, got torch.float32 "
                                        r"of shape \[0\]"):
        cudnn_rnn_backprop(*args, torch.empty(0), None, backend="reference")
    with pytest.raises(ValueError, match="no valid header"):
        cudnn_rnn_backprop(*args, torch.zeros_like(a.reserve_space), None, backend="reference")


# ----------------------------------------------------------------------------- dropout


def _dropout_run(seed, seed2, x, h, c, p):
    return cudnn_rnn(x, h, c, p, torch.tensor([5, 2, 4]), rnn_mode="lstm", dropout=0.5,
                     seed=seed, seed2=seed2, backend="reference")


def test_dropout_is_deterministic_and_seeded():
    x, h, c, p = _inputs("lstm", L=3, H=8)
    a = _dropout_run(1, 2, x, h, c, p)
    b = _dropout_run(1, 2, x, h, c, p)
    other = _dropout_run(1, 3, x, h, c, p)
    off = cudnn_rnn(x, h, c, p, torch.tensor([5, 2, 4]), rnn_mode="lstm", dropout=0.5, seed=1,
                    seed2=2, is_training=False, backend="reference")
    none = cudnn_rnn(x, h, c, p, torch.tensor([5, 2, 4]), rnn_mode="lstm", backend="reference")
    assert torch.equal(a.output, b.output) and torch.equal(a.reserve_space, b.reserve_space)
    assert not torch.equal(a.output, other.output)
    assert not torch.equal(a.output, _dropout_run(4, 2, x, h, c, p).output)  # seed counts too
    assert torch.equal(off.output, none.output)  # no dropout when is_training=False
    assert not torch.equal(a.output, none.output)


def test_dropout_mask_rate_and_scale():
    from tritonrnn.rnn import dropout as dmod
    from tritonrnn.rnn.packing import make_pack_info

    info = make_pack_info([64] * 32, 64, torch.device("cpu"))
    # Each of seed, seed2 and the layer draws another mask.
    mask = dmod.keep_mask(info, 64, 0.5, 7, 8, 0)
    for other in ((9, 8, 0), (7, 9, 0), (7, 8, 1)):
        assert not torch.equal(mask, dmod.keep_mask(info, 64, 0.5, *other)), other
    for p in (0.1, 0.5, 0.9):
        keep = dmod.keep_mask(info, 64, p, 7, 8, 0)
        rate = 1 - keep.double().mean().item()
        assert abs(rate - p) < 0.01, (p, rate)
    x = torch.ones(info.N, 64, dtype=F64)
    y = dmod.apply(x, dmod.keep_mask(info, 64, 0.25, 7, 8, 0), 0.25)
    assert set(torch.unique(y).tolist()) == {0.0, 1 / 0.75}
    # Independent of the other sequences' lengths: position (t, b, ch) fixes the bit.
    short = make_pack_info([64] * 31 + [3], 64, torch.device("cpu"))
    full = dmod.keep_mask(info, 64, 0.5, 1, 2, 1)
    part = dmod.keep_mask(short, 64, 0.5, 1, 2, 1)
    pairs = lambda pi: zip(pi.row_time.tolist(), pi.row_batch.tolist(), strict=True)  # noqa: E731
    rows_full = {tb: i for i, tb in enumerate(pairs(info))}
    for i, (t, b) in enumerate(pairs(short)):
        assert torch.equal(part[i], full[rows_full[(t, b)]])


def test_dropout_matches_manual_stack():
    """Dropout sits between layers: layer 2 sees mask * y1 / (1 - p)."""
    from tritonrnn.rnn import dropout as dmod
    from tritonrnn.rnn.packing import make_pack_info, pack

    module, x, h0, c0, lens = make_case("gru", 3, 4, 2, False, 0, 5, [5, 3], True)
    p = params_from_module(module)
    got = cudnn_rnn(x, h0, None, p, lens, rnn_mode="gru", dropout=0.3, seed=5, seed2=6,
                    backend="reference")
    l0 = torch.nn.GRU(3, 4).double()
    l1 = torch.nn.GRU(4, 4).double()
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(l0, name + "_l0").data.copy_(getattr(module, name + "_l0"))
        getattr(l1, name + "_l0").data.copy_(getattr(module, name + "_l1"))
    y0 = torch.zeros(5, 2, 4, dtype=F64)
    with torch.no_grad():
        y0[:, 0], h_a = l0(x[:, 0], h0[0, :1])
        y0[:3, 1], h_b = l0(x[:3, 1], h0[0, 1:])
    info = make_pack_info([5, 3], 5, torch.device("cpu"))
    mask = dmod.keep_mask(info, 4, 0.3, 5, 6, 0)
    x1 = torch.zeros_like(y0).view(10, 4)
    x1[info.padded_index] = dmod.apply(pack(y0, info), mask, 0.3)
    x1 = x1.view(5, 2, 4)
    with torch.no_grad():
        out0, _ = l1(x1[:, 0], h0[1, :1])
        out1, _ = l1(x1[:3, 1], h0[1, 1:])
    torch.testing.assert_close(got.output[:, 0], out0, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got.output[:3, 1], out1, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_gradcheck_with_dropout(mode):
    """Finite differences of the whole op with dropout on (the mask is a function of the
    seeds, so the op is deterministic and differentiable)."""
    x, h, c, p = _inputs(mode, T=3, B=2, I=2, H=2, L=2, D=2)
    lens = torch.tensor([3, 2])
    leaves = [t.clone().requires_grad_(True) for t in (x, h, p)]
    cc = c.clone().requires_grad_(True) if c is not None else None

    def f(x_, h_, p_, *c_):
        out = cudnn_rnn(x_, h_, c_[0] if c_ else None, p_, lens, rnn_mode=mode, dropout=0.4,
                        seed=3, seed2=4, direction="bidirectional", backend="reference")
        return out.output, out.output_h, *( (out.output_c,) if c_ else ())

    assert torch.autograd.gradcheck(f, (*leaves, *([cc] if cc is not None else [])),
                                    eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_tiny(mode):
    P = 2 if mode == "lstm" else 0  # LSTM with a projection of P = H
    x, h, c, p = _inputs(mode, T=3, B=2, I=2, H=2, P=P)
    lens = torch.tensor([3, 1])

    def f(x_, h_, p_, *c_):
        out = cudnn_rnn(x_, h_, c_[0] if c_ else None, p_, lens, rnn_mode=mode, num_proj=P,
                        backend="reference")
        return out.output, out.output_h, *((out.output_c,) if c_ else ())

    leaves = [t.clone().requires_grad_(True) for t in (x, h, p)]
    if c is not None:
        leaves.append(c.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(f, tuple(leaves), eps=1e-6, atol=1e-6)


def test_float32_close_to_float64_oracle():
    errors = compare_with_torch("lstm", L=2, bidirectional=True, dtype=torch.float32,
                                rtol=1e-5, atol=1e-5)
    assert max(errors.values()) < 1e-5


def test_pack_info_refuses_more_rows_than_int32_offsets_hold():
    # 4096 sequences of 2^19 steps: 2^31 packed rows, one more than the kernels' int32
    # offsets hold. Refused from the lengths alone, before any tensor of N rows exists.
    from tritonrnn.rnn.packing import make_pack_info

    with pytest.raises(ValueError, match=r"sequence_lengths: .* at most 2147483647 .* got "
                                         r"2147483648"):
        make_pack_info([2**19] * 4096, 2**19, torch.device("cpu"))



def test_an_input_of_more_rows_than_int32_offsets_hold_is_named():
    """Without sequence_lengths the rows are the input's max time x batch: the error names
    the input (an expanded tensor: no memory)."""
    H = 2
    p = torch.zeros(params_size(rnn_mode="gru", num_layers=1, num_units=H, input_size=1))
    x = torch.zeros(1, 1, 1).expand(2**16, 2**15 + 8, 1)
    with pytest.raises(ValueError, match=r"^input: expected max time x batch of at most "
                                         r"2147483647 .* got 65536 x 32776 = 2148007936$"):
        cudnn_rnn(x, torch.zeros(1, 2**15 + 8, H), None, p, rnn_mode="gru",
                  backend="reference", is_training=False)
