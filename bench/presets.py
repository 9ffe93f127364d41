"""Benchmark shapes, the named presets and the variable-length distributions.

A `BenchShape` is one point of a sweep: everything that decides the work of one training step
(mode, sizes, dtype, layout of the lengths). A preset is a named list of shapes; `anchor` is
the design's reference point (LSTM H=768 B=16 T=1024 bf16, where cuDNN takes about 2.0 ms
forward and 5.2 ms forward+backward on an H100).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace

import torch

MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp64": torch.float64,
    "float64": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_dtype(name: str) -> torch.dtype:
    """'bf16' | 'fp16' | 'fp32' | 'fp64' (or the torch names) -> torch dtype."""
    if name not in DTYPES:
        raise ValueError(f"--dtype: expected one of bf16, fp16, fp32, fp64, got {name!r}")
    return DTYPES[name]


def parse_varlen(spec: str | None) -> str:
    """Validates a --varlen distribution and returns its canonical spelling.

    none            every sequence has length T
    uniform         lengths uniform in [ceil(T/8), T] (the design's variable-length target)
    uniform:F       lengths uniform in [ceil(F*T), T], 0 <= F <= 1 (F=0 allows length 0)
    """
    if spec is None or spec == "none":
        return "none"
    if spec == "uniform":
        return "uniform"
    if spec.startswith("uniform:"):
        try:
            frac = float(spec.split(":", 1)[1])
        except ValueError:
            frac = -1.0
        if not 0.0 <= frac <= 1.0:
            raise ValueError(
                f"--varlen: expected 'uniform:F' with F in [0, 1], got {spec!r}"
            )
        return f"uniform:{frac:g}"
    raise ValueError(f"--varlen: expected one of none, uniform, uniform:F, got {spec!r}")


def make_lengths(dist: str, batch: int, max_time: int, seed: int = 0) -> list[int] | None:
    """Seeded lengths for a distribution (None for 'none': every sequence is full).

    The longest sequence is always T, so the padded input has exactly T steps."""
    dist = parse_varlen(dist)
    if dist == "none":
        return None
    frac = 1.0 / 8.0 if dist == "uniform" else float(dist.split(":")[1])
    lo = -(-int(round(frac * max_time * 1e6)) // 1_000_000)  # ceil(frac*T), float-safe
    lo = min(max(lo, 0), max_time)
    rng = random.Random(seed)
    lengths = [rng.randint(lo, max_time) for _ in range(batch)]
    lengths[rng.randrange(batch)] = max_time
    return lengths


@dataclass(frozen=True)
class BenchShape:
    """One benchmark configuration (input_size None: the same as hidden)."""

    mode: str = "lstm"
    hidden: int = 768
    batch: int = 16
    time: int = 1024
    layers: int = 1
    bidirectional: bool = False
    proj: int = 0
    dtype: str = "bfloat16"
    varlen: str = "none"
    input_size: int | None = None

    @property
    def input(self) -> int:
        return self.hidden if self.input_size is None else self.input_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    @property
    def direction(self) -> str:
        return "bidirectional" if self.bidirectional else "unidirectional"

    @property
    def num_dirs(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def out_size(self) -> int:
        return self.proj or self.hidden

    @property
    def label(self) -> str:
        """Short human label, e.g. 'lstm H768 B16 T1024 bf16'."""
        parts = [self.mode, f"H{self.hidden}", f"B{self.batch}", f"T{self.time}"]
        if self.input != self.hidden:
            parts.insert(1, f"I{self.input}")
        if self.layers > 1:
            parts.append(f"L{self.layers}")
        if self.bidirectional:
            parts.append("bi")
        if self.proj:
            parts.append(f"P{self.proj}")
        parts.append({"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                      "float64": "fp64"}[self.dtype])
        if self.varlen != "none":
            parts.append(f"varlen={self.varlen}")
        return " ".join(parts)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["input_size"] = self.input
        return d

    def validated(self) -> BenchShape:
        """Checks every field (ValueError naming the option) and canonicalises dtype/varlen."""
        if self.mode not in MODES:
            raise ValueError(f"--mode: expected one of {list(MODES)}, got {self.mode!r}")
        for name, value in (("--hidden", self.hidden), ("--batch", self.batch),
                            ("--time", self.time), ("--layers", self.layers)):
            if value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value}")
        if self.input_size is not None and self.input_size < 1:
            raise ValueError(f"--input-size: expected an int >= 1, got {self.input_size}")
        if self.proj < 0:
            raise ValueError(f"--proj: expected an int >= 0, got {self.proj}")
        if self.proj and self.mode != "lstm":
            raise ValueError(
                f"--proj: expected 0 for --mode {self.mode} (projection is LSTM only), "
                f"got {self.proj}"
            )
        if self.proj > self.hidden:
            raise ValueError(
                f"--proj: expected a value in [0, --hidden={self.hidden}], got {self.proj}"
            )
        return replace(self, dtype=dtype_name(parse_dtype(self.dtype)),
                       varlen=parse_varlen(self.varlen))


def _sweep(**common) -> list[BenchShape]:
    """Cartesian product over the keyword arguments that are lists."""
    shapes = [BenchShape()]
    for key, value in common.items():
        values = value if isinstance(value, list) else [value]
        shapes = [replace(s, **{key: v}) for s in shapes for v in values]
    return shapes


PRESETS: dict[str, list[BenchShape]] = {
    # The design's reference point.
    "anchor": _sweep(mode="lstm", hidden=768, batch=16, time=1024),
    # B <= 64, H in 256..1024, T = 1024: the >= 2x cuDNN target.
    "small-batch": _sweep(mode="lstm", hidden=[256, 512, 768, 1024], batch=16, time=1024),
    # B >= 256: the >= 1.1x cuDNN target.
    "large-batch": _sweep(mode="lstm", hidden=[256, 512, 768, 1024], batch=256, time=1024),
    # Lengths uniform in [T/8, T]: the >= 2.5x cuDNN-on-padded-input target.
    "varlen": _sweep(mode="lstm", hidden=[256, 768], batch=[16, 64], time=1024,
                     varlen="uniform"),
    "gru": _sweep(mode="gru", hidden=[256, 512, 768, 1024], batch=16, time=1024),
    # The first LSTM/GRU timing against cuDNN (issue 4): B in {16, 256}, H in {256, 768}.
    "first-timing": _sweep(mode=["lstm", "gru"], hidden=[256, 768], batch=[16, 256],
                           time=1024),
    # The persistent-grid sweep of issue 5: B in {1, 16, 64}, H in {512, 768, 1024}, GRU also
    # at 1536 (the on-chip reach), fwd+bwd against cuDNN.
    "grid": _sweep(mode=["lstm", "gru"], hidden=[512, 768, 1024], batch=[1, 16, 64],
                   time=1024) + _sweep(mode="gru", hidden=1536, batch=[1, 16], time=1024),
    # fp16, where cuDNN has its widest choice of algorithms (torch asks for cuDNN's persistent
    # RNN algorithm only for fp16, and only on some GPUs): the anchor and B = 64 at H = 1024.
    "fp16": _sweep(mode=["lstm", "gru"], hidden=[768, 1024], batch=[16, 64], time=1024,
                   dtype="float16"),
    # Layer overlap: a 2-layer unidirectional stack (rnn/pipeline.py).
    "pipeline": _sweep(mode="lstm", hidden=768, batch=16, time=1024, layers=2),
    # Stacks: two bidirectional layers, and the LSTM projection.
    "stack": _sweep(mode="lstm", hidden=512, batch=32, time=512, layers=2,
                    bidirectional=True) + _sweep(mode="lstm", hidden=1024, proj=512,
                                                 batch=32, time=512),
    # The shapes of scripts/split_k_probe.py's default configs (gpu_session.sh splitk): the
    # library's and cuDNN's backward beside the split-K probe's.
    "split-k": _sweep(mode="lstm", hidden=[1024, 768], batch=[256, 64], time=1024)
    + _sweep(mode="lstm", hidden=1024, batch=16, time=1024),
    # Tiny, runs on the CPU through the Triton interpreter in seconds.
    "smoke": _sweep(mode="lstm", hidden=32, input_size=24, batch=4, time=8, dtype="float32")
    + _sweep(mode="gru", hidden=32, input_size=24, batch=4, time=8, dtype="float32",
             varlen="uniform"),
}


def _union(*names: str) -> list[BenchShape]:
    out: list[BenchShape] = []
    for name in names:
        out += [s for s in PRESETS[name] if s not in out]
    return out


# Every design target in one run (the evidence sweep of a GPU session).
PRESETS["targets"] = _union("anchor", "small-batch", "large-batch", "varlen", "gru")

CPU_PRESETS = ("smoke",)
