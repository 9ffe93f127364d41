"""Random configurations of cudnn_rnn(backend="triton") against torch.nn in float64 (a
development tool: the test suite's shapes are chosen; these are drawn).

Each case draws a cell, layers, direction, batch-major or time-major, a projection, input and
hidden sizes, a batch of lengths (zeros, unsorted, all full), the kernel family and its tiles
(plan_constraints: block_h, block_b, block_k, warps), the experiment switch
(TRITONRNN_HOIST_WEIGHTS), the split-K backward's two forms (TRITONRNN_BWD_SPLIT_K,
TRITONRNN_BWD_SPLIT_K1, and the constraint split_k_bwd over them) and the widest single
resident chunk
(`grid_tiles._MAX_CHUNK` 16 or 32 instead of 512: the small sizes drawn here then hold
their reductions in halved chunks as H = 1024, or H = 512 at 64-column tiles, do on a GPU;
`_XJOIN_TILE` 16 x 64 instead of 64 x 64: streamed 16 x 64 tiles then start their joint
product from the input-side tiles as the large-batch tiles do; `_LATE_TILE` 16 x 64 instead
of 128 x 64: the backward's sub-steps on 16 x 64 tiles and wider then load their inputs after
their product as the 128 x 64 tiles of B = 1024 do; `_HOIST_8WARP_THREAD_BYTES` 8 instead of
512: 16-wide tiles on 8 warps then hold only their first resident chunk in registers,
`Hoist.FIRST`, as GRU H=1536 does),
runs the forward and the autograd
backward in float32 and compares every output and gradient with the float64 oracle of
tests/helpers.py (the suite's tolerance, 2e-5). A forced choice the planner refuses is
recorded as `refused` (the planner's ValueError names it), not as a failure.

    python scripts/fuzz_configs.py --cases 200 [--start 0] [--out fuzz.jsonl]
                                   [--split-k | --hoist-first | --extras]

Case i is drawn from seed i, so `--start i --cases 1` replays it (with the focus flag it was
drawn with). --split-k: cases the split-K backward runs on where it has tiles (a grid family
without a projection, H a multiple of 16, one switch or both on, or a form forced;
`focus_split_k`), which the
plain draws reach in about one case in a hundred. --hoist-first: cases whose grid launches
hold only their first resident chunk in registers (`focus_hoist_first`), which no plain draw
of 133 reached (2026-11-28). --extras: cases with dropout between layers, skip_input, or
both (`focus_extras`), which torch.nn has neither of: they are compared with the reference
backend in float64 through the same op (`compare_with_reference`; the suite checks that
backend against torch.nn for both). Each record counts the split-K launches its backward made and
what its grid launches held in registers (`hoist_launches`). Exit status 1 if a case failed. Runs on
the GPU when there is one, else in the Triton interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # the interpreter unless a GPU is present (as the tests)
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TRITONRNN_POISON", "1")

import torch  # noqa: E402

SWITCHES = ("TRITONRNN_HOIST_WEIGHTS",)
# How the planner's refusals of a forced choice begin (rnn/planner.py); any other error,
# ValueErrors from the launchers' own checks included, is a failure.
REFUSAL = "plan_constraints: "


def draw(i: int) -> dict:
    """Case i: {"shape": ..., "constraints": plan_constraints keys, "env": switches}."""
    rng = random.Random(i * 7919 + 13)
    mode = rng.choice(["lstm", "gru", "rnn_tanh", "rnn_relu"])
    T = rng.randint(1, 7)
    B = rng.choice([1, 1, 2, 3, 5, 9, 17, 20, 33])
    lens = [T] * B if rng.random() < 0.3 else [rng.randint(0, T) for _ in range(B)]
    H = rng.choice([1, 3, 8, 9, 16, 17, 24, 31, 33, 40, 64, 65])
    proj = rng.choice([p for p in (0, 0, 3, 9) if p < H]) if mode == "lstm" else 0
    shape = dict(mode=mode, L=rng.choice([1, 1, 2]), bidirectional=rng.random() < 0.4,
                 time_major=rng.random() < 0.5, proj=proj, I=rng.randint(1, 20), H=H, T=T,
                 lengths=lens, seed=rng.randint(0, 10**6))
    family = rng.choice(["persistent_cta", "persistent_grid", "persistent_grid", "stepwise",
                         None])
    cons = {} if family is None else {"family": family}
    if family in ("persistent_grid", "stepwise"):
        if rng.random() < 0.6:
            cons["block_h"] = rng.choice([8, 16, 32])
        if rng.random() < 0.5:
            cons["block_b"] = rng.choice([1, 2, 4, 16, 32, 64])
        if rng.random() < 0.5:
            cons["block_k"] = rng.choice([0, 16, 32, 64])
    if rng.random() < 0.4:
        cons["num_warps"] = rng.choice([1, 2, 4, 8])
    if rng.random() < 0.2:
        cons["num_warps_bwd"] = rng.choice([2, 4, 8])
    env = {}
    if rng.random() < 0.3:
        env["TRITONRNN_HOIST_WEIGHTS"] = rng.choice(["off", "fwd", "bwd", "fwd,bwd"])
    kernel = {"_MAX_CHUNK": rng.choice([16, 32])} if rng.random() < 0.3 else {}
    if rng.random() < 0.3:  # streamed 64-column tiles start the product from x (`_xjoin`)
        kernel["_XJOIN_TILE"] = 16 * 64
    if rng.random() < 0.3:  # the backward loads a sub-step's inputs after its product
        kernel["_LATE_TILE"] = 16 * 64
    # The streamed loops' pipeline depth, drawn last: a seed keeps the rest of its case.
    if cons.get("block_k") and rng.random() < 0.3:
        cons["num_stages"] = rng.choice([1, 2, 4, 8])
    # The split-K backward (TRITONRNN_BWD_SPLIT_K; where `split_k_tiles` has tiles: H a
    # multiple of 16 whose G*H rows split in blocks of 64 or more), drawn after the rest.
    split = rng.random() < 0.25
    # Its one-barrier form (TRITONRNN_BWD_SPLIT_K1; where `split_k1_tiles` has tiles, B <=
    # 32, ahead of the two-barrier form), drawn last.
    split1 = rng.random() < 0.25
    # Only the first resident chunk in registers on 8 warps (`Hoist.FIRST`).
    if rng.random() < 0.3:
        kernel["_HOIST_8WARP_THREAD_BYTES"] = 8
    # The split-K backward named by the plan's choice (constraint split_k_bwd, over the
    # switches), drawn last.
    if rng.random() < 0.15:
        cons["split_k_bwd"] = rng.choice([0, 1, 2])
    return {"shape": shape, "constraints": cons, "env": env, "kernel": kernel,
            "split_k": split, "split_k1": split1}


def focus_split_k(case: dict, i: int) -> dict:
    """Case i (`draw`) turned into one the split-K backward may run on: H one of 16 / 32 / 48
    / 64 (the unit and K blocks are multiples of 16), no projection, a persistent-grid or
    stepwise plan (the drawn family where it is one), the two-barrier switch, the
    one-barrier switch or both, and in some cases a form forced by the constraint
    split_k_bwd instead (the plain draw's split_k_bwd, if any, kept where none is forced);
    the rest as drawn. Whether the planner's forced tiles fit,
    and which form has tiles (the one-barrier form up to B = 32), stays the case's own."""
    rng = random.Random(i * 7919 + 17)
    shape = dict(case["shape"], H=rng.choice([16, 32, 48, 64]), proj=0)
    cons = dict(case["constraints"])
    if cons.get("family") not in ("persistent_grid", "stepwise"):
        cons["family"] = rng.choice(["persistent_grid", "stepwise"])
    two, one = rng.choice([(True, False), (False, True), (True, True)])
    # Or a form forced by the constraint (the switches as drawn, overridden), drawn last.
    if rng.random() < 0.4:
        cons["split_k_bwd"] = rng.choice([1, 2])
    return {**case, "shape": shape, "constraints": cons, "split_k": two, "split_k1": one}


def focus_hoist_first(case: dict, i: int) -> dict:
    """Case i (`draw`) turned into one whose grid launches hold only their first resident
    chunk in registers (`Hoist.FIRST`): H = 33, 40 or 65 (two resident chunks, 32 + 16 or
    64 + 16), no projection, a persistent-grid plan of 16-wide batch tiles and resident
    weights on 8 warps in both passes (block_h 16 or 32), the 8-warp budget drawn down to
    8 B and TRITONRNN_HOIST_WEIGHTS left to its default rule; the rest as drawn (the
    cell, layers, direction, lengths)."""
    rng = random.Random(i * 7919 + 19)
    shape = dict(case["shape"], H=rng.choice([33, 40, 65]), proj=0)
    cons = {"family": "persistent_grid", "block_h": rng.choice([16, 32]), "block_b": 16,
            "block_k": 0, "num_warps": 8}
    kernel = {k: v for k, v in case["kernel"].items() if k != "_MAX_CHUNK"}
    return {**case, "shape": shape, "constraints": cons, "env": {},
            "kernel": {**kernel, "_HOIST_8WARP_THREAD_BYTES": 8}}


def focus_extras(case: dict, i: int) -> dict:
    """Case i (`draw`) with dropout between layers (2 or 3 layers, p drawn, the op's seeds
    drawn), skip_input (input size = hidden size), or both; the rest as drawn."""
    rng = random.Random(i * 7919 + 23)
    shape = dict(case["shape"])
    dropout, skip = rng.choice([(True, False), (False, True), (True, True)])
    if dropout:
        shape.update(L=rng.choice([2, 3]), dropout=rng.choice([0.1, 0.5, 0.9]),
                     seeds=[rng.randint(0, 2**31 - 1), rng.randint(0, 2**31 - 1)])
    if skip:
        shape.update(I=shape["H"], skip_input=True)
    return {**case, "shape": shape, "extras": True}


def compare_with_reference(s: dict, device: str, tol: float = 2e-5) -> dict:
    """The op on the Triton backend in float32 against the reference backend in float64 (the
    same params, inputs, seeds and upstream gradients): every output and every gradient.
    Returns the max abs errors by name; AssertionError past the tolerance."""
    import helpers

    from tritonrnn.rnn import cudnn_rnn

    module, x, h0, c0, lens = helpers.make_case(
        s["mode"], s["I"], s["H"], s["L"], s["bidirectional"], s["proj"], s["T"],
        s["lengths"], s["time_major"], s["seed"])
    params = helpers.params_from_module(module, skip_input=s.get("skip_input", False))
    seed, seed2 = s.get("seeds", [0, 0])
    kw = dict(rnn_mode=s["mode"], time_major=s["time_major"], num_proj=s["proj"],
              direction="bidirectional" if s["bidirectional"] else "unidirectional",
              input_mode="skip_input" if s.get("skip_input") else "linear_input",
              dropout=s.get("dropout", 0.0), seed=seed, seed2=seed2)
    g = torch.Generator().manual_seed(s["seed"] + 1)
    runs = {}
    for backend, dtype, dev in (("reference", torch.float64, "cpu"),
                                ("triton", torch.float32, device)):
        leaves = [t.to(device=dev, dtype=dtype).requires_grad_(True) if t is not None else None
                  for t in (x, h0, c0, params)]
        res = cudnn_rnn(*leaves[:3], leaves[3], lens, backend=backend, **kw)
        outs = [res.output, res.output_h] + ([res.output_c] if c0 is not None else [])
        if backend == "reference":
            ups = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
        loss = sum((o * u.to(device=dev, dtype=dtype)).sum() for o, u in zip(outs, ups,
                                                                               strict=True))
        grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
        names = ["output", "output_h", "output_c"][:len(outs)] + [
            "dx", "dh0"] + (["dc0"] if c0 is not None else []) + ["dparams"]
        runs[backend] = dict(zip(names, [*outs, *grads], strict=True))
    errors = {}
    for name, want in runs["reference"].items():
        got = runs["triton"][name].detach().cpu().double()
        torch.testing.assert_close(got, want.detach(), rtol=tol, atol=tol,
                                   msg=lambda m, n=name: f"{n}: {m}")
        errors[name] = (got - want.detach()).abs().max().item() if got.numel() else 0.0
    return errors


def run_case(case: dict) -> dict:
    """Runs one drawn case; returns {"status": "ok" | "refused" | "failed", ...}."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import helpers

    from tritonrnn.kernels import grid_tiles as gt
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn import planner
    from tritonrnn.rnn.planner import plan_constraints

    s = case["shape"]
    saved = {k: os.environ.get(k) for k in SWITCHES}
    os.environ.update(case["env"])
    kernel = case.get("kernel", {})
    saved_kernel = {k: getattr(gt, k) for k in kernel}
    for k, v in kernel.items():
        setattr(gt, k, v)
    saved_split = split_k._BWD_SPLIT_K, split_k._BWD_SPLIT_K1
    split_k._BWD_SPLIT_K = case.get("split_k", False)
    split_k._BWD_SPLIT_K1 = case.get("split_k1", False)
    # Which split-K forms the case's backward ran (its launches, counted per form).
    ran, split_run = {"one": 0, "two": 0}, split_k.split_k_backward

    def counted(*args, **kw):
        ran["one" if kw.get("one_barrier") else "two"] += 1
        return split_run(*args, **kw)

    split_k.split_k_backward = counted
    # What the grid kernels' launches held in registers (`grid_tiles.Hoist`, counted per
    # launch: the interpreter's launch one step each; "FIRST" counts those of `Hoist.FIRST`).
    hoisted, hoist_run = {}, gt._hoist_constexprs

    def hoist_counted(choice):
        key = gt.Hoist(choice).name
        hoisted[key] = hoisted.get(key, 0) + 1
        return hoist_run(choice)

    gt._hoist_constexprs = hoist_counted
    helpers.LENGTHS["_fuzz"] = lambda T, lens=s["lengths"]: lens
    # The planner's caches are keyed by the switches, not by the launch rules' constants a
    # case overrides (`kernel`): a plan cached by another case would hide them.
    planner.clear_plan_caches()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    try:
        with plan_constraints(**case["constraints"]):
            if case.get("extras"):
                errors = compare_with_reference(s, device)
            else:
                errors = helpers.compare_with_torch(
                    s["mode"], L=s["L"], bidirectional=s["bidirectional"], lengths="_fuzz",
                    time_major=s["time_major"], proj=s["proj"], I=s["I"], H=s["H"], T=s["T"],
                    backend="triton", dtype=torch.float32, rtol=2e-5, atol=2e-5,
                    seed=s["seed"], device=device)
        out = {"status": "ok", "max_error": max(errors.values()),
               "split_k_launches": dict(ran), "hoist_launches": dict(hoisted)}
    except ValueError as e:
        if not str(e).startswith(REFUSAL):  # the launchers' own checks raise ValueError too
            out = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
        else:  # a forced choice the planner refuses, with its reason
            out = {"status": "refused", "reason": str(e)[:300]}
    except Exception as e:  # noqa: BLE001 (any other error is the finding)
        out = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in saved_kernel.items():
            setattr(gt, k, v)
        split_k._BWD_SPLIT_K, split_k._BWD_SPLIT_K1 = saved_split
        split_k.split_k_backward = split_run
        gt._hoist_constexprs = hoist_run
        helpers.LENGTHS.pop("_fuzz", None)
        planner.clear_plan_caches()
    out["seconds"] = round(time.time() - t0, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100, help="how many cases (default 100)")
    ap.add_argument("--start", type=int, default=0, help="first case index (its seed)")
    ap.add_argument("--out", type=Path, help="append one JSON line per case here")
    focus = ap.add_mutually_exclusive_group()
    focus.add_argument("--split-k", action="store_true",
                       help="cases the split-K backward may run on (`focus_split_k`)")
    focus.add_argument("--hoist-first", action="store_true",
                       help="cases whose grid launches hold only their first resident chunk "
                            "in registers (`focus_hoist_first`)")
    focus.add_argument("--extras", action="store_true",
                       help="cases with dropout between layers and/or skip_input, against the "
                            "float64 reference backend (`focus_extras`)")
    args = ap.parse_args(argv)
    counts = {"ok": 0, "refused": 0, "failed": 0}
    for i in range(args.start, args.start + args.cases):
        case = draw(i)
        if args.split_k:
            case = focus_split_k(case, i)
        elif args.hoist_first:
            case = focus_hoist_first(case, i)
        elif args.extras:
            case = focus_extras(case, i)
        rec = {"case": i, **case, **run_case(case)}
        counts[rec["status"]] += 1
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        if rec["status"] == "failed":
            print(f"case {i} FAILED: {json.dumps(case)}\n  {rec['error']}", flush=True)
    print(f"{args.cases} cases from {args.start}: {counts['ok']} ok, {counts['refused']} refused "
          f"by the planner, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
