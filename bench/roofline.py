"""FLOP and byte counts of an RNN training step, and the roofline measured on the device.

FLOPs (model FLOPs: useful work only, the same count for every implementation). For layer l
and one direction, with N = sum(lengths) valid tokens (padding is not useful work, so cuDNN on
padded input is charged the same N), G gates, H units, Hout = P or H, in_l = I (l = 0) or
D*Hout (l > 0):

    fwd    = 2*N*G*H*in_l  (input projection)  +  2*N*G*H*Hout  (recurrence)
             + 2*N*P*H  (LSTM projection, when P > 0)
    bwd    = 2 * fwd       (every GEMM Y = A B needs dA = dY B^T and dB = A^T dY)
    fwdbwd = 3 * fwd

summed over layers and directions. Pointwise cell math (O(N*G*H)) and tritonrnn's
recomputation of the pre-activations in the backward are not counted.

Bytes (compulsory HBM traffic, itemsize s, Pn params, S = L*D*B*(Hout + H[lstm]) state
elements):

    fwd    = s * (sum_l N*(in_l + D*Hout + D*H[lstm]) + Pn + 2*S)
             read the input, write the output and the LSTM cell states (the reserve),
             read the params once, read h0/c0 and write hT/cT
    bwd    = s * (sum_l N*(2*in_l + 2*D*Hout + D*H[lstm]) + 2*Pn + 3*S)
             read input, output, output gradient and cell states, write the input gradient,
             read params and write their gradient, read h0/c0 and dhT/dcT, write dh0/dc0
    fwdbwd = fwd + bwd

Roofline time = max(FLOPs / matrix ceiling, bytes / memory ceiling), with both ceilings
measured on the same device in the same run (a large copy, a large matmul in the benchmark
dtype). `% of roofline` = roofline time / measured time. A recurrent layer at small batch is
bound by the latency of its T sequential steps, not by either ceiling: a low percentage there
is the honest figure, not a measurement error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonrnn.rnn.config import GATES

from .presets import BenchShape, dtype_name
from .timing import TimingConfig, measure

PASSES = ("fwd", "bwd", "fwdbwd")


def _layer_inputs(shape: BenchShape) -> list[int]:
    return [shape.input if layer == 0 else shape.num_dirs * shape.out_size
            for layer in range(shape.layers)]


def param_count(shape: BenchShape) -> int:
    G, H, Hout, P, D = (GATES[shape.mode], shape.hidden, shape.out_size, shape.proj,
                        shape.num_dirs)
    per_dir = [G * H * (i + Hout) + P * H + 2 * G * H for i in _layer_inputs(shape)]
    return D * sum(per_dir)


def flops(shape: BenchShape, tokens: int, pass_: str) -> float:
    """Model FLOPs of one pass over `tokens` valid (time, batch) positions (module docstring)."""
    G, H, Hout, P, D = (GATES[shape.mode], shape.hidden, shape.out_size, shape.proj,
                        shape.num_dirs)
    fwd = D * sum(2.0 * tokens * G * H * (i + Hout) + 2.0 * tokens * P * H
                  for i in _layer_inputs(shape))
    return {"fwd": fwd, "bwd": 2.0 * fwd, "fwdbwd": 3.0 * fwd}[pass_]


def min_bytes(shape: BenchShape, tokens: int, pass_: str) -> float:
    """Compulsory memory traffic of one pass in bytes (module docstring)."""
    s = shape.torch_dtype.itemsize
    H, Hout, D = shape.hidden, shape.out_size, shape.num_dirs
    Hc = H if shape.mode == "lstm" else 0
    S = shape.layers * D * shape.batch * (Hout + Hc)
    Pn = param_count(shape)
    ins = _layer_inputs(shape)
    fwd = s * (sum(tokens * (i + D * Hout + D * Hc) for i in ins) + Pn + 2 * S)
    bwd = s * (sum(tokens * (2 * i + 2 * D * Hout + D * Hc) for i in ins) + 2 * Pn + 3 * S)
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[pass_]


@dataclass
class Ceilings:
    """Measured peak rates of one device (bytes/s and FLOP/s per dtype name)."""

    device_type: str
    memory_bytes_per_s: float
    matrix_flops_per_s: dict[str, float] = field(default_factory=dict)
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "memory_bytes_per_s": self.memory_bytes_per_s,
            "matrix_flops_per_s": dict(self.matrix_flops_per_s),
            "method": self.details,
        }

    def roofline(self, flop: float, nbytes: float, dtype: str) -> tuple[float, str]:
        """(roofline time in ms, 'compute' | 'memory')."""
        t_compute = flop / self.matrix_flops_per_s[dtype]
        t_memory = nbytes / self.memory_bytes_per_s
        if t_compute >= t_memory:
            return t_compute * 1e3, "compute"
        return t_memory * 1e3, "memory"


def measure_ceilings(device: torch.device, dtypes: list[torch.dtype],
                     timing: TimingConfig) -> Ceilings:
    """Memory bandwidth from a large copy and matrix throughput from a large square matmul per
    dtype, timed like the benchmark itself. Sizes are large on a GPU (512 MiB copy, n = 8192
    matmul) and small on the CPU, where the figures only keep the report's shape."""
    cuda = device.type == "cuda"
    copy_bytes = (512 if cuda else 32) * 2**20
    buffers = torch.ones(2, copy_bytes, dtype=torch.uint8, device=device)
    t = measure(lambda b=buffers: b[1].copy_(b[0]), device.type, timing)
    # A copy reads and writes every byte once.
    bandwidth = 2 * copy_bytes / (t.ms * 1e-3)
    del buffers
    out = Ceilings(device.type, bandwidth, details={
        "memory": f"copy of {copy_bytes // 2**20} MiB (2 x bytes per copy), median",
    })
    for dtype in dtypes:
        n = (4096 if dtype == torch.float64 else 8192) if cuda else 256
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        t = measure(lambda a=a, b=b: a @ b, device.type, timing)
        out.matrix_flops_per_s[dtype_name(dtype)] = 2.0 * n**3 / (t.ms * 1e-3)
        out.details[f"matrix_{dtype_name(dtype)}"] = f"{n}x{n} @ {n}x{n} matmul, median"
        del a, b
    if cuda:
        out.details["tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        torch.cuda.empty_cache()
    else:
        out.details["note"] = ("CPU: small copy and matmul; tiny benchmark shapes run from "
                               "caches, so % of roofline can pass 100 and means nothing")
    return out
