"""Timing: triton.testing.do_bench on a GPU, a plain timer loop on the CPU.

do_bench needs CUDA (events, an L2 flush buffer); on the CPU the harness times the callable
with time.perf_counter after a warm-up, which is enough to exercise the harness and to see
that the interpreter path runs, and says nothing about GPU speed.

CPU warm-up: torch's first calls on the CPU are slow, and not only the first (a bare
nn.LSTM forward + backward took 818, 356, 228, 220, 307, 77 ms, then about 1 ms), so a fixed
one or two warm-up calls timed the warm-up (a report had torch-cpu fwd 82 ms, bwd 176 ms and
fwdbwd 1.4 ms). `measure` calls the pass until its last CPU_STABLE_CALLS calls agree within
CPU_STABLE_RATIO (max / min; two calls are not enough: 228 and 220 agree), at least
`cpu_warmup` calls and at most `cpu_warmup_max_calls` calls or `cpu_warmup_max_s` seconds;
each timing records how many calls its warm-up took and whether they settled.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

QUANTILES = (0.5, 0.2, 0.8)
MIN_SAMPLES = 10
CPU_STABLE_CALLS = 3
CPU_STABLE_RATIO = 1.25


@dataclass(frozen=True)
class Timing:
    """Median and the 20th/80th percentiles of one callable, in milliseconds."""

    ms: float
    ms_p20: float
    ms_p80: float
    # CPU only: the warm-up's calls, and whether its last CPU_STABLE_CALLS agreed (False: it
    # stopped at its cap, the timing may still include warm-up).
    warmup_calls: int | None = None
    warmup_settled: bool | None = None

    def as_dict(self) -> dict:
        out = {"ms": self.ms, "ms_p20": self.ms_p20, "ms_p80": self.ms_p80}
        if self.warmup_calls is not None:
            out.update(warmup_calls=self.warmup_calls, warmup_settled=self.warmup_settled)
        return out


@dataclass(frozen=True)
class TimingConfig:
    """GPU: warmup/rep are do_bench's milliseconds. CPU: the warm-up's bounds (calls until
    the last CPU_STABLE_CALLS agree within CPU_STABLE_RATIO, at least cpu_warmup, at most
    cpu_warmup_max_calls or cpu_warmup_max_s seconds) and the timed calls."""

    warmup_ms: int = 25
    rep_ms: int = 100
    cpu_warmup: int = 1
    cpu_rep: int = 3
    cpu_warmup_max_calls: int = 100
    cpu_warmup_max_s: float = 5.0

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
            "warmup": f"until the last {CPU_STABLE_CALLS} calls agree within "
            f"{CPU_STABLE_RATIO}x (max / min), at least {self.cpu_warmup} and at most "
            f"{self.cpu_warmup_max_calls} calls or {self.cpu_warmup_max_s:g} s (each run's "
            "warmup_calls, warmup_settled)",
            "warmup_iters": self.cpu_warmup,
            "warmup_max_calls": self.cpu_warmup_max_calls,
            "warmup_max_s": self.cpu_warmup_max_s,
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
    calls, settled = _cpu_warmup(fn, cfg)
    samples = []
    for _ in range(max(cfg.cpu_rep, 1)):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return Timing(statistics.median(samples), _quantile(samples, 0.2), _quantile(samples, 0.8),
                  warmup_calls=calls, warmup_settled=settled)


def _cpu_warmup(fn: Callable[[], object], cfg: TimingConfig) -> tuple[int, bool]:
    """Calls fn until its last CPU_STABLE_CALLS calls agree within CPU_STABLE_RATIO (and at
    least cfg.cpu_warmup calls), or the cap (cfg.cpu_warmup_max_calls calls or
    cfg.cpu_warmup_max_s seconds) is reached; returns (calls, settled)."""
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        last = times[-CPU_STABLE_CALLS:]
        settled = (len(last) == CPU_STABLE_CALLS
                   and max(last) <= CPU_STABLE_RATIO * min(last))
        if len(times) >= cfg.cpu_warmup and settled:
            return len(times), True
        if len(times) >= max(cfg.cpu_warmup, cfg.cpu_warmup_max_calls) or (
                t1 - start >= cfg.cpu_warmup_max_s and len(times) >= cfg.cpu_warmup):
            return len(times), False


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
