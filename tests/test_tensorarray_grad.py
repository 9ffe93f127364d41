"""Conformance tests for TensorArrayGrad: source-keyed accumulators, size freezing, aggregating
writes, shape soft copy, shape_to_prepend, flow chaining and the gradient-array errors.

Contract: shared/spec/tensor_array.md, section "TensorArrayGrad (the heart)".
"""

from __future__ import annotations

import pytest
import torch
from ta_helpers import nan_allocator, raises

from tritonrnn.tensorarray import (
    TensorArray,
    TensorArrayClosedError,
    TensorArrayDTypeError,
    TensorArrayGradError,
    TensorArrayGradResult,
    TensorArrayHandle,
    TensorArrayIndexError,
    TensorArrayReadError,
    TensorArrayRegistry,
    TensorArrayShapeError,
    TensorArrayTypeError,
    TensorArrayWriteError,
    tensor_array_grad,
)

FLOAT_DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16]
DTYPES = [*FLOAT_DTYPES, torch.int32, torch.int64]
STORAGES = ["slab", "list"]




def forward(storage: str, dtype=torch.float32, size=3, elem=(2, 3), **kw) -> TensorArray:
    """A forward array with every index written (values 1, 2, 3, ...)."""
    if storage == "slab":
        kw.setdefault("element_shape", elem)
    kw.setdefault("allocator", nan_allocator())
    ta = TensorArray(dtype, size, **kw)
    for i in range(size):
        ta = ta.write(i, torch.full(elem, i + 1, dtype=dtype))
    return ta


# ---------------------------------------------------------------- source-keyed lookup


def test_same_source_returns_the_same_accumulator():
    ta = forward("slab")
    g1 = ta.grad("gradients")
    g2 = ta.grad("gradients")
    op = tensor_array_grad(ta.handle, ta.flow, "gradients")
    assert g1.handle is g2.handle is op.grad_handle
    g1.write(0, torch.ones(2, 3))
    g2.write(0, torch.ones(2, 3))
    assert torch.equal(TensorArray.from_handle(op.grad_handle).read(0), torch.full((2, 3), 2.0))


def test_different_sources_get_separate_accumulators():
    ta = forward("list")
    g = ta.grad("gradients")
    g1 = ta.grad("gradients_1")
    assert g.handle is not g1.handle
    g.write(1, torch.ones(2, 3))
    assert torch.equal(g.read(1), torch.ones(2, 3))
    assert torch.equal(g1.read(1), torch.zeros(2, 3))  # untouched by the other source


def test_grad_handle_name_and_registry():
    reg = TensorArrayRegistry()
    ta = TensorArray(torch.float32, 2, registry=reg)
    g = ta.grad("gradients")
    assert g.handle.name == f"{ta.handle.name}@gradients"
    assert reg.lookup(g.handle.name) is g.handle
    assert g.is_grad and not ta.is_grad


def test_op_level_form_returns_named_pair_with_flow_out():
    ta = forward("slab")
    result = tensor_array_grad(ta.handle, ta.flow, "gradients")
    assert isinstance(result, TensorArrayGradResult)
    grad_handle, flow_out = result
    assert isinstance(grad_handle, TensorArrayHandle)
    assert flow_out.shape == () and flow_out.dtype == torch.float32
    # .grad() hands back the same flow_out for chaining.
    g = ta.grad("gradients")
    assert g.flow is flow_out
    g2 = g.write(0, torch.ones(2, 3))
    assert g2.handle is grad_handle


def test_grad_flow_argument_is_accepted():
    ta = forward("slab")
    g = ta.grad("gradients", flow=ta.flow)
    assert g.handle is ta.grad("gradients").handle


@pytest.mark.parametrize(
    "flow, fragment",
    [
        (0.0, "flow_in must be a torch.Tensor, got float"),
        (torch.zeros(2), "flow_in must be a scalar float tensor (an array's flow), got shape (2,)"),
        (torch.tensor(0), "got shape () dtype torch.int64"),
    ],
    ids=["float", "vector", "int"],
)
def test_error_flow_in_must_be_a_scalar_float_tensor(flow, fragment):
    ta = forward("slab")
    with raises(TensorArrayTypeError, ta, "tensor_array_grad", fragment):
        tensor_array_grad(ta.handle, flow, "gradients")
    # The method names its own argument, flow (the op's is flow_in).
    with raises(TensorArrayTypeError, ta, "grad: flow must", fragment.replace("flow_in", "flow")):
        ta.grad("gradients", flow=flow)
    with raises(TensorArrayTypeError, ta, "from_handle", fragment.replace("flow_in", "flow")):
        TensorArray.from_handle(ta.handle, flow)
    assert not ta.handle._res.grads  # nothing was created


