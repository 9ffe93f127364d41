"""Autograd through TensorArray ops, checked against the same computation in plain torch.

Rules (TensorFlow's): read<->write, gather<->scatter (duplicates add), stack<->unstack,
concat<->split; flow orders every read's backward before its write's backward.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tritonrnn.tensorarray import (
    AUTOGRAD_SOURCE_PREFIX,
    TensorArray,
    TensorArrayClosedError,
    TensorArrayGradError,
    TensorArrayIndexError,
    TensorArrayRegistry,
)

FLOAT_DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
STORAGES = ["slab", "list"]
TOL = {
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
    torch.float32: dict(rtol=1e-6, atol=1e-6),
    torch.float64: dict(rtol=1e-12, atol=1e-12),
}


def leaf(shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device).requires_grad_()


def array(dtype, size, storage, elem, device="cpu", **kw) -> TensorArray:
    if storage == "slab":
        kw.setdefault("element_shape", elem)
    return TensorArray(dtype, size, device=device, **kw)


def grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, inputs, allow_unused=False))


# --------------------------------------------------------------------- single rules


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_write_read(dtype, storage, device):
    xs = [leaf((3, 5), dtype, device) for _ in range(4)]
    ws = [torch.randn(3, 5, dtype=dtype, device=device) for _ in range(4)]
    ta = array(dtype, 4, storage, (3, 5), device)
    for i, x in enumerate(xs):
        ta = ta.write(i, x * 2)
    reads = {i: ta.read(i) for i in (2, 0, 3, 1)}
    loss = sum((reads[i] * ws[i]).sum() for i in range(4))
    got = grads(loss, xs)
    for g, w in zip(got, ws, strict=True):
        torch.testing.assert_close(g, 2 * w, **TOL[dtype])


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_unstack_stack(dtype, storage, device):
    x = leaf((7, 3, 5), dtype, device)
    w = torch.randn(7, 3, 5, dtype=dtype, device=device)
    y = array(dtype, 7, storage, (3, 5), device).unstack(x * 3).stack()
    torch.testing.assert_close(y, x.detach() * 3, **TOL[dtype])
    (got,) = grads((y * w).sum(), [x])
    torch.testing.assert_close(got, 3 * w, **TOL[dtype])


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_scatter_gather_with_duplicates(dtype, storage):
    x = leaf((5, 2), dtype)
    perm = [3, 0, 4, 1, 2]
    ta = array(dtype, 5, storage, (2,), clear_after_read=False).scatter(perm, x)
    idx = [1, 4, 4, 0, 4]
    w = torch.randn(5, 2, dtype=dtype)
    out = ta.gather(idx)
    # Plain torch: element perm[k] of the array is x[k].
    inv = torch.empty(5, dtype=torch.long)
    inv[torch.tensor(perm)] = torch.arange(5)
    x_ref = x.detach().clone().requires_grad_()
    ref = x_ref[inv][idx]
    torch.testing.assert_close(out, ref.detach(), rtol=0, atol=0)
    (got,) = grads((out * w).sum(), [x])
    (expect,) = grads((ref * w).sum(), [x_ref])
    torch.testing.assert_close(got, expect, **TOL[dtype])


@pytest.mark.parametrize("storage", STORAGES)
def test_write_then_gather_and_scatter_then_read(storage):
    xs = [leaf((2,)) for _ in range(4)]
    ta = array(torch.float32, 4, storage, (2,), clear_after_read=False)
    for i, x in enumerate(xs):
        ta = ta.write(i, x)
    g = ta.gather([3, 1, 3])
    v = leaf((3, 2))
    tb = array(torch.float32, 3, storage, (2,)).scatter([2, 0, 1], v)
    loss = (g * torch.tensor([[1.0], [2.0], [3.0]])).sum() + tb.read(0).sum() * 5
    got = grads(loss, [*xs, v])
    torch.testing.assert_close(got[3], torch.full((2,), 4.0))
    torch.testing.assert_close(got[1], torch.full((2,), 2.0))
    torch.testing.assert_close(got[0], torch.zeros(2))
    torch.testing.assert_close(got[4], torch.tensor([[0.0, 0], [5, 5], [0, 0]]))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_split_concat(dtype):
    x = leaf((10, 3), dtype)
    lengths = [3, 0, 5, 2]
    y = TensorArray(dtype, 4).split(x * 2, lengths).concat()
    w = torch.randn(10, 3, dtype=dtype)
    (got,) = grads((y * w).sum(), [x])
    torch.testing.assert_close(got, 2 * w, **TOL[dtype])


def test_split_then_read_pieces():
    x = leaf((6, 2))
    ta = TensorArray(torch.float32, 3).split(x, [1, 2, 3])
    loss = ta.read(2).sum() * 3 + ta.read(0).sum()
    (got,) = grads(loss, [x])
    expect = torch.tensor([[1.0, 1], [0, 0], [0, 0], [3, 3], [3, 3], [3, 3]])
    torch.testing.assert_close(got, expect)


def test_write_then_concat():
    a, b = leaf((2, 4)), leaf((3, 4))
    y = TensorArray(torch.float32, 2).write(0, a).write(1, b).concat()
    w = torch.randn(5, 4)
    ga, gb = grads((y * w).sum(), [a, b])
    torch.testing.assert_close(ga, w[:2])
    torch.testing.assert_close(gb, w[2:])


def test_split_into_slab_backed_array():
    x = leaf((6, 3))
    ta = TensorArray(torch.float32, 3, element_shape=(2, 3)).split(x, [2, 2, 2])
    w = torch.randn(6, 3)
    (got,) = grads((ta.concat() * w).sum(), [x])
    torch.testing.assert_close(got, w)


# ---------------------------------------------------------------- the autograd cases


@pytest.mark.parametrize("storage", STORAGES)
def test_value_read_twice_gets_the_sum(storage):
    x = leaf((3,))
    ta = array(torch.float32, 2, storage, (3,), clear_after_read=False).write(0, torch.ones(3))
    ta = ta.write(1, x)
    loss = ta.read(1).sum() * 2 + ta.read(1).sum() * 5 + ta.stack()[1].sum() * 11
    (got,) = grads(loss, [x])
    torch.testing.assert_close(got, torch.full((3,), 18.0))


@pytest.mark.parametrize("storage", STORAGES)
def test_unread_elements_get_zero_gradient(storage):
    xs = [leaf((2, 2)) for _ in range(3)]
    ta = array(torch.float32, 3, storage, (2, 2))
    for i, x in enumerate(xs):
        ta = ta.write(i, x)
    ta.read(1).sum().backward()
    torch.testing.assert_close(xs[0].grad, torch.zeros(2, 2), rtol=0, atol=0)
    torch.testing.assert_close(xs[1].grad, torch.ones(2, 2), rtol=0, atol=0)
    torch.testing.assert_close(xs[2].grad, torch.zeros(2, 2), rtol=0, atol=0)


@pytest.mark.parametrize("storage", STORAGES)
def test_two_backward_passes_each_get_the_exact_gradient(storage):
    x = leaf((4, 3))
    w = torch.randn(4, 3)
    ta = array(torch.float32, 4, storage, (3,), clear_after_read=False).unstack(x)
    loss = (ta.stack() * w).sum() + (ta.read(2) * w[2]).sum()
    expect = w.clone()
    expect[2] *= 2
    first = torch.autograd.grad(loss, [x], retain_graph=True)[0]
    second = torch.autograd.grad(loss, [x], retain_graph=True)[0]
    torch.testing.assert_close(first, expect, rtol=0, atol=0)
    torch.testing.assert_close(second, expect, rtol=0, atol=0)
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * expect, rtol=0, atol=0)


def _grads_probe(ta: TensorArray, seen: list, fail: bool = False):
    """An identity whose backward records the names of `ta`'s gradient arrays at that point
    of the pass in `seen`, then raises if `fail`."""

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            return v.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(list(ta.handle._res.grads))
            if fail:
                raise RuntimeError("boom")
            return g

    return Probe


def test_gradient_arrays_of_a_pass_are_freed_when_it_ends():
    reg = TensorArrayRegistry()
    x = leaf((3, 2))
    ta = TensorArray(torch.float32, 3, registry=reg).unstack(x)
    ta.stack().sum().backward()
    assert reg.names() == [ta.handle.name]
    assert ta.handle._res.grads == {}
    # During the pass, the gradient array exists under a source derived from the pass.
    seen: list[list[str]] = []
    ta2 = TensorArray(torch.float32, 1, registry=reg)
    ta2 = ta2.write(0, _grads_probe(ta2, seen).apply(x[0]))
    ta2.read(0).sum().backward()
    assert len(seen) == 1 and len(seen[0]) == 1
    assert seen[0][0].startswith(AUTOGRAD_SOURCE_PREFIX)
    assert ta2.handle._res.grads == {}


@pytest.mark.parametrize("failing", ["another_node", "concat_gradient"])
def test_gradient_arrays_of_a_failed_pass_are_freed_too(failing):
    """The autograd engine drops its queued callbacks uncalled when a node raises: the
    gradient array the pass had made stayed open and registered, one more per failed pass,
    for as long as the forward array lived. It is closed with the failed pass; a later pass
    gets its exact gradient."""
    reg = TensorArrayRegistry()
    x = leaf((3, 2))
    ta = TensorArray(torch.float32, 0, dynamic_size=True, clear_after_read=False,
                     registry=reg)
    seen: list[list[str]] = []
    if failing == "another_node":
        # Made first, so its backward runs after the array's, and raises.
        boom = _grads_probe(ta, seen, fail=True).apply(x)
        ta = ta.write(0, x[0] * 1).write(1, x[1] * 2).write(2, x[2] * 3)
        loss, error = ta.stack().sum() + boom.sum(), RuntimeError
    else:  # read's backward makes the gradient array, then concat's raises (the array grew)
        ta = ta.write(0, x[:1] * 1).write(1, x[1:] * 1)
        v = ta.concat()
        ta = ta.write(2, x[:1] * 2)
        loss, error = v.sum() + ta.read(2).sum(), TensorArrayGradError
    for _ in range(3):
        with pytest.raises(error):
            loss.backward(retain_graph=True)
        assert ta.handle._res.grads == {}
        assert reg.names() == [ta.handle.name]
    if failing == "another_node":
        assert len(seen) == 3 and all(len(names) == 1 for names in seen)
    (g,) = grads(ta.read(1).sum() * 5, [x])
    torch.testing.assert_close(g[1], torch.full((2,), 10.0 if failing == "another_node"
                                                else 5.0))
    assert ta.handle._res.grads == {} and reg.names() == [ta.handle.name]


def test_autograd_grad_with_selected_inputs():
    a, b = leaf((2,)), leaf((2,))
    ta = TensorArray(torch.float32, 2).write(0, a * 3).write(1, b * 5)
    y = ta.stack()
    (ga,) = torch.autograd.grad(y.sum(), [a])
    torch.testing.assert_close(ga, torch.full((2,), 3.0))


def test_old_objects_and_unassigned_writes_still_order_the_backward():
    a, b, c = leaf((2,)), leaf((2,)), leaf((2,))
    ta = TensorArray(torch.float32, 3)
    ta.write(0, a)  # result dropped: the write still happened on the shared handle
    ta1 = ta.write(1, b)
    ta.write(2, c)  # branch from an old object
    y = ta1.stack()  # an object created before the write of c
    w = torch.tensor([[1.0], [2.0], [3.0]])
    ga, gb, gc = grads((y * w).sum(), [a, b, c])
    torch.testing.assert_close(ga, torch.full((2,), 1.0))
    torch.testing.assert_close(gb, torch.full((2,), 2.0))
    torch.testing.assert_close(gc, torch.full((2,), 3.0))


def test_values_without_history_read_without_history():
    ta = TensorArray(torch.float32, 2).write(0, torch.ones(2)).write(1, leaf((2,)))
    assert not ta.read(0).requires_grad
    assert ta.read(1).requires_grad
    ints = TensorArray(torch.int64, 1).write(0, torch.arange(3))
    assert not ints.stack().requires_grad


def test_mixed_history_in_one_stack():
    x = leaf((2,))
    ta = TensorArray(torch.float32, 3, element_shape=(2,)).write(0, torch.ones(2)).write(2, x)
    y = ta.stack()  # index 1 unwritten: zeros
    assert y.requires_grad
    (gx,) = grads((y * torch.tensor([[1.0], [2.0], [3.0]])).sum(), [x])
    torch.testing.assert_close(gx, torch.full((2,), 3.0))


def test_no_grad_mode_records_nothing():
    x = leaf((2,))
    with torch.no_grad():
        ta = TensorArray(torch.float32, 1).write(0, x)
    assert not ta.read(0).requires_grad


def test_value_history_is_preserved_through_chained_arrays():
    x = leaf((4, 3))
    src = TensorArray(torch.float32, 4).unstack(x)
    dst = TensorArray(torch.float32, 4, element_shape=(3,))
    for t in range(4):
        dst = dst.write(3 - t, torch.sin(src.read(t)))
    y = dst.stack()
    x_ref = x.detach().clone().requires_grad_()
    ref = torch.sin(x_ref).flip(0)
    torch.testing.assert_close(y, ref.detach())
    w = torch.randn(4, 3)
    torch.testing.assert_close(grads((y * w).sum(), [x])[0], grads((ref * w).sum(), [x_ref])[0])


def test_gradcheck_float64():
    def fn(x, v):
        ta = TensorArray(torch.float64, 4, clear_after_read=False).unstack(x * x)
        tb = TensorArray(torch.float64, 2, clear_after_read=False).split(v, [1, 2])
        out = ta.gather([0, 2, 2]) * 2 + ta.read(3)
        return out.sum(0) * tb.concat().sum(0) + tb.read(1).sum(0)

    x = leaf((4, 3), torch.float64)
    v = leaf((3, 3), torch.float64)
    assert torch.autograd.gradcheck(fn, (x, v))


def test_concat_grad_with_unread_pieces():
    x = leaf((5, 2))
    ta = TensorArray(torch.float32, 2).split(x, [2, 3])
    tb = TensorArray(torch.float32, 2).write(0, ta.read(1)).write(1, ta.read(0) * 0 + 1)
    (gx,) = grads(tb.read(0).sum(), [x])
    torch.testing.assert_close(gx, torch.tensor([[0.0, 0], [0, 0], [1, 1], [1, 1], [1, 1]]))


# -------------------------------------------------------------- errors and freezing


def test_concat_of_an_array_that_grew_afterwards_names_the_forward_array():
    # TensorFlow's concat gradient splits the gradient array, which has the array's size at
    # the backward: after growth the lengths cannot cover it (TensorFlow fails there too).
    xs = [leaf((2, 3)) for _ in range(3)]
    ta = TensorArray(torch.float32, 0, dynamic_size=True, clear_after_read=False, name="grow")
    ta = ta.write(0, xs[0]).write(1, xs[1])
    v = ta.concat()
    ta = ta.write(2, xs[2])
    with pytest.raises(TensorArrayGradError) as info:
        v.sum().backward()
    msg = str(info.value)
    assert msg.startswith(f"TensorArray {ta.handle.name!r}: gradient of concat(): expected the "
                          "array's size at the concat, 2, got 3 elements"), msg
    assert "it grew after the concat" in msg
    # Concat after the growth: every element has its gradient.
    for g in grads(ta.concat().sum(), xs):
        torch.testing.assert_close(g, torch.ones(2, 3))


def test_higher_order_gradients_are_refused():
    x = leaf((3, 2))
    y = TensorArray(torch.float32, 3).unstack(x * 1).stack()
    with pytest.raises(TensorArrayGradError, match="create_graph=True"):
        torch.autograd.grad((y**2).sum(), [x], create_graph=True)


def test_backward_after_close_raises():
    x = leaf((2,))
    ta = TensorArray(torch.float32, 1).write(0, x)
    y = ta.read(0)
    ta.close()
    with pytest.raises(TensorArrayClosedError, match=f"'{ta.handle.name}'"):
        y.sum().backward()


def test_backward_freezes_a_dynamic_array():
    x = leaf((2,))
    ta = TensorArray(torch.float32, 0, dynamic_size=True).write(0, x).write(1, x * 2)
    ta.read(0).sum().backward()
    assert not ta.dynamic_size
    with pytest.raises(TensorArrayIndexError, match="got 2"):
        ta.write(2, x)


def test_gradient_array_written_with_history_refuses_its_own_gradient():
    ta = TensorArray(torch.float32, 1).write(0, torch.ones(2))
    g = ta.grad("gradients").write(0, leaf((2,)))
    with pytest.raises(TensorArrayGradError, match="gradient array"):
        g.read(0).sum().backward()


def test_graph_keeps_the_storage_alive_until_backward_and_no_longer():
    reg = TensorArrayRegistry()
    x = leaf((3, 2))
    ta = TensorArray(torch.float32, 3, registry=reg).unstack(x * 2)
    res = weakref.ref(ta.handle._res)
    y = ta.stack()
    assert len(reg) == 1
    del ta
    gc.collect()
    # The registry indexes live handles only; the graph still holds the storage for backward.
    assert len(reg) == 0 and res() is not None
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3, 2), 2.0))
    del y
    gc.collect()
    assert res() is None  # no reference cycle keeps it


def test_device_placement_on_a_non_cpu_device():
    """The meta device stands in for an accelerator on the CPU: storage, reads and gradients
    stay on the array's device, the flow on the CPU."""
    x = leaf((4, 2, 3)).to("meta").detach().requires_grad_()
    ta = TensorArray(torch.float32, 4, element_shape=(2, 3), device="meta")
    for t in range(4):
        ta = ta.write(t, x[t] * 2)
    y = ta.stack()
    assert y.device.type == ta.slab.device.type == "meta"
    assert ta.flow.device.type == "cpu"
    y.sum().backward()
    assert x.grad.device.type == "meta" and x.grad.shape == x.shape
    empty = TensorArray(torch.float32, 2, element_shape=(3,), device="meta")
    assert empty.stack().device.type == "meta"


