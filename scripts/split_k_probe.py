"""A probe of a split-K backward recurrence (a development tool; the planner does not use it).

Why: every program of the persistent grid's backward step reads the whole of its batch
tile's dph from L2 (its R^T slice spans all gates), and at B >= 256, where the weights are
streamed, its R^T slice too. LSTM H=1024 B=256 (32 x 64 tiles, 128 programs) reads 768 KiB
per program, about 100 MB per step, and its backward lost to cuDNN (36.2 ms against 27.8,
H200, 2026-11-27); at B=64 (resident 16 x 32 tiles) 256 KiB per program, 33.6 MB per step,
and the layer stays under 2x cuDNN's CUDA graph. Splitting the reduction (K = G*H) across
programs as well lets each keep a block of R resident and read only its K range of dph:

    program (unit block ub of U units, K block kb of KB gate rows, batch tile bt of BB rows)
    phase A: partial[kb][bt, ub] = dph_{t+1}[bt, kb] @ R[kb, ub]   (R block resident, fp32 out)
             grid barrier (phase B's own inputs load while the other programs arrive)
    phase B: for its cell slice (US units of ub, batch tile bt): dh = dy_t + the NK
             partials, the LSTM cell's backward (dc carried in registers), dph_t stored
             grid barrier

At H=1024 B=256 with U = 128, KB = 512, BB = 128 (8 x 8 x 2 = 128 programs): a 128 KiB R
block, and per program and step 128 KiB of dph read, a 64 KiB fp32 partial written and
64 KiB of partials read back, 16 KiB of dph written: about 35 MB per step, a third of the
streamed grid's bytes; at B=64 with U = 64, KB = 512, BB = 64 (128 programs, a 64 KiB R
block) about 100 KiB per program, a quarter; at H=1024 B=16 with U = 64, KB = 1024, BB = 16
(64 programs and a 128 KiB R block, as the grid's 16 x 16 tiles) 32 KiB of dph read and
4 + 4 KiB of partials, against 128 KiB of dph. Each step meets two grid barriers instead of
one. This probe times that step (LSTM only, full-length sequences, no projection) so a GPU
session can decide whether the idea is worth a kernel family: compare its `layer_estimate_ms`
(the recurrence and the GEMMs a layer backward runs outside it) with the library's backward
and cuDNN's at the same shapes in the same session (`tritonrnn bench --preset split-k --pass
bwd`), and its `step_us` with the bare barriers' (`bare_step_us`, two per step).

    python scripts/split_k_probe.py [--config H,B,U,KB,BB ...] [--time 1024] [--json F]
    python scripts/split_k_probe.py --aot          # no GPU: the sm_90 compiles' reports

Correctness: `check` runs the probe against a float64 recurrence (a GPU run checks T = 64
first and reports the error; tests/test_split_k_probe.py runs it in the interpreter, one
launch per step and phase, as the grid kernels do there, and checks that recurrence against
autograd through an LSTM). The sm_90 compiles (`--aot`, bf16, 8 warps; Triton 3.6 unless
said): at H=1024 B=256 196608 B of shared memory (the 128 KiB R block and the staged dph
chunks), wgmma, 4 atomics per step, 255 registers and 10 local loads and 1 store per step
(5 and none without phase B's inputs prefetched during phase A's barrier; Triton 3.9: 242
registers and none), 1072 step-loop instructions (H=768 1566); at B=64 86016 B, wgmma, 188
/ 205 registers (H=1024 / 768), 710 / 837 instructions, no spills; at H=1024 B=16 147456 B,
mma.sync, 80 registers, 452 instructions, no spills, its longest chain of dependent MMAs 32
(four accumulators, `split`). On 4 warps B=16 / 64 ran 634 / 778 instructions, and B=256
spilled 130 local memory operations per step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

from tritonrnn.kernels.cells import tanh
from tritonrnn.kernels.compile_options import FP_FUSION
from tritonrnn.kernels.grid_barrier import (
    DEFAULT_MAX_SPIN,
    check_flags,
    cooperative_launch_options,
    grid_arrive,
    grid_wait,
)

G = 4  # LSTM gates (i, f, g, o), gate-major rows of R and columns of dph: g * H + unit


@triton.jit
def _mm(a, b, acc, FP32_DOT: tl.constexpr):
    """acc + a @ b in fp32; fp32 operands in IEEE precision (no tf32)."""
    if FP32_DOT:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit(do_not_specialize=["T", "B", "q_begin", "q_end", "do_a", "do_b", "max_spin"])
def _split_k_bwd_kernel(R, ACT, C, DY, DPH, PART, DC, SYNC, T, B, q_begin, q_end, do_a, do_b,
                        max_spin, H: tl.constexpr, U: tl.constexpr, KC: tl.constexpr,
                        BB: tl.constexpr, NK: tl.constexpr, US: tl.constexpr,
                        SPLIT: tl.constexpr, FP32_DOT: tl.constexpr, BARRIER: tl.constexpr):
    """Backward steps q in [q_begin, q_end) (step q is time T - 1 - q) of the LSTM recurrence:
    R [4H, H], ACT [T, B, 4H] activated gates, C [T + 1, B, H] cell states (C[0] = c0),
    DY [T, B, H]; DPH [T + 1, B, 4H] out (DPH[T] zero); PART [NK, B, H] fp32 scratch; DC
    [B, H] fp32 carry in and out. do_a / do_b: run phase A / B (both on a GPU; one per
    launch in the interpreter, BARRIER = 0). Phase B: the programs kb < U / US of a unit
    block each take US of its units (a power of two: the others only meet the barriers)."""
    NU: tl.constexpr = H // U
    GH: tl.constexpr = 4 * H
    KB: tl.constexpr = 4 * KC
    pid = tl.program_id(0)
    ub = pid % NU
    kb = (pid // NU) % NK
    bt = pid // (NU * NK)
    rows = (bt * BB + tl.arange(0, BB)).to(tl.int64)
    cols = ub * U + tl.arange(0, U)
    kk = tl.arange(0, KC)
    # The resident R block [KB, U], as four [KC, U] chunks (one operand staged at a time).
    r_base = R + (kb * KB + kk)[:, None] * H + cols[None, :]
    r0 = tl.load(r_base)
    r1 = tl.load(r_base + KC * H)
    r2 = tl.load(r_base + 2 * KC * H)
    r3 = tl.load(r_base + 3 * KC * H)
    su = ub * U + kb * US + tl.arange(0, US)  # this program's cell units
    own = (rows[:, None] >= 0) & (kb * US + tl.arange(0, US) < U)[None, :]  # all or none
    dc = tl.load(DC + rows[:, None] * H + su[None, :], mask=own, other=0.0)
    nprog = tl.num_programs(0)
    failed = q_begin * 0
    q = q_begin
    while (q < q_end) & (failed == 0):
        t = T - 1 - q
        if do_a != 0:
            a = DPH + ((t + 1) * B + rows)[:, None] * GH + kb * KB + kk[None, :]
            # SPLIT independent accumulators (1, 2 or 4) shorten the chain of MMAs each
            # waiting for the one before, where the registers allow (`split`).
            acc = _mm(tl.load(a), r0, tl.zeros((BB, U), dtype=tl.float32), FP32_DOT)
            if SPLIT == 4:
                acc1 = _mm(tl.load(a + KC), r1, tl.zeros((BB, U), dtype=tl.float32), FP32_DOT)
                acc2 = _mm(tl.load(a + 2 * KC), r2, tl.zeros((BB, U), dtype=tl.float32),
                           FP32_DOT)
                acc3 = _mm(tl.load(a + 3 * KC), r3, tl.zeros((BB, U), dtype=tl.float32),
                           FP32_DOT)
                acc = (acc + acc1) + (acc2 + acc3)
            elif SPLIT == 2:
                acc = _mm(tl.load(a + KC), r1, acc, FP32_DOT)
                acc2 = _mm(tl.load(a + 2 * KC), r2, tl.zeros((BB, U), dtype=tl.float32),
                           FP32_DOT)
                acc = acc + _mm(tl.load(a + 3 * KC), r3, acc2, FP32_DOT)
            else:
                acc = _mm(tl.load(a + KC), r1, acc, FP32_DOT)
                acc = _mm(tl.load(a + 2 * KC), r2, acc, FP32_DOT)
                acc = _mm(tl.load(a + 3 * KC), r3, acc, FP32_DOT)
            tl.store(PART + (kb * B + rows)[:, None] * H + cols[None, :], acc)
            if BARRIER:
                grid_arrive(SYNC)
        # Phase B's own inputs, loaded while the other programs arrive.
        at = (t * B + rows)[:, None] * H + su[None, :]
        g_off = (t * B + rows)[:, None] * GH + su[None, :]
        g_at = ACT + g_off
        dh = tl.load(DY + at, mask=own, other=0.0).to(tl.float32)
        i = tl.load(g_at, mask=own, other=0.0).to(tl.float32)
        f = tl.load(g_at + H, mask=own, other=0.0).to(tl.float32)
        g = tl.load(g_at + 2 * H, mask=own, other=0.0).to(tl.float32)
        o = tl.load(g_at + 3 * H, mask=own, other=0.0).to(tl.float32)
        c = tl.load(C + B * H + at, mask=own, other=0.0).to(tl.float32)
        cp = tl.load(C + at, mask=own, other=0.0).to(tl.float32)
        if BARRIER:  # (on a GPU every program runs both phases)
            failed = grid_wait(SYNC, (2 * (q - q_begin) + 1) * nprog, max_spin)
        run_b = (do_b != 0) & (failed == 0)
        if NK * US > U:  # some programs of the unit block have no cell slice
            run_b = run_b & (kb * US < U)
        if run_b:
            for k in tl.static_range(NK):
                dh += tl.load(PART + (k * B + rows)[:, None] * H + su[None, :])
            tc = tanh(c)
            dc = dc + dh * o * (1.0 - tc * tc)
            d_at = DPH + g_off
            ty = DPH.dtype.element_ty
            tl.store(d_at, (dc * g * i * (1.0 - i)).to(ty))
            tl.store(d_at + H, (dc * cp * f * (1.0 - f)).to(ty))
            tl.store(d_at + 2 * H, (dc * i * (1.0 - g * g)).to(ty))
            tl.store(d_at + 3 * H, (dh * tc * o * (1.0 - o)).to(ty))
            dc = dc * f
        if BARRIER:  # (a program that failed phase A's wait sees the error flag here)
            grid_arrive(SYNC)
            failed = failed | grid_wait(SYNC, (2 * (q - q_begin) + 2) * nprog, max_spin)
        q += 1
    tl.store(DC + rows[:, None] * H + su[None, :], dc, mask=own)


def tiles(H: int, B: int, U: int, KB: int, BB: int) -> tuple[int, int, int]:
    """(programs, NK K blocks, US cell units per program) of a probe launch; ValueError
    naming what does not divide or is not a power of two."""
    pow2 = all(v > 0 and v & (v - 1) == 0 for v in (U, KB, BB))
    if not pow2 or H % U or (G * H) % KB or B % BB or KB < 64:
        raise ValueError(f"split_k_probe: expected powers of two U | H, 64 <= KB | 4H and "
                         f"BB | B, got H={H}, B={B}, U={U}, KB={KB}, BB={BB}")
    nk = G * H // KB
    return (H // U) * nk * (B // BB), nk, triton.next_power_of_2(-(-U // nk))


def split(U: int, BB: int) -> int:
    """Independent accumulators of phase A's product: 4 for [BB, U] tiles of up to 1024
    elements, 2 up to 4096, else 1 (a [128, 128] fp32 accumulator is 64 registers a thread
    on 8 warps already)."""
    return 4 if BB * U <= 1024 else 2 if BB * U <= 4096 else 1


def inputs(H: int, B: int, T: int, dtype: torch.dtype, device, seed: int = 0) -> dict:
    """Random probe inputs made on `device`: R, activated gates (in (0, 1), g in (-1, 1)),
    cell states and dy, in `dtype`."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0):
        x = torch.rand(*shape, generator=gen, device=device)
        return ((x * 2 - 1) * scale).to(dtype)

    act = torch.rand(T, B, G * H, generator=gen, device=device)
    act[..., 2 * H:3 * H] = act[..., 2 * H:3 * H] * 2 - 1  # g = tanh(.)
    return dict(R=rnd(G * H, H, scale=H ** -0.5), ACT=act.to(dtype),
                C=rnd(T + 1, B, H, scale=2.0), DY=rnd(T, B, H))