# ------------------------------------------------------------------------- freezing


def test_grad_freezes_a_dynamic_array_at_its_current_size():
    ta = TensorArray(torch.float32, 0, dynamic_size=True)
    for i in range(3):
        ta = ta.write(i, torch.ones(2))
    g = ta.grad("gradients")
    assert not ta.dynamic_size and ta.size() == 3 and g.size() == 3
    with raises(TensorArrayIndexError, ta, "got 3", "size 3"):
        ta.write(3, torch.ones(2))
    with raises(TensorArrayIndexError, g, "got 3", "size 3"):
        g.write(3, torch.ones(2))
    # Freezing is for good: a new source sees the same size.
    assert ta.grad("gradients_1").size() == 3


def test_a_user_array_named_like_a_gradient_array_does_not_collide_with_it():
    # The spec: the gradient array is looked up under the key (N, S), and two arrays never
    # collide. A user array whose name is the gradient array's "<name>@<source>" used to block
    # its creation (TensorArrayNameError); TensorFlow keys gradient arrays apart too.
    reg = TensorArrayRegistry()
    ta = TensorArray(torch.float32, 0, dynamic_size=True, registry=reg).write(0, torch.ones(2))
    squatter = TensorArray(torch.float32, 1, name=f"{ta.handle.name}@src", registry=reg)
    source = squatter.handle.name.removeprefix(f"{ta.handle.name}@")
    g = ta.grad(source)
    assert g.handle.name == squatter.handle.name and g.handle is not squatter.handle
    assert not ta.dynamic_size and g.size() == 1 and squatter.size() == 1
    assert ta.grad(source).handle is g.handle  # the same accumulator, looked up by (N, S)
    # The name finds the user's array; the gradient array stays reachable through grad().
    assert reg.lookup(squatter.handle.name) is squatter.handle
    assert reg.names().count(squatter.handle.name) == 2
    squatter.close()
    assert reg.lookup(g.handle.name) is g.handle and not g.handle.closed
    assert squatter.handle.name in reg
    g = g.write(0, torch.full((2,), 3.0)).write(0, torch.full((2,), 4.0))
    assert torch.equal(g.read(0), torch.full((2,), 7.0))
    ta.close()
    assert g.handle.closed and reg.names() == []


@pytest.mark.parametrize("prepend", [(-1,), ("a",), 3.5], ids=["undefined", "str", "float"])
def test_failed_grad_creation_leaves_the_array_growable(prepend):
    # A refused grad (its shape_to_prepend) must not freeze the forward array.
    ta = TensorArray(torch.float32, 0, dynamic_size=True).write(0, torch.ones(2))
    with pytest.raises((TensorArrayShapeError, TensorArrayTypeError), match="shape_to_prepend"):
        ta.grad("gradients", shape_to_prepend=prepend)
    assert ta.dynamic_size and ta.size() == 1 and ta.handle._res.grads == {}
    ta = ta.write(3, torch.ones(2))
    assert ta.size() == 4
    g = ta.grad("gradients")
    assert not ta.dynamic_size and g.size() == 4


def test_grad_before_any_write_on_size0_dynamic_array_freezes_both_at_zero():
    ta = TensorArray(torch.float32, 0, dynamic_size=True)
    g = ta.grad("gradients")
    assert ta.size() == 0 and g.size() == 0
    with raises(TensorArrayIndexError, ta, "got 0", "size 0"):
        ta.write(0, torch.ones(1))
    with raises(TensorArrayIndexError, g, "got 0", "size 0"):
        g.write(0, torch.ones(1))


