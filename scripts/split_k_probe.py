"""Times the split-K backward recurrence (kernels/split_k.py, an experiment the planner does
not choose) on a GPU, beside what it would replace (a development tool).

Why (kernels/NOTES.md, "Large batches: a split-K backward"): every program of the
persistent grid's backward step reads the whole of its batch tile's dph from L2 (its R^T
slice spans all gates), and at B >= 256, where the weights are streamed, its R^T slice too.
LSTM H=1024 B=256 (32 x 64 tiles, 128 programs) reads 768 KiB per program, about 100 MB per
step, and its backward lost to cuDNN (36.2 ms against 27.8, H200, 2026-11-27); at B=64
(resident 16 x 32 tiles) 256 KiB per program, 33.6 MB per step, and the layer stays under
2x cuDNN's CUDA graph. The split-K kernel keeps a [KB, U] block of R resident and reads only
its K range of dph, for a second grid barrier a step: at H=1024 B=256 with U = 128, KB =
512, BB = 128 (128 programs) about 35 MB per step, a third; at B=64 with U = 64, KB = 512,
BB = 64 (128 programs, a 64 KiB R block) about 100 KiB per program, a quarter; at H=1024 B=16
with U = 64, KB = 1024, BB = 16 (64 programs and a 128 KiB R block, as the grid's 16 x 16
tiles) 40 KiB against 128.

For each config this times the whole recurrence (full lengths, T steps) and reports
`layer_estimate_ms`, the recurrence and the GEMMs a layer backward runs outside it, to
compare with the library's backward and cuDNN's at the same shapes in the same session
(`tritonrnn bench --preset split-k --pass bwd`, gpu_session.sh `splitk`), and `step_us`
against the bare barriers' (`bare_step_us`, two per step; one with --one-barrier). A GPU
run first checks the kernel against `rnn.reference.recurrence_backward` (T = 64, the
reference's fp32 math) and reports the error.

    python scripts/split_k_probe.py [--cell lstm] [--config H,B,U,KB,BB ...] [--json F]
    python scripts/split_k_probe.py --aot          # no GPU: the sm_90 compiles' reports
    python scripts/split_k_probe.py --one-barrier  # the one-barrier form (B = 16 / 32)

The sm_90 compiles (`--aot`, LSTM, bf16, 8 warps, Triton 3.6): see kernels/NOTES.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import triton

from tritonrnn.bench.barrier import bare_timed_out
from tritonrnn.bench.timing import TimingConfig, measure
from tritonrnn.kernels import cells
from tritonrnn.kernels.split_k import split_k1_tiles, split_k_backward, split_k_tiles, tiles
from tritonrnn.rnn.packing import make_pack_info
from tritonrnn.rnn.planner import write_json_atomic
from tritonrnn.rnn.reference import recurrence_backward


def inputs(cell: str, H: int, B: int, T: int, dtype: torch.dtype, device,
           seed: int = 0) -> dict:
    """Random backward inputs of one layer with full-length sequences, made on `device` in
    `dtype`: split_k_backward's keyword arguments before `reverse` (and its outputs, empty)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    info = make_pack_info([T] * B, T, torch.device(device))
    N = info.N

    def rnd(*shape, scale=1.0):
        x = torch.rand(*shape, generator=gen, device=device)
        return ((x * 2 - 1) * scale).to(dtype)

    gated, lstm = cell in ("lstm", "gru"), cell == "lstm"
    return dict(
        pre_x=rnd(N, G * H, scale=2.0) if gated else None,
        pre_h=rnd(N, G * H, scale=2.0) if gated else None,
        R=rnd(G * H, H, scale=H ** -0.5), y=rnd(N, H), h_prev=rnd(N, H),
        c_seq=rnd(N, H, scale=2.0) if lstm else None,
        c_prev=rnd(N, H, scale=2.0) if lstm else None,
        dy=rnd(N, H), dhT=rnd(B, H), dcT=rnd(B, H) if lstm else None, info=info,
        dpre_x=torch.empty(N, G * H, dtype=dtype, device=device),
        dpre_h=torch.empty(N, G * H, dtype=dtype, device=device) if cell == "gru" else None,
        dh0=torch.empty(B, H, dtype=dtype, device=device),
        dc0=torch.empty(B, H, dtype=dtype, device=device) if lstm else None,
    )


_ORDER = ("pre_x", "pre_h", "R", "y", "h_prev", "c_seq", "c_prev", "dy", "dhT", "dcT", "info")
_OUTS = ("dpre_x", "dpre_h", "dh0", "dc0")


def run(cell: str, x: dict, U: int, KB: int, BB: int, num_warps: int = 8,
        one_barrier: bool = False) -> dict:
    """split_k_backward on `x` (forward time order); returns the outputs."""
    split_k_backward(cell, *(x[k] for k in _ORDER), False, *(x[k] for k in _OUTS), units=U,
                     kblock=KB, btile=BB, num_warps=num_warps, one_barrier=one_barrier)
    return {k: x[k] for k in _OUTS if x[k] is not None}


