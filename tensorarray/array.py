"""The public TensorArray object and the op-level ``tensor_array_grad``."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .autograd import ConcatFn, GatherFn, ReadFn, ScatterFn, SplitFn, WriteFn
from .errors import TensorArrayDTypeError, TensorArrayShapeError, TensorArrayTypeError
from .registry import TensorArrayHandle, TensorArrayRegistry, default_registry, unique_name
from .resource import ArrayResource, new_flow
from .shapes import (
    MAX_SIZE,
    PartialShape,
    as_index,
    as_index_list,
    as_partial_shape,
    is_fully_defined,
)
from .storage import Allocator, resolve_device

# The element dtypes: those whose rows torch copies, fills and adds by index (a scatter, an
# unwritten row's zeros, a gradient's aggregation). Its unsigned integers past 8 bits and the
# float8 types have none of these.
DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128)

__all__ = ["TensorArray", "TensorArrayGradResult", "tensor_array_grad"]


def _not_tensor(res: ArrayResource, op: str, what: str, got: object) -> TensorArrayTypeError:
    return TensorArrayTypeError(
        f"TensorArray {res.name!r}: {op}: {what} must be a torch.Tensor, got {type(got).__name__}"
    )


def _next_flow(flow: torch.Tensor) -> torch.Tensor:
    """The flow a mutation without autograd history returns: a new tensor object, as every
    mutator returns a new flow. A flow with history stays connected (a view of it, made even
    under no_grad), so the backward of a later read still runs before that of an earlier
    write."""
    if not flow.requires_grad:
        return new_flow(flow)
    with torch.enable_grad():
        return flow.view_as(flow)


def _check_flow(res: ArrayResource, op: str, what: str, flow: object) -> torch.Tensor:
    """A flow argument must be a scalar float tensor (TensorFlow's float32 flow; any float is
    taken, as the flow only carries autograd edges)."""
    if not isinstance(flow, torch.Tensor):
        raise _not_tensor(res, op, what, flow)
    if flow.dim() != 0 or not flow.is_floating_point():
        raise TensorArrayTypeError(
            f"TensorArray {res.name!r}: {op}: {what} must be a scalar float tensor (an array's "
            f"flow), got shape {tuple(flow.shape)} dtype {flow.dtype}"
        )
    return flow


def _as_prepend(shape_to_prepend: object, name: str) -> tuple[int, ...] | None:
    shape = as_partial_shape(shape_to_prepend, "shape_to_prepend", name)
    if shape is not None and not is_fully_defined(shape):
        raise TensorArrayShapeError(
            f"TensorArray {name!r}: grad: shape_to_prepend must be fully defined, got "
            f"{shape_to_prepend!r}"
        )
    return shape  # type: ignore[return-value]


def _check_source(source: object, name: str) -> str:
    if not isinstance(source, str) or not source:
        raise TensorArrayTypeError(
            f"TensorArray {name!r}: grad: source must be a non-empty str (e.g. 'gradients'), got "
            f"{source!r}"
        )
    return source


def _store(handle: TensorArrayHandle, value: torch.Tensor, recorded, plain) -> TensorArray:
    """A mutator's store and the array's next flow, under the array's lock (the flow's read
    and update too, so that threads writing one array chain their flows): `recorded(flow)`
    through its autograd function where `value` has history to keep, else `plain()`."""
    res = handle._res
    with res.lock:
        if value.requires_grad and torch.is_grad_enabled():
            handle._flow = recorded(handle._flow)
        else:
            plain()
            handle._flow = _next_flow(handle._flow)
        return TensorArray._wrap(handle, handle._flow)


class TensorArray:
    """TensorFlow's TensorArray (V3 semantics) for PyTorch, differentiable through autograd.

    A TensorArray is a handle to shared storage plus a ``flow`` scalar. Mutators (``write``,
    ``scatter``, ``unstack``, ``split``) return a new TensorArray that shares the handle and
    carries the new flow; the old object stays usable. Values keep their autograd history:
    gradients follow TensorFlow's rules (read<->write, gather<->scatter, stack<->unstack,
    concat<->split) through a gradient array per backward pass.

    Args:
        dtype: element dtype; every written value must have it.
        size: initial number of elements (an int or a 0-d integer tensor).
        dynamic_size: let writes past the end grow the array (geometrically).
        clear_after_read: drop an element's data when it is read; a second read is an error.
        element_shape: shape of each element; entries may be None (or -1) for unknown
            dimensions, or the whole shape None for unknown rank. When fully defined, elements
            live in one slab ``[size, *element_shape]`` and unwritten indices read as zeros.
        identical_element_shapes: all elements have one shape; the first write fixes it.
        name: prefix of the handle name ``name + "_" + counter`` (default "TensorArray").
        device: device of the elements; None takes the device of the first value written.
        registry: registry indexing the array (default :data:`default_registry`).
        allocator: slab allocator ``(shape, dtype, device) -> Tensor`` used for this array and
            its gradient arrays (default: the registry's, else ``torch.empty``).

    Values stored are aliases, not copies, except in slab storage (one copy into the slab per
    write). Modifying a written tensor in place, or a read result that does not require grad,
    changes the array's contents.
    """

    __slots__ = ("_flow", "_handle")

    def __init__(
        self,
        dtype: torch.dtype,
        size: int | torch.Tensor = 0,
        dynamic_size: bool = False,
        clear_after_read: bool = True,
        element_shape: PartialShape | torch.Size | list[int | None] = None,
        identical_element_shapes: bool = False,
        name: str | None = None,
        device: torch.device | str | None = None,
        *,
        registry: TensorArrayRegistry | None = None,
        allocator: Allocator | None = None,
    ):
        base = "TensorArray" if name is None else name
        if not isinstance(base, str):
            raise TensorArrayTypeError(f"TensorArray: name must be a str, got {name!r}")
        if not isinstance(dtype, torch.dtype):
            raise TensorArrayTypeError(
                f"TensorArray {base!r}: dtype must be a torch.dtype, got {dtype!r}"
            )
        if dtype not in DTYPES:
            raise TensorArrayDTypeError(
                f"TensorArray {base!r}: dtype must be one of "
                f"[{', '.join(str(d).removeprefix('torch.') for d in DTYPES)}], got {dtype} "
                f"(torch implements no row copy or addition for it)"
            )
        n = as_index(size, "size", base)
        if not 0 <= n <= MAX_SIZE:
            raise TensorArrayShapeError(f"TensorArray {base!r}: size must be in [0, {MAX_SIZE}] "
                                        f"(TensorFlow's int32 sizes), got {n}")
        es = as_partial_shape(element_shape, "element_shape", base)
        if registry is None:
            registry = default_registry
        elif not isinstance(registry, TensorArrayRegistry):
            raise TensorArrayTypeError(
                f"TensorArray {base!r}: registry must be a TensorArrayRegistry, got "
                f"{type(registry).__name__}"
            )
        if allocator is None:
            allocator = registry.allocator
        elif not callable(allocator):
            raise TensorArrayTypeError(
                f"TensorArray {base!r}: allocator must be callable (shape, dtype, device) -> "
                f"Tensor, got {type(allocator).__name__}"
            )
        for flag, value in (("dynamic_size", dynamic_size),
                            ("clear_after_read", clear_after_read),
                            ("identical_element_shapes", identical_element_shapes)):
            if not isinstance(value, bool):
                raise TensorArrayTypeError(
                    f"TensorArray {base!r}: {flag} must be a bool, got "
                    f"{type(value).__name__} {value!r}"
                )
        res = ArrayResource(
            unique_name(base),
            dtype,
            n,
            bool(dynamic_size),
            bool(clear_after_read),
            es,
            bool(identical_element_shapes),
            resolve_device(device, base),
            allocator,
            registry,
        )
        handle = TensorArrayHandle(res, registry, new_flow())
        registry.register(handle)
        self._handle = handle
        self._flow = handle._flow

    @classmethod
    def _wrap(cls, handle: TensorArrayHandle, flow: torch.Tensor) -> TensorArray:
        ta = object.__new__(cls)
        ta._handle = handle
        ta._flow = flow
        return ta

    @classmethod
    def from_handle(cls, handle: TensorArrayHandle, flow: torch.Tensor | None = None):
        """A TensorArray object for an existing handle (e.g. one from :func:`tensor_array_grad`).

        ``flow`` defaults to the handle's newest flow.
        """
        if not isinstance(handle, TensorArrayHandle):
            raise TensorArrayTypeError(
                f"TensorArray: from_handle: handle must be a TensorArrayHandle, got "
                f"{type(handle).__name__}"
            )
        if flow is None:
            return cls._wrap(handle, handle._flow)
        return cls._wrap(handle, _check_flow(handle._res, "from_handle", "flow", flow))

    @classmethod
    def from_slab(
        cls,
        slab: torch.Tensor,
        *,
        clear_after_read: bool = True,
        name: str | None = None,
        registry: TensorArrayRegistry | None = None,
        allocator: Allocator | None = None,
    ) -> TensorArray:
        """A fixed-size array whose storage is ``slab`` itself, without a copy, when slab is
        contiguous; otherwise (a transposed or expanded view) a contiguous copy of it, as
        ``unstack`` makes, which later changes to ``slab`` do not reach.

        slab: ``[size, *element_shape]``; element i is ``slab[i]``. Equivalent to
        ``TensorArray(slab.dtype, slab.shape[0], element_shape=slab.shape[1:],
        device=slab.device).unstack(slab)``, autograd included: the gradient of ``slab`` is the
        gradient array's stack (itself a view of the gradient array's slab).
        """
        if not isinstance(slab, torch.Tensor) or slab.dim() < 1:
            raise TensorArrayShapeError(
                f"TensorArray: from_slab: slab must be a tensor of at least 1 dimension, got "
                f"{slab.shape if isinstance(slab, torch.Tensor) else type(slab).__name__}"
            )
        ta = cls(
            slab.dtype,
            size=slab.shape[0],
            clear_after_read=clear_after_read,
            element_shape=tuple(slab.shape[1:]),
            name=name,
            device=slab.device,
            registry=registry,
            allocator=allocator,
        )
        return ta.unstack(slab)

    # -------------------------------------------------------------- properties

    @property
    def handle(self) -> TensorArrayHandle:
        """The shared handle (``.name`` is the unique array name)."""
        return self._handle

    @property
    def flow(self) -> torch.Tensor:
        """Scalar float32 tensor (on the CPU) carrying the autograd ordering edge."""
        return self._flow

    @property
    def name(self) -> str:
        return self._handle.name

    @property
    def dtype(self) -> torch.dtype:
        return self._handle._res.dtype

    @property
    def device(self) -> torch.device | None:
        """Device of the elements; None until the first value fixes it."""
        return self._handle._res.device

    @property
    def element_shape(self) -> PartialShape:
        """Known element shape: a tuple with None for unknown dimensions, or None."""
        return self._handle._res.element_shape

    @property
    def dynamic_size(self) -> bool:
        """Whether writes may grow the array (switched off for good by :meth:`grad`)."""
        return self._handle._res.dynamic_size

    @property
    def clear_after_read(self) -> bool:
        return self._handle._res.clear_after_read

    @property
    def is_grad(self) -> bool:
        """True for a gradient array."""
        return self._handle._res.is_grad

    @property
    def slab(self) -> torch.Tensor | None:
        """The storage ``[size, *element_shape]``, or None when not slab-backed (or not yet
        allocated, or closed).

        A view of the allocated (or adopted) slab, no copy. Rows never written, and rows of a
        gradient array that only hold a soft-copied shape, are uninitialised here; ``stack()``
        zero-fills them and returns the same memory.
        """
        res = self._handle._res
        if res.closed or res.slab is None:
            return None
        return res.slab[: res.size]

    def __repr__(self) -> str:
        res = self._handle._res
        state = "closed" if res.closed else f"size={res.size}"
        return (
            f"TensorArray({self.name!r}, dtype={res.dtype}, {state}, "
            f"element_shape={res.element_shape}, dynamic_size={res.dynamic_size}, "
            f"storage={'slab' if res.slab_shape is not None else 'list'})"
        )

    # ------------------------------------------------------------------ writes

    def write(self, index: int | torch.Tensor, value: torch.Tensor) -> TensorArray:
        """Write ``value`` (shape ``element_shape``) at ``index``; returns the new array."""
        handle = self._handle
        res = handle._res
        i = index if type(index) is int else as_index(index, "write: index", res.name)
        if not isinstance(value, torch.Tensor):
            raise _not_tensor(res, f"write(index={i})", "value", value)
        return _store(handle, value,
                      lambda flow: WriteFn.apply(flow, value, res, i),
                      lambda: res.write(i, value))

    def scatter(self, indices: list[int] | torch.Tensor, value: torch.Tensor) -> TensorArray:
        """Write ``value[k]`` at ``indices[k]``; value ``[len(indices), *element_shape]``."""
        handle = self._handle
        res = handle._res
        idx = as_index_list(indices, "scatter: indices", res.name)
        if not isinstance(value, torch.Tensor):
            raise _not_tensor(res, "scatter", "value", value)
        return _store(handle, value,
                      lambda flow: ScatterFn.apply(flow, value, res, idx, "scatter"),
                      lambda: res.scatter(idx, value))

    def unstack(self, value: torch.Tensor) -> TensorArray:
        """Write ``value[k]`` at index k for every k; value ``[n, *element_shape]``.

        On a fresh slab-backed array that ``value`` fills completely, ``value`` becomes the slab
        (no copy).
        """
        handle = self._handle
        res = handle._res
        if not isinstance(value, torch.Tensor):
            raise _not_tensor(res, "unstack", "value", value)
        return _store(handle, value,
                      lambda flow: ScatterFn.apply(flow, value, res, None, "unstack"),
                      lambda: res.unstack(value))

    def split(self, value: torch.Tensor, lengths: list[int] | torch.Tensor) -> TensorArray:
        """Write ``value`` cut along dimension 0 into pieces of ``lengths``.

        value: ``[sum(lengths), *rest]``; element k: ``[lengths[k], *rest]``.
        """
        handle = self._handle
        res = handle._res
        lens = as_index_list(lengths, "split: lengths", res.name)
        if not isinstance(value, torch.Tensor):
            raise _not_tensor(res, "split", "value", value)
        return _store(handle, value,
                      lambda flow: SplitFn.apply(flow, value, res, lens),
                      lambda: res.split(value, lens))

    # ------------------------------------------------------------------- reads

    def _check_dtype(self, dtype: torch.dtype | None, op: str) -> None:
        res = self._handle._res
        if dtype is not None and dtype != res.dtype:
            res._check_dtype(dtype, op, "requested")

    def read(self, index: int | torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The element at ``index`` (shape ``element_shape``).

        Unwritten indices read as zeros when the element shape is fully defined.
        """
        handle = self._handle
        res = handle._res
        i = index if type(index) is int else as_index(index, "read: index", res.name)
        if dtype is not None:
            self._check_dtype(dtype, f"read(index={i})")
        if 0 <= i < res.size and res.hist[i] and torch.is_grad_enabled():
            return ReadFn.apply(handle._flow, res, i)
        return res.read(i)

    def gather(
        self, indices: list[int] | torch.Tensor, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """Elements at ``indices`` stacked: ``[len(indices), *element_shape]``."""
        handle = self._handle
        res = handle._res
        idx = as_index_list(indices, "gather: indices", res.name)
        self._check_dtype(dtype, "gather")
        if torch.is_grad_enabled() and res.hist.find(1) != -1:
            hist, size = res.hist, res.size
            if any(hist[i] for i in idx if 0 <= i < size):
                return GatherFn.apply(handle._flow, res, idx, "gather")
        return res.gather(idx)

    def stack(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """All elements stacked: ``[size, *element_shape]``; a view of the slab when
        slab-backed."""
        handle = self._handle
        res = handle._res
        self._check_dtype(dtype, "stack()")
        if torch.is_grad_enabled() and res.hist.find(1, 0, res.size) != -1:
            return GatherFn.apply(handle._flow, res, None, "stack()")
        return res.stack()

    def concat(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """All elements concatenated along dimension 0: ``[sum of element dim 0, *rest]``."""
        handle = self._handle
        res = handle._res
        self._check_dtype(dtype, "concat()")
        if torch.is_grad_enabled() and res.hist.find(1, 0, res.size) != -1:
            return ConcatFn.apply(handle._flow, res)
        return res.concat()[0]

    # ------------------------------------------------------------------- other

    def size(self) -> int:
        """Number of elements (for a dynamic array, the highest index written + 1)."""
        res = self._handle._res
        res.check_open("size()")
        return res.size

    def close(self) -> None:
        """Free the storage and every gradient array of this array; later ops raise, a second
        close() included (TensorFlow is silent there).

        A closed gradient array keeps its key: grad(source) on the forward array returns the
        closed array again, as TensorFlow's lookup does, rather than a fresh accumulator.
        """
        res = self._handle._res
        res.check_open("close()")
        res.close()

    def grad(
        self,
        source: str,
        flow: torch.Tensor | None = None,
        shape_to_prepend: tuple[int, ...] | list[int] | torch.Size | None = None,
    ) -> TensorArray:
        """The gradient array of this array for ``source`` (TF TensorArrayGrad[WithShape]).

        The same ``source`` always returns the same accumulator (also via
        :func:`tensor_array_grad`). The first call freezes this array (``dynamic_size`` off for
        good); the gradient array has this array's current size, aggregating writes,
        ``clear_after_read`` on, and every index written here marked written there with its
        shape (``shape_to_prepend + shape``) and no data, so reading it gives zeros. As in
        TensorFlow, only number dtypes aggregate: a bool gradient array takes one write per
        index and refuses a second (TensorArrayDTypeError) rather than OR-ing them.

        ``flow`` orders the lookup in TensorFlow graphs; eager PyTorch needs no such edge, so it
        is only checked to be a tensor.
        """
        if flow is not None:  # under this method's name for it (the op's is flow_in)
            _check_flow(self._handle._res, "grad", "flow", flow)
        grad_handle, grad_flow = tensor_array_grad(
            self._handle, self._flow if flow is None else flow, source, shape_to_prepend
        )
        return TensorArray._wrap(grad_handle, grad_flow)


class TensorArrayGradResult(NamedTuple):
    """Outputs of :func:`tensor_array_grad`."""

    grad_handle: TensorArrayHandle
    flow_out: torch.Tensor


def tensor_array_grad(
    handle: TensorArrayHandle,
    flow_in: torch.Tensor,
    source: str,
    shape_to_prepend: tuple[int, ...] | list[int] | torch.Size | None = None,
) -> TensorArrayGradResult:
    """Op-level TensorArrayGrad: look up or create the gradient array of ``handle``.

    The accumulator is keyed by (``handle.name``, ``source``); :meth:`TensorArray.grad` sees the
    same one. See :meth:`TensorArray.grad` for the rules.

    Returns:
        ``(grad_handle, flow_out)``: the gradient array's handle (named
        ``"<handle.name>@<source>"``) and its flow, for chaining.
    """
    if not isinstance(handle, TensorArrayHandle):
        raise TensorArrayTypeError(
            f"TensorArray: tensor_array_grad: handle must be a TensorArrayHandle, got "
            f"{type(handle).__name__}"
        )
    res = handle._res
    _check_flow(res, "tensor_array_grad", "flow_in", flow_in)
    source = _check_source(source, res.name)
    prepend = _as_prepend(shape_to_prepend, res.name)
    with res.lock:
        grad_handle = res.make_grad(source, prepend)
    return TensorArrayGradResult(grad_handle, grad_handle._flow)