def test_grad_array_is_fixed_size_and_clear_after_read():
    ta = forward("slab")
    g = ta.grad("gradients")
    assert not g.dynamic_size and g.clear_after_read
    g.read(0)
    with raises(TensorArrayReadError, g, "index 0", "clear_after_read=False"):
        g.read(0)
    with raises(TensorArrayWriteError, g, "index 0", "already read"):
        g.write(0, torch.ones(2, 3))


@pytest.mark.parametrize("prepend", [None, (5,)])
def test_error_grad_element_shape_is_named_as_inherited(prepend):
    ta = TensorArray(torch.float32, 2, element_shape=(2, 3))
    g = ta.grad("gradients", shape_to_prepend=prepend)
    expected = (*(prepend or ()), 2, 3)
    fragments = [str(expected), f"inherited from the forward array '{ta.handle.name}'"]
    if prepend:
        fragments.append("shape_to_prepend (5,)")
    with raises(TensorArrayShapeError, g, "(9,)", *fragments):
        g.write(0, torch.ones(9))


def test_grad_inherits_element_shape_and_identical_flag_as_they_stand():
    ta = TensorArray(torch.float32, 2, identical_element_shapes=True)
    ta = ta.write(0, torch.ones(4, 5))  # infers (4, 5)
    g = ta.grad("gradients")
    assert g.element_shape == (4, 5)
    assert g.handle._res.identical_element_shapes
    partial = TensorArray(torch.float32, 2, element_shape=(None, 3)).grad("gradients")
    assert partial.element_shape == (None, 3)


# ---------------------------------------------------------------- aggregating writes


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_aggregating_writes_add(dtype, storage):
    ta = forward(storage, dtype, elem=(2,))
    g = ta.grad("gradients")
    for v in (3, 4, 5):
        g = g.write(1, torch.full((2,), v, dtype=dtype))
    assert torch.equal(g.read(1), torch.full((2,), 12, dtype=dtype))


@pytest.mark.parametrize("storage", STORAGES)
def test_scatter_into_grad_adds_duplicates(storage):
    ta = forward(storage, elem=(2,), size=4)
    g = ta.grad("gradients")
    g = g.scatter([0, 2, 0, 3], torch.tensor([[1.0, 1], [2, 2], [4, 4], [8, 8]]))
    g = g.scatter([3], torch.tensor([[16.0, 16]]))
    expect = torch.tensor([[5.0, 5], [0, 0], [2, 2], [24, 24]])
    assert torch.equal(g.stack(), expect)


@pytest.mark.parametrize("storage", STORAGES)
def test_unstack_and_split_into_grad_add(storage):
    ta = forward(storage, elem=(2,), size=2)
    g = ta.grad("gradients").unstack(torch.ones(2, 2)).unstack(torch.ones(2, 2))
    assert torch.equal(g.stack(), torch.full((2, 2), 2.0))
    sp = TensorArray(torch.float32, 2).split(torch.zeros(3, 2), [1, 2])
    gs = sp.grad("gradients").split(torch.ones(3, 2), [1, 2]).split(torch.ones(3, 2), [1, 2])
    assert torch.equal(gs.concat(), torch.full((3, 2), 2.0))


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize(
    "aggregate",
    [
        lambda g: g.write(1, torch.ones(2, dtype=torch.bool)),
        lambda g: g.scatter([2, 0, 2], torch.ones(3, 2, dtype=torch.bool)),
        lambda g: g.unstack(torch.ones(3, 2, dtype=torch.bool)),
    ],
    ids=["write", "scatter", "unstack"],
)
def test_error_a_bool_gradient_array_does_not_aggregate(aggregate, storage):
    """TensorFlow adds number types only (tensor_array::AddToTensor refuses bool): a repeated
    write of a bool gradient array is an error naming the index and dtype, not an OR, and
    leaves the array as it was. First writes (over soft-copied rows too) still replace."""
    ta = forward(storage, torch.bool, elem=(2,))
    g = ta.grad("gradients").write(1, torch.tensor([True, False]))
    with pytest.raises(TensorArrayDTypeError, match=r"cannot aggregate into index \d: .*number "
                                                    r"dtype, got torch.bool"):
        aggregate(g)
    assert torch.equal(g.read(1), torch.tensor([True, False]))
    assert torch.equal(g.gather([0, 2]), torch.zeros(2, 2, dtype=torch.bool))


