"""Conformance tests for tritonrnn.tensorarray: forward-array rules, storage, registry, errors.

Contract: shared/spec/tensor_array.md. Gradient arrays are in test_tensorarray_grad.py and
autograd in test_tensorarray_autograd.py.
"""

from __future__ import annotations

import gc
import re

import pytest
import torch
from ta_helpers import nan_allocator, raises

from tritonrnn.tensorarray import (
    TensorArray,
    TensorArrayAllocatorError,
    TensorArrayClosedError,
    TensorArrayDeviceError,
    TensorArrayDTypeError,
    TensorArrayError,
    TensorArrayIndexError,
    TensorArrayReadError,
    TensorArrayRegistry,
    TensorArrayShapeError,
    TensorArrayTypeError,
    TensorArrayWriteError,
    default_registry,
)

DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# "slab": element shape declared, storage is one slab; "list": unknown element shape.
STORAGES = ["slab", "list"]


def rand(shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device)
    return torch.randint(-1000, 1000, shape, dtype=dtype, device=device)


def make(dtype=torch.float32, size=0, storage="list", elem=(3, 5), **kw) -> TensorArray:
    if storage == "slab":
        kw.setdefault("element_shape", elem)
    return TensorArray(dtype, size, **kw)




@pytest.fixture
def registry() -> TensorArrayRegistry:
    return TensorArrayRegistry()


# ---------------------------------------------------------------------------- objects


def test_handle_name_is_name_plus_process_wide_counter():
    a = TensorArray(torch.float32, name="foo")
    b = TensorArray(torch.float32, name="foo")
    c = TensorArray(torch.float32)
    assert re.fullmatch(r"foo_\d+", a.handle.name)
    assert re.fullmatch(r"TensorArray_\d+", c.handle.name)
    assert a.handle.name != b.handle.name
    # The counter is process-wide: another registry never reuses a name.
    d = TensorArray(torch.float32, name="foo", registry=TensorArrayRegistry())
    assert d.handle.name not in {a.handle.name, b.handle.name}


def test_flow_is_scalar_float32():
    ta = TensorArray(torch.float16, 2)
    assert ta.flow.shape == () and ta.flow.dtype == torch.float32
    ta2 = ta.write(0, rand((2,), torch.float16))
    assert ta2.flow.shape == () and ta2.flow.dtype == torch.float32


MUTATIONS = {
    "write": lambda ta, v: ta.write(0, v[0]),
    "scatter": lambda ta, v: ta.scatter([1, 0], v),
    "unstack": lambda ta, v: ta.unstack(v),
    "split": lambda ta, v: ta.split(v.reshape(4), [2, 2]),
}


@pytest.mark.parametrize("history", [False, True], ids=["plain", "history"])
@pytest.mark.parametrize("op", sorted(MUTATIONS))
def test_every_mutation_returns_a_new_flow(op, history):
    # The spec: a mutator returns a new object that carries the new flow, whether or not the
    # value has autograd history.
    ta = TensorArray(torch.float32, 2)
    value = rand((2, 2)).requires_grad_(history)
    ta2 = MUTATIONS[op](ta, value)
    assert ta2 is not ta and ta2.handle is ta.handle
    assert ta2.flow is not ta.flow
    assert ta2.flow.shape == () and ta2.flow.dtype == torch.float32


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
def test_a_plain_write_keeps_the_flow_connected_to_earlier_writes(grad_mode):
    # write(0, x) has history; write(1, plain) then returns a new flow. A read of index 0
    # through the newest flow must still reach x's gradient: the new flow may not cut the
    # ordering edge, even when the plain write runs under no_grad.
    x = rand((3,)).requires_grad_()
    ta = TensorArray(torch.float32, 2, element_shape=(3,)).write(0, x * 2)
    with torch.set_grad_enabled(grad_mode):
        ta = ta.write(1, rand((3,)))
    w = rand((3,))
    (ta.read(0) * w).sum().backward()
    assert torch.equal(x.grad, 2 * w)


def test_mutators_return_new_object_sharing_the_handle():
    ta = TensorArray(torch.float32, 3, clear_after_read=False)
    x = rand((4,))
    ta2 = ta.write(0, x)
    assert ta2 is not ta and ta2.handle is ta.handle
    # The old object stays usable and sees the shared storage.
    torch.testing.assert_close(ta.read(0), x)
    for mutated in (ta.scatter([1], x[None]), ta.unstack(x[None].expand(0, 4))):
        assert mutated is not ta and mutated.handle is ta.handle


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_write_read_roundtrip(dtype, storage, device):
    xs = [rand((3, 5), dtype, device) for _ in range(7)]
    ta = make(dtype, 7, storage)
    for i, x in enumerate(xs):
        ta = ta.write(i, x)
    assert ta.size() == 7
    assert ta.device.type == device
    for i in (4, 0, 6, 1, 2, 3, 5):
        out = ta.read(i)
        assert out.dtype == dtype and out.device.type == device
        assert torch.equal(out, xs[i])


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_unstack_stack_roundtrip(dtype, storage, device):
    x = rand((7, 3, 5), dtype, device)
    ta = make(dtype, 7, storage).unstack(x)
    assert torch.equal(ta.stack(), x)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scatter_gather(dtype, storage):
    x = rand((5, 3, 5), dtype)
    perm = [3, 0, 4, 1, 2]
    ta = make(dtype, 5, storage, clear_after_read=False).scatter(perm, x)
    expect = torch.empty_like(x)
    expect[perm] = x
    assert torch.equal(ta.stack(), expect)
    assert torch.equal(ta.gather([4, 1, 1, 0]), expect[[4, 1, 1, 0]])
    assert torch.equal(ta.gather([1, 2, 3]), expect[1:4])  # contiguous range
    if storage == "slab":
        assert ta.gather([]).shape == (0, 3, 5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_concat(dtype):
    x = rand((10, 3), dtype)
    lengths = [3, 0, 5, 2]
    ta = TensorArray(dtype, 4, clear_after_read=False).split(x, lengths)
    offsets = [0, 3, 3, 8, 10]
    for k in range(4):
        assert torch.equal(ta.read(k), x[offsets[k] : offsets[k + 1]])
    assert torch.equal(ta.concat(), x)


def test_split_into_slab_and_concat_is_a_view():
    x = rand((6, 3))
    ta = TensorArray(torch.float32, 3, element_shape=(2, 3)).split(x, [2, 2, 2])
    slab = ta.slab
    out = ta.concat()
    assert torch.equal(out, x) and out.data_ptr() == slab.data_ptr()


def test_concat_of_written_elements():
    a, b = rand((2, 4)), rand((3, 4))
    ta = TensorArray(torch.float32, 2).write(0, a).write(1, b)
    assert torch.equal(ta.concat(), torch.cat([a, b]))


def test_index_arguments_accept_tensors():
    x = rand((4, 2))
    ta = TensorArray(torch.float32, 4, clear_after_read=False)
    ta = ta.write(torch.tensor(0), x[0]).scatter(torch.tensor([1, 2], dtype=torch.int32), x[1:3])
    ta = ta.write(torch.tensor(3, dtype=torch.int16), x[3])
    assert torch.equal(ta.read(torch.tensor(2)), x[2])
    assert torch.equal(ta.gather(torch.tensor([3, 0])), x[[3, 0]])
    sp = TensorArray(torch.float32, 2).split(x, torch.tensor([1, 3]))
    assert torch.equal(sp.concat(), x)
    assert TensorArray(torch.float32, torch.tensor(5)).size() == 5


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.uint8, torch.uint16, torch.uint32, torch.uint64],
                         ids=str)
