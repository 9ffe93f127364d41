"""The fused Triton dropout kernel against the torch oracle (rnn/dropout.py), bit for bit.

The oracle (keep_mask + apply) always runs on the CPU, so on a GPU these tests also check that
the CUDA kernel's bits do not depend on the device."""

from __future__ import annotations

import pytest
import torch

from tritonrnn.kernels.dropout import dropout_apply
from tritonrnn.rnn import dropout as dmod
from tritonrnn.rnn.packing import make_pack_info

# The interpreter runs the uint64 mixer as numpy array ops: an overflow warning would mean a
# wrap-around was not silent (or a scalar op slipped in), so warnings fail these tests.
pytestmark = pytest.mark.filterwarnings("error")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INTERPRETED = DEVICE.type == "cpu"
CPU = torch.device("cpu")

# (seed, seed2): zeros, small, negative, around 2**63 and at/above it (taken mod 2**64).
SEEDS = {
    "zero": (0, 0),
    "small": (1, 2),
    "neg": (-5, 7),
    "i64_edges": (2**63 - 1, -(2**63)),
    "neg_seed2": (123456789, -1),
    "u64_max": (2**64 - 1, 2**63 + 3),
    "at_2_63": (2**63, 2**63),
}
# Packed layouts: varlen with a length-0 row (and ties), and batch 1 shorter than T.
LAYOUTS = {"varlen_len0": ([7, 0, 3, 7, 1], 7), "batch1": ([5], 7)}


def _info(layout: str, device: torch.device = DEVICE):
    lengths, T = LAYOUTS[layout]
    return make_pack_info(lengths, T, device)


def _oracle(x: torch.Tensor, layout: str, p: float, seed: int, seed2: int, layer: int):
    """keep_mask + apply on the CPU, in x's dtype."""
    mask = dmod.keep_mask(_info(layout, CPU), x.shape[1], p, seed, seed2, layer)
    return dmod.apply(x.cpu(), mask, p)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize(("seed", "seed2"), list(SEEDS.values()), ids=list(SEEDS))
def test_mask_bit_identical(seed, seed2, p, layout):
    info = _info(layout)
    for C, layer in ((37, 0), (130, 3)):  # one column tile, then two (BLOCK_C = 128)
        x = torch.ones(info.N, C, device=DEVICE)
        out = torch.full_like(x, float("nan"))
        got = dropout_apply(x, out, info.padded_index, p, dmod.layer_key(seed, seed2, layer))
        want = dmod.keep_mask(_info(layout, CPU), C, p, seed, seed2, layer)
        assert got.data_ptr() == out.data_ptr()
        assert torch.equal(got.cpu() != 0, want)
        scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)
        assert torch.equal(got.cpu()[want], scale.expand(int(want.sum())))


# Triton types an integer argument i32 or i64 by its value, so keys and thresholds (ceil(p *
# 2**53)) that fit in 32 bits, signed or unsigned, take other code paths than typical ones;
# 1 is also a value Triton may specialise on.
KEYS = {"0": 0, "1": 1, "16": 16, "u32": 3_000_000_000, "2_32": 2**32, "2_63": 2**63,
        "all_ones": 2**64 - 1}
PS = {"zero": 0.0, "thr1": 2.0**-53, "thr_i32": 1e-9, "thr_u32": 3e9 * 2.0**-53, "half": 0.5,
      "max": 1.0 - 2.0**-53}


@pytest.mark.parametrize("p", list(PS.values()), ids=list(PS))
@pytest.mark.parametrize("key", list(KEYS.values()), ids=list(KEYS))
def test_scalar_argument_types(key, p):
    info = _info("varlen_len0")
    C = 9
    x = torch.ones(info.N, C, device=DEVICE)
    got = dropout_apply(x, torch.full_like(x, float("nan")), info.padded_index, p, key)
    cpu = _info("varlen_len0", CPU)
    counter = cpu.padded_index[:, None] * C + torch.arange(C)[None, :]
    want = dmod.uniform(counter, key) >= p
    assert torch.equal(got.cpu() != 0, want)


# Under the interpreter (Triton 3.9) fp32 -> bf16 truncates; GPUs round to nearest even like
# torch. Exact bf16 equality with the oracle is therefore checked on a GPU, and the interpreter
# by test_bf16_in_interpreter.
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, marks=pytest.mark.gpu, id="bf16")]