# ------------------------------------------------------------------ shape soft copy


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_soft_copied_index_reads_zeros_of_forward_shape(dtype, storage):
    ta = forward(storage, dtype)
    g = ta.grad("gradients")
    out = g.read(2)
    assert out.dtype == dtype and torch.equal(out, torch.zeros(2, 3, dtype=dtype))
    assert torch.equal(g.gather([0, 1]), torch.zeros(2, 2, 3, dtype=dtype))


def test_soft_copy_keeps_each_forward_shape():
    ta = TensorArray(torch.float32, 3).write(0, torch.ones(1, 2)).write(2, torch.ones(4, 2))
    g = ta.grad("gradients")
    assert torch.equal(g.read(0), torch.zeros(1, 2))
    assert torch.equal(g.read(2), torch.zeros(4, 2))
    # Index 1 was never written forward: not soft-copied, and the shape is unknown.
    with raises(TensorArrayReadError, g, "index 1", "never written"):
        g.read(1)


@pytest.mark.parametrize("storage", STORAGES)
def test_first_write_replaces_then_writes_add(storage):
    ta = forward(storage)  # slab gradient memory is NaN-poisoned by the allocator
    g = ta.grad("gradients")
    v = torch.randn(2, 3)
    g = g.write(0, v)
    g = g.write(1, v).write(1, v)
    torch.testing.assert_close(g.read(0), v, rtol=0, atol=0)
    torch.testing.assert_close(g.read(1), 2 * v, rtol=0, atol=0)


@pytest.mark.parametrize("storage", STORAGES)
def test_soft_copy_write_of_another_shape_gives_both_shapes(storage):
    ta = forward(storage)
    g = ta.grad("gradients")
    # Slab storage has the element shape declared, which is checked first (as in TF); list
    # storage has only the soft-copied shape. Both messages give both shapes.
    extra = "incompatible" if storage == "slab" else "existing shape is (2, 3)"
    with raises(TensorArrayShapeError, g, "index=1", "(2, 3)", "(3, 2)", extra):
        g.write(1, torch.ones(3, 2))


def test_soft_copy_mixed_with_unwritten_indices_and_full_shape():
    ta = TensorArray(torch.float32, 4, element_shape=(2,), allocator=nan_allocator())
    ta = ta.write(1, torch.ones(2)).write(3, torch.ones(2))
    g = ta.grad("gradients").write(3, torch.full((2,), 7.0))
    # 0 and 2 unwritten forward: zeros from the full element shape; 1 soft; 3 written.
    expect = torch.tensor([[0.0, 0], [0, 0], [0, 0], [7, 7]])
    assert torch.equal(g.stack(), expect)


def test_scattered_soft_rows_of_a_gradient_slab_read_as_zeros():
    ta = forward("slab", elem=(2,), size=5)  # gradient slab memory is NaN-poisoned
    g = ta.grad("gradients").write(0, torch.ones(2)).write(2, torch.ones(2))
    g = g.write(4, torch.ones(2))
    expect = torch.tensor([[1.0, 1], [0, 0], [1, 1], [0, 0], [1, 1]])
    assert torch.equal(g.stack(), expect)


def test_gradient_array_reads_past_its_size_are_errors():
    g = forward("slab").grad("gradients")
    with raises(TensorArrayIndexError, g, "got 3", "size 3"):
        g.read(3)
    with raises(TensorArrayIndexError, g, "got 5"):
        g.gather([0, 5])


def test_soft_copy_covers_forward_indices_read_as_zeros():
    ta = TensorArray(torch.float32, 2, element_shape=(3,))
    ta.read(0)  # unwritten + full shape: zeros, and the index counts as written
    g = ta.grad("gradients")
    assert g.handle._res.written[0] == 1 and g.handle._res.soft[0] == 1


# ---------------------------------------------------------------- shape_to_prepend


@pytest.mark.parametrize("storage", STORAGES)
def test_shape_to_prepend(storage):
    ta = forward(storage)
    g = ta.grad("gradients", shape_to_prepend=(4,))
    if storage == "slab":
        assert g.element_shape == (4, 2, 3)
    else:
        assert g.element_shape is None  # unknown forward rank stays unknown
    assert torch.equal(g.read(0), torch.zeros(4, 2, 3))
    v = torch.randn(4, 2, 3)
    g = g.write(1, v)
    torch.testing.assert_close(g.read(1), v, rtol=0, atol=0)
    with raises(TensorArrayShapeError, g, "(4, 2, 3)", "(2, 3)"):
        g.write(2, torch.ones(2, 3))


