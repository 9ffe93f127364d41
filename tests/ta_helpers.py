"""Shared helpers of the TensorArray test modules."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tritonrnn.tensorarray import TensorArray, TensorArrayError


@contextlib.contextmanager
def raises(exc: type[BaseException], ta: TensorArray, *fragments: str):
    """pytest.raises plus: the message names the array and contains every fragment."""
    with pytest.raises(exc) as info:
        yield info
    msg = str(info.value)
    assert f"'{ta.handle.name}'" in msg, msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert isinstance(info.value, TensorArrayError)


def nan_allocator(calls: list | None = None):
    """Slab allocator that poisons fresh memory, so a row the array forgets to zero shows up."""

    def alloc(shape, dtype, device):
        if calls is not None:
            calls.append(shape)
        if dtype.is_floating_point:
            return torch.full(shape, float("nan"), dtype=dtype, device=device)
        return torch.full(shape, -777, dtype=dtype, device=device)

    return alloc
