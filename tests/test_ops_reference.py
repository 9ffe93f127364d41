"""The op API on the reference engine against torch.nn in float64 (the independent oracle)."""

from __future__ import annotations

import pytest
from helpers import compare_with_torch

MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]


@pytest.mark.parametrize("time_major", [True, False], ids=["time_major", "batch_major"])
@pytest.mark.parametrize("lengths", ["full", "varlen", "zero"])
@pytest.mark.parametrize("layers", [1, 2], ids=["L1", "L2"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("mode", MODES)
def test_matches_torch(mode, bidirectional, layers, lengths, time_major):
    compare_with_torch(mode, L=layers, bidirectional=bidirectional, lengths=lengths,
                       time_major=time_major)


@pytest.mark.parametrize("lengths", ["full", "zero", "batch1"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("proj", [3, 6], ids=["P3", "P6"])
def test_lstm_projection(proj, bidirectional, lengths):
    compare_with_torch("lstm", L=2, bidirectional=bidirectional, lengths=lengths, proj=proj)


@pytest.mark.parametrize("mode", MODES)
def test_odd_sizes_batch1(mode):
    compare_with_torch(mode, L=1, lengths="batch1", I=3, H=9, T=7)