@pytest.mark.parametrize("rows", ["contiguous", "strided"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_match_oracle(dtype, in_place, rows):
    """apply_packed (the fused kernel here) equals keep_mask + apply bit for bit: the scale is
    applied in fp32 and rounded once to the tensor's dtype by both."""
    info = _info("varlen_len0")
    g = torch.Generator().manual_seed(0)
    C, p, seed, seed2, layer = 33, 0.3, 4, -5, 1
    wide = (torch.randn(info.N, 50, generator=g) * 4).to(dtype).to(DEVICE)
    # strided rows: a column slice of a wider buffer (row stride 50, unit column stride)
    x = wide[:, 5 : 5 + C] if rows == "strided" else wide[:, :C].contiguous()
    x_before = x.clone()
    want = _oracle(x, "varlen_len0", p, seed, seed2, layer)
    if in_place:
        out = x
    else:  # a NaN-poisoned output, itself strided when the input is
        out_wide = torch.full((info.N, 41), float("nan"), dtype=dtype, device=DEVICE)
        out = out_wide[:, 3 : 3 + C] if rows == "strided" else out_wide[:, :C].contiguous()
    got = dmod.apply_packed(x, info, p, seed, seed2, layer, out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
    assert torch.equal(got.cpu(), want)
    if in_place:  # through the buffer itself, not just the returned view
        assert torch.equal(x.cpu(), want)
    else:
        assert torch.equal(x, x_before)
        if rows == "strided":
            assert out_wide[:, :3].isnan().all() and out_wide[:, 3 + C :].isnan().all()


def test_strided_in_place_leaves_neighbours():
    info = _info("varlen_len0")
    wide = torch.randn(info.N, 50, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    before = wide.clone()
    dmod.apply_packed(wide[:, 5:38], info, 0.5, 3, 4, 2, out=wide[:, 5:38])
    assert torch.equal(wide[:, :5], before[:, :5]) and torch.equal(wide[:, 38:], before[:, 38:])
    assert torch.equal(wide[:, 5:38].cpu(), _oracle(before[:, 5:38], "varlen_len0", 0.5, 3, 4, 2))


@pytest.mark.skipif(not INTERPRETED, reason="exact bf16 against the oracle runs on the GPU")
def test_bf16_in_interpreter():
    """The kernel's fp32 products are exact; only the final bf16 rounding is the interpreter's
    (truncation in Triton 3.9), so the result equals the truncated fp32 oracle bit for bit, or
    the round-to-nearest-even oracle should a later interpreter round like the GPU."""
    info = _info("varlen_len0")
    p = 0.3
    x = torch.randn(info.N, 33, generator=torch.Generator().manual_seed(0)).bfloat16()
    got = dmod.apply_packed(x, info, p, 4, 5, 1)
    mask = dmod.keep_mask(info, 33, p, 4, 5, 1)
    y32 = torch.where(mask, x.float() * (1.0 / (1.0 - p)), 0.0)
    truncated = (y32.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()  # exact
    rounded = dmod.apply(x, mask, p)
    assert not torch.equal(truncated, rounded)  # the two candidates are distinguishable here
    assert torch.equal(got, truncated) or torch.equal(got, rounded)


def test_default_out_is_new():
    info = _info("varlen_len0")
    x = torch.randn(info.N, 6, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    before = x.clone()
    got = dmod.apply_packed(x, info, 0.5, 1, 2, 0)
    assert got.data_ptr() != x.data_ptr() and torch.equal(x, before)
    assert torch.equal(got.cpu(), _oracle(x, "varlen_len0", 0.5, 1, 2, 0))


def test_torch_paths():
    """Inputs the kernel does not take go to the oracle itself: float64, a column-strided view,
    an empty batch (all lengths 0)."""
    info = make_pack_info([0, 0], 3, DEVICE)
    assert dmod.apply_packed(torch.empty(0, 4, device=DEVICE), info, 0.5, 1, 2, 0).shape == (0, 4)
    info = _info("varlen_len0")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(info.N, 6, dtype=torch.float64, generator=g).to(DEVICE)
    assert torch.equal(dmod.apply_packed(x, info, 0.5, 1, 2, 0).cpu(),
                       _oracle(x, "varlen_len0", 0.5, 1, 2, 0))
    wide = torch.randn(info.N, 12, generator=g).to(DEVICE)
    x = wide[:, ::2]  # column stride 2
    out = torch.full((info.N, 6), float("nan"), device=DEVICE)
    dmod.apply_packed(x, info, 0.5, 1, 2, 0, out=out)
    assert torch.equal(out.cpu(), _oracle(x, "varlen_len0", 0.5, 1, 2, 0))