def test_index_tensors_of_every_integer_dtype(dtype):
    x = rand((3, 2))
    ta = TensorArray(torch.float32, 3, clear_after_read=False)
    ta = ta.scatter(torch.tensor([2, 0], dtype=dtype), x[[2, 0]])
    ta = ta.write(torch.tensor(1, dtype=dtype), x[1])
    assert torch.equal(ta.gather(torch.tensor([0, 2, 1], dtype=dtype)), x[[0, 2, 1]])
    assert torch.equal(ta.read(torch.tensor(1, dtype=dtype)), x[1])
    with pytest.raises(TensorArrayTypeError, match=r"must have an integer dtype, got "
                                                   r"torch.float32"):
        ta.gather(torch.tensor([0.0]))


def test_index_lists_may_hold_0d_integer_tensors():
    x = rand((3, 2))
    ta = TensorArray(torch.float32, 3).scatter([torch.tensor(2), 0, torch.tensor(1)], x)
    assert torch.equal(ta.gather([torch.tensor(2), 0, 1]), x)


def test_numpy_indices_and_misfit_index_entries():
    """NumPy integer arrays and 0-d arrays index as TensorFlow takes them; a 0-d tensor of
    another dtype in an index list is named by its dtype (it was called a nested sequence)."""
    import numpy as np

    x = rand((3, 2))
    ta = TensorArray(torch.float32, 3, clear_after_read=False).scatter(np.array([2, 0, 1]),
                                                                       x[[2, 0, 1]])
    assert torch.equal(ta.gather(np.array([1, 2], dtype=np.uint8)), x[[1, 2]])
    assert torch.equal(ta.read(np.array(2)), x[2])
    sp = TensorArray(torch.float32, 2).split(x.reshape(-1), np.array([2, 4]))
    assert torch.equal(sp.concat(), x.reshape(-1))
    for bad, got in ((torch.tensor(True), "torch.bool"), (torch.tensor(1.0), "torch.float32")):
        with raises(TensorArrayTypeError, ta, "must contain ints, got a 0-d tensor of dtype",
                    got):
            ta.gather([0, bad])
    with raises(TensorArrayTypeError, ta, "integer dtype, got NumPy float64"):
        ta.gather(np.array([0.0]))
    with raises(TensorArrayShapeError, ta, "must be a vector, got an array of shape (1, 2)"):
        ta.gather(np.array([[0, 1]]))


def test_size_counts_dynamic_growth():
    ta = TensorArray(torch.float32, 2, dynamic_size=True)
    assert ta.size() == 2
    ta = ta.write(6, rand((1,)))
    assert ta.size() == 7
    ta = ta.scatter([9, 8], rand((2, 1)))
    assert ta.size() == 10


# ------------------------------------------------------------------- reads and zeros


def test_unwritten_index_reads_zeros_when_shape_fully_known():
    ta = TensorArray(torch.float32, 3, element_shape=(2, 3), allocator=nan_allocator())
    ta = ta.write(1, rand((2, 3)))
    assert torch.equal(ta.read(0), torch.zeros(2, 3))
    stacked = TensorArray(torch.float32, 3, element_shape=(2,), allocator=nan_allocator())
    stacked = stacked.write(2, torch.ones(2))
    assert torch.equal(stacked.stack(), torch.tensor([[0.0, 0], [0, 0], [1, 1]]))


def test_unwritten_index_read_counts_as_written():
    ta = TensorArray(torch.float32, 2, element_shape=(1,))
    ta.read(0)
    with raises(TensorArrayWriteError, ta, "index 0", "already read"):
        ta.write(0, torch.ones(1))


def test_clear_after_read_false_allows_rereads():
    x = rand((2,))
    ta = TensorArray(torch.float32, 1, clear_after_read=False).write(0, x)
    for _ in range(3):
        assert torch.equal(ta.read(0), x)
    assert torch.equal(ta.stack(), x[None])


def test_read_with_matching_dtype_argument():
    ta = TensorArray(torch.float64, 1).write(0, rand((2,), torch.float64))
    assert ta.read(0, dtype=torch.float64).dtype == torch.float64


def test_gather_with_duplicates_when_not_cleared():
    x = rand((3, 2))
    ta = TensorArray(torch.float32, 3, clear_after_read=False).unstack(x)
    assert torch.equal(ta.gather([2, 2, 0]), x[[2, 2, 0]])


# ------------------------------------------------------------------- element shapes