def check(cell: str, H: int, B: int, T: int, U: int, KB: int, BB: int, dtype: torch.dtype,
          device, num_warps: int = 8, one_barrier: bool = False) -> dict:
    """max |error| / max |reference| of each output against the reference engine."""
    x = inputs(cell, H, B, T, dtype, device, seed=1)
    got = run(cell, x, U, KB, BB, num_warps, one_barrier)
    want = {k: torch.empty_like(v) for k, v in got.items()}
    recurrence_backward(cell, x["pre_x"], x["pre_h"], x["R"], None, x["y"], x["h_prev"],
                        x["c_seq"], x["c_prev"], x["dy"], x["dhT"], x["dcT"], x["info"], False,
                        want["dpre_x"], want.get("dpre_h"), want["dh0"], want.get("dc0"), None,
                        None)
    return {k: float((got[k].float() - want[k].float()).abs().max()
                     / want[k].float().abs().max().clamp_min(1e-30)) for k in got}


def _aot(cell: str, H: int, B: int, U: int, KB: int, BB: int, dtype: torch.dtype,
         num_warps: int = 8, one_barrier: bool = False) -> dict:
    """The sm_90 compile of the kernel's persistent launch on the h100 preset (no GPU needed:
    `tritonrnn.bench.aot`): its launch recorded on CPU tensors, then given the GPU's barrier,
    step range and both phases."""
    from tritonrnn.bench.aot import GpuContext, recording, report_kernel
    from tritonrnn.kernels.grid_barrier import cooperative_launch_options
    from tritonrnn.rnn.planner import PRESETS

    x = inputs(cell, H, B, 8, dtype, "cpu")
    with recording(("tritonrnn.kernels.split_k",)) as sink:
        run(cell, x, U, KB, BB, num_warps, one_barrier)
    (call,) = sink.values()
    args = list(call.args)
    S = x["info"].max_len
    if one_barrier:
        args[-3:-1] = [0, S + 1]  # q_begin, q_end
    else:
        args[-5:-1] = [0, S + 1, 1, 1]  # q_begin, q_end, do_a, do_b
    kwargs = {**call.kwargs, "BARRIER": 1, **cooperative_launch_options()}
    call = dataclasses.replace(call, args=tuple(args), kwargs=kwargs)
    rep = report_kernel("backward", call, GpuContext(dtype, True), PRESETS["h100"])
    return dataclasses.asdict(rep)


# (H, B) timed by default, on `split_k_tiles`' tiles (what TRITONRNN_BWD_SPLIT_K=on runs):
# the B = 256 shapes whose streamed backward lost to cuDNN, and B = 64 / 16, where the layer
# stays under 2x cuDNN's CUDA graph; then H=1024 B=16 on 64 programs with a 128 KiB R block,
# as the grid's 16 x 16 tiles (the rule's has 128 programs and half the block).
SHAPES = ((1024, 256), (768, 256), (1024, 64), (768, 64), (1024, 16))
EXTRA = ((1024, 16, 64, 1024, 16),)


# The one-barrier form's (a small-batch design: every program reads H * btile fp32 partials a
# step and holds its cells' inputs, `split_k1_tiles`): B = 16 and 32; then H=1024 B=16 on
# the tiles the rule chose before it preferred the smaller cell tile (K blocks of 64 units,
# 949 step-loop instructions against 723 on sm_90, for half the partial bytes stored).
ONE_BARRIER_SHAPES = ((1024, 16), (768, 16), (1024, 32))
ONE_BARRIER_EXTRA = ((1024, 16, 128, 256, 16),)


def default_configs(cell: str, dtype: torch.dtype, props,
                    one_barrier: bool = False) -> list[tuple[int, int, int, int, int]]:
    """(H, B, U, KB, BB) of SHAPES on `split_k_tiles`' tiles on the device `props` (those
    it has), then EXTRA; one_barrier: ONE_BARRIER_SHAPES on `split_k1_tiles`', then
    ONE_BARRIER_EXTRA. The extra tiles are LSTM's: those the cell has no tiling for (a GRU
    K block is 3 gates' rows) are left out."""
    out = []
    rule = split_k1_tiles if one_barrier else split_k_tiles
    for H, B in ONE_BARRIER_SHAPES if one_barrier else SHAPES:
        t = rule(cell, H, B, dtype, props)
        if t is not None:
            out.append((H, B, *t))
    return out + [c for c in (ONE_BARRIER_EXTRA if one_barrier else EXTRA)
                  if c not in out and config_problem(cell, c, one_barrier) is None]


def _config(text: str) -> tuple[int, int, int, int, int]:
    try:
        H, B, U, KB, BB = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected H,B,U,KB,BB (five ints), got {text!r}") from None
    return H, B, U, KB, BB