def test_shape_to_prepend_op_level_and_torch_size():
    ta = TensorArray(torch.float32, 1, element_shape=(3,))
    ta = ta.write(0, torch.ones(3))
    h, _ = tensor_array_grad(ta.handle, ta.flow, "gradients", shape_to_prepend=torch.Size([2, 5]))
    g = TensorArray.from_handle(h)
    assert g.element_shape == (2, 5, 3)
    assert torch.equal(g.read(0), torch.zeros(2, 5, 3))


def test_shape_to_prepend_must_be_fully_defined():
    ta = TensorArray(torch.float32, 1)
    with raises(TensorArrayShapeError, ta, "shape_to_prepend"):
        ta.grad("gradients", shape_to_prepend=(None, 2))


# --------------------------------------------------------------------------- errors


def test_error_gradient_of_a_gradient_array():
    ta = forward("slab")
    g = ta.grad("gradients")
    with raises(TensorArrayGradError, g, "gradient array", ta.handle.name):
        g.grad("gradients")
    with raises(TensorArrayGradError, g, "gradient array"):
        tensor_array_grad(g.handle, g.flow, "gradients_1")


def test_error_concat_on_gradient_array_whose_forward_was_never_split():
    ta = forward("list")
    g = ta.grad("gradients")
    with raises(TensorArrayGradError, g, "concat", "never split", ta.handle.name):
        g.concat()


def test_concat_on_gradient_array_of_a_split_forward_array():
    x = torch.randn(5, 2)
    ta = TensorArray(torch.float32, 3).split(x, [2, 0, 3])
    g = ta.grad("gradients").write(2, torch.ones(3, 2))
    expect = torch.cat([torch.zeros(2, 2), torch.ones(3, 2)])
    assert torch.equal(g.concat(), expect)


def test_grad_created_before_split_learns_of_the_split():
    ta = TensorArray(torch.float32, 2)
    g = ta.grad("gradients")
    ta.split(torch.ones(3), [1, 2])
    g.write(0, torch.ones(1)).write(1, torch.ones(2))
    assert torch.equal(g.concat(), torch.ones(3))


def test_error_grad_of_closed_array():
    ta = forward("slab")
    ta.close()
    with raises(TensorArrayClosedError, ta, "grad(source='gradients')", "closed"):
        ta.grad("gradients")


def test_closing_the_forward_array_closes_its_gradient_arrays():
    ta = forward("slab")
    g = ta.grad("gradients")
    g1 = ta.grad("gradients_1")
    ta.close()
    for grad in (g, g1):
        with raises(TensorArrayClosedError, grad, "closed"):
            grad.read(0)


def test_a_closed_gradient_array_is_returned_again():
    # TensorFlow keeps a closed array in its resource manager, so the (N, S) lookup finds the
    # closed one and every op on it fails; a fresh zero accumulator would drop what was
    # accumulated without a word.
    ta = forward("slab")
    g = ta.grad("gradients").write(0, torch.ones(2, 3))
    g.close()
    again = ta.grad("gradients")
    assert again.handle is g.handle and again.handle.closed
    with raises(TensorArrayClosedError, again, "read(index=0)", "closed"):
        again.read(0)
    with raises(TensorArrayClosedError, again, "closed"):
        again.write(1, torch.ones(2, 3))
    # Another source is another accumulator, open and empty.
    other = ta.grad("gradients_1")
    assert not other.handle.closed
    assert torch.equal(other.read(0), torch.zeros(2, 3))


def test_grad_slab_is_allocated_through_the_forward_allocator():
    calls: list = []
    ta = TensorArray(torch.float32, 3, element_shape=(2,), allocator=nan_allocator(calls))
    ta = ta.unstack(torch.ones(3, 2))  # adopted: no allocation
    g = ta.grad("gradients", shape_to_prepend=(5,))
    g.write(0, torch.ones(5, 2))
    assert calls == [(3, 5, 2)]
    assert g.slab.shape == (3, 5, 2)