# ---------------------------------------------------------------- RNN-style loop


def rnn_reference(x, h0, w_ih, w_hh, b):
    h, outs = h0, []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w_ih.T + h @ w_hh.T + b)
        outs.append(h)
    if not outs:
        return x.new_zeros(0, h0.shape[0], h0.shape[1])
    return torch.stack(outs)


def rnn_tensorarray(x, h0, w_ih, w_hh, b, storage, feedback=False):
    """feedback: each step reads the state back from the output array (row t - 1) before
    writing row t, instead of carrying it in a Python variable."""
    T, B = x.shape[0], h0.shape[0]
    H = h0.shape[1]
    inputs = TensorArray(x.dtype, T, element_shape=x.shape[1:]).unstack(x)
    kw = dict(clear_after_read=not feedback)  # stack() reads the rows again at the end
    if storage == "slab":
        out = TensorArray(x.dtype, T, element_shape=(B, H), **kw)
    elif storage == "list":
        out = TensorArray(x.dtype, T, **kw)
    elif storage == "dynamic":
        out = TensorArray(x.dtype, 0, dynamic_size=True, element_shape=(B, H), **kw)
    else:  # identical
        out = TensorArray(x.dtype, T, identical_element_shapes=True, element_shape=(None, H),
                          **kw)
    h = h0
    for t in range(T):  # per-step writes in a Python loop
        if feedback and t:
            h = out.read(t - 1)
        h = torch.tanh(inputs.read(t) @ w_ih.T + h @ w_hh.T + b)
        out = out.write(t, h)
    return out.stack()