def test_identical_element_shapes_infers_the_first_shape_and_uses_a_slab():
    ta = TensorArray(torch.float32, 3, identical_element_shapes=True)
    assert ta.element_shape is None
    ta = ta.write(0, rand((2, 4)))
    assert ta.element_shape == (2, 4)
    assert ta.slab is not None and ta.slab.shape == (3, 2, 4)
    # Fully known now: unwritten indices read as zeros.
    assert torch.equal(ta.read(2), torch.zeros(2, 4))


def test_partial_element_shape_accepts_compatible_values():
    ta = TensorArray(torch.float32, 2, element_shape=(None, 3))
    ta = ta.write(0, rand((1, 3))).write(1, rand((4, 3)))
    assert ta.concat().shape == (5, 3)
    ta2 = TensorArray(torch.float32, 1, element_shape=[-1, 3])
    assert ta2.element_shape == (None, 3)


def test_element_shape_none_allows_any_shapes_and_concat():
    ta = TensorArray(torch.float32, 3)
    ta = ta.write(0, rand((1, 2))).write(1, rand((5, 2))).write(2, rand((0, 2)))
    assert ta.concat().shape == (6, 2)


# -------------------------------------------------------------------------- storage


def test_fixed_size_known_shape_allocates_one_slab_through_the_hook():
    calls: list = []
    ta = TensorArray(torch.float32, 5, element_shape=(2, 3), allocator=nan_allocator(calls))
    for i in range(5):
        ta = ta.write(i, rand((2, 3)))
    assert calls == [(5, 2, 3)]
    assert ta.slab.shape == (5, 2, 3)


def test_stack_and_contiguous_gather_are_views_of_the_slab():
    x = rand((6, 2))
    ta = TensorArray(torch.float32, 6, element_shape=(2,), clear_after_read=False)
    for i in range(6):
        ta = ta.write(i, x[i])
    slab = ta.slab
    stacked = ta.stack()
    assert torch.equal(stacked, x) and stacked.data_ptr() == slab.data_ptr()
    part = ta.gather([2, 3, 4])
    assert torch.equal(part, x[2:5]) and part.data_ptr() == slab[2].data_ptr()
    picked = ta.gather([4, 0])  # not a range: one index_select copy
    assert torch.equal(picked, x[[4, 0]])


def test_from_slab_adopts_the_tensor_without_copy():
    y = rand((7, 3, 4))
    ta = TensorArray.from_slab(y, clear_after_read=False)
    assert ta.size() == 7 and ta.element_shape == (3, 4)
    assert ta.slab.data_ptr() == y.data_ptr()
    assert ta.read(2).data_ptr() == y[2].data_ptr()
    assert ta.stack().data_ptr() == y.data_ptr()


def test_unstack_into_fresh_shaped_array_adopts_value():
    calls: list = []
    y = rand((4, 2))
    ta = TensorArray(torch.float32, 4, element_shape=(2,), allocator=nan_allocator(calls))
    ta = ta.unstack(y)
    assert calls == [] and ta.slab.data_ptr() == y.data_ptr()
    # A partial unstack into a fixed array of size 5 cannot adopt: it copies into a slab.
    ta5 = TensorArray(torch.float32, 5, element_shape=(2,), allocator=nan_allocator(calls))
    ta5 = ta5.unstack(y)
    assert calls == [(5, 2)]
    assert torch.equal(ta5.stack(), torch.cat([y, torch.zeros(1, 2)]))


@pytest.mark.parametrize("layout", ["transposed", "expanded"])
@pytest.mark.parametrize("how", ["unstack", "from_slab"])
def test_adopted_value_that_is_not_contiguous_becomes_a_contiguous_slab(layout, how):
    base = rand((4, 3))
    value = base.t() if layout == "transposed" else base[:, 0].expand(3, 4)
    assert not value.is_contiguous()
    if how == "unstack":
        ta = TensorArray(torch.float32, 3, element_shape=(4,), clear_after_read=False)
        ta = ta.unstack(value)
    else:
        ta = TensorArray.from_slab(value, clear_after_read=False)
    assert ta.slab.is_contiguous() and 0 not in ta.slab.stride()
    assert torch.equal(ta.stack(), value)
    assert torch.equal(ta.read(1), value[1])


def test_list_storage_has_no_slab():
    ta = TensorArray(torch.float32, 2).write(0, rand((3,)))
    assert ta.slab is None


def test_dynamic_slab_grows_geometrically():
    calls: list = []
    ta = TensorArray(
        torch.float32, 0, dynamic_size=True, element_shape=(2,), allocator=nan_allocator(calls)
    )
    xs = rand((100, 2))
    for i in range(100):
        ta = ta.write(i, xs[i])
    assert ta.size() == 100
    assert len(calls) <= 8  # 1, 2, 4, ..., 128
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    assert torch.equal(ta.stack(), xs)


def test_dynamic_array_grows_past_an_adopted_slab():
    y = rand((3, 2))
    ta = TensorArray(torch.float32, 0, dynamic_size=True, element_shape=(2,)).unstack(y)
    assert ta.slab.data_ptr() == y.data_ptr()
    z = rand((2,))
    ta = ta.write(4, z)
    assert ta.size() == 5 and ta.slab.data_ptr() != y.data_ptr()
    assert torch.equal(ta.stack(), torch.cat([y, torch.zeros(1, 2), z[None]]))


def test_dynamic_list_array_with_holes_and_known_shape_reads_zeros():
    ta = TensorArray(torch.float32, 0, dynamic_size=True, element_shape=(3,))
    ta = ta.write(3, torch.ones(3))
    assert torch.equal(ta.stack(), torch.tensor([[0.0] * 3] * 3 + [[1.0] * 3]))


def test_registry_allocator_is_the_default(registry):
    calls: list = []
    registry.allocator = nan_allocator(calls)
    TensorArray(torch.float32, 2, element_shape=(1,), registry=registry).write(0, torch.ones(1))
    assert calls == [(2, 1)]


