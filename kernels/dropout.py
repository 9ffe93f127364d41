"""Fused counter-based dropout between layers: mask generation and inverted dropout in one pass.

Bit-identical to the PyTorch oracle in rnn/dropout.py: element (packed row r, channel ch) has
counter padded_index[r] * C + ch, mixed with the layer key by splitmix64 in uint64 (wrapping
multiplies, logical shifts); it is kept iff its top 53 bits >= ceil(p * 2**53), which is
exactly the oracle's `uniform >= p`. Kept values are multiplied by 1 / (1 - p) in fp32 and
cast once to the tensor's dtype. Nothing is stored: the backward calls the same kernel on the
gradient.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def splitmix64(x):
    """splitmix64 finaliser on uint64 (multiplications wrap modulo 2**64)."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _dropout_kernel(X, OUT, PADDED_INDEX, N, C, stride_x, stride_o, key, threshold, scale,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < N
    mask = row_ok[:, None] & (cols < C)[None, :]
    idx = tl.load(PADDED_INDEX + rows, mask=row_ok, other=0)
    counter = (idx[:, None] * C + cols[None, :]).to(tl.uint64, bitcast=True)
    bits = splitmix64(counter ^ key.to(tl.uint64, bitcast=True)) >> 11
    keep = bits >= threshold.to(tl.uint64, bitcast=True)
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + r64 * stride_x + cols[None, :], mask=mask, other=0.0)
    y = tl.where(keep, x.to(tl.float32) * scale, 0.0)
    tl.store(OUT + r64 * stride_o + cols[None, :],
             y.to(OUT.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


def _signed(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def dropout_apply(x: torch.Tensor, out: torch.Tensor, padded_index: torch.Tensor, p: float,
                  key: int) -> torch.Tensor:
    """out <- inverted dropout of x ([N, C], unit column stride; out may be x).

    padded_index: [N] int64, t * B + b of each packed row; key: the layer's 64-bit key
    (rnn.dropout.layer_key). Returns out."""
    N, C = x.shape
    if N == 0 or C == 0:
        return out
    threshold = math.ceil(p * 2.0**53)  # exact: p * 2**53 only shifts the exponent
    scale = 1.0 / (1.0 - p)
    block_c = min(triton.next_power_of_2(C), 128)
    block_r = max(1, 4096 // block_c)
    grid = (triton.cdiv(N, block_r), triton.cdiv(C, block_c))
    _dropout_kernel[grid](
        x, out, padded_index, N, C, x.stride(0), out.stride(0), _signed(key),
        _signed(threshold), scale, BLOCK_R=block_r, BLOCK_C=block_c,
    )
    return out