@pytest.mark.parametrize("storage", ["slab", "list", "dynamic", "identical"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "T, B, I, H",
    [(7, 3, 5, 33), (1, 1, 2, 3), (5, 1, 4, 8)],
    ids=["T7_B3_I5_H33", "T1_B1", "T5_B1"],
)
@pytest.mark.parametrize("device", DEVICES)
def test_rnn_loop_matches_plain_torch(T, B, I, H, dtype, storage, device):
    params = [
        leaf((T, B, I), dtype, device),
        leaf((B, H), dtype, device),
        leaf((H, I), dtype, device),
        leaf((H, H), dtype, device),
        leaf((H,), dtype, device),
    ]
    refs = [p.detach().clone().requires_grad_() for p in params]
    y = rnn_tensorarray(*params, storage)
    y_ref = rnn_reference(*refs)
    tol = TOL[dtype]
    torch.testing.assert_close(y, y_ref, **tol)
    gy = torch.randn(y_ref.shape, dtype=dtype, device=device)
    got = grads((y * gy).sum(), params)
    expect = grads((y_ref * gy).sum(), refs)
    for name, g, e in zip(["x", "h0", "w_ih", "w_hh", "b"], got, expect, strict=True):
        torch.testing.assert_close(g, e, **tol, msg=lambda m, n=name: f"grad {n}: {m}")


# The recurrence through one array: each step reads back the state the step before wrote
# (row t - 1) and then writes row t. Slab storage hands out views of its rows; the writes
# that follow a read must not invalidate them for autograd (they did: "Output 0 of ReadFn is
# a view and its base ... has been modified inplace").
@pytest.mark.parametrize("storage", ["slab", "list", "dynamic", "identical"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_rnn_loop_reading_back_its_states_matches_plain_torch(dtype, storage):
    torch.manual_seed(7)
    T, B, I, H = 6, 2, 3, 5
    params = [leaf((T, B, I), dtype), leaf((B, H), dtype), leaf((H, I), dtype),
              leaf((H, H), dtype), leaf((H,), dtype)]
    refs = [p.detach().clone().requires_grad_() for p in params]
    y = rnn_tensorarray(*params, storage, feedback=True)
    y_ref = rnn_reference(*refs)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    gy = torch.randn(y_ref.shape, dtype=dtype)
    got = grads((y * gy).sum(), params)
    expect = grads((y_ref * gy).sum(), refs)
    for name, g, e in zip(["x", "h0", "w_ih", "w_hh", "b"], got, expect, strict=True):
        torch.testing.assert_close(g, e, **TOL[dtype], msg=lambda m, n=name: f"grad {n}: {m}")


# A value handed out (a read, a range gather or stack: views of a slab's rows; an
# index_select gather; an unwritten row read as zeros), then another row written: the value
# stays the same and differentiable.
@pytest.mark.parametrize("storage, op", [
    *[(s, op) for s in STORAGES for op in ("read", "gather", "gather_reversed", "stack")],
    ("slab", "read_unwritten"),
])
def test_values_handed_out_survive_later_writes(storage, op):
    torch.manual_seed(3)
    x = leaf((2,), torch.float64)
    dynamic = op == "stack"
    ta = array(torch.float64, 0 if dynamic else 4, storage, (2,), dynamic_size=dynamic,
               clear_after_read=False)
    ta = ta.write(0, x * 2).write(1, x * 3)
    value, expect = {
        "read": lambda: (ta.read(0), x * 2),
        "gather": lambda: (ta.gather([0, 1]), torch.stack([x * 2, x * 3])),
        "gather_reversed": lambda: (ta.gather([1, 0]), torch.stack([x * 3, x * 2])),
        "stack": lambda: (ta.stack(), torch.stack([x * 2, x * 3])),
        "read_unwritten": lambda: (ta.read(3) + ta.read(0), x * 2),
    }[op]()
    before = value.detach().clone()
    ta = ta.write(2, x * 4)
    torch.testing.assert_close(value, before, rtol=0, atol=0)
    torch.testing.assert_close(value, expect, rtol=0, atol=0)
    w = torch.randn(value.shape, dtype=torch.float64)
    (got,) = grads((value * w).sum() + ta.read(2).sum(), [x])
    (want,) = grads((expect * w).sum() + (x * 4).sum(), [x])
    torch.testing.assert_close(got, want, **TOL[torch.float64])  # (summed in another order)


# The array's own writes leave the version counter alone, not the user's: a value read from
# the tensor a full unstack adopted as its slab, that tensor then changed in place by the user,
# is refused by autograd as before.
def test_in_place_change_of_an_unstacked_value_is_still_caught():
    x = leaf((3, 2))
    v = x * 1
    ta = TensorArray(torch.float32, 3, element_shape=(2,)).unstack(v)
    r = ta.read(0)
    v.add_(1)
    with pytest.raises(RuntimeError, match="modified inplace"):
        r.sum().backward()


def test_rnn_loop_with_zero_steps():
    x = leaf((0, 2, 3))
    h0 = leaf((2, 4))
    params = [x, h0, leaf((4, 3)), leaf((4, 4)), leaf((4,))]
    y = rnn_tensorarray(*params, "slab")
    assert y.shape == (0, 2, 4)
    assert not y.requires_grad  # nothing was written


# --------------------------------------------------------------- link to the RNN path


class _FakeRNN(torch.autograd.Function):
    """Stands in for the fused RNN op: records the output gradient its backward receives."""

    seen: list[torch.Tensor] = []

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        _FakeRNN.seen.append(dy)
        return dy * 2


def test_rnn_output_is_the_slab_and_the_gradient_slab_reaches_backward_without_copy():
    T, B, H = 6, 3, 4
    grad_slabs: list[torch.Tensor] = []

    def planner_alloc(shape, dtype, device):
        slab = torch.full(shape, float("nan"), dtype=dtype, device=device)
        grad_slabs.append(slab)
        return slab

    x = leaf((T, B, H))
    y = _FakeRNN.apply(x)
    ta = TensorArray.from_slab(y, allocator=planner_alloc)
    assert ta.slab.data_ptr() == y.data_ptr()  # the RNN's output tensor is the slab
    w = torch.randn(T, B, H)
    loss = sum((ta.read(t) * w[t]).sum() for t in range(T) if t != 4)
    _FakeRNN.seen.clear()
    loss.backward()
    (dy,) = _FakeRNN.seen
    assert len(grad_slabs) == 1 and dy.data_ptr() == grad_slabs[0].data_ptr()
    expect = w.clone()
    expect[4] = 0  # never read: the gradient array zero-fills it in place
    torch.testing.assert_close(dy, expect, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, 2 * expect, rtol=0, atol=0)


def test_each_read_is_its_own_tensor_with_its_own_history():
    """List storage with clear_after_read=False: each read is a new tensor object with its
    own history (returning the stored element itself handed every read one object, whose
    history a later differentiable read rewrote)."""
    v = torch.tensor([1.0, 2.0], requires_grad=True)
    ta = TensorArray(torch.float32, 2, clear_after_read=False)  # list storage (no shape)
    ta = ta.write(0, v * 1).write(1, torch.zeros(3))
    with torch.no_grad():
        plain = ta.read(0)
    assert not plain.requires_grad
    a = ta.read(0)
    b = ta.read(0)
    assert a is not b and a.grad_fn is not b.grad_fn
    assert not plain.requires_grad and plain.grad_fn is None  # untouched by the later reads
    (g,) = torch.autograd.grad((a * 2).sum() + (b * 3).sum(), [v])
    assert torch.equal(g, torch.tensor([5.0, 5.0]))
