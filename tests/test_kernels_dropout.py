"""The fused Triton dropout kernel against the torch oracle (rnn/dropout.py), bit for bit."""

from __future__ import annotations

import pytest
import torch

from tritonrnn.kernels.dropout import dropout_apply
from tritonrnn.rnn import dropout as dmod
from tritonrnn.rnn.packing import make_pack_info

SEEDS = [(0, 0), (1, 2), (-5, 7), (2**63 - 1, -(2**63)), (123456789, -1)]


def _info():
    return make_pack_info([7, 0, 3, 7, 1], 7, torch.device("cpu"))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize(("seed", "seed2"), SEEDS, ids=[f"s{i}" for i in range(len(SEEDS))])
def test_mask_bit_identical(seed, seed2, p):
    info = _info()
    C = 37
    for layer in (0, 3):
        x = torch.ones(info.N, C)
        got = dropout_apply(x, torch.full_like(x, float("nan")), info.padded_index, p,
                            dmod.layer_key(seed, seed2, layer))
        want = dmod.keep_mask(info, C, p, seed, seed2, layer)
        assert torch.equal(got != 0, want)


INTERPRETED = not torch.cuda.is_available()
# The Triton interpreter (3.9) truncates fp32 -> bf16 even with fp_downcast_rounding="rtne";
# GPUs round to nearest even. Exact bf16 equality is therefore a GPU test, and the
# interpreter checks bf16 to within the truncation (test_bf16_in_interpreter).
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.gpu, id="bf16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
def test_values_match_oracle(dtype, in_place):
    info = _info()
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(info.N, 50, generator=g).to(dtype)
    x = wide[:, 5:38]  # strided rows: a column slice of a wider buffer
    want = dmod.apply(x, dmod.keep_mask(info, 33, 0.3, 4, 5, 1), 0.3)
    out = x if in_place else torch.full_like(x, float("nan"))
    got = dmod.apply_packed(x.clone() if not in_place else x, info, 0.3, 4, 5, 1, out=out)
    assert got.dtype == dtype
    assert torch.equal(got, want)
    if in_place:
        assert torch.equal(wide[:, 5:38], want) and got.data_ptr() == wide[:, 5:].data_ptr()


@pytest.mark.skipif(not INTERPRETED, reason="exact bf16 is checked on the GPU")
def test_bf16_in_interpreter():
    info = _info()
    x = torch.randn(info.N, 33, generator=torch.Generator().manual_seed(0)).bfloat16()
    want = dmod.apply(x, dmod.keep_mask(info, 33, 0.3, 4, 5, 1), 0.3)
    got = dmod.apply_packed(x, info, 0.3, 4, 5, 1)
    assert torch.equal(got == 0, want == 0)
    ulp = want.float().abs() * 2.0**-7  # one bf16 ulp at most (truncation vs rounding)
    assert ((got.float() - want.float()).abs() <= ulp).all()


def test_empty_and_float64_paths():
    info = make_pack_info([0, 0], 3, torch.device("cpu"))
    x = torch.empty(0, 4)
    assert dmod.apply_packed(x, info, 0.5, 1, 2, 0).shape == (0, 4)
    info = _info()
    x = torch.randn(info.N, 6, dtype=torch.float64)
    want = dmod.apply(x, dmod.keep_mask(info, 6, 0.5, 1, 2, 0), 0.5)
    assert torch.equal(dmod.apply_packed(x, info, 0.5, 1, 2, 0), want)
