"""The TensorArray resource: storage, per-index state and TensorFlow's kernel rules.

This layer works on detached tensors and knows nothing about autograd; :mod:`.autograd` wraps
it. Its rules follow TensorFlow's legacy TensorArray kernels (tensor_array.h,
tensor_array_ops.cc); where TensorFlow crashes or is silent it raises.

Per-index state, one bytearray each (so range checks and updates run in C, not per element):

- ``written``: the index holds a value, or a shape only ("soft": reads give zeros);
- ``soft``: written with a shape but no data (gradient arrays' shape soft copy, or an unwritten
  index of a fully-shaped array materialised by a read);
- ``read``: the index was read (a forward write to it is then an error);
- ``cleared``: its data was dropped by a read under ``clear_after_read``;
- ``hist``: the value came from an autograd-recorded write, so reads of it must be recorded.

Storage is either one slab ``[capacity, *slab_shape]`` (when the element shape is known: declared
fully, inferred under ``identical_element_shapes``, or, for a gradient array, the one shape of
every soft-copied entry) or a list of tensors with their shapes.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING

import torch

from .errors import (
    TensorArrayClosedError,
    TensorArrayDeviceError,
    TensorArrayDTypeError,
    TensorArrayGradError,
    TensorArrayIndexError,
    TensorArrayReadError,
    TensorArrayShapeError,
    TensorArrayWriteError,
)
from .shapes import MAX_SIZE, PartialShape, fmt_shape, is_compatible, is_fully_defined
from .storage import Allocator, allocate_slab

if TYPE_CHECKING:
    from .registry import TensorArrayHandle, TensorArrayRegistry

__all__ = ["ArrayResource", "new_flow"]

_ONE = b"\x01"
_ZERO = b"\x00"


def new_flow(flow_in: torch.Tensor | None = None) -> torch.Tensor:
    """A new flow scalar: float32 zero on the CPU.

    The flow only carries autograd ordering edges, never data, so it stays on the CPU whatever
    the array's device. A flow derived from ``flow_in`` is a detached alias of it (a new tensor
    object, no allocation): every op output needs its own tensor to carry its autograd node, and
    nothing ever writes a flow.
    """
    if flow_in is not None:
        return flow_in.detach()
    return torch.zeros((), dtype=torch.float32)


def _unversioned(slab: torch.Tensor) -> torch.Tensor:
    """The slab for the array's own in-place writes, apart from autograd's version counter.

    Reads, stack and range gathers hand out views of the slab (no copy). Were the array's
    later writes to other rows (or zeros filled into soft rows) to bump the counter those
    views share, autograd would refuse every earlier read's result ("a view ... and its base
    ... has been modified inplace"): the loop ``h = f(ta.read(t)); ta = ta.write(t + 1, h)``
    could not be differentiated. No row a view shows is ever rewritten (a write twice is an
    error; a gradient array aggregates into a row before its one read, in backward), so no
    value handed out changes. The counter still catches in-place changes the user makes to
    the values: a view handed out, or the tensor a full unstack adopted as the slab.
    """
    return slab.data


def _locked(op):
    """Runs a public op of an array under its lock, as TensorFlow's TensorArray kernels each
    hold the array's mutex: ops on one array from several threads do not interleave (a first
    write allocating the slab, or a dynamic array growing, is check-then-act). Reentrant:
    the array module holds it across a mutator's autograd function, which calls the op, and
    around gradient-array creation (`make_grad`)."""

    @functools.wraps(op)
    def run(self, *args, **kwargs):
        with self.lock:
            return op(self, *args, **kwargs)

    return run


class ArrayResource:
    """Storage and state of one TensorArray (the resource a handle points to)."""

    __slots__ = (
        "__weakref__",
        "aggregate",
        "allocator",
        "clear_after_read",
        "cleared",
        "closed",
        "device",
        "dtype",
        "dynamic_size",
        "element_shape",
        "forward_name",
        "forward_was_split",
        "grads",
        "hist",
        "identical_element_shapes",
        "is_grad",
        "items",
        "lock",
        "name",
        "read_",
        "registry",
        "shapes",
        "size",
        "slab",
        "slab_shape",
        "soft",
        "source",
        "shape_origin",
        "was_split",
        "written",
    )

    def __init__(
        self,
        name: str,
        dtype: torch.dtype,
        size: int,
        dynamic_size: bool,
        clear_after_read: bool,
        element_shape: PartialShape,
        identical_element_shapes: bool,
        device: torch.device | None,
        allocator: Allocator | None,
        registry: TensorArrayRegistry,
        *,
        is_grad: bool = False,
    ):
        self.name = name
        self.dtype = dtype
        self.size = size
        self.dynamic_size = dynamic_size
        self.clear_after_read = clear_after_read
        self.element_shape = element_shape
        # Where element_shape came from, for error messages: "declared", "inferred from the
        # first write" (identical_element_shapes) or "inherited from ..." (gradient arrays).
        self.shape_origin = "declared"
        self.identical_element_shapes = identical_element_shapes
        self.device = device
        self.allocator = allocator
        self.registry = registry
        self.is_grad = is_grad
        # Gradient arrays add repeated writes (TF multiple_writes_aggregate).
        self.aggregate = is_grad
        self.closed = False
        self.was_split = False
        self.forward_was_split = False
        self.forward_name: str | None = None
        self.source: str | None = None
        self.grads: dict[str, TensorArrayHandle] = {}
        self.lock = threading.RLock()  # each public op holds it (`_locked`)
        self.written = bytearray(size)
        self.soft = bytearray(size)
        self.read_ = bytearray(size)
        self.cleared = bytearray(size)
        self.hist = bytearray(size)
        self.slab: torch.Tensor | None = None
        self.slab_shape: tuple[int, ...] | None = None
        self.items: list[torch.Tensor | None] | None = [None] * size
        self.shapes: list[tuple[int, ...] | None] | None = [None] * size
        if is_fully_defined(element_shape):
            self._use_slab(element_shape)  # type: ignore[arg-type]

    # ----------------------------------------------------------------- helpers

    def _prefix(self, op: str) -> str:
        return f"TensorArray {self.name!r}: {op}: "

    @property
    def registry_key(self) -> str | tuple[str, str]:
        """Where the registry indexes this array: under its name, a gradient array under
        (forward name, source), TensorArrayGrad's key. TensorFlow keeps gradient arrays in a
        container of their own, so a user array named like one ("<forward name>@<source>")
        never collides with it."""
        return (self.forward_name, self.source) if self.is_grad else self.name  # type: ignore[return-value]

    def check_open(self, op: str) -> None:
        if self.closed:
            raise TensorArrayClosedError(
                f"{self._prefix(op)}expected an open array, but it was closed (close() frees "
                "it and its gradient arrays)"
            )

    def _check_dtype(self, dtype: torch.dtype, op: str, what: str) -> None:
        if dtype != self.dtype:
            raise TensorArrayDTypeError(
                f"{self._prefix(op)}{what} dtype must be the array's dtype {self.dtype}, got "
                f"{dtype}"
            )

    def _check_value(self, value: torch.Tensor, op: str) -> None:
        """dtype and device of a value to store. An array without a device yet takes the
        value's only when the value is stored (`_adopt_device`): a rejected value changes
        nothing."""
        if value.dtype != self.dtype:
            self._check_dtype(value.dtype, op, "value")
        device = value.device
        if self.device is not None and device != self.device:
            raise TensorArrayDeviceError(
                f"{self._prefix(op)}value must be on the array's device {self.device}, got a "
                f"value on {device}"
            )

    def _adopt_device(self, value: torch.Tensor) -> None:
        """The first stored value fixes the device of an array made without one."""
        if self.device is None:
            self.device = value.device

    def _check_element_shape(self, shape: torch.Size, op: str, of: str = "") -> None:
        """of: the whole value's shape where `shape` is its elements' (scatter, unstack)."""
        es = self.element_shape
        if es is None or shape == es or is_compatible(es, shape):
            return
        what = f"element shape {fmt_shape(shape)} of value shape {of}" if of else (
            f"value shape {fmt_shape(shape)}")
        raise TensorArrayShapeError(
            f"{self._prefix(op)}{what} is incompatible with the array's element shape "
            f"{fmt_shape(es)} ({self.shape_origin})"
        )

    def _infer_shape(self, shape: torch.Size) -> None:
        """identical_element_shapes: the first written shape becomes the element shape."""
        if self.identical_element_shapes and not is_fully_defined(self.element_shape):
            self.element_shape = tuple(shape)
            self.shape_origin = "inferred from the first write"
            if self.slab_shape is None and self.written.find(1) == -1:
                self._use_slab(tuple(shape))

    def _use_slab(self, shape: tuple[int, ...]) -> None:
        self.slab_shape = shape
        self.items = None
        self.shapes = None

    def _resolve_device(self) -> torch.device:
        if self.device is None:
            self.device = torch.get_default_device()
        return self.device

    def _shape_of(self, i: int) -> tuple[int, ...] | None:
        """Shape of a written (or soft) index; None when unwritten."""
        if not self.written[i]:
            return None
        if self.slab_shape is not None:
            return self.slab_shape
        return self.shapes[i]  # type: ignore[index]

    def _ensure_capacity(self, needed: int) -> torch.Tensor:
        """The slab, allocated or grown (geometrically) to hold ``needed`` rows."""
        slab = self.slab
        if slab is not None and slab.shape[0] >= needed:
            return slab
        assert self.slab_shape is not None
        if slab is None:
            capacity = max(needed, self.size)
        else:
            capacity = max(needed, 2 * slab.shape[0])
        new = allocate_slab(
            self.allocator,
            (capacity, *self.slab_shape),
            self.dtype,
            self._resolve_device(),
            self.name,
        )
        if slab is not None and self.size:
            new[: min(self.size, slab.shape[0])].copy_(slab[: self.size])
        self.slab = new
        return new

    def _grow(self, new_size: int) -> None:
        """Dynamic arrays: extend the logical size to ``new_size``."""
        extra = new_size - self.size
        for flags in (self.written, self.soft, self.read_, self.cleared, self.hist):
            flags.extend(bytes(extra))
        if self.items is not None:
            self.items.extend([None] * extra)
            self.shapes.extend([None] * extra)  # type: ignore[union-attr]
        self.size = new_size

    @contextlib.contextmanager
    def _undone_on_failure(self):
        """What a store sets before its storage exists (the device, an inferred element shape,
        slab mode, a grown size) put back if the store fails (an allocator's error: out of
        memory, a planner's refusal): a failed op changes nothing."""
        saved = (self.device, self.element_shape, self.shape_origin, self.slab_shape,
                 self.items, self.shapes, self.size)
        try:
            yield
        except BaseException:
            (self.device, self.element_shape, self.shape_origin, self.slab_shape, self.items,
             self.shapes, size) = saved
            for flags in (self.written, self.soft, self.read_, self.cleared, self.hist):
                del flags[size:]
            if self.items is not None:
                del self.items[size:]
                del self.shapes[size:]  # type: ignore[union-attr]
            self.size = size
            raise

    def _check_range(self, i: int, op: str, for_write: bool) -> None:
        if for_write and self.dynamic_size:
            if i < 0:
                raise TensorArrayIndexError(
                    f"{self._prefix(op)}index must be >= 0 (a dynamic array grows on writes past "
                    f"its end), got {i}"
                )
            if i >= MAX_SIZE:
                raise TensorArrayIndexError(
                    f"{self._prefix(op)}index must be < {MAX_SIZE} (the largest size, "
                    f"TensorFlow's int32), got {i}"
                )
            return
        if i < 0 or i >= self.size:
            if self.dynamic_size:
                what = f"the current size {self.size} of this dynamic array (reads never grow it)"
            else:
                what = f"this fixed-size array of size {self.size}"
            raise TensorArrayIndexError(
                f"{self._prefix(op)}index must be in [0, {self.size}) for {what}, got {i}"
            )

    # ------------------------------------------------------------ flag helpers

    def _fresh_mask(self, a: int, b: int) -> bytes | None:
        """One byte per index of ``[a, b)``: 1 where it is unwritten or soft (it reads as
        zeros), else 0; None where no index is.

        Bytes are 0/1, so the per-index logic runs as big-integer bit operations in C.
        """
        written, soft = self.written, self.soft
        if written.find(0, a, b) == -1 and soft.find(1, a, b) == -1:
            return None
        n = b - a
        ones = int.from_bytes(_ONE * n, "little")
        w = int.from_bytes(written[a:b], "little")
        s = int.from_bytes(soft[a:b], "little")
        return ((w ^ ones) | s).to_bytes(n, "little")

    @staticmethod
    def _mask_indices(mask: bytes | None, a: int) -> list[int]:
        """The indices a `_fresh_mask` of ``[a, ...)`` marks (list storage: one element each)."""
        out: list[int] = []
        j = mask.find(1) if mask is not None else -1
        while j != -1:
            out.append(a + j)
            j = mask.find(1, j + 1)  # type: ignore[union-attr]
        return out

    @staticmethod
    def _zero_masked(slab: torch.Tensor, a: int, mask: bytes | None) -> None:
        """Zero the slab rows a `_fresh_mask` of ``[a, ...)`` marks, in one tensor op whatever
        their number (a stack of a gradient array whose rows are still soft copies walked
        them one by one in Python: 28.5 ms for 200,000 rows on a CPU, 0.6 ms now)."""
        if mask is None:
            return
        if mask.find(0) == -1:
            slab[a : a + len(mask)].zero_()
            return
        rows = torch.frombuffer(bytearray(mask), dtype=torch.uint8).nonzero().squeeze(1)
        slab.index_fill_(0, rows.add_(a).to(slab.device), 0)

    def _has_data_in_range(self, a: int, b: int) -> bool:
        """Whether some index in ``[a, b)`` holds real data (written and not soft)."""
        if self.written.find(1, a, b) == -1:
            return False
        w = int.from_bytes(self.written[a:b], "little")
        s = int.from_bytes(self.soft[a:b], "little")
        return (w & ~s) != 0

    @staticmethod
    def _zero_rows(slab: torch.Tensor, rows: list[int]) -> None:
        if not rows:
            return
        if rows[-1] - rows[0] + 1 == len(rows):
            slab[rows[0] : rows[-1] + 1].zero_()
        else:
            slab.index_fill_(0, torch.tensor(rows, device=slab.device), 0)

    @staticmethod
    def _mark(flags: bytearray, indices, lo: int, end: int, on: bool) -> None:
        """Set (``on``) or clear ``flags`` at ``indices`` (None: the range ``[lo, end)``)."""
        if indices is None:
            flags[lo:end] = (_ONE if on else _ZERO) * (end - lo)
        else:
            v = 1 if on else 0
            for i in indices:
                flags[i] = v

    # ------------------------------------------------------------------ writes

    def _check_write_target(self, i: int, shape, op: str, dup: bool = False) -> None:
        """Rules for writing ``shape`` at in-range index ``i`` (TF LockedWriteOrAggregate).

        ``dup``: an earlier index of the same op already targets ``i`` (which may lie past the
        current size of a dynamic array: then only the duplicate counts).
        """
        exists = i < self.size
        if exists and self.read_[i]:
            raise TensorArrayWriteError(
                f"{self._prefix(op)}index {i} must be unread to be written, but it was already read"
            )
        if (exists and self.written[i]) or dup:
            if not self.aggregate and not (exists and self.written[i]):
                raise TensorArrayWriteError(
                    f"{self._prefix(op)}index {i} must appear once in indices, got it more than "
                    "once (each index of a forward TensorArray is written once)"
                )
            if not self.aggregate:
                raise TensorArrayWriteError(
                    f"{self._prefix(op)}index {i} must be unwritten, but it was already written "
                    "(each index of a forward TensorArray is written once)"
                )
            if self.dtype is torch.bool and (dup or not self.soft[i]):
                # TensorFlow adds only number types (tensor_array::AddToTensor refuses bool
                # with InvalidArgument); a sum of bools would be an OR, not a gradient.
                raise TensorArrayDTypeError(
                    f"{self._prefix(op)}cannot aggregate into index {i}: a gradient array adds "
                    "repeated writes, which needs a number dtype, got torch.bool"
                )
            existing = self._shape_of(i) if exists else None
            if existing is not None and tuple(shape) != existing:
                raise TensorArrayShapeError(
                    f"{self._prefix(op)}cannot aggregate into index {i}: the existing shape is "
                    f"{fmt_shape(existing)} but the new value shape is {fmt_shape(shape)}"
                )

    @_locked
    def write(self, i: int, value: torch.Tensor, hist: bool = False) -> None:
        """Write (or, in a gradient array, add) ``value`` at index ``i``."""
        # Fast path, the per-step write of a loop: an open array, a fresh in-range index, the
        # array's dtype and device, and a shape that needs no inference. Anything else takes
        # the checked path below, which raises the precise error.
        if (
            not self.closed
            and 0 <= i < self.size
            and not self.written[i]
            and not self.read_[i]
            and value.dtype == self.dtype
            and value.device == self.device
        ):
            if self.slab_shape is not None:
                if value.shape == self.slab_shape:
                    slab = self.slab
                    if slab is None:
                        slab = self._ensure_capacity(self.size)
                    _unversioned(slab)[i].copy_(value)
                    self.written[i] = 1
                    if hist:
                        self.hist[i] = 1
                    return
            elif self.element_shape is None and not self.identical_element_shapes:
                self.items[i] = value.detach()  # type: ignore[index]
                self.shapes[i] = value.shape  # type: ignore[index]
                self.written[i] = 1
                if hist:
                    self.hist[i] = 1
                return
        self._write_checked(i, value, hist)

    def _write_checked(self, i: int, value: torch.Tensor, hist: bool) -> None:
        op = f"write(index={i})"
        if self.closed:
            self.check_open(op)
        self._check_range(i, op, for_write=True)
        self._check_value(value, op)
        shape = value.shape
        self._check_element_shape(shape, op)
        if i < self.size:
            self._check_write_target(i, shape, op)
        with self._undone_on_failure():
            self._adopt_device(value)
            self._infer_shape(shape)
            if i >= self.size:
                self._grow(i + 1)
            if self.slab_shape is not None:
                row = _unversioned(self._ensure_capacity(i + 1))[i]
        value = value.detach()
        has_data = self.written[i] and not self.soft[i]
        if self.slab_shape is not None:
            if has_data:
                row.add_(value)
            else:
                row.copy_(value)
        else:
            items = self.items
            if has_data:
                items[i] = items[i] + value  # type: ignore[index, operator]
            else:
                items[i] = value  # type: ignore[index]
                self.shapes[i] = tuple(shape)  # type: ignore[index]
        self.written[i] = 1
        self.soft[i] = 0
        if hist:
            self.hist[i] = 1

    @_locked
    def scatter(
        self, indices: list[int], value: torch.Tensor, op: str = "scatter", hist: bool = False
    ) -> None:
        """Write ``value[k]`` at ``indices[k]`` (gradient arrays add, duplicates included).

        value: ``[len(indices), *element_shape]``.
        """
        self.check_open(op)
        self._check_value(value, op)
        if value.dim() < 1:
            raise TensorArrayShapeError(
                f"{self._prefix(op)}value must be at least a vector, got shape "
                f"{fmt_shape(value.shape)}"
            )
        n = len(indices)
        if n != value.shape[0]:
            raise TensorArrayShapeError(
                f"{self._prefix(op)}len(indices) must equal value.shape[0], got {n} indices "
                f"and value shape {fmt_shape(value.shape)}"
            )
        elem = value.shape[1:]
        self._check_element_shape(elem, op, fmt_shape(value.shape))
        if n == 0:
            return
        lo, hi = min(indices), max(indices)
        if lo < 0:
            raise TensorArrayIndexError(f"{self._prefix(op)}indices must be >= 0, got {lo}")
        if hi >= MAX_SIZE:
            raise TensorArrayIndexError(f"{self._prefix(op)}indices must be < {MAX_SIZE} (the "
                                        f"largest size, TensorFlow's int32), got {hi}")
        if hi >= self.size and not self.dynamic_size:
            if op.startswith("unstack"):
                raise TensorArrayIndexError(
                    f"{self._prefix(op)}value.shape[0] must be <= the fixed array size "
                    f"{self.size}, got value shape {fmt_shape(value.shape)}"
                )
            raise TensorArrayIndexError(
                f"{self._prefix(op)}max index must be < the fixed array size {self.size}, got {hi}"
            )
        contiguous = hi - lo + 1 == n and indices == list(range(lo, hi + 1))
        if contiguous:
            self._check_range_targets(lo, min(hi + 1, self.size), op, shape=elem)
        else:
            seen: set[int] = set()
            for i in indices:
                if i < self.size or i in seen:
                    self._check_write_target(i, elem, op, dup=i in seen)
                seen.add(i)
        with self._undone_on_failure():
            self._adopt_device(value)
            self._infer_shape(elem)
            if hi >= self.size:
                self._grow(hi + 1)
            self._put_rows(None if contiguous else indices, lo, hi + 1, value.detach())
        if hist:
            self._mark(self.hist, None if contiguous else indices, lo, hi + 1, True)

    def _check_range_targets(
        self, lo: int, end: int, op: str, shape=None, shapes: list | None = None
    ) -> None:
        """Write checks for the in-range part ``[lo, end)`` of a contiguous multi-write.

        Every index gets ``shape``, or index i gets ``shapes[i]``. Bytearray searches keep the
        common cases (nothing written yet; a gradient slab receiving its own shape) free of
        per-index Python work.
        """
        if lo >= end:
            return
        shape_of = (lambda i: shape) if shapes is None else shapes.__getitem__
        i = self.read_.find(1, lo, end)
        if i != -1:
            self._check_write_target(i, shape_of(i), op)
        i = self.written.find(1, lo, end)
        if i == -1:
            return
        if not self.aggregate:
            self._check_write_target(i, shape_of(i), op)
        if (
            shapes is None
            and self.slab_shape is not None
            and tuple(shape) == self.slab_shape
            and self.dtype is not torch.bool
        ):
            return  # every written index of a slab has the slab shape: all aggregations match
        for i in range(lo, end):
            if self.written[i]:
                self._check_write_target(i, shape_of(i), op)

    def _put_rows(self, indices: list[int] | None, lo: int, end: int, value: torch.Tensor) -> None:
        """Store ``value`` rows at ``indices`` (None: the range ``[lo, end)``), checks passed.

        value: ``[len(indices), *shape]``.
        """
        written, soft = self.written, self.soft
        fresh_mask = None
        if indices is None:
            has_data = self._has_data_in_range(lo, end)
            duplicates = False
            fresh = None
            if has_data:
                fresh_mask = self._fresh_mask(lo, end)
        else:
            has_data = any(written[i] and not soft[i] for i in indices)
            unique = list(dict.fromkeys(indices))
            duplicates = len(unique) != len(indices)
            fresh = sorted(i for i in unique if not written[i] or soft[i])
        if self.slab_shape is not None:
            if (
                indices is None
                and lo == 0
                and end == self.size
                and self.slab is None
                and not self.aggregate
                and written.find(1) == -1
            ):
                # A fresh forward array filled completely adopts the value as its slab: no copy
                # unless the value is not contiguous (a transposed or expanded tensor), since
                # the slab is one contiguous block whose rows may be written in place.
                self.slab = value.contiguous()
            else:
                slab = _unversioned(self._ensure_capacity(end))
                if not has_data and not duplicates:
                    if indices is None:
                        slab[lo:end].copy_(value)
                    else:
                        slab.index_copy_(0, torch.tensor(indices, device=slab.device), value)
                else:
                    # Aggregation: fresh rows start at zero, then every row adds (index_add_
                    # sums duplicate indices).
                    if indices is None:
                        self._zero_masked(slab, lo, fresh_mask)
                    else:
                        self._zero_rows(slab, fresh)  # type: ignore[arg-type]
                    if indices is None:
                        slab[lo:end].add_(value)
                    else:
                        slab.index_add_(0, torch.tensor(indices, device=slab.device), value)
        else:
            self._put_list(range(lo, end) if indices is None else indices, value.unbind(0))
        self._mark(written, indices, lo, end, True)
        self._mark(soft, indices, lo, end, False)

    def _put_list(self, indices, pieces) -> None:
        items, shapes, written, soft = self.items, self.shapes, self.written, self.soft
        done: set[int] = set()
        for i, piece in zip(indices, pieces, strict=True):
            if (written[i] and not soft[i]) or i in done:
                items[i] = items[i] + piece  # type: ignore[index, operator]
            else:
                items[i] = piece  # type: ignore[index]
                shapes[i] = tuple(piece.shape)  # type: ignore[index]
                done.add(i)

    @_locked
    def unstack(self, value: torch.Tensor, hist: bool = False) -> None:
        """Write ``value[k]`` at index ``k`` for every k; value: ``[n, *element_shape]``."""
        op = "unstack(value)"
        self.check_open(op)
        self._check_value(value, op)
        if value.dim() < 1:
            raise TensorArrayShapeError(
                f"{self._prefix(op)}value must be at least a vector, got shape "
                f"{fmt_shape(value.shape)}"
            )
        self.scatter(list(range(value.shape[0])), value, op=op, hist=hist)

    @_locked
    def split(self, value: torch.Tensor, lengths: list[int], hist: bool = False) -> None:
        """Write ``value[sum(lengths[:k]) : sum(lengths[:k+1])]`` at index k.

        value: ``[sum(lengths), *rest]``; element k has shape ``[lengths[k], *rest]``.
        """
        op = f"split(lengths={lengths})" if len(lengths) <= 8 else "split(lengths=[...])"
        self.check_open(op)
        self._check_value(value, op)
        if value.dim() < 1:
            raise TensorArrayShapeError(
                f"{self._prefix(op)}value must be at least a vector, got shape "
                f"{fmt_shape(value.shape)}"
            )
        negative = [n for n in lengths if n < 0]
        if negative:
            raise TensorArrayShapeError(
                f"{self._prefix(op)}lengths must be >= 0, got {negative[0]}"
            )
        total = sum(lengths)
        if total != value.shape[0]:
            raise TensorArrayShapeError(
                f"{self._prefix(op)}sum(lengths) must equal value.shape[0], got sum {total} and "
                f"value shape {fmt_shape(value.shape)}"
            )
        n = len(lengths)
        if not self.dynamic_size and n != self.size:
            raise TensorArrayShapeError(
                f"{self._prefix(op)}len(lengths) must equal the size {self.size} of this "
                f"fixed-size array, got {n} lengths"
            )
        if self.dynamic_size and n < self.size:
            # TensorFlow's kernel grows a dynamic array to the number of lengths, and refuses
            # fewer lengths than elements (a split never shrinks an array).
            raise TensorArrayShapeError(
                f"{self._prefix(op)}len(lengths) must be at least the size {self.size} of this "
                f"dynamic array (it grows to the number of lengths, never shrinks), got {n} "
                f"lengths"
            )
        rest = tuple(value.shape[1:])
        shapes = [torch.Size((length, *rest)) for length in lengths]
        for k, shape in enumerate(shapes):
            self._check_element_shape(shape, f"{op} element {k}")
            if self.identical_element_shapes and shape != shapes[0]:
                raise TensorArrayShapeError(
                    f"{self._prefix(op)}identical_element_shapes requires every element to have "
                    f"one shape, but element 0 has shape {fmt_shape(shapes[0])} and element {k} "
                    f"has shape {fmt_shape(shape)}"
                )
        if n:
            self._check_range_targets(0, min(n, self.size), op, shapes=shapes)
            value = value.detach()
            with self._undone_on_failure():
                self._adopt_device(value)
                self._infer_shape(shapes[0])
                if n > self.size:
                    self._grow(n)
                if self.slab_shape is not None:
                    # Every piece has the slab shape here (checked above): value is a stack.
                    self._put_rows(None, 0, n, value.reshape(n, *self.slab_shape))
            if self.slab_shape is None:
                self._put_list(range(n), value.split(lengths))
                self._mark(self.written, None, 0, n, True)
                self._mark(self.soft, None, 0, n, False)
            if hist:
                self._mark(self.hist, None, 0, n, True)
        self.was_split = True
        for handle in self.grads.values():
            handle._res.forward_was_split = True

    # ------------------------------------------------------------------- reads

    def _zeros(self, shape) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self._resolve_device())

    def _unwritten_error(self, i: int, op: str) -> TensorArrayReadError:
        return TensorArrayReadError(
            f"{self._prefix(op)}index {i} was never written, and an unwritten index reads as "
            f"zeros only when the element shape is fully defined, but it is "
            f"{fmt_shape(self.element_shape)}; write the index first or give the array a full "
            "element_shape"
        )

    def _cleared_error(self, i: int, op: str) -> TensorArrayReadError:
        return TensorArrayReadError(
            f"{self._prefix(op)}index {i} must not have been cleared, but an earlier read "
            "cleared it (clear_after_read=True); create the array with clear_after_read=False to "
            "read an index more than once"
        )

    @_locked
    def read(self, i: int) -> torch.Tensor:
        """The value at index ``i`` (zeros for a soft entry); a view of the slab in slab mode."""
        op = f"read(index={i})"
        if self.closed:
            self.check_open(op)
        if i < 0 or i >= self.size:
            self._check_range(i, op, for_write=False)
        unwritten = not self.written[i]
        es = self.element_shape
        if unwritten and not is_fully_defined(es):
            raise self._unwritten_error(i, op)
        if self.cleared[i]:
            raise self._cleared_error(i, op)
        zeros_due = unwritten or self.soft[i]
        # The storage first: an allocation that fails (out of memory, an allocator's refusal)
        # leaves the index as it was, unwritten or soft.
        with self._undone_on_failure():
            if self.slab_shape is not None:
                slab = self._ensure_capacity(self.size)
            elif zeros_due:
                zeros = self._zeros(es if unwritten else self.shapes[i])  # type: ignore[index]
        if unwritten:
            # TF: an unwritten index of a fully shaped array reads as zeros and counts as written.
            self.written[i] = 1
            if self.shapes is not None:
                self.shapes[i] = es  # type: ignore[assignment]
        self.soft[i] = 0
        if self.slab_shape is not None:
            if zeros_due:
                _unversioned(slab)[i].zero_()
            value = slab[i]
        else:
            items = self.items
            if zeros_due:
                items[i] = zeros
            value = items[i]  # type: ignore[index]
            if self.clear_after_read:
                items[i] = None  # type: ignore[index]
            else:
                # A new tensor object per read: autograd attaches each read's history to it.
                value = value.detach()  # type: ignore[union-attr]
        self.read_[i] = 1
        if self.clear_after_read:
            self.cleared[i] = 1
        return value  # type: ignore[return-value]

    @_locked
    def gather(self, indices: list[int], op: str = "gather") -> torch.Tensor:
        """Values at ``indices`` stacked: ``[len(indices), *element_shape]``.

        A contiguous range of a slab is returned as a view, any other slab gather is one
        ``index_select``, list storage is one ``torch.stack``.
        """
        self.check_open(op)
        n = len(indices)
        if n == 0:
            return self._empty(op, "gather of zero indices")
        lo, hi = min(indices), max(indices)
        if lo < 0 or hi >= self.size:
            bad = lo if lo < 0 else hi
            self._check_range(bad, op, for_write=False)
        if hi - lo + 1 == n and indices == list(range(lo, hi + 1)):
            self._check_readable_range(lo, hi + 1, op)
            self._check_same_shape(range(lo, hi + 1), op)
            return self._consume(None, lo, hi + 1, stack=True)
        self._check_readable_list(indices, op)
        self._check_same_shape(indices, op)
        return self._consume(indices, lo, hi + 1, stack=True)

    @_locked
    def stack(self) -> torch.Tensor:
        """All values stacked: ``[size, *element_shape]`` (a view of the slab when possible)."""
        op = "stack()"
        self.check_open(op)
        if self.size == 0:
            return self._empty(op, "stack of a size-0 array")
        self._check_readable_range(0, self.size, op)
        self._check_same_shape(range(self.size), op)
        return self._consume(None, 0, self.size, stack=True)

    @_locked
    def concat(self, count: int | None = None) -> tuple[torch.Tensor, list[int]]:
        """The first ``count`` values (default: all) concatenated along dimension 0.

        Returns ``(value, lengths)``: value ``[sum(lengths), *rest]``, lengths the per-element
        sizes of dimension 0.
        """
        op = "concat()"
        self.check_open(op)
        if self.is_grad and not self.forward_was_split:
            raise TensorArrayGradError(
                f"{self._prefix(op)}concat of a gradient array requires its forward array "
                f"{self.forward_name!r} to have been split (concat is the gradient of split), "
                "but it was never split"
            )
        n = self.size if count is None else count
        es = self.element_shape
        if n == 0:
            if es is not None and len(es) == 0:
                raise self._scalar_concat_error(-1, op)
            if es is None or None in es[1:]:
                raise TensorArrayShapeError(
                    f"{self._prefix(op)}concat of a size-0 array needs the element shape known "
                    f"beyond dimension 0, got element shape {fmt_shape(es)}"
                )
            empty = torch.empty((0, *es[1:]), dtype=self.dtype, device=self._resolve_device())  # type: ignore[misc]
            return empty, []
        self._check_readable_range(0, n, op)
        shapes = self._read_shapes(range(n))
        first = shapes[0]
        for k, s in enumerate(shapes):
            if len(s) == 0:
                raise self._scalar_concat_error(k, op)
            if s[1:] != first[1:]:
                raise TensorArrayShapeError(
                    f"{self._prefix(op)}elements must agree beyond dimension 0, but index 0 has "
                    f"shape {fmt_shape(first)} and index {k} has shape {fmt_shape(s)}"
                )
        lengths = [s[0] for s in shapes]
        data = self._consume(None, 0, n, stack=False)
        if isinstance(data, torch.Tensor):
            value = data.reshape(n * first[0], *first[1:])
        else:
            value = torch.cat(data)
        return value, lengths

    def _scalar_concat_error(self, i: int, op: str) -> TensorArrayShapeError:
        where = f"index {i} has" if i >= 0 else "the element shape is"
        return TensorArrayShapeError(
            f"{self._prefix(op)}elements must be at least vectors, but {where} shape (); "
            "use stack() for scalars"
        )

    def _empty(self, op: str, what: str) -> torch.Tensor:
        es = self.element_shape
        if not is_fully_defined(es):
            raise TensorArrayShapeError(
                f"{self._prefix(op)}{what} needs a fully defined element shape, got {fmt_shape(es)}"
            )
        return torch.empty((0, *es), dtype=self.dtype, device=self._resolve_device())  # type: ignore[misc]

    def _read_shapes(self, indices) -> list[tuple[int, ...]]:
        """Shapes the reads of ``indices`` give (unwritten: the element shape)."""
        if self.slab_shape is not None:
            return [self.slab_shape] * len(indices)
        shapes, written, es = self.shapes, self.written, self.element_shape
        return [shapes[i] if written[i] else es for i in indices]  # type: ignore[index, misc]

    def _check_same_shape(self, indices, op: str) -> None:
        if self.slab_shape is not None:
            return
        shapes = self._read_shapes(indices)
        first = shapes[0]
        for k, s in enumerate(shapes):
            if s != first:
                raise TensorArrayShapeError(
                    f"{self._prefix(op)}all elements must have the same shape, but index "
                    f"{indices[0]} has shape {fmt_shape(first)} and index {indices[k]} has shape "
                    f"{fmt_shape(s)}"
                )

    def _check_readable_range(self, a: int, b: int, op: str) -> None:
        i = self.written.find(0, a, b)
        if i != -1 and not is_fully_defined(self.element_shape):
            raise self._unwritten_error(i, op)
        i = self.cleared.find(1, a, b)
        if i != -1:
            raise self._cleared_error(i, op)

    def _check_readable_list(self, indices: list[int], op: str) -> None:
        written, cleared = self.written, self.cleared
        es_full = is_fully_defined(self.element_shape)
        # With clear_after_read the second read of a repeated index finds it cleared (as TF).
        seen: set[int] | None = set() if self.clear_after_read else None
        for i in indices:
            if not written[i] and not es_full:
                raise self._unwritten_error(i, op)
            if cleared[i]:
                raise self._cleared_error(i, op)
            if seen is not None and i in seen:
                raise TensorArrayReadError(
                    f"{self._prefix(op)}index {i} must appear once in indices when reads clear "
                    "(clear_after_read=True), got it more than once; create the array with "
                    "clear_after_read=False to read an index more than once"
                )
            if seen is not None:
                seen.add(i)

    def _consume(self, indices: list[int] | None, lo: int, end: int, stack: bool):
        """Materialise zeros where needed, mark read/cleared and return the data (checks passed).

        indices None means the range ``[lo, end)``. Slab storage returns one tensor
        ``[n, *shape]`` (a view for a range); list storage returns ``torch.stack`` of the
        elements (``stack=True``) or the list of elements (``stack=False``).
        """
        written, soft = self.written, self.soft
        mask = None
        if indices is None:
            mask = self._fresh_mask(lo, end)
            rng = range(lo, end)
        else:
            fresh = sorted(i for i in dict.fromkeys(indices) if not written[i] or soft[i])
            rng = indices
        if self.slab_shape is not None:
            slab = self._ensure_capacity(self.size)
            if indices is None:
                self._zero_masked(_unversioned(slab), lo, mask)
            else:
                self._zero_rows(_unversioned(slab), fresh)
            if indices is None:
                data = slab[lo:end]
            else:
                data = slab.index_select(0, torch.tensor(indices, device=slab.device))
        else:
            if indices is None:
                fresh = self._mask_indices(mask, lo)
            items, shapes, es = self.items, self.shapes, self.element_shape
            for i in fresh:
                if not written[i]:
                    shapes[i] = es  # type: ignore[index, assignment]
                items[i] = self._zeros(shapes[i])  # type: ignore[index]
            parts = [items[i] for i in rng]  # type: ignore[index]
            data = torch.stack(parts) if stack else parts  # type: ignore[arg-type]
        self._mark(written, indices, lo, end, True)
        self._mark(soft, indices, lo, end, False)
        self._mark(self.read_, indices, lo, end, True)
        if self.clear_after_read:
            self._mark(self.cleared, indices, lo, end, True)
            if self.items is not None:
                if indices is None:
                    self.items[lo:end] = [None] * (end - lo)
                else:
                    for i in indices:
                        self.items[i] = None
        return data

    # --------------------------------------------------------------- gradients

    @_locked
    def make_grad(
        self, source: str, shape_to_prepend: tuple[int, ...] | None = None
    ) -> TensorArrayHandle:
        """Look up or create the gradient array for ``source`` (TF TensorArrayGrad[WithShape]).

        Creation freezes this array (no more dynamic growth), gives the gradient array this
        array's current size, and soft-copies the shape of every written index.
        """
        from .registry import TensorArrayHandle

        op = f"grad(source={source!r})"
        if self.closed:
            self.check_open(op)
        if self.is_grad:
            raise TensorArrayGradError(
                f"{self._prefix(op)}expected a forward array, got the gradient array of "
                f"{self.forward_name!r}; a gradient array has no gradient (TensorFlow refuses "
                "it too)"
            )
        handle = self.grads.get(source)
        if handle is not None:
            return handle
        prepend = tuple(shape_to_prepend) if shape_to_prepend is not None else ()
        es = self.element_shape
        grad_es = None if es is None else (*prepend, *es)
        g = ArrayResource(
            f"{self.name}@{source}",
            self.dtype,
            self.size,
            dynamic_size=False,
            clear_after_read=True,
            element_shape=grad_es,
            identical_element_shapes=self.identical_element_shapes,
            device=self.device,
            allocator=self.allocator,
            registry=self.registry,
            is_grad=True,
        )
        g.forward_name = self.name
        g.shape_origin = f"inherited from the forward array {self.name!r}" + (
            f" with shape_to_prepend {fmt_shape(prepend)}" if prepend else ""
        )
        g.forward_was_split = self.was_split
        g.source = source
        # Shape soft copy: written forward indices are written in the gradient with a shape but
        # no data.
        g.written[:] = self.written
        g.soft[:] = self.written
        if self.slab_shape is not None:
            g._use_slab((*prepend, *self.slab_shape))
        else:
            fwd_shapes = self.shapes
            shapes = [
                (*prepend, *fwd_shapes[i]) if self.written[i] else None  # type: ignore[index, misc]
                for i in range(self.size)
            ]
            if g.slab_shape is None:
                first = shapes[0] if shapes else None
                if first is not None and all(s == first for s in shapes):
                    g._use_slab(first)  # every index soft with one shape: a slab fits
                else:
                    g.shapes = shapes
        handle = TensorArrayHandle(g, self.registry, new_flow())
        self.registry.register(handle)
        # Frozen only once the gradient array exists: a failed creation (a shape_to_prepend
        # the gradient array's constructor refuses) leaves this array as it was.
        self.dynamic_size = False
        self.grads[source] = handle
        return handle

    def release_grad(self, source: str) -> None:
        """Close and forget the gradient array of ``source`` (end of an autograd pass)."""
        with self.lock:
            handle = self.grads.pop(source, None)
        if handle is not None:
            handle._res.close()

    def close(self) -> None:
        """Free the storage, close the gradient arrays and leave the registry (idempotent here;
        the public close() refuses a closed array).

        A closed gradient array stays under its (forward, source) key, as in TensorFlow, whose
        closed arrays stay in the resource manager until the end of the step: grad(source)
        returns it again and every op on it raises, instead of handing out a fresh zero
        accumulator that would silently drop what was accumulated."""
        # Under the lock that gradient-array creation holds (`make_grad`'s callers): one made
        # meanwhile is either refused (closed) or among the gradient arrays closed here.
        with self.lock:
            if self.closed:
                return
            self.closed = True
            grads = list(self.grads.values())
            self.grads.clear()
        self.slab = None
        self.items = None
        for handle in grads:
            handle._res.close()
        self.registry.unregister(self.registry_key)