def config_problem(cell: str, config: tuple[int, int, int, int, int],
                   one_barrier: bool) -> str | None:
    """Why `config` has no tiling for the cell and form (`tiles`' message), or None."""
    try:
        tiles(cell, *config, one_barrier=one_barrier)
    except ValueError as e:
        return f"--config {','.join(map(str, config))}: {e}"
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=_config, action="append",
                    help="H,B,U,KB,BB: hidden size, batch, units / gate rows / batch rows per "
                         "program (repeatable; default: `default_configs`)")
    ap.add_argument("--cell", default="lstm", choices=tuple(cells.CELL_IDS))
    ap.add_argument("--time", type=int, default=1024)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--warps", type=int, default=8, choices=(4, 8),
                    help="warps per program (the sm_90 compiles of the default configs: "
                         "fewer step-loop instructions on 8, and no spills)")
    ap.add_argument("--one-barrier", action="store_true",
                    help="the one-barrier form (split_k_backward(one_barrier=True); KB = G x "
                         "the K block's units; default configs: ONE_BARRIER_SHAPES)")
    ap.add_argument("--aot", action="store_true", help="report the sm_90 compiles instead")
    ap.add_argument("--json", help="write the results there (rewritten after each config)")
    return ap


def _timed(cell: str, H: int, B: int, U: int, KB: int, BB: int, T: int, dtype: torch.dtype,
           num_warps: int, one_barrier: bool = False) -> dict:
    """One config on the GPU: its error against the reference (T = 64), the whole
    recurrence's time, the bare barriers' (2T, T for one_barrier; the same programs) and the
    GEMMs a layer backward runs outside the recurrence (input size H: dx = dpre @ W, dW =
    dpre^T @ x, dR = dpre^T @ h, the bias sums); medians in ms, as `tritonrnn bench` times
    (`bench.timing.measure`)."""
    from tritonrnn.kernels.grid_barrier import check_barriers, run_bare_barriers

    dev = torch.device("cuda")
    programs = tiles(cell, H, B, U, KB, BB, one_barrier)[0]
    err = check(cell, H, B, min(T, 64), U, KB, BB, dtype, dev, num_warps, one_barrier)
    x = inputs(cell, H, B, T, dtype, dev)
    cfg = TimingConfig()

    def median(fn):
        return measure(fn, "cuda", cfg).ms

    ms = median(lambda: run(cell, x, U, KB, BB, num_warps, one_barrier))
    barriers = T if one_barrier else 2 * T
    syncs: list[torch.Tensor] = []  # each run's counter and error flag
    bare = median(lambda: syncs.append(run_bare_barriers(barriers, programs, dev,
                                                         num_warps=num_warps)))
    check_barriers()
    if bare_timed_out(syncs):  # its time would be the timeout's, not the barriers'
        raise RuntimeError("a bare grid barrier timed out (programs not co-resident?)")
    dpre, w, h = x["dpre_x"], x["R"], x["h_prev"]
    gemm = median(lambda: (dpre @ w, dpre.t() @ h, dpre.t() @ h, dpre.sum(0)))
    return {"programs": programs, "rel_error_vs_reference": err, "ms": ms,
            "step_us": 1e3 * ms / T, "bare_barriers_ms": bare, "bare_step_us": 1e3 * bare / T,
            "gemms_ms": gemm, "layer_estimate_ms": ms + gemm}


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    for config in a.config or ():
        if (problem := config_problem(a.cell, config, a.one_barrier)) is not None:
            ap.error(problem)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    if not a.aot and not torch.cuda.is_available():
        print("split_k_probe: timing needs a GPU (--aot compiles without one)", file=sys.stderr)
        return 2
    env = {"torch": torch.__version__, "triton": triton.__version__,
           "device": torch.cuda.get_device_name() if not a.aot else "sm_90 (aot, h100 preset)",
           "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "cell": a.cell, "time": a.time,
           "dtype": a.dtype, "warps": a.warps, "one_barrier": a.one_barrier,
           "timing": None if a.aot else TimingConfig().describe("cuda")}
    from tritonrnn.rnn.planner import PRESETS, device_properties

    props = PRESETS["h100"] if a.aot else device_properties()
    results = []
    for H, B, U, KB, BB in a.config or default_configs(a.cell, dtype, props, a.one_barrier):
        row = dict(hidden=H, batch=B, units=U, kblock=KB, btile=BB)
        try:
            if a.aot:
                rep = _aot(a.cell, H, B, U, KB, BB, dtype, a.warps, a.one_barrier)
                row.update({k: rep.get(k) for k in ("shared", "regs", "stack", "local", "mma",
                                                    "fits", "error", "profile")})
            else:
                row.update(_timed(a.cell, H, B, U, KB, BB, a.time, dtype, a.warps,
                                  a.one_barrier))
        except Exception as e:  # a config that fails is a finding; the others still run
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        print(json.dumps(row), flush=True)
        results.append(row)
        if a.json:  # replaced whole after each config: a box's timeout keeps those done
            write_json_atomic(Path(a.json), {**env, "results": results}, sort_keys=False)
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
