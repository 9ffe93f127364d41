"""Shared pytest fixtures: seeding, device selection and GPU marking."""

from __future__ import annotations

import os

import pytest
import torch

# Tests run the Triton kernels on the CPU through the interpreter unless a GPU is present.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Fresh engine/reserve buffers start as NaN, so a missing kernel write cannot pass.
os.environ.setdefault("TRITONRNN_POISON", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_failed_barrier():
    """On a GPU, every test ends by checking that no persistent-grid barrier timed out (the
    launches report failures asynchronously, kernels/grid_barrier.py)."""
    yield
    if torch.cuda.is_available():
        from tritonrnn.kernels.grid_barrier import check_barriers

        check_barriers()
