"""Slab allocation: the single hook through which every TensorArray slab is allocated.

When an array's size and element shape are known its elements live in one slab
``[capacity, *element_shape]``. The slab comes from an :data:`Allocator`, a plain callable that
the RNN planner can supply so that, e.g., a gradient array's slab is a buffer it planned.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .errors import TensorArrayAllocatorError, TensorArrayDeviceError, TensorArrayTypeError

__all__ = ["Allocator", "allocate_slab", "default_allocator", "resolve_device"]

Allocator = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]
"""``allocator(shape, dtype, device) -> Tensor``.

Must return a tensor of exactly ``shape`` (``(capacity, *element_shape)``), ``dtype`` and
``device``. Contents may be anything: the array tracks which rows hold data and fills rows it
has to read as zeros itself. The array writes rows in place, so the tensor must not be an
expanded (stride-0) view, and it must not be shared with anything that writes it concurrently.

Gradient arrays (made per backward pass) inherit their forward array's allocator, and a
write's backward returns a view of the gradient slab (no copy); a leaf's ``.grad`` may keep
such a view. An allocator that recycles a buffer must therefore not hand it out again while the
gradients of the pass that used it are still alive.
"""


def default_allocator(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    """``torch.empty(shape, dtype=dtype, device=device)``."""
    return torch.empty(shape, dtype=dtype, device=device)


def resolve_device(
    device: torch.device | str | int | None, array_name: str = "TensorArray"
) -> torch.device | None:
    """Normalise ``device`` so that equal placements compare equal (``"cuda"`` -> ``cuda:N``).

    Raises:
        TensorArrayTypeError: ``device`` is not a torch.device, str, int or None.
        TensorArrayDeviceError: ``device`` names no device type torch knows, or a CUDA device
            that this machine does not have.
    """
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, torch.device | str | int):
        raise TensorArrayTypeError(
            f"TensorArray {array_name!r}: device must be a torch.device, str, int or None, "
            f"got {type(device).__name__} {device!r}"
        )
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise TensorArrayDeviceError(
            f"TensorArray {array_name!r}: device must name a torch device (e.g. 'cpu', "
            f"'cuda:0'), got {device!r} ({e})"
        ) from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if resolved.index is None and count:
            resolved = torch.device("cuda", torch.cuda.current_device())
        if resolved.index is None or resolved.index >= count:
            raise TensorArrayDeviceError(
                f"TensorArray {array_name!r}: device must be an available device; got "
                f"{device!r}, and this machine has {count} CUDA device(s)"
            )
    return resolved


def allocate_slab(
    allocator: Allocator | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    array_name: str,
) -> torch.Tensor:
    """Allocate one slab through ``allocator`` and check what it returned.

    Byte size: ``shape[0] * prod(shape[1:]) * dtype.itemsize``.
    """
    slab = (allocator or default_allocator)(shape, dtype, device)
    if not isinstance(slab, torch.Tensor):
        raise TensorArrayAllocatorError(
            f"TensorArray {array_name!r}: allocator must return a torch.Tensor of shape "
            f"{shape}, got {type(slab).__name__}"
        )
    if tuple(slab.shape) != shape or slab.dtype != dtype or slab.device != device:
        raise TensorArrayAllocatorError(
            f"TensorArray {array_name!r}: allocator returned a tensor of shape "
            f"{tuple(slab.shape)}, dtype {slab.dtype}, device {slab.device}; expected shape "
            f"{shape}, dtype {dtype}, device {device}"
        )
    if slab.numel() > 1 and 0 in slab.stride():
        raise TensorArrayAllocatorError(
            f"TensorArray {array_name!r}: allocator returned an expanded tensor (strides "
            f"{slab.stride()}); the slab is written in place and needs distinct memory per element"
        )
    return slab
