"""Where does a persistent-grid forward step spend its time? (GPU only, a development tool.)

Times the forward recurrence (the planner's tiles, T steps, one launch) with parts of the step
replaced by no-ops, one variant per process: Triton resolves a kernel's helper functions
from its module's globals when it first compiles it, so swapping a helper in
`tritonrnn.kernels.persistent_grid` before the first launch gives a kernel without that
part. The outputs of a variant are garbage (no barrier means races); only its time counts.

    python scripts/step_ablation.py [--out DIR]        # every variant, every shape

Variants (comma-joined in one process):
    full      the production kernel
    nowait    grid_wait returns at once (arrivals still counted)
    noarrive  grid_arrive does nothing (with nowait: no barrier at all)
    nodot     the recurrent matmul (h load + dots + split-K reduction) returns zeros
    nocell    the cell nonlinearity is replaced by additions
    noxg      the input-side gate tiles are not loaded
    nostore   the y / c_seq output stores are dropped
and `bare4` / `bare8`: bare grid barriers at the same grid with 4 / 8 warps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

SHAPES = [("lstm", 512, 1), ("lstm", 768, 16), ("lstm", 768, 64), ("gru", 1024, 16)]
VARIANTS = ["full", "nowait", "nowait,noarrive", "nodot", "nocell", "noxg", "nostore",
            "nowait,noarrive,nodot", "nowait,noarrive,nodot,noxg,nostore", "bare4", "bare8"]
T = 1024


@triton.jit
def _no_wait(sync_ptr, target, max_spin):
    return target * 0


@triton.jit
def _no_arrive(sync_ptr):
    tl.debug_barrier()


@triton.jit
def _no_dot(R, s_r, hs, h_ok, src, jb64, b_ok, wa0, wa1, wa2, wa3, wb0, wb1, wb2, wb3,
            G: tl.constexpr, H: tl.constexpr, HOUT: tl.constexpr, KA: tl.constexpr,
            KB: tl.constexpr, RESIDENT: tl.constexpr, S: tl.constexpr, DOT_DT: tl.constexpr,
            FP32_DOT: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    z = tl.zeros([BH, BB], tl.float32)
    return z, z, z, z


@triton.jit
def _no_cell(CELL: tl.constexpr, x0, x1, x2, x3, p0, p1, p2, p3, h_old, c):
    return x0 + p0 + x1 + p1 + x2 + p2 + x3 + p3 + h_old, c + p0


@triton.jit
def _no_load(ptr, stride, rows, hs, mask, k: tl.constexpr, G: tl.constexpr,
             H: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    return tl.zeros([BH, BB], tl.float32)


@triton.jit
def _no_store(ptr, stride, rows, cols, val, mask):
    pass


def _apply(variant: str) -> None:
    from tritonrnn.kernels import cells
    from tritonrnn.kernels import persistent_grid as pg

    for part in variant.split(","):
        if part == "nowait":
            pg.grid_wait = _no_wait
        elif part == "noarrive":
            pg.grid_arrive = _no_arrive
        elif part == "nodot":
            pg._fwd_pre = _no_dot
        elif part == "nocell":
            cells.cell_forward = _no_cell
        elif part == "noxg":
            pg._load_gate = _no_load
        elif part == "nostore":
            pg._store_rows = _no_store
        elif part != "full":
            raise ValueError(f"--variant: unknown part {part!r}")


def _measure(variant: str) -> list[dict]:
    from tritonrnn.bench.barrier import _recurrence_inputs
    from tritonrnn.kernels.grid_barrier import run_bare_barriers
    from tritonrnn.kernels.persistent_grid import grid_forward
    from tritonrnn.rnn.planner import device_properties, recurrence_choice

    if not variant.startswith("bare"):
        _apply(variant)
    dev = torch.device("cuda")
    props = device_properties(dev)
    rows = []
    for mode, H, B in SHAPES:
        lp, _ = recurrence_choice(mode, H, H, 0, torch.bfloat16, B, props)
        if variant.startswith("bare"):
            warps = int(variant[4:])
            fn = lambda n=lp.num_programs, w=warps: run_bare_barriers(T, n, dev, num_warps=w)  # noqa: E731
        else:
            kw = _recurrence_inputs(mode, H, B, T, torch.bfloat16, dev)
            fn = lambda kw=kw, lp=lp: grid_forward(  # noqa: E731
                *kw.values(), persistent=True, block_h=lp.block_h, block_b=lp.block_b,
                num_warps=lp.num_warps, _max_spin=1 << 20)
        fn()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        rows.append({"variant": variant, "mode": mode, "H": H, "B": B,
                     "programs": lp.num_programs, "num_warps": lp.num_warps,
                     "block_b": lp.block_b, "step_us": ms * 1e3 / T})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.variant:
        for row in _measure(args.variant):
            print(json.dumps(row), flush=True)
        return 0
    rows = []
    for v in VARIANTS:
        r = subprocess.run([sys.executable, __file__, "--variant", v], capture_output=True,
                           text=True, timeout=240)
        got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        if r.returncode != 0:
            print(f"{v}: rc {r.returncode}: {r.stderr.strip().splitlines()[-1:]}", flush=True)
        rows += got
        for row in got:
            print(f"{v:<40} {row['mode']} H{row['H']} B{row['B']} p{row['programs']} "
                  f"w{row['num_warps']}: {row['step_us']:.2f} us/step", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "step_ablation.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