def reference(R, ACT, C, DY) -> tuple[torch.Tensor, torch.Tensor]:
    """(dph [T, B, 4H], dc0 [B, H]) of the probe's recurrence in float64 (on the inputs'
    device)."""
    R, ACT, C, DY = (x.double() for x in (R, ACT, C, DY))
    T, B, H = DY.shape
    dph = torch.zeros(T + 1, B, G * H, dtype=torch.float64, device=DY.device)
    dc = torch.zeros(B, H, dtype=torch.float64, device=DY.device)
    for t in range(T - 1, -1, -1):
        dh = DY[t] + dph[t + 1] @ R
        i, f, g, o = ACT[t].split(H, dim=1)
        tc = torch.tanh(C[t + 1])
        dc = dc + dh * o * (1 - tc * tc)
        dph[t] = torch.cat([dc * g * i * (1 - i), dc * C[t] * f * (1 - f), dc * i * (1 - g * g),
                            dh * tc * o * (1 - o)], dim=1)
        dc = dc * f
    return dph[:T], dc


def launch(R, ACT, C, DY, *, U: int, KB: int, BB: int, num_warps: int = 8,
           max_spin: int = DEFAULT_MAX_SPIN) -> tuple[torch.Tensor, torch.Tensor]:
    """(dph [T, B, 4H], dc0 [B, H] fp32): the whole recurrence in one launch on a GPU (all
    programs co-resident), one launch per step and phase in the interpreter."""
    T, B, H = DY.shape
    programs, nk, us = tiles(H, B, U, KB, BB)
    dph = torch.empty(T + 1, B, G * H, dtype=DY.dtype, device=DY.device)
    dph[T].zero_()
    part = torch.empty(nk, B, H, dtype=torch.float32, device=DY.device)
    dc = torch.zeros(B, H, dtype=torch.float32, device=DY.device)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    sync = torch.zeros(1, 2, dtype=torch.int32, device=DY.device)
    meta = dict(H=H, U=U, KC=KB // 4, BB=BB, NK=nk, US=us, SPLIT=split(U, BB),
                FP32_DOT=DY.dtype == torch.float32, num_warps=num_warps,
                **FP_FUSION)
    if interp:
        for q in range(T):
            for a, b in ((1, 0), (0, 1)):
                _split_k_bwd_kernel[(programs,)](R, ACT, C, DY, dph, part, dc, sync, T, B, q,
                                                 q + 1, a, b, max_spin, BARRIER=0, **meta)
    else:
        sms = torch.cuda.get_device_properties(DY.device).multi_processor_count
        if programs > sms:
            raise ValueError(f"split_k_probe: {programs} programs, {sms} SMs")
        _split_k_bwd_kernel[(programs,)](R, ACT, C, DY, dph, part, dc, sync, T, B, 0, T, 1, 1,
                                         max_spin, BARRIER=1, **meta,
                                         **cooperative_launch_options())
        check_flags(sync, "split_k_probe")
    return dph[:T], dc


