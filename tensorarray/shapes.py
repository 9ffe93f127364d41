"""Partial shapes and argument normalisation shared by the TensorArray ops.

A partial shape is ``None`` (unknown rank) or a tuple whose entries are ints or ``None``
(unknown dimension), TensorFlow's PartialTensorShape.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Sequence

import torch

from .errors import TensorArrayShapeError, TensorArrayTypeError

__all__ = [
    "PartialShape",
    "as_index",
    "as_index_list",
    "as_partial_shape",
    "fmt_shape",
    "is_compatible",
    "is_fully_defined",
]

PartialShape = tuple[int | None, ...] | None

# The largest size of an array (and so its largest index + 1): TensorFlow's sizes and
# indices are int32.
MAX_SIZE = 2**31 - 1

_INT_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64,
                         torch.uint8, torch.uint16, torch.uint32, torch.uint64})


def fmt_shape(shape: PartialShape | torch.Size) -> str:
    """``(2, 3)``, ``(None, 3)``, ``()`` or ``<unknown>``."""
    if shape is None:
        return "<unknown>"
    dims = ", ".join("None" if d is None else str(d) for d in shape)
    return f"({dims},)" if len(shape) == 1 else f"({dims})"


def is_fully_defined(shape: PartialShape) -> bool:
    return shape is not None and None not in shape


def is_compatible(partial: PartialShape, shape: Sequence[int]) -> bool:
    """Whether the concrete ``shape`` matches ``partial`` (TF IsCompatibleWith)."""
    if partial is None:
        return True
    if len(partial) != len(shape):
        return False
    return all(p is None or p == s for p, s in zip(partial, shape, strict=True))


def as_partial_shape(shape: object, what: str, array_name: str | None = None) -> PartialShape:
    """Normalise ``None``, a torch.Size or a sequence of ints/None (-1 = unknown)."""
    if shape is None:
        return None
    prefix = f"TensorArray {array_name!r}: " if array_name else "TensorArray: "
    if isinstance(shape, torch.Tensor):
        shape = host_values(shape, f"{prefix}{what}")
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TensorArrayTypeError(
            f"{prefix}{what} must be None or a sequence of ints/None, got {shape!r}"
        )
    out: list[int | None] = []
    for d in shape:
        if d is None or (isinstance(d, numbers.Integral) and not isinstance(d, bool) and d == -1):
            out.append(None)
        elif isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise TensorArrayShapeError(
                f"{prefix}{what} must contain ints >= 0, None or -1, got {tuple(shape)!r}"
            )
    return tuple(out)


def as_index(index: object, what: str, array_name: str) -> int:
    """A Python int from an int or an integer 0-d tensor (bools are refused)."""
    if type(index) is int:
        return index
    if isinstance(index, torch.Tensor):
        if index.dtype in _INT_DTYPES and index.dim() == 0:
            # (tolist, not int(): a uint64 above int64's range is an index out of range)
            return host_values(index, f"TensorArray {array_name!r}: {what}")
        raise TensorArrayTypeError(
            f"TensorArray {array_name!r}: {what} must be an int or a 0-d integer tensor, got a "
            f"tensor of dtype {index.dtype} and shape {tuple(index.shape)}"
        )
    if isinstance(index, numbers.Integral) and not isinstance(index, bool):
        return int(index)
    if _is_ndarray(index) and index.ndim == 0 and index.dtype.kind in "iu":
        return int(index)
    raise TensorArrayTypeError(
        f"TensorArray {array_name!r}: {what} must be an int or a 0-d integer tensor, got "
        f"{type(index).__name__} {index!r}"
    )


def host_values(t: torch.Tensor, what: str):
    """t's values as Python numbers (t.tolist()): an argument the ops read on the host. A
    meta tensor has none."""
    if t.is_meta:
        raise TensorArrayTypeError(f"{what} must be a tensor with data (it is read on the "
                                   f"host), got a meta tensor")
    return t.tolist()


def _is_int_scalar(i: object) -> bool:
    if isinstance(i, torch.Tensor):
        return i.dim() == 0 and i.dtype in _INT_DTYPES
    return isinstance(i, numbers.Integral) and not isinstance(i, bool)


def _is_ndarray(x: object) -> bool:
    """Whether x is a NumPy array (without importing NumPy: one exists only once loaded)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def as_index_list(indices: object, what: str, array_name: str) -> list[int]:
    """A list of ints from a list/tuple/range of ints, a 1-d integer tensor or NumPy array.

    Raises:
        TensorArrayShapeError: ``indices`` is not a vector (a scalar or a nested list).
        TensorArrayTypeError: the entries are not integers.
    """
    prefix = f"TensorArray {array_name!r}: {what}"
    if isinstance(indices, torch.Tensor):
        if indices.dim() != 1:
            raise TensorArrayShapeError(
                f"{prefix} must be a vector, got a tensor of shape {tuple(indices.shape)}"
            )
        if indices.dtype not in _INT_DTYPES:
            raise TensorArrayTypeError(f"{prefix} must have an integer dtype, got {indices.dtype}")
        return host_values(indices, prefix)
    if isinstance(indices, range):
        return list(indices)
    if _is_ndarray(indices):  # as TensorFlow takes them
        if indices.ndim != 1:
            raise TensorArrayShapeError(
                f"{prefix} must be a vector, got an array of shape {indices.shape}"
            )
        if indices.dtype.kind not in "iu":
            raise TensorArrayTypeError(
                f"{prefix} must have an integer dtype, got NumPy {indices.dtype}"
            )
        return [int(i) for i in indices]
    if isinstance(indices, (list, tuple)):
        out = []
        for i in indices:
            if type(i) is int:
                out.append(i)
            elif _is_int_scalar(i):
                out.append(int(i))
            elif isinstance(i, torch.Tensor) and i.dim() == 0:
                raise TensorArrayTypeError(
                    f"{prefix} must contain ints, got a 0-d tensor of dtype {i.dtype} "
                    f"({i.item()!r})"
                )
            elif isinstance(i, (list, tuple, torch.Tensor)) or _is_ndarray(i):
                raise TensorArrayShapeError(
                    f"{prefix} must be a vector, got a nested sequence {indices!r}"
                )
            else:
                raise TensorArrayTypeError(
                    f"{prefix} must contain ints, got {type(i).__name__} {i!r}"
                )
        return out
    raise TensorArrayShapeError(
        f"{prefix} must be a vector (list, tuple, range, 1-d integer tensor or NumPy array), "
        f"got "
        f"{type(indices).__name__} {indices!r}"
    )
