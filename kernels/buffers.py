"""The workspaces the launchers allocate for a launch: exchange slots, carried states, split-K
partials, and the stand-ins that strided outputs are written through."""

from __future__ import annotations

import os

import torch


def scratch(*shape: int | tuple[int, ...], dtype: torch.dtype,
            device: torch.device | str) -> torch.Tensor:
    """An uninitialised workspace (`torch.empty(*shape)`: sizes, or one size tuple),
    NaN-filled where it is floating point and TRITONRNN_POISON=1 (the tests set it, as for
    the engine's buffers): a kernel that reads a slot no launch wrote, or multiplies a
    masked-off operand instead of selecting it, then fails the comparison instead of passing
    on whatever the allocator returned (on a GPU, which may hold a NaN's bits)."""
    return poisoned(torch.empty(*shape, dtype=dtype, device=device))


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """`t`, NaN-filled where it is floating point and TRITONRNN_POISON=1 (the one rule for
    every fresh buffer: the launchers' workspaces, the engine's and the reserve's)."""
    if t.is_floating_point() and os.environ.get("TRITONRNN_POISON") == "1":
        t.fill_(float("nan"))
    return t
