"""TensorFlow's TensorArray and TensorArrayGrad (V3 semantics) for PyTorch.

Contract: shared/spec/tensor_array.md. Quick tour::

    ta = TensorArray(torch.float32, size=T, element_shape=(B, H))
    for t in range(T):
        ta = ta.write(t, step(x[t]))        # values keep their autograd history
    y = ta.stack()                          # [T, B, H], a view of the slab
    y.sum().backward()                      # gradients follow TensorFlow's rules

Storage hook for planners: every slab is allocated by an :data:`Allocator`
``(shape, dtype, device) -> Tensor`` given to :class:`TensorArray` (``allocator=``) or to a
:class:`TensorArrayRegistry`; gradient arrays inherit their forward array's allocator.
:meth:`TensorArray.from_slab` adopts an existing tensor as the slab and :attr:`TensorArray.slab`
exposes it.
"""

from .array import TensorArray, TensorArrayGradResult, tensor_array_grad
from .autograd import AUTOGRAD_SOURCE_PREFIX
from .errors import (
    TensorArrayAllocatorError,
    TensorArrayClosedError,
    TensorArrayDeviceError,
    TensorArrayDTypeError,
    TensorArrayError,
    TensorArrayGradError,
    TensorArrayIndexError,
    TensorArrayNameError,
    TensorArrayReadError,
    TensorArrayShapeError,
    TensorArrayTypeError,
    TensorArrayWriteError,
)
from .registry import TensorArrayHandle, TensorArrayRegistry, default_registry
from .storage import Allocator, default_allocator

__all__ = [
    "AUTOGRAD_SOURCE_PREFIX",
    "Allocator",
    "TensorArray",
    "TensorArrayAllocatorError",
    "TensorArrayClosedError",
    "TensorArrayDTypeError",
    "TensorArrayDeviceError",
    "TensorArrayError",
    "TensorArrayGradError",
    "TensorArrayGradResult",
    "TensorArrayHandle",
    "TensorArrayIndexError",
    "TensorArrayNameError",
    "TensorArrayReadError",
    "TensorArrayRegistry",
    "TensorArrayShapeError",
    "TensorArrayTypeError",
    "TensorArrayWriteError",
    "default_allocator",
    "default_registry",
    "tensor_array_grad",
]