def check(H: int, B: int, T: int, U: int, KB: int, BB: int, dtype: torch.dtype, device,
          seed: int = 0) -> dict:
    """The probe against `reference`: max |error| / max |reference| of dph and dc0."""
    x = inputs(H, B, T, dtype, device, seed)
    dph, dc = launch(x["R"], x["ACT"], x["C"], x["DY"], U=U, KB=KB, BB=BB)
    ref_dph, ref_dc = reference(x["R"], x["ACT"], x["C"], x["DY"])

    def rel(a, b):
        return float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))

    return {"dph": rel(dph, ref_dph), "dc0": rel(dc, ref_dc)}


def _aot(H: int, B: int, U: int, KB: int, BB: int, dtype: torch.dtype,
         num_warps: int = 8) -> dict:
    """The sm_90 compile of the probe's GPU launch on the h100 preset (no GPU needed:
    `tritonrnn.bench.aot`): shared memory, registers, spills, the step loop's counts."""
    import dataclasses

    from tritonrnn.bench.aot import GpuContext, Launch, _names, report_kernel
    from tritonrnn.rnn.planner import PRESETS

    programs, nk, us = tiles(H, B, U, KB, BB)
    T = 8
    x = inputs(H, B, T, dtype, "cpu")
    dph = torch.zeros(T + 1, B, G * H, dtype=dtype)
    part = torch.empty(nk, B, H, dtype=torch.float32)
    dc = torch.zeros(B, H, dtype=torch.float32)
    sync = torch.zeros(1, 2, dtype=torch.int32)
    kernel = _split_k_bwd_kernel
    call = Launch(__name__, "_split_k_bwd_kernel", kernel.fn, (programs,),
                  (x["R"], x["ACT"], x["C"], x["DY"], dph, part, dc, sync, T, B, 0, T, 1, 1,
                   DEFAULT_MAX_SPIN),
                  dict(H=H, U=U, KC=KB // 4, BB=BB, NK=nk, US=us, SPLIT=split(U, BB),
                       FP32_DOT=dtype == torch.float32,
                       BARRIER=1, num_warps=num_warps, **FP_FUSION,
                       **cooperative_launch_options()),
                  _names(kernel, kernel.fn, "do_not_specialize"))
    rep = report_kernel("backward", call, GpuContext(dtype, True), PRESETS["h100"])
    return dataclasses.asdict(rep)


