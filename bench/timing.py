"""Timing: triton.testing.do_bench on a GPU, a plain timer loop on the CPU.

do_bench needs CUDA (events, an L2 flush buffer); on the CPU the harness times the callable
with time.perf_counter after a warm-up, which is enough to exercise the harness and to see
that the interpreter path runs, and says nothing about GPU speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

QUANTILES = (0.5, 0.2, 0.8)
MIN_SAMPLES = 10


@dataclass(frozen=True)
class Timing:
    """Median and the 20th/80th percentiles of one callable, in milliseconds."""

    ms: float
    ms_p20: float
    ms_p80: float

    def as_dict(self) -> dict:
        return {"ms": self.ms, "ms_p20": self.ms_p20, "ms_p80": self.ms_p80}


@dataclass(frozen=True)
class TimingConfig:
    """GPU: warmup/rep are do_bench's milliseconds. CPU: iteration counts."""

    warmup_ms: int = 25
    rep_ms: int = 100
    cpu_warmup: int = 1
    cpu_rep: int = 3

    def describe(self, device_type: str) -> dict:
        if device_type == "cuda":
            return {
                "method": "triton.testing.do_bench",
                "warmup_ms": self.warmup_ms,
                "rep_ms": self.rep_ms,
                # `measure` stretches both for a slow pass: warm-up >= 2 calls, repetition
                # >= MIN_SAMPLES calls; warmup_ms / rep_ms alone understate what ran.
                "min_warmup_calls": 2,
                "min_samples": MIN_SAMPLES,
                "quantiles": list(QUANTILES),
                "note": "medians after warm-up (and tuning); do_bench flushes L2 between runs; "
                "warm-up and repetition are at least 2 and min_samples calls of the pass",
            }
        return {
            "method": "time.perf_counter loop (do_bench needs CUDA)",
            "warmup_iters": self.cpu_warmup,
            "rep_iters": self.cpu_rep,
            "quantiles": list(QUANTILES),
            "note": "CPU timings (Triton interpreter / torch on the CPU) say nothing about GPU "
            "speed",
        }


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an ascending list."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def measure(fn: Callable[[], object], device_type: str, cfg: TimingConfig) -> Timing:
    """Times `fn` (which must do the whole operation, synchronously or on the current stream)."""
    if device_type == "cuda":
        import triton.testing

        # do_bench repeats int(rep / estimate) times: for a pass slower than rep/10 that is a
        # handful of samples or one. Stretch the budget to at least MIN_SAMPLES calls.
        once_ms = one_run_ms(fn, device_type)
        med, p20, p80 = triton.testing.do_bench(
            fn, warmup=max(cfg.warmup_ms, 2 * once_ms),
            rep=max(cfg.rep_ms, MIN_SAMPLES * once_ms), quantiles=list(QUANTILES),
        )
        return Timing(float(med), float(p20), float(p80))
    for _ in range(cfg.cpu_warmup):
        fn()
    samples = []
    for _ in range(max(cfg.cpu_rep, 1)):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return Timing(statistics.median(samples), _quantile(samples, 0.2), _quantile(samples, 0.8))


def one_run_ms(fn: Callable[[], object], device_type: str) -> float:
    """Milliseconds of one call of fn, with the device synchronised before and after."""
    synchronize(device_type)
    t0 = time.perf_counter()
    fn()
    synchronize(device_type)
    return (time.perf_counter() - t0) * 1e3


def synchronize(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()