@pytest.mark.parametrize(
    "bad, fragments",
    [
        (lambda shape, dtype, device: torch.empty(shape[1:], dtype=dtype), ["(2, 3)", "(3,)"]),
        (lambda shape, dtype, device: torch.empty(shape, dtype=torch.float64), ["float64"]),
        (lambda shape, dtype, device: [0.0] * shape[0], ["torch.Tensor", "list"]),
        (lambda shape, dtype, device: torch.zeros(shape[1:], dtype=dtype).expand(shape),
         ["expanded", "(0, 1)"]),
    ],
    ids=["shape", "dtype", "type", "expanded"],
)
def test_allocator_returning_a_wrong_tensor_raises(bad, fragments):
    ta = TensorArray(torch.float32, 2, element_shape=(3,), allocator=bad)
    # A ValueError like every other TensorArray error (a builtin type callers can catch).
    with raises(TensorArrayAllocatorError, ta, "allocator", *fragments) as info:
        ta.write(0, torch.ones(3))
    assert isinstance(info.value, ValueError)
    assert not ta.handle._res.written[0], "a failed allocation must leave the index unwritten"


def _failing_once():
    """An allocator whose first call fails (out of memory, a planner's refusal), then works."""
    calls = []

    def allocate(shape, dtype, device):
        calls.append(shape)
        if len(calls) == 1:
            raise MemoryError("simulated out of memory")
        return torch.empty(shape, dtype=dtype, device=device)

    return allocate


@pytest.mark.parametrize("kw, op", [
    (dict(element_shape=(3,)), "write"),
    (dict(identical_element_shapes=True), "write"),
    (dict(element_shape=(3,)), "scatter"),
    (dict(identical_element_shapes=True), "scatter"),
], ids=["write", "write-identical", "scatter", "scatter-identical"])
def test_a_failed_allocation_changes_nothing(kw, op):
    """A dynamic array's store that fails in its allocator leaves the size, the element shape
    and the storage as they were, so the array behaves as if the op had never run."""
    ta = TensorArray(torch.float32, 0, dynamic_size=True, allocator=_failing_once(), **kw)
    res = ta.handle._res
    before = (res.size, res.element_shape, res.slab_shape, res.device)
    value = torch.ones(2, 3)
    store = {"write": lambda: ta.write(1, value[0]),
             "scatter": lambda: ta.scatter(torch.tensor([0, 3]), value)}[op]
    with pytest.raises(MemoryError, match="simulated out of memory"):
        store()
    assert (res.size, res.element_shape, res.slab_shape, res.device) == before
    assert not any(res.written) and len(res.written) == res.size == 0
    ta2 = store()  # the allocator works now: as on a fresh array
    assert ta2.size() == (4 if op == "scatter" else 2)


def test_sizes_and_indices_past_int32_are_refused_before_any_storage():
    """TensorFlow's sizes and indices are int32: a size, a dynamic write's index or a
    scatter's index of 2**31 - 1 or more is refused by name (before, the per-index flags of
    such a size raised a bare MemoryError); the array stays usable."""
    with pytest.raises(TensorArrayShapeError, match=r"size must be in \[0, 2147483647\] .*got "
                                                    r"4611686018427387904$"):
        TensorArray(torch.float32, 2**62)
    ta = TensorArray(torch.float32, 0, dynamic_size=True, element_shape=(2,))
    with pytest.raises(TensorArrayIndexError, match=r"write\(index=2147483647\): index must "
                                                    r"be < 2147483647 .*got 2147483647$"):
        ta.write(2**31 - 1, torch.ones(2))
    with pytest.raises(TensorArrayIndexError, match=r"scatter: indices must be < 2147483647 "
                                                    r".*got 4611686018427387904$"):
        ta.scatter([0, 2**62], torch.ones(2, 2))
    assert ta.size() == 0
    assert ta.write(3, torch.ones(2)).size() == 4


@pytest.mark.parametrize("call, what", [
    (lambda ta, m: ta.write(m(0), torch.ones(2)), "write: index"),
    (lambda ta, m: ta.scatter(m([0]), torch.ones(1, 2)), "scatter: indices"),
    (lambda ta, m: ta.gather(m([0])), "gather: indices"),
    (lambda ta, m: TensorArray(torch.float32, 2).split(torch.ones(4), m([2, 2])),
     "split: lengths"),
    (lambda ta, m: TensorArray(torch.float32, m(2)), "size"),
    (lambda ta, m: TensorArray(torch.float32, 2, element_shape=m([2])), "element_shape"),
], ids=["write", "scatter", "gather", "split", "size", "element_shape"])
def test_meta_tensor_arguments_are_refused_by_name(call, what):
    """Indices, lengths, sizes and shapes are read on the host: a meta tensor has no values
    (torch's own error named no argument)."""
    ta = TensorArray(torch.float32, 2, element_shape=(2,))
    meta = lambda v: torch.tensor(v, device="meta")  # noqa: E731
    with pytest.raises(TensorArrayTypeError, match=rf"{what} must be a tensor with data "
                                                   rf"\(it is read on the host\), got a meta"):
        call(ta, meta)


def test_a_uint64_index_past_int64_is_out_of_range():
    ta = TensorArray(torch.float32, 2, element_shape=(2,))
    with pytest.raises(TensorArrayIndexError, match=r"index must be in \[0, 2\) .*got "
                                                    r"9223372036854775808$"):
        ta.write(torch.tensor(2**63, dtype=torch.uint64), torch.ones(2))


def test_a_read_whose_allocation_fails_changes_nothing():
    """Reading an unwritten index of a fully shaped array allocates the slab for its zeros;
    when that fails the index stays unwritten (and the device unchosen), so a later write
    to it is allowed, as on a fresh array."""
    ta = TensorArray(torch.float32, 2, element_shape=(3,), allocator=_failing_once())
    res = ta.handle._res
    with pytest.raises(MemoryError, match="simulated out of memory"):
        ta.read(0)
    assert not res.written[0] and not res.soft[0] and res.device is None
    ta = ta.write(0, torch.ones(3))
    assert torch.equal(ta.read(0), torch.ones(3)) and torch.equal(ta.read(1), torch.zeros(3))