def _time(fn, reps: int) -> float:
    """Median ms of `reps` calls of fn (CUDA events; one warm-up call first)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


# (H, B, U, KB, BB) timed by default: the B = 256 shapes whose streamed backward lost to
# cuDNN, B = 64 (resident 16 x 32 tiles) with 64-unit blocks, 128 / 72 programs, and LSTM
# H=1024 B=16 (16 x 16 tiles, 1.85x cuDNN's CUDA graph on an H200) on 64 programs with a
# 128 KiB R block, as the grid's: 2x the graph is not reached at any of them.
CONFIGS = ((1024, 256, 128, 512, 128), (768, 256, 128, 512, 128),
           (1024, 64, 64, 512, 64), (768, 64, 64, 512, 64), (1024, 16, 64, 1024, 16))


def _config(text: str) -> tuple[int, int, int, int, int]:
    try:
        H, B, U, KB, BB = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected H,B,U,KB,BB (five ints), got {text!r}") from None
    try:
        tiles(H, B, U, KB, BB)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return H, B, U, KB, BB


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=_config, action="append",
                    help="H,B,U,KB,BB: hidden size, batch, units / gate rows / batch rows per "
                         "program (repeatable; default: CONFIGS)")
    ap.add_argument("--time", type=int, default=1024)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--warps", type=int, default=8, choices=(4, 8),
                    help="warps per program (the sm_90 compiles of the default configs: "
                         "fewer step-loop instructions on 8, and no spills)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--aot", action="store_true", help="report the sm_90 compiles instead")
    ap.add_argument("--json", help="write the results there (rewritten after each config)")
    return ap


def _timed(H: int, B: int, U: int, KB: int, BB: int, T: int, dtype: torch.dtype,
           num_warps: int, reps: int) -> dict:
    """One config on the GPU: its error against float64 (T = 64), the whole recurrence's
    time, the bare barriers' (2T, the same programs) and the GEMMs a layer backward runs
    outside the recurrence (input size H: dx = dpre @ W, dW = dpre^T @ x, dR = dpre^T @ h)."""
    from tritonrnn.kernels.grid_barrier import check_barriers, run_bare_barriers

    dev = torch.device("cuda")
    programs = tiles(H, B, U, KB, BB)[0]
    err = check(H, B, min(T, 64), U, KB, BB, dtype, dev)
    x = inputs(H, B, T, dtype, dev)

    def run():
        return launch(x["R"], x["ACT"], x["C"], x["DY"], U=U, KB=KB, BB=BB,
                      num_warps=num_warps)

    ms = _time(run, reps)
    bare = _time(lambda: run_bare_barriers(2 * T, programs, dev,
                                           num_warps=num_warps), reps)
    check_barriers()
    dpre = run()[0].reshape(T * B, G * H)
    w, acts = x["R"], x["C"][1:].reshape(T * B, H)
    gemm = _time(lambda: (dpre @ w, dpre.t() @ acts, dpre.t() @ acts, dpre.sum(0)), reps)
    return {"programs": programs, "rel_error_vs_float64": err, "ms": ms,
            "step_us": 1e3 * ms / T, "bare_barriers_ms": bare, "bare_step_us": 1e3 * bare / T,
            "gemms_ms": gemm, "layer_estimate_ms": ms + gemm}


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    if not a.aot and not torch.cuda.is_available():
        print("split_k_probe: timing needs a GPU (--aot compiles without one)", file=sys.stderr)
        return 2
    env = {"torch": torch.__version__, "triton": triton.__version__,
           "device": torch.cuda.get_device_name() if not a.aot else "sm_90 (aot, h100 preset)",
           "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "time": a.time, "dtype": a.dtype,
           "warps": a.warps}
    results = []
    for H, B, U, KB, BB in a.config or CONFIGS:
        row = dict(hidden=H, batch=B, units=U, kblock=KB, btile=BB)
        try:
            if a.aot:
                rep = _aot(H, B, U, KB, BB, dtype, a.warps)
                row.update({k: rep.get(k) for k in ("shared", "regs", "stack", "local", "mma",
                                                    "fits", "error", "profile")})
            else:
                row.update(_timed(H, B, U, KB, BB, a.time, dtype, a.warps, a.reps))
        except Exception as e:  # a config that fails is a finding; the others still run
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        print(json.dumps(row), flush=True)
        results.append(row)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({**env, "results": results}, f, indent=1)
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
