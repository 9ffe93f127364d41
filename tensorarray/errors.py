"""Exceptions raised by tritonrnn.tensorarray.

Every error is a :class:`TensorArrayError` and also a builtin exception (``ValueError``,
``IndexError`` or ``TypeError``) so callers can catch either. Messages name the array by its
handle name and give the offending argument, what was expected and what was given, e.g.
``TensorArray 'ta_3': write(index=2): index 2 must be unwritten, but it was already
written (...)``.
"""

from __future__ import annotations

__all__ = [
    "TensorArrayAllocatorError",
    "TensorArrayClosedError",
    "TensorArrayDTypeError",
    "TensorArrayDeviceError",
    "TensorArrayError",
    "TensorArrayGradError",
    "TensorArrayIndexError",
    "TensorArrayNameError",
    "TensorArrayReadError",
    "TensorArrayShapeError",
    "TensorArrayTypeError",
    "TensorArrayWriteError",
]


class TensorArrayError(Exception):
    """Base class of every TensorArray error."""


class TensorArrayClosedError(TensorArrayError, ValueError):
    """An op on an array (or its gradient array) after ``close()``."""


class TensorArrayIndexError(TensorArrayError, IndexError):
    """An index that is negative, past the end of a fixed-size array, or (a dynamic array's
    write) past the largest size, 2**31 - 1."""


class TensorArrayWriteError(TensorArrayError, ValueError):
    """A write to an index that was already written (forward arrays) or already read, or an
    index repeated within one scatter (forward arrays)."""


class TensorArrayReadError(TensorArrayError, ValueError):
    """A read of a cleared index, or of an unwritten one whose shape is not fully known."""


class TensorArrayTypeError(TensorArrayError, TypeError):
    """An argument of the wrong type (an index that is not an integer, a value that is not a
    tensor, a source that is not a string)."""


class TensorArrayDTypeError(TensorArrayTypeError):
    """A value or requested dtype that differs from the array's dtype."""


class TensorArrayDeviceError(TensorArrayError, ValueError):
    """A value on another device than the array's."""


class TensorArrayShapeError(TensorArrayError, ValueError):
    """Element shapes that disagree, or shape-related argument errors (split, scatter, ...)."""


class TensorArrayGradError(TensorArrayError, ValueError):
    """Gradient-array misuse: the gradient of a gradient array, or concat without a split."""


class TensorArrayAllocatorError(TensorArrayError, ValueError):
    """An allocator that returned something unusable as a slab: not a tensor, the wrong shape,
    dtype or device, or an expanded (stride-0) tensor."""


class TensorArrayNameError(TensorArrayError, ValueError):
    """``TensorArrayRegistry.register`` of a handle whose key (its name; a gradient array's
    forward name and source) a live array of the registry already holds. The arrays' own
    names are unique (name + "_" + a counter), and gradient arrays are keyed apart from them,
    so a user array named like a gradient array (``"<forward name>@<source>"``) does not
    collide with it."""