def test_registry_reads_hold_its_lock(registry):
    """Other threads register arrays while one lists them (a weak dict changing size under an
    iteration raises): names(), iteration, `in` and close_all() read under the registry's
    lock, as register() writes under it."""
    import threading

    held = []

    class Recording:
        def __init__(self):
            self.lock = threading.Lock()

        def __enter__(self):
            held.append(True)
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    TensorArray(torch.float32, 1, registry=registry)
    registry._lock = Recording()
    for read in (registry.names, lambda: list(registry), lambda: "x" in registry,
                 registry.close_all):
        held.clear()
        read()
        assert held, read


@pytest.mark.parametrize("history", [False, True], ids=["values", "autograd"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic"])
def test_threads_writing_one_array_lose_nothing(dynamic, history, monkeypatch):
    """Each op holds the array's lock, as TensorFlow's kernels hold its mutex: threads
    writing distinct indices of one array keep every row and, with autograd history, every
    gradient. A first write allocates the slab (a dynamic array's grows it); a slowed
    allocation widens the window in which, unlocked, each thread allocated its own slab and
    all but the last one's rows vanished; and each write's flow (the chain the backward
    follows) was read and replaced outside the lock, so the writes' flows forked and all but
    one write's gradient were lost."""
    import threading
    import time

    from tritonrnn.tensorarray import resource

    allocate = resource.allocate_slab

    def slow(*args):
        time.sleep(0.01)
        return allocate(*args)

    monkeypatch.setattr(resource, "allocate_slab", slow)
    n = 6
    x = torch.arange(1.0, n + 1)[:, None].expand(n, 2).clone().requires_grad_(history)
    ta = TensorArray(torch.float32, 0 if dynamic else n, dynamic_size=dynamic,
                     element_shape=(2,))
    start, errors = threading.Barrier(n), []

    def write(i):
        start.wait()
        try:
            ta.write(i, x[i] * 1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stacked = TensorArray._wrap(ta.handle, ta.handle._flow).stack()
    assert torch.equal(stacked.detach(), x.detach())
    if history:
        stacked.sum().backward()
        assert torch.equal(x.grad, torch.ones(n, 2))


def test_close_during_grad_creation_closes_the_new_gradient_array():
    """close() waits for a gradient array being created on another thread, then closes it
    with the forward array: none is left open and registered."""
    import threading
    import time

    entered = threading.Event()

    class SlowRegistry(TensorArrayRegistry):
        def register(self, handle):
            if "@" in handle.name:  # the gradient array, inside grad()
                entered.set()
                time.sleep(0.2)
            super().register(handle)

    reg = SlowRegistry()
    ta = TensorArray(torch.float32, 2, element_shape=(3,), registry=reg).write(0, torch.ones(3))
    made = []
    worker = threading.Thread(target=lambda: made.append(ta.grad("gradients")))
    worker.start()
    assert entered.wait(5)
    ta.close()
    worker.join()
    assert made[0].handle.closed and reg.names() == []


@pytest.mark.parametrize("flag", ["dynamic_size", "clear_after_read", "identical_element_shapes"])
@pytest.mark.parametrize("value", ["no", None, 2])
def test_error_flags_must_be_bools(flag, value):
    # A string "no" would otherwise turn into True without a word.
    with pytest.raises(TensorArrayTypeError, match=rf"{flag} must be a bool, got "
                       rf"{type(value).__name__} {re.escape(repr(value))}"):
        TensorArray(torch.float32, 2, **{flag: value})


@pytest.mark.parametrize(
    "device, exc, fragment",
    [
        ("gpu0", TensorArrayDeviceError, "device must name a torch device"),
        ("cuda:99", TensorArrayDeviceError, "device must be an available device; got 'cuda:99'"),
        (1.0, TensorArrayTypeError, "device must be a torch.device, str, int or None, got float"),
        (True, TensorArrayTypeError, "got bool True"),
    ],
)
def test_error_bad_device_is_named(device, exc, fragment):
    with pytest.raises(exc, match=re.escape(fragment)) as info:
        TensorArray(torch.float32, 2, name="dev", device=device)
    assert "TensorArray 'dev'" in str(info.value)


def test_device_none_takes_the_first_value_device():
    ta = TensorArray(torch.float32, 1)
    assert ta.device is None
    ta = ta.write(0, torch.ones(1))
    assert ta.device == torch.device("cpu")


# ------------------------------------------------------------------------- registry


def test_default_registry_indexes_arrays_by_name():
    ta = TensorArray(torch.float32, 1)
    assert ta.handle.registry is default_registry
    assert default_registry.lookup(ta.handle.name) is ta.handle


def test_explicit_registry_isolates(registry):
    mine = TensorArray(torch.float32, 1, registry=registry)
    other = TensorArray(torch.float32, 1)
    assert registry.names() == [mine.handle.name]
    assert other.handle.name not in registry and other.handle.name in default_registry
    assert len(registry) == 1


def test_close_removes_from_registry_and_frees_storage(registry):
    ta = TensorArray(torch.float32, 2, element_shape=(3,), registry=registry)
    ta = ta.write(0, torch.ones(3))
    g = ta.grad("gradients")
    assert set(registry.names()) == {ta.handle.name, g.handle.name}
    ta.close()
    assert registry.names() == [] and ta.handle.closed and g.handle.closed
    assert ta.slab is None
    # close() is an op too: after close() it raises (TensorFlow is silent), on the forward
    # array and on the gradient array that the forward's close() closed.
    for closed in (ta, g):
        with raises(TensorArrayClosedError, closed, "close()", "closed"):
            closed.close()


def test_registry_close_all(registry):
    tas = [TensorArray(torch.float32, 1, registry=registry) for _ in range(3)]
    registry.close_all()
    assert len(registry) == 0 and all(t.handle.closed for t in tas)


def test_registry_holds_arrays_weakly(registry):
    ta = TensorArray(torch.float32, 2, registry=registry).write(0, rand((3,)))
    name = ta.handle.name
    del ta
    gc.collect()
    assert name not in registry
    with pytest.raises(TensorArrayClosedError, match=re.escape(f"'{name}'")):
        registry.lookup(name)


# --------------------------------------------------------------------------- errors


def test_error_write_twice():
    ta = TensorArray(torch.float32, 3).write(2, torch.ones(1))
    with raises(TensorArrayWriteError, ta, "write(index=2)", "index 2", "already written"):
        ta.write(2, torch.ones(1))


def test_error_scatter_into_written_index():
    ta = TensorArray(torch.float32, 3).write(1, torch.ones(1))
    with raises(TensorArrayWriteError, ta, "index 1", "already written"):
        ta.scatter([0, 1], torch.ones(2, 1))


def test_error_scatter_duplicate_indices_in_forward_array():
    # Named as a repeat, not as an earlier write (the index was never written).
    ta = TensorArray(torch.float32, 3)
    with raises(TensorArrayWriteError, ta, "index 2 must appear once in indices, got it more "
                "than once"):
        ta.scatter([2, 0, 2], torch.ones(3, 1))


@pytest.mark.parametrize("storage", STORAGES)
def test_error_scatter_duplicate_indices_past_the_end_of_a_dynamic_array(storage):
    # The duplicate lies beyond the current size (a growing scatter): the same write error,
    # and the rejected scatter leaves the array as it was.
    shape = (1,) if storage == "slab" else None
    ta = TensorArray(torch.float32, 1, dynamic_size=True, element_shape=shape)
    with raises(TensorArrayWriteError, ta, "index 3 must appear once in indices"):
        ta.scatter([3, 3], torch.ones(2, 1))
    assert ta.size() == 1
    ta = ta.scatter([3, 0], torch.tensor([[3.0], [0.0]]))
    assert ta.size() == 4 and ta.read(3).item() == 3.0


@pytest.mark.parametrize("op", ["write", "scatter", "unstack", "split"])
def test_rejected_value_does_not_fix_the_device(op):
    # An array made without a device takes the first stored value's: a value rejected by a
    # later check (shape, length) must not fix it ("nothing is lost").
    ta = TensorArray(torch.float32, 2, element_shape=(3,))
    bad = torch.ones(2, 4, device="meta")
    with pytest.raises(TensorArrayShapeError):
        if op == "write":
            ta.write(0, bad[0])
        elif op == "scatter":
            ta.scatter([0, 1], bad)
        elif op == "unstack":
            ta.unstack(bad)
        else:
            ta.split(bad.reshape(8), [4, 4])
    assert ta.device is None
    ta = ta.write(0, torch.ones(3))
    assert ta.device == torch.device("cpu")


def test_error_write_after_read():
    ta = TensorArray(torch.float32, 3, clear_after_read=False).write(0, torch.ones(1))
    ta.read(0)
    with raises(TensorArrayWriteError, ta, "index 0", "already read"):
        ta.write(0, torch.ones(1))


def test_error_read_cleared_index_suggests_clear_after_read_false():
    ta = TensorArray(torch.float32, 2).write(0, torch.ones(1)).write(1, torch.ones(1))
    ta.read(0)
    with raises(TensorArrayReadError, ta, "index 0", "cleared", "clear_after_read=False"):
        ta.read(0)
    ta.read(1)
    with raises(TensorArrayReadError, ta, "index 0", "clear_after_read=False"):
        ta.stack()


def test_error_gather_repeated_index_with_clear_after_read():
    # Named as a repeat, not as an earlier read (the index was never read).
    ta = TensorArray(torch.float32, 2).unstack(torch.ones(2, 1))
    with raises(TensorArrayReadError, ta, "index 1 must appear once in indices when reads "
                "clear", "clear_after_read=False"):
        ta.gather([1, 1])


@pytest.mark.parametrize("index", [3, 7, -1], ids=["at_size", "past_size", "negative"])
def test_error_index_out_of_range_on_fixed_array(index):
    ta = TensorArray(torch.float32, 3, element_shape=(1,))
    with raises(TensorArrayIndexError, ta, f"got {index}", "size 3"):
        ta.write(index, torch.ones(1))
    with raises(TensorArrayIndexError, ta, f"got {index}", "size 3"):
        ta.read(index)
    with raises(TensorArrayIndexError, ta, str(index)):
        ta.gather([0, index])


def test_error_negative_index_on_dynamic_array_and_read_past_end():
    ta = TensorArray(torch.float32, 0, dynamic_size=True)
    with raises(TensorArrayIndexError, ta, "got -1"):
        ta.write(-1, torch.ones(1))
    with raises(TensorArrayIndexError, ta, "got 0", "reads never grow"):
        ta.read(0)
    with raises(TensorArrayIndexError, ta, "-2"):
        ta.scatter([1, -2], torch.ones(2, 1))


def test_error_read_unwritten_index_without_full_shape():
    ta = TensorArray(torch.float32, 3, element_shape=(None, 2))
    with raises(TensorArrayReadError, ta, "index 1", "never written", "(None, 2)"):
        ta.read(1)
    ta2 = TensorArray(torch.float32, 2).write(0, torch.ones(1))
    with raises(TensorArrayReadError, ta2, "index 1", "<unknown>"):
        ta2.stack()


@pytest.mark.parametrize("op", ["write", "scatter", "unstack", "split"])
def test_error_value_dtype_mismatch(op):
    ta = TensorArray(torch.float32, 2)
    v = torch.ones(2, 1, dtype=torch.float64)
    call = {
        "write": lambda: ta.write(0, v[0]),
        "scatter": lambda: ta.scatter([0, 1], v),
        "unstack": lambda: ta.unstack(v),
        "split": lambda: ta.split(v, [1, 1]),
    }[op]
    with raises(TensorArrayDTypeError, ta, "torch.float32", "torch.float64"):
        call()


@pytest.mark.parametrize("op", ["read", "gather", "stack", "concat"])
def test_error_requested_dtype_mismatch(op):
    ta = TensorArray(torch.float32, 1, clear_after_read=False).write(0, torch.ones(2))
    call = {
        "read": lambda: ta.read(0, dtype=torch.int32),
        "gather": lambda: ta.gather([0], dtype=torch.int32),
        "stack": lambda: ta.stack(dtype=torch.int32),
        "concat": lambda: ta.concat(dtype=torch.int32),
    }[op]
    with raises(TensorArrayDTypeError, ta, "torch.float32", "torch.int32"):
        call()
    assert isinstance(pytest.raises(TypeError, call).value, TensorArrayError)


def test_error_element_shape_incompatible_with_declared():
    ta = TensorArray(torch.float32, 3, element_shape=(2, 3))
    with raises(TensorArrayShapeError, ta, "(2, 4)", "(2, 3)", "declared"):
        ta.write(0, torch.ones(2, 4))
    with raises(TensorArrayShapeError, ta, "element shape (3,) of value shape (2, 3)",
                "array's element shape (2, 3)"):
        ta.scatter([0, 1], torch.ones(2, 3))
    with raises(TensorArrayShapeError, ta, "element shape (4,) of value shape (3, 4)"):
        ta.unstack(torch.ones(3, 4))
    partial = TensorArray(torch.float32, 1, element_shape=(None, 3))
    with raises(TensorArrayShapeError, partial, "(2, 4)", "(None, 3)"):
        partial.write(0, torch.ones(2, 4))
    # Declared and identical_element_shapes: still "declared", before any write.
    both = TensorArray(torch.float32, 2, element_shape=(2, 3), identical_element_shapes=True)
    with raises(TensorArrayShapeError, both, "(2, 4)", "(2, 3) (declared)"):
        both.write(0, torch.ones(2, 4))


def test_error_element_shape_incompatible_with_inferred():
    ta = TensorArray(torch.float32, 3, identical_element_shapes=True).write(0, torch.ones(2, 3))
    with raises(TensorArrayShapeError, ta, "(3, 2)", "(2, 3)", "inferred"):
        ta.write(1, torch.ones(3, 2))
    sp = TensorArray(torch.float32, 2, identical_element_shapes=True)
    with raises(TensorArrayShapeError, sp, "(1, 2)", "(2, 2)"):
        sp.split(torch.ones(3, 2), [1, 2])


def test_error_stack_of_different_shapes():
    ta = TensorArray(torch.float32, 3).write(0, torch.ones(2)).write(1, torch.ones(2))
    ta = ta.write(2, torch.ones(3))
    with raises(TensorArrayShapeError, ta, "index 0 has shape (2,)", "index 2 has shape (3,)"):
        ta.stack()
    with raises(TensorArrayShapeError, ta, "(2,)", "(3,)"):
        ta.gather([2, 1])


def test_error_stack_error_leaves_the_array_unread():
    ta = TensorArray(torch.float32, 2).write(0, torch.ones(2)).write(1, torch.ones(3))
    with pytest.raises(TensorArrayShapeError):
        ta.stack()
    assert torch.equal(ta.read(0), torch.ones(2))  # the failed stack cleared nothing


def test_error_concat_of_scalars():
    ta = TensorArray(torch.float32, 2).write(0, torch.tensor(1.0)).write(1, torch.tensor(2.0))
    with raises(TensorArrayShapeError, ta, "index 0 has shape ()", "stack()"):
        ta.concat()
    empty = TensorArray(torch.float32, 0, element_shape=())
    with raises(TensorArrayShapeError, empty, "shape ()"):
        empty.concat()


@pytest.mark.parametrize("scalar_at", [0, 1, 2])
def test_error_concat_of_a_scalar_at_any_index(scalar_at):
    # Elements of different ranks (list storage): the scalar is named wherever it sits.
    ta = TensorArray(torch.float32, 3)
    for i in range(3):
        ta = ta.write(i, torch.tensor(1.0) if i == scalar_at else torch.ones(2))
    with raises(TensorArrayShapeError, ta, f"index {scalar_at} has shape ()", "stack()"):
        ta.concat()
    assert torch.equal(ta.read(0), torch.ones(2) if scalar_at else torch.tensor(1.0))


def test_error_concat_shapes_differ_beyond_dim0():
    ta = TensorArray(torch.float32, 2).write(0, torch.ones(1, 2)).write(1, torch.ones(3, 4))
    with raises(TensorArrayShapeError, ta, "beyond dimension 0", "(1, 2)", "index 1", "(3, 4)"):
        ta.concat()


def test_error_split_lengths_not_a_vector():
    ta = TensorArray(torch.float32, 2)
    with raises(TensorArrayShapeError, ta, "lengths", "vector", "(1, 2)"):
        ta.split(torch.ones(3), torch.tensor([[1, 2]]))
    with raises(TensorArrayShapeError, ta, "lengths", "vector"):
        ta.split(torch.ones(3), 3)
    with raises(TensorArrayShapeError, ta, "lengths", "vector"):
        ta.split(torch.ones(3), [[1], [2]])


def test_error_split_lengths_do_not_sum_to_value_rows():
    ta = TensorArray(torch.float32, 2)
    with raises(TensorArrayShapeError, ta, "sum(lengths)", "sum 4", "(3, 2)"):
        ta.split(torch.ones(3, 2), [1, 3])
    with raises(TensorArrayShapeError, ta, "lengths must be >= 0", "-1"):
        ta.split(torch.ones(3, 2), [4, -1])


def test_error_split_value_not_a_vector():
    ta = TensorArray(torch.float32, 1)
    with raises(TensorArrayShapeError, ta, "at least a vector", "()"):
        ta.split(torch.tensor(1.0), [1])


def test_error_split_count_differs_from_fixed_size():
    ta = TensorArray(torch.float32, 3)
    with raises(TensorArrayShapeError, ta, "size 3", "got 2 lengths"):
        ta.split(torch.ones(4), [1, 3])
    dyn = TensorArray(torch.float32, 1, dynamic_size=True).split(torch.ones(4), [1, 3])
    assert dyn.size() == 2
    # As TensorFlow's kernel: a dynamic array grows to the lengths' count, never shrinks.
    with raises(TensorArrayShapeError, dyn, "at least the size 2 of this dynamic array",
                "got 1 lengths"):
        dyn.split(torch.ones(4), [4])


def test_error_scatter_indices_count_differs_from_value_rows():
    ta = TensorArray(torch.float32, 4)
    with raises(TensorArrayShapeError, ta, "len(indices)", "3 indices", "(2, 5)"):
        ta.scatter([0, 1, 2], torch.ones(2, 5))


def test_error_scatter_max_index_past_fixed_size():
    ta = TensorArray(torch.float32, 3)
    with raises(TensorArrayIndexError, ta, "max index", "size 3", "got 5"):
        ta.scatter([0, 5], torch.ones(2, 1))
    with raises(TensorArrayIndexError, ta, "unstack", "value.shape[0]", "size 3", "(4, 1)"):
        ta.unstack(torch.ones(4, 1))


def test_error_unstack_scatter_of_scalar_value():
    ta = TensorArray(torch.float32, 3)
    with raises(TensorArrayShapeError, ta, "unstack", "at least a vector", "()"):
        ta.unstack(torch.tensor(1.0))
    with raises(TensorArrayShapeError, ta, "scatter", "at least a vector"):
        ta.scatter([], torch.tensor(1.0))


@pytest.mark.parametrize("op", ["stack", "concat"])
def test_error_size0_with_unknown_element_shape(op):
    ta = TensorArray(torch.float32, 0)
    with raises(TensorArrayShapeError, ta, f"{op}()", "size-0", "<unknown>"):
        getattr(ta, op)()
    partial = TensorArray(torch.float32, 0, element_shape=(2, None))
    with raises(TensorArrayShapeError, partial, "(2, None)"):
        getattr(partial, op)()


def test_size0_with_known_element_shape_stacks_and_concats_empty():
    ta = TensorArray(torch.float64, 0, element_shape=(2, 3))
    assert ta.stack().shape == (0, 2, 3) and ta.stack().dtype == torch.float64
    assert ta.concat().shape == (0, 3)
    assert TensorArray(torch.float32, 0, element_shape=(None, 3)).concat().shape == (0, 3)


def test_error_gather_of_no_indices_without_full_shape():
    ta = TensorArray(torch.float32, 2)
    with raises(TensorArrayShapeError, ta, "gather of zero indices", "<unknown>"):
        ta.gather([])


OPS_AFTER_CLOSE = {
    "write": lambda ta: ta.write(0, torch.ones(1)),
    "read": lambda ta: ta.read(0),
    "gather": lambda ta: ta.gather([0]),
    "scatter": lambda ta: ta.scatter([0], torch.ones(1, 1)),
    "stack": lambda ta: ta.stack(),
    "unstack": lambda ta: ta.unstack(torch.ones(1, 1)),
    "concat": lambda ta: ta.concat(),
    "split": lambda ta: ta.split(torch.ones(1), [1]),
    "size": lambda ta: ta.size(),
    "grad": lambda ta: ta.grad("gradients"),
}


@pytest.mark.parametrize("op", list(OPS_AFTER_CLOSE))
def test_error_any_op_after_close(op):
    ta = TensorArray(torch.float32, 1, element_shape=(1,))
    old = ta
    ta = ta.write(0, torch.ones(1))
    ta.close()
    for obj in (ta, old):  # every object sharing the handle
        with raises(TensorArrayClosedError, ta, "close"):
            OPS_AFTER_CLOSE[op](obj)


def test_error_value_on_another_device():
    ta = TensorArray(torch.float32, 2, device="cpu")
    with raises(TensorArrayDeviceError, ta, "cpu", "meta"):
        ta.write(0, torch.ones(1, device="meta"))


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda ta: ta.write(1.0, torch.ones(1)), "float"),
        (lambda ta: ta.write(True, torch.ones(1)), "bool"),
        (lambda ta: ta.read(torch.tensor(0.0)), "torch.float32"),
        (lambda ta: ta.gather([0.5]), "float"),
        (lambda ta: ta.write(0, [1.0]), "torch.Tensor"),
        (lambda ta: ta.grad(3), "source"),
    ],
    ids=[
        "float_index",
        "bool_index",
        "float_tensor_index",
        "float_in_indices",
        "list_value",
        "int_source",
    ],
)
def test_error_argument_types(call, fragment):
    ta = TensorArray(torch.float32, 2)
    with raises(TensorArrayTypeError, ta, fragment):
        call(ta)


