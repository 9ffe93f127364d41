"""TensorArray tests that close gaps found by mutation testing tritonrnn.tensorarray (50
mutants, 8 of which the suite let through; each test here fails on its mutant).

Contract: shared/spec/tensor_array.md. Each test pins one rule that the suite did not check:
the process-wide name counter, registry.close(name), the allocator's device check, CUDA
device indices past the machine's count, element shapes with a zero-sized dimension, gradient
aggregation that must leave the values given to it unchanged, and the non-empty grad source.
"""

from __future__ import annotations

import re

import pytest
import torch
from ta_helpers import nan_allocator, raises

from tritonrnn.tensorarray import (
    TensorArray,
    TensorArrayAllocatorError,
    TensorArrayClosedError,
    TensorArrayDeviceError,
    TensorArrayRegistry,
    TensorArrayShapeError,
    TensorArrayTypeError,
    tensor_array_grad,
)

STORAGES = ["slab", "list"]


def _counter(ta: TensorArray) -> int:
    match = re.fullmatch(r".+_(\d+)", ta.handle.name)
    assert match, ta.handle.name
    return int(match.group(1))


# ------------------------------------------------------------------ names and registry


def test_name_counter_is_shared_by_arrays_of_different_names():
    # Spec: name + "_" + a process-wide counter; one counter for every name, not one per name.
    a = TensorArray(torch.float32, name="mutants_counter_a")
    b = TensorArray(torch.float32, name="mutants_counter_b")
    c = TensorArray(torch.float32, name="mutants_counter_a", registry=TensorArrayRegistry())
    assert a.handle.name.startswith("mutants_counter_a_")
    assert _counter(a) < _counter(b) < _counter(c)


def test_registry_close_by_name_closes_the_array_and_its_gradient_arrays():
    registry = TensorArrayRegistry()
    ta = TensorArray(torch.float32, 2, element_shape=(3,), registry=registry)
    ta = ta.write(0, torch.ones(3))
    g = ta.grad("gradients")
    other = TensorArray(torch.float32, 1, registry=registry)
    registry.close(ta.handle.name)
    assert ta.handle.closed and g.handle.closed and not other.handle.closed
    assert registry.names() == [other.handle.name]
    assert ta.slab is None
    with raises(TensorArrayClosedError, ta, "read(index=0)", "closed"):
        ta.read(0)
    with raises(TensorArrayClosedError, g, "read(index=0)", "closed"):
        g.read(0)
    with pytest.raises(TensorArrayClosedError, match=re.escape(f"'{ta.handle.name}'")):
        registry.close(ta.handle.name)


# ----------------------------------------------------------------------- devices


def test_allocator_returning_a_tensor_on_another_device_raises():
    def on_meta(shape, dtype, device):
        return torch.empty(shape, dtype=dtype, device="meta")

    ta = TensorArray(torch.float32, 2, element_shape=(3,), device="cpu", allocator=on_meta)
    with raises(TensorArrayAllocatorError, ta, "allocator", "device meta", "device cpu") as info:
        ta.write(0, torch.ones(3))
    assert isinstance(info.value, ValueError)
    assert not ta.handle._res.written[0], "a failed allocation must leave the index unwritten"


def test_error_cuda_device_index_equal_to_the_device_count():
    # The first index past this machine's CUDA devices ("cuda:0" on a machine without one).
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(TensorArrayDeviceError,
                       match=re.escape(f"device must be an available device; got "
                                       f"'cuda:{count}', and this machine has {count} CUDA "
                                       "device(s)")) as info:
        TensorArray(torch.float32, 2, name="dev", device=f"cuda:{count}")
    assert "TensorArray 'dev'" in str(info.value)


# ---------------------------------------------------------------- zero-sized shapes


def test_element_shape_with_a_zero_sized_dimension():
    ta = TensorArray(torch.float32, 3, element_shape=(0, 3), clear_after_read=False)
    assert ta.element_shape == (0, 3)
    assert ta.read(0).shape == (0, 3)
    ta = ta.write(1, torch.ones(0, 3))
    assert ta.stack().shape == (3, 0, 3)
    assert ta.concat().shape == (0, 3)
    with raises(TensorArrayShapeError, ta, "(1, 3)", "(0, 3)"):
        ta.write(2, torch.ones(1, 3))
    partial = TensorArray(torch.float32, 1, element_shape=(None, 0))
    assert partial.element_shape == (None, 0)
    with raises(TensorArrayShapeError, partial, "(2, 1)", "(None, 0)"):
        partial.write(0, torch.ones(2, 1))


# ------------------------------------------------------- aggregation leaves values alone


def _gradient_array(storage: str) -> TensorArray:
    """The gradient array of a size-2 forward array that was never written: a fresh slab
    ([2, 3]) or list storage (the forward element shape unknown)."""
    shape = (3,) if storage == "slab" else None
    ta = TensorArray(torch.float32, 2, element_shape=shape, allocator=nan_allocator())
    return ta.grad("gradients")


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("first", ["write", "scatter", "unstack", "split"])
def test_aggregating_writes_leave_the_values_given_unchanged(storage, first):
    # A gradient array adds (3 + 4 + 5 = 12) into its own storage: the tensors handed to it,
    # the ones that started an index included, are never changed in place.
    torch.manual_seed(0)
    g = _gradient_array(storage)
    a = torch.randn(2, 3)
    b = torch.randn(3)
    c = torch.randn(2, 3)
    given = [a, b, c]
    before = [t.clone() for t in given]
    if first == "write":
        g = g.write(0, a[0]).write(1, a[1])
    elif first == "scatter":
        g = g.scatter([1, 0], a.flip(0))
    elif first == "unstack":
        g = g.unstack(a)
    else:
        g = g.split(a.reshape(6), [3, 3])
    g = g.write(0, b)
    g = g.scatter([1, 1], c)
    for t, t0 in zip(given, before, strict=True):
        torch.testing.assert_close(t, t0, rtol=0, atol=0)
    expect = torch.stack([a[0] + b, a[1] + c[0] + c[1]])
    torch.testing.assert_close(g.stack(), expect)


def test_gradient_of_gather_leaves_the_given_output_gradient_unchanged():
    # Elements of two shapes: the gradient array keeps list storage. The gather's backward
    # starts element 0 with dy's row and the read's backward adds into it: dy, the caller's
    # tensor, must keep its values.
    torch.manual_seed(1)
    x = torch.randn(3, requires_grad=True)
    z = torch.randn(2, requires_grad=True)
    ta = TensorArray(torch.float32, 2, clear_after_read=False)
    ta = ta.write(0, x * 1).write(1, z * 1)
    r = ta.read(0)
    y = ta.gather([0])  # made last, its backward runs first: dy starts the element
    dy = torch.randn(1, 3)
    dr = torch.randn(3)
    dy0 = dy.clone()
    torch.autograd.backward([r, y], [dr, dy])
    torch.testing.assert_close(dy, dy0, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, dy0[0] + dr)
    assert z.grad is None or not z.grad.any()


# --------------------------------------------------------------------------- source


def test_error_grad_source_must_be_a_non_empty_string():
    ta = TensorArray(torch.float32, 2, element_shape=(3,))
    with raises(TensorArrayTypeError, ta, "source must be a non-empty str", "''"):
        ta.grad("")
    with raises(TensorArrayTypeError, ta, "source must be a non-empty str", "''"):
        tensor_array_grad(ta.handle, ta.flow, "")
    assert ta.handle._res.grads == {}