# Aggregation in a gradient array kept as a list (the forward's element shapes differ, so
# make_grad cannot give the gradient a slab): the other "list" cases write one shape at every
# index, so their gradient arrays are slabs and ArrayResource._put_list never aggregates.


def _ragged_forward() -> TensorArray:
    ta = TensorArray(torch.float32, 3)
    ta = ta.write(0, torch.full((2,), 1.0))
    ta = ta.write(1, torch.full((3,), 2.0))  # another shape: no slab for the gradient
    return ta.write(2, torch.full((2,), 3.0))


def test_list_gradient_scatter_adds_duplicate_indices():
    g = _ragged_forward().grad("gradients")
    assert g.handle._res.slab_shape is None  # the list path is the one under test
    g = g.scatter([0, 2, 0], torch.tensor([[1.0, 1], [2, 2], [4, 4]]))
    assert torch.equal(g.read(0), torch.tensor([5.0, 5]))
    assert torch.equal(g.read(2), torch.tensor([2.0, 2]))


def test_list_gradient_first_write_replaces_the_soft_copy_then_writes_add():
    g = _ragged_forward().grad("gradients")
    assert g.handle._res.slab_shape is None
    v = torch.randn(3, generator=torch.Generator().manual_seed(0))
    once = g.write(1, v)  # over the soft-copied zeros: the value itself
    twice = once.write(1, v)
    assert torch.equal(twice.read(1), 2 * v)
    assert torch.equal(twice.read(0), torch.zeros(2)) and torch.equal(twice.read(2),
                                                                      torch.zeros(2))
    g = _ragged_forward().grad("gradients").write(1, v)
    assert torch.equal(g.read(1), v)


def test_list_gradient_shape_to_prepend():
    g = _ragged_forward().grad("gradients", shape_to_prepend=(4,))
    assert g.handle._res.slab_shape is None and g.element_shape is None
    assert torch.equal(g.read(0), torch.zeros(4, 2))  # each forward shape, prepended
    v = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    g = g.write(1, v).write(1, v)
    assert torch.equal(g.read(1), 2 * v)
    with raises(TensorArrayShapeError, g, "index=2", "(4, 2)", "(2,)"):
        g.write(2, torch.ones(2))


def test_list_gradient_writes_and_scatters_add():
    g = _ragged_forward().grad("gradients")
    g = g.write(1, torch.full((3,), 1.0))
    g = g.write(1, torch.full((3,), 2.0))
    g = g.scatter([0, 0], torch.tensor([[1.0, 1], [2, 2]]))
    g = g.scatter([0], torch.tensor([[4.0, 4]]))
    assert torch.equal(g.read(1), torch.full((3,), 3.0))
    assert torch.equal(g.read(0), torch.full((2,), 7.0))


@pytest.mark.parametrize("storage", ["slab", "list"])
def test_stack_and_unstack_over_soft_rows_between_written_ones(storage):
    """A gradient array whose rows are soft copies (zeros) except every third, which holds
    data: stack reads zeros and the data in place, an aggregating unstack over the whole
    range replaces the soft rows and adds to the others, and a contiguous gather reads a
    range past 0 (the rows to zero found in one tensor op whatever their pattern). List
    storage: the forward array's last row unwritten (no shape to soft-copy there), which the
    gradient array's first write fills."""
    n = 10
    written = n if storage == "slab" else n - 1
    ta = TensorArray(torch.float32, n).scatter(torch.arange(written),
                                              torch.ones(written, 2))
    held = list(range(0, n, 3))
    want = torch.zeros(n, 2)
    want[held] = 5.0

    def grad(source):
        g = ta.grad(source)
        assert (g.handle._res.slab_shape is None) == (storage == "list")
        return g.scatter(torch.tensor(held), torch.full((len(held), 2), 5.0))

    assert torch.equal(grad("gradients").stack(), want)
    ramp = torch.arange(2 * n, dtype=torch.float32).view(n, 2)
    assert torch.equal(grad("gradients_1").unstack(ramp).stack(), want + ramp)
    assert torch.equal(grad("gradients_2").gather(torch.arange(4, 9)), want[4:9])