def test_error_constructor_arguments():
    with pytest.raises(TensorArrayTypeError, match="dtype must be a torch.dtype"):
        TensorArray("float32")
    # Dtypes torch copies, fills and adds no rows of by index: refused up front (a scatter or
    # a gather's zeros raised torch's own NotImplementedError, naming neither array nor dtype).
    for dtype in (torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn):
        with pytest.raises(TensorArrayDTypeError, match=rf"dtype must be one of \[bool, uint8, "
                           rf".*complex128\], got {dtype}"):
            TensorArray(dtype, 2)
    for dtype in (torch.bool, torch.int16, torch.complex128):  # accepted: rows move and add
        ta = TensorArray(dtype, 4, element_shape=(2,)).scatter([3, 0], torch.ones(2, 2,
                                                                                  dtype=dtype))
        assert torch.equal(ta.gather([0, 1]), torch.tensor([[1, 1], [0, 0]]).to(dtype))
    with pytest.raises(TensorArrayShapeError, match=r"size must be in \[0, 2147483647\] .*, "
                                                    r"got -1$"):
        TensorArray(torch.float32, -1)
    with pytest.raises(TensorArrayShapeError, match="element_shape"):
        TensorArray(torch.float32, 1, element_shape=(2, -3))


@pytest.mark.parametrize("shape", ["ab", 3, 2.5], ids=["str", "int", "float"])
def test_an_element_shape_of_another_type_is_a_type_error(shape):
    """Not a sequence: a TypeError naming element_shape (it was a ShapeError, a ValueError,
    which a shape of the right type but bad values raises)."""
    with pytest.raises(TensorArrayTypeError, match=r"element_shape must be None or a sequence "
                                                   r"of ints/None, got "):
        TensorArray(torch.float32, 2, element_shape=shape)
