"""Counter-based dropout between layers: the mask is a pure function of
(seed, seed2, layer, t, b, channel), so the backward regenerates it instead of storing it.

The generator is splitmix64 (a bijective 64-bit mixer) applied to the element's counter
xor a per-(seed, seed2, layer) key. It only needs integer multiply, xor and shifts, so the same
bits come out of this torch version on any device and of a Triton version of it.

keep_mask + apply are the oracle: the fused kernel (kernels/dropout.py, reached through
apply_packed) is tested to reproduce them bit for bit, masks and values, in fp32/fp16/bf16.
"""

from __future__ import annotations

import torch

from .interpreter import check_interpreter_in_effect, interpreter_requested
from .packing import PackInfo

_MASK64 = (1 << 64) - 1


def _to_signed(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def _splitmix64_int(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def layer_key(seed: int, seed2: int, layer: int) -> int:
    """64-bit key of one layer's dropout stream."""
    k = _splitmix64_int(seed & _MASK64)
    k = _splitmix64_int(k ^ (seed2 & _MASK64))
    return _splitmix64_int(k ^ layer)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    # int64 arithmetic wraps modulo 2**64, which is what the mixer needs.
    x = x + _to_signed(0x9E3779B97F4A7C15)
    x = (x ^ _shr(x, 30)) * _to_signed(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _to_signed(0x94D049BB133111EB)
    return x ^ _shr(x, 31)


def uniform(counter: torch.Tensor, key: int) -> torch.Tensor:
    """float64 uniforms in [0, 1) with 53 random bits, one per int64 counter."""
    bits = _shr(_splitmix64(counter ^ _to_signed(key)), 11)
    return bits.to(torch.float64) * (1.0 / (1 << 53))


def keep_mask(
    info: PackInfo, channels: int, p: float, seed: int, seed2: int, layer: int
) -> torch.Tensor:
    """[N, channels] bool mask of kept elements of layer `layer`'s packed output.

    The counter of element (t, b, ch) is (t * B + b) * channels + ch: it does not depend on the
    packing, so equal inputs give equal masks whatever the other sequences' lengths."""
    ch = torch.arange(channels, device=info.padded_index.device, dtype=torch.int64)
    counter = info.padded_index[:, None] * channels + ch[None, :]
    return uniform(counter, layer_key(seed, seed2, layer)) >= p


def apply(x: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout: kept elements scaled by 1 / (1 - p) in fp32 (float64 for float64)
    and cast once to x's dtype, dropped ones exactly 0."""
    opmath = torch.float64 if x.dtype == torch.float64 else torch.float32
    scaled = (x.to(opmath) * (1.0 / (1.0 - p))).to(x.dtype)
    return torch.where(mask, scaled, torch.zeros((), dtype=x.dtype, device=x.device))


def apply_packed(x: torch.Tensor, info: PackInfo, p: float, seed: int, seed2: int, layer: int,
                 *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Dropout of layer `layer`'s packed output x: [N, C] (into `out`, [N, C] of x's dtype,
    which may be x for in place; default a new tensor). Returns out.

    On CUDA or under TRITON_INTERPRET=1, for fp32/fp16/bf16 with unit column strides, one fused
    Triton kernel generates the mask and applies it (kernels/dropout.py). Otherwise (float64,
    CPU without the interpreter, column-strided views) this module's torch path keep_mask +
    apply runs: it is the oracle, and the kernel is tested to match it bit for bit."""
    if out is None:
        out = torch.empty_like(x)
    fused = (x.dtype in (torch.float32, torch.float16, torch.bfloat16) and out.dtype == x.dtype
             and (x.is_cuda or interpreter_requested()) and x.stride(1) == 1
             and out.stride(1) == 1)
    if fused:
        if not x.is_cuda:
            check_interpreter_in_effect()
        from tritonrnn.kernels.dropout import dropout_apply

        return dropout_apply(x, out, info.padded_index, p, layer_key(seed, seed2, layer))
    mask = keep_mask(info, x.shape[1], p, seed, seed2, layer)
    return out.copy_(apply(x, mask, p))
