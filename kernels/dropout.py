"""Fused counter-based dropout between layers: mask generation and inverted dropout in one pass.

Bit-identical to the PyTorch oracle in rnn/dropout.py (keep_mask + apply): element (packed row
r, channel ch) has counter padded_index[r] * C + ch, mixed with the layer key by splitmix64 in
uint64 (multiplies wrap modulo 2**64, shifts are logical); it is kept iff its top 53 bits are
>= ceil(p * 2**53), which is exactly the oracle's `uniform >= p` (uniform = bits * 2**-53 is
exact in float64). Kept values are multiplied by fl32(1 / (1 - p)) in fp32 and rounded once
(to nearest even) to the output's dtype, as the oracle does. Nothing is stored: the backward
calls the same kernel on the gradient, in place.

Traffic: one read and one write of [N, C] plus N int64 indices; no [N, C] counter tensor.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .compile_options import FP_FUSION


@triton.jit
def splitmix64(x):
    """splitmix64 finaliser on uint64 (multiplications wrap modulo 2**64; >> is logical on
    unsigned types). Under the interpreter these are numpy uint64 array ops, which wrap
    silently."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit(do_not_specialize=["N", "key", "threshold"])
def _dropout_kernel(X, OUT, PADDED_INDEX, N, C, stride_x, stride_o, key, threshold, scale,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < N
    mask = row_ok[:, None] & (cols < C)[None, :]
    idx = tl.load(PADDED_INDEX + rows, mask=row_ok, other=0)
    counter = (idx[:, None] * C + cols[None, :]).to(tl.uint64, bitcast=True)
    # key and threshold arrive as i32 or i64 depending on their value (Triton types integer
    # arguments by range); a value cast sign-extends, giving the same 64-bit pattern either way.
    bits = splitmix64(counter ^ key.to(tl.uint64)) >> 11
    keep = bits >= threshold.to(tl.uint64)
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + r64 * stride_x + cols[None, :], mask=mask, other=0.0)
    y = tl.where(keep, x.to(tl.float32) * scale, 0.0)
    # fp32 -> fp16/bf16 defaults to round-to-nearest-even on GPUs (the interpreter truncates
    # bf16; see tests/test_kernels_dropout.py).
    tl.store(OUT + r64 * stride_o + cols[None, :], y.to(OUT.dtype.element_ty), mask=mask)


def _signed(v: int) -> int:
    """The int64 with v's low 64 bits (Triton has no uint64 scalar argument above 2**63 - 1
    on every path, so keys travel as their signed bit pattern)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def dropout_apply(x: torch.Tensor, out: torch.Tensor, padded_index: torch.Tensor, p: float,
                  key: int) -> torch.Tensor:
    """out <- inverted dropout of x, in one kernel.

    x, out: [N, C] fp32/fp16/bf16 with unit column stride and any row stride (out may be x
    for in place; it is cast to out's dtype). padded_index: [N] int64, t * B + b of each packed
    row (PackInfo.padded_index). p: drop probability in [0, 1). key: the layer's 64-bit key
    (rnn.dropout.layer_key). Returns out. Inputs are validated by rnn.dropout.apply_packed."""
    N, C = x.shape
    if N == 0 or C == 0:
        return out
    threshold = math.ceil(p * 2.0**53)  # exact: p * 2**53 only shifts p's exponent
    scale = 1.0 / (1.0 - p)  # passed as fp32, like torch's fp32 tensor * Python float
    block_c = min(triton.next_power_of_2(C), 128)
    block_r = max(1, 4096 // block_c)
    grid = (triton.cdiv(N, block_r), triton.cdiv(C, block_c))
    with torch.cuda.device_of(x):  # Triton launches on the current device: the tensors'
        _dropout_kernel[grid](
            x, out, padded_index, N, C, x.stride(0), out.stride(0), _signed(key), threshold,
            scale, BLOCK_R=block_r, BLOCK_C=block_c, **FP_FUSION,
        )
    return out
