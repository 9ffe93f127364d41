"""The `tritonrnn` command: bench, check, tune, plan, aot and barrier.

    tritonrnn bench [--preset NAME | shape options] [--pass fwd|bwd|fwdbwd|all] [--out DIR]
    tritonrnn check [--backend B] [--dtype D] [small shape options]
    tritonrnn tune  [--preset NAME | shape options] [--force] [--max-candidates N]
    tritonrnn plan  [--preset NAME | shape options]
                    [--device-preset current|h100|h200|a100|interpreter] [--pipeline-chunks C]
                    [--split-k-bwd 0|1|2]
    tritonrnn aot   [--preset NAME | shape options] [--device-preset h100|h200|a100|current]
                    [--arch CC] [--jobs N]
                    [--family F] [--block-h N] [--block-b N] [--block-k N] [--num-warps N]
                    [--num-stages N] [--num-stages-bwd N] [--split-k-bwd 0|1|2] [--maxnreg N]
                    [--json PATH] [--dump DIR]   (no GPU needed)
    tritonrnn barrier [--time T] [--dtype D] [--mode M..] [--hidden H..] [--batch B..]
                      [--out DIR]   (GPU only)

Without a GPU, bench runs the `smoke` preset with the Triton interpreter against torch.nn on
the CPU and says so. Exit codes: 0 success, 1 a failed check/benchmark, nothing run or a
required module missing, 2 a bad option (one line on stderr, never a traceback), 130
interrupted, 141 the reader of stdout gone (`| head`).
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from .presets import CPU_PRESETS, MODES, PRESETS, BenchShape

EPILOG = ("Exit codes: 0 success, 1 a failed check or benchmark (or nothing ran), 2 a bad "
          "option, 130 interrupted, 141 stdout closed early.")
# bench's tuning before timing: the candidates of a missing plan key it times (the nearest
# the planner's own choice, one change of a tile or the warps first), the rest left to
# `tritonrnn tune`.
TUNE_CANDIDATES = 16


class UsageError(Exception):
    """A bad option: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # instead of argparse's usage + message: one line
        command = self.prog.removeprefix("tritonrnn").strip()
        raise UsageError(f"{command}: {message}" if command else message)


# ----------------------------------------------------------------------------- options

_SHAPE_FIELDS = ("mode", "hidden", "input_size", "batch", "time", "layers", "bidirectional",
                 "proj", "dtype", "varlen")


def _add_shape_options(p: argparse.ArgumentParser, presets: bool = True,
                       default: str = "anchor on a GPU, smoke on the CPU") -> None:
    d = BenchShape()
    g = p.add_argument_group(
        "shape (override every shape of a preset when both are given; without a preset the "
        "defaults below, the anchor's)")
    if presets:
        g.add_argument("--preset", choices=sorted(PRESETS),
                       help=f"named sweep (default: {default}, unless a shape option is given)")
    g.add_argument("--mode", choices=MODES, help=f"cell (default {d.mode})")
    g.add_argument("--hidden", type=int, metavar="H", help=f"num_units (default {d.hidden})")
    g.add_argument("--input-size", type=int, metavar="I", help="input size (default H)")
    g.add_argument("--batch", type=int, metavar="B", help=f"(default {d.batch})")
    g.add_argument("--time", type=int, metavar="T", help=f"max time (default {d.time})")
    g.add_argument("--layers", type=int, metavar="L", help=f"(default {d.layers})")
    g.add_argument("--bidirectional", action=argparse.BooleanOptionalAction, default=None,
                   help="both directions (--no-bidirectional: one, also on a preset's "
                        "bidirectional shapes; default: the preset's, else one)")
    g.add_argument("--proj", type=int, metavar="P", help="LSTM projection size (0 = off)")
    g.add_argument("--dtype", help="bf16 | fp16 | fp32 | fp64 (default bf16)")
    g.add_argument("--varlen", metavar="DIST",
                   help="none | uniform (lengths uniform in [T/8, T]) | uniform:F ([F*T, T])")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: the GPU when there is one, else the CPU with the interpreter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


WARMUP_MS, REP_MS, CPU_REP = 25, 100, 3


def _add_timing_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warmup", type=int, default=WARMUP_MS, metavar="MS",
                   help="do_bench warm-up in ms (GPU)")
    p.add_argument("--rep", type=int, default=REP_MS, metavar="MS",
                   help="do_bench repetition time in ms (GPU)")
    p.add_argument("--cpu-rep", type=int, default=CPU_REP, metavar="N",
                   help="timed repetitions on the CPU")


def _versions() -> str:
    """tritonrnn's version and the torch and Triton installed, from their metadata (importing
    them here would fix the interpreter choice before --device is read)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (f"tritonrnn {installed('tritonrnn')} (torch {installed('torch')}, Triton "
            f"{installed('triton')})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tritonrnn", description="tritonrnn benchmark, check, tuning and "
                     "planning tools.", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=_versions())
    sub = parser.add_subparsers(dest="command",
                                metavar="{bench,check,tune,plan,aot,barrier}")

    b = sub.add_parser("bench", help="time tritonrnn against cuDNN (and FlashRNN)",
                       description="Times tritonrnn against torch.nn (cuDNN) on padded and "
                       "packed input, with the same cuDNN passes also replayed from CUDA "
                       "graphs on a GPU (no host launches), and FlashRNN when importable; "
                       "writes JSON and a PNG.",
                       epilog=EPILOG)
    _add_shape_options(b)
    b.add_argument("--pass", dest="passes", choices=("fwd", "bwd", "fwdbwd", "all"),
                   default="all", help="which pass to time (default all)")
    b.add_argument("--impl", action="append", choices=("tritonrnn", "torch", "torch-graph",
                                                       "torch-packed", "flashrnn"),
                   help="implementations to run (repeatable; default all that apply)")
    b.add_argument("--backend", choices=("auto", "triton", "reference"), default="auto",
                   help="tritonrnn backend (default auto: Triton on a GPU or the interpreter)")
    b.add_argument("--out", type=Path, default=Path("tritonrnn-results"), metavar="DIR",
                   help="where the JSON and the PNG go (default ./tritonrnn-results); the "
                   "checkpoint after each shape goes to <report>.partial.json, which the "
                   "complete report replaces")
    b.add_argument("--no-tune", action="store_true",
                   help="GPU: do not tune missing plan keys before timing")
    b.add_argument("--tune-candidates", type=int, default=TUNE_CANDIDATES, metavar="N",
                   help="GPU: a missing plan key is tuned over its first N candidates (those "
                   "nearest the planner's choice; stored as partial, `tritonrnn tune` times "
                   f"the rest) before timing (default {TUNE_CANDIDATES}; a key has up to a "
                   "few hundred)")
    b.add_argument("--allow-slow", action="store_true",
                   help="CPU: allow shapes larger than the interpreter budget")
    _add_timing_options(b)
    _add_run_options(b)

    c = sub.add_parser("check", help="every mode/direction/varlen combination vs float64",
                       description="Runs every mode x direction x varlen combination (plus "
                       "projection and 2-layer stacks) through cudnn_rnn/cudnn_rnn_backprop "
                       "and compares outputs and gradients with torch.nn in float64.",
                       epilog=EPILOG)
    c.add_argument("--backend", choices=("auto", "triton", "reference"), default="auto")
    c.add_argument("--dtype", default="fp32", help="bf16 | fp16 | fp32 | fp64 (default fp32)")
    c.add_argument("--mode", action="append", choices=MODES,
                   help="restrict to these modes (repeatable; default all)")
    c.add_argument("--hidden", type=int, default=20, metavar="H")
    c.add_argument("--input-size", type=int, default=12, metavar="I")
    c.add_argument("--batch", type=int, default=5, metavar="B")
    c.add_argument("--time", type=int, default=6, metavar="T")
    _add_run_options(c)

    t = sub.add_parser("tune", help="time the planner's candidates, cache the best",
                       description="Times every candidate choice of the planner for each "
                       "shape's plan key on the GPU and keeps the best in the tuning cache "
                       "($TRITONRNN_CACHE_DIR/tuning.json, default ~/.cache/tritonrnn). "
                       "Resumable.", epilog=EPILOG)
    _add_shape_options(t)
    t.add_argument("--force", action="store_true", help="retune keys already in the cache")
    t.add_argument("--max-candidates", type=int, metavar="N",
                   help="time at most the first N candidates per plan key (the planner's own "
                   "and its nearest variants first); the best is cached as partial, and a "
                   "later run with a larger N carries on")
    t.add_argument("--allow-cpu", action="store_true",
                   help="tune in the interpreter without a GPU (exercises the machinery only)")
    _add_timing_options(t)
    _add_run_options(t)

    pl = sub.add_parser("plan", help="print the planner's Plan.explain() for a shape",
                        epilog=EPILOG)
    _add_shape_options(pl, default="anchor")
    pl.add_argument("--device-preset", default="current",
                    help="current | h100 | h200 | a100 | interpreter (default: this machine)")
    pl.add_argument("--pipeline-chunks", type=int, metavar="C",
                    help="force the layer pipeline to C time chunks (plan_constraints; 1: off); "
                    "default: the automatic rule, opt-in with TRITONRNN_PIPELINE=1")
    pl.add_argument("--split-k-bwd", type=int, choices=(0, 1, 2), metavar="FORM",
                    help="force the backward (plan_constraints split_k_bwd; 0: the family's "
                    "own; the split-K kernel's form with 1 or 2 grid barriers a step)")
    a = sub.add_parser(
        "aot", help="compile the planner's kernels for a GPU target (no GPU needed) and report "
        "shared memory, registers, spills, MMA kind and a step-loop profile",
        description="Captures the forward and backward kernel launches the planner's choice "
        "for each shape makes on the device preset (the real launchers on dummy CPU tensors, "
        "nothing run), compiles them ahead of time for sm_<arch> with Triton's ptxas, and "
        "reports per kernel: shared memory, registers, spill bytes, MMA kind, whether it fits "
        "the preset, and static per-iteration instruction counts of the time-step loop. "
        "--time, --layers and --varlen do not change the kernels and are ignored.",
        epilog="Exit codes: 0 every kernel compiled and fits, 1 a kernel failed to compile, "
        "spills in its step loop or does not fit (or ptxas is missing), 2 a bad option.")
    _add_shape_options(a, default="anchor")
    a.add_argument("--device-preset", default="h100",
                   help="planner device preset: h100 | h200 | a100 | current (this machine's "
                   "GPU: its compiles are the Triton cache entries its runs look up) "
                   "(default h100)")
    a.add_argument("--arch", type=int, default=None, metavar="CC",
                   help="CUDA compute capability to compile for, one that Triton's ptxas "
                   "compiles for (75 to 121) (default: the preset's, 90 for h100 / h200, 80 "
                   "for a100)")
    a.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="compile in N processes at once (default 1); the reports print when "
                   "all are done")
    a.add_argument("--family", choices=("persistent_cta", "persistent_grid", "stepwise"),
                   help="force the kernel family (plan_constraints)")
    a.add_argument("--block-h", type=int, metavar="N", help="force block_h (power of two >= 16)")
    a.add_argument("--block-b", type=int, metavar="N", help="force block_b (power of two >= 16)")
    a.add_argument("--block-k", type=int, metavar="N",
                   help="force block_k (0: resident weights; power of two >= 16: streamed)")
    a.add_argument("--num-warps", type=int, metavar="N",
                   help="force num_warps (power of two; both passes)")
    a.add_argument("--num-warps-bwd", type=int, metavar="N",
                   help="force the backward's num_warps (power of two)")
    a.add_argument("--num-stages", type=int, metavar="N",
                   help="force the streamed loops' pipeline depth (int >= 1; both passes; "
                   "streamed weights only)")
    a.add_argument("--num-stages-bwd", type=int, metavar="N",
                   help="force the backward's streamed-loop pipeline depth (int >= 1)")
    a.add_argument("--split-k-bwd", type=int, choices=(0, 1, 2), metavar="FORM",
                   help="force the backward (0: the family's own; the split-K kernel's form "
                   "with 1 or 2 grid barriers a step: grid families without a projection)")
    a.add_argument("--maxnreg", type=int, metavar="N",
                   help="experiment: cap registers per thread (Triton's maxnreg option, "
                   "16..255) on top of what the launchers pass")
    a.add_argument("--json", type=Path, default=None, metavar="PATH",
                   help="also write the reports as JSON there (a new file, or an earlier "
                   "aot report to replace: any other file is refused)")
    a.add_argument("--dump", type=Path, default=None, metavar="DIR",
                   help="also write each kernel's TTGIR, PTX and SASS under DIR")

    br = sub.add_parser("barrier", help="persistent-grid per-step latency vs a bare grid "
                        "barrier (GPU only)", epilog=EPILOG)
    br.add_argument("--time", type=int, default=1024, metavar="T", help="steps (default 1024)")
    br.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32")
    br.add_argument("--mode", nargs="+", choices=("lstm", "gru"), default=None,
                    help="only these cells (default: lstm and gru)")
    br.add_argument("--hidden", nargs="+", type=int, default=None, metavar="H",
                    help="only these hidden sizes (default: 512 768 1024)")
    br.add_argument("--batch", nargs="+", type=int, default=None, metavar="B",
                    help="only these batch sizes (default: 1 16 64)")
    br.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="also write barrier-<device>-<date>.json there")
    _add_timing_options(br)
    return parser


# ----------------------------------------------------------------------------- helpers


def _device(choice: str):
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU found")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cpu":
        # Triton kernels run on the CPU only through the interpreter, which Triton chooses
        # when it is first imported (its own @jit library functions included): `main` calls
        # this before any command imports triton.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return torch.device(choice)


def _overrides(args) -> dict:
    """The shape options given on the command line ({field: value})."""
    return {f: getattr(args, f) for f in _SHAPE_FIELDS if getattr(args, f) is not None}


def resolve_shapes(args, default_preset: str) -> tuple[str, list[BenchShape]]:
    """(preset name or 'custom', validated shapes) from --preset and the shape options."""
    overrides = _overrides(args)
    preset = getattr(args, "preset", None)
    if preset is None and not overrides:
        preset = default_preset
    base = PRESETS[preset] if preset else [BenchShape()]
    shapes = []
    for s in base:
        try:
            shapes.append(replace(s, **overrides).validated())
        except ValueError as e:
            # A preset's own value may be the one at odds with an option given: say whose.
            where = f"--preset {preset}'s shape {s.label} with the options given: " if (
                preset and overrides) else ""
            raise UsageError(f"{where}{e}") from None
    # Overrides can make a preset's shapes equal (--hidden on the grid sweep): each runs once,
    # in the preset's order.
    return preset or "custom", list(dict.fromkeys(shapes))


def _effective_backend(backend: str, device, dtypes: Iterable = ()) -> str:
    """The tritonrnn backend that runs (what the banner and the report's tritonrnn_backend
    say): 'auto' resolved as the library resolves it (ops._resolve_backend), and 'reference'
    where every shape is float64 (the planner runs float64 on its reference family, Triton
    or not)."""
    import torch

    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "auto":
        backend = "triton" if device.type == "cuda" or interpret else "reference"
    dtypes = set(dtypes)
    if backend == "triton" and dtypes and dtypes <= {torch.float64}:
        return "reference"
    if backend == "triton" and device.type != "cuda":
        return "triton-interpreter"
    return backend


def _check_interpreter(backend: str, device, option: str = "--backend triton") -> None:
    """--backend triton (or `option`) on the CPU runs the kernels in Triton's interpreter,
    which only TRITON_INTERPRET=1 selects (`_device` sets it when it is unset): any other
    value set in the environment is refused up front, before anything runs."""
    value = os.environ.get("TRITON_INTERPRET")
    if backend == "triton" and device.type == "cpu" and value != "1":
        raise UsageError(f"{option}: on the CPU the Triton kernels run only in "
                         f"Triton's interpreter: expected TRITON_INTERPRET unset or 1, got "
                         f"TRITON_INTERPRET={value!r}")


_BACKEND_WORDS = {
    "triton": "tritonrnn's Triton kernels",
    "triton-interpreter": "tritonrnn's Triton kernels in the Triton interpreter",
    "reference": "tritonrnn's pure-PyTorch reference engine",
}


def _cpu_work(s: BenchShape) -> int:
    from tritonrnn.rnn.config import GATES

    gates = GATES[s.mode]
    return s.time * s.batch * gates * s.hidden * (s.input + s.hidden) * s.layers * s.num_dirs


def _check_output(path: Path, option: str, *, file: bool = False) -> None:
    """Checks, before anything runs, that an output can be written: creates the directory
    (`path`, or its parent for a file) and a scratch file in it. An output path that cannot be
    written is a bad option (UsageError naming `option`), not a traceback after the first
    shape has run."""
    directory = path.parent if file else path
    try:
        if file and path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
        if file and path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, "permission denied")
    except OSError as e:
        what = "a writable file path" if file else "a writable directory"
        raise UsageError(f"{option}: expected {what}, got '{path}' ({e.strerror or e})") from None


CPU_WORK_BUDGET = 50_000_000  # multiply-adds per step set: ~a minute in the interpreter


# Options that apply on one kind of device, with their defaults. Given where they do not
# apply (a script may pass both kinds' options), they are ignored, and a note says so.
_GPU_ONLY = {"warmup": WARMUP_MS, "rep": REP_MS, "no_tune": False,
             "tune_candidates": TUNE_CANDIDATES}
_CPU_ONLY = {"cpu_rep": CPU_REP, "allow_slow": False}


def _note_ignored(args, cpu: bool) -> None:
    """Says on stderr which options given (away from their defaults) do nothing here; called
    once the command's options have passed their checks."""
    given = [f"--{dest.replace('_', '-')}" for dest, default in
             (_GPU_ONLY if cpu else _CPU_ONLY).items() if getattr(args, dest, default) != default]
    if given:
        print(f"tritonrnn: note: {' '.join(given)} ignored: {'GPU' if cpu else 'CPU'} only "
              f"(this run is on {'the CPU' if cpu else 'a GPU'})", file=sys.stderr)


def _timing(args):
    from .timing import TimingConfig

    for name in ("warmup", "rep", "cpu_rep"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: expected an int >= 1, got "
                             f"{getattr(args, name)}")
    return TimingConfig(warmup_ms=args.warmup, rep_ms=args.rep, cpu_rep=args.cpu_rep)


# ----------------------------------------------------------------------------- commands


def cmd_bench(args, argv) -> int:
    from .harness import IMPLS, BenchOptions, format_table, run_benchmark, write_report
    from .plot import plot_report

    device = _device(args.device)
    cpu = device.type == "cpu"
    preset, shapes = resolve_shapes(args, "smoke" if cpu else "anchor")
    timing = _timing(args)
    if args.tune_candidates < 1:
        raise UsageError(f"--tune-candidates: expected an int >= 1, got {args.tune_candidates}")
    if cpu and not args.allow_slow:
        if preset not in CPU_PRESETS and preset != "custom":
            raise UsageError(
                f"--preset {preset}: needs a CUDA GPU (none found; the interpreter would take "
                f"hours). Use --preset smoke, a small custom shape, or --allow-slow"
            )
        big = [s.label for s in shapes if _cpu_work(s) > CPU_WORK_BUDGET]
        if big:
            raise UsageError(f"shape '{big[0]}' is too large for the CPU interpreter (no GPU "
                             "found); use smaller sizes, --preset smoke, or --allow-slow")
    _check_interpreter(args.backend, device)
    _check_output(args.out, "--out")
    _note_ignored(args, cpu)
    passes = ("fwd", "bwd", "fwdbwd") if args.passes == "all" else (args.passes,)
    impls = tuple(args.impl) if args.impl else IMPLS
    impls = tuple(i for i in IMPLS if i in impls)  # fixed order: tritonrnn first
    backend = _effective_backend(args.backend, device, (s.torch_dtype for s in shapes))
    if cpu:
        print("tritonrnn: no CUDA GPU found" if not _gpu() else "tritonrnn: --device cpu")
        print(f"  Running preset '{preset}' on the CPU: {_BACKEND_WORDS[backend]} against "
              "torch.nn on the CPU.")
        print("  CPU timings say nothing about GPU speed; correctness is still checked "
              "against torch.nn in float64.")
    else:
        import torch

        print(f"tritonrnn bench '{preset}' on {torch.cuda.get_device_name(device)}, tritonrnn "
              f"backend {backend}")
        if not args.no_tune and backend != "reference" and "tritonrnn" in impls:
            _tune_before_bench(shapes, device, timing, args)
    opts = BenchOptions(device=device, backend=args.backend, passes=passes, impls=impls,
                        timing=timing, seed=args.seed)
    # A preset with shape options overridden is not that preset's sweep: the report says
    # which options, and its file is named after them (never over the preset's own report).
    overrides = _overrides(args)
    extra = {"overrides": overrides} if overrides and preset != "custom" else {}
    # So is a run of other passes, implementations or backend than the defaults: its file is
    # named after them, never over the full run's report (nor a `--pass fwd` over a `bwd`).
    selection = {"pass": args.passes} if args.passes != "all" else {}
    if impls != IMPLS:
        selection["impl"] = "-".join(impls)
    if args.backend != "auto":
        selection["backend"] = args.backend
    if selection:
        extra["selection"] = selection

    saved: list[Path] = []  # the last checkpoint's file

    def checkpoint(partial: dict) -> None:
        saved[:] = [write_report({**partial, **extra, "tritonrnn_backend": backend},
                                 args.out)]

    try:
        report = run_benchmark(shapes, opts, progress=not args.no_progress, preset=preset,
                               argv=argv, checkpoint=checkpoint)
    except KeyboardInterrupt:
        # The checkpoints went to <stem>.partial.json: a finished report of the same name
        # from an earlier run is left as it was.
        where = (f"the shapes finished before it are in {saved[0]}" if saved
                 else "no shape had finished, nothing written")
        print(f"tritonrnn: interrupted; {where}", file=sys.stderr)
        return 130
    report.update(extra)
    report["tritonrnn_backend"] = backend
    json_path = write_report(report, args.out)
    try:
        png = f"wrote {plot_report(report, json_path.with_suffix('.png'))}"
    except ImportError as e:  # matplotlib: the `bench` extra
        png = f"no plot: {e} (pip install matplotlib)"
    print(format_table(report))
    print(f"\nwrote {json_path}\n{png}")
    if report["failures"]:
        print(f"FAILED ({len(report['failures'])}):")
        for f in report["failures"]:
            print(f"  {f}")
        return 1
    if not any(r["runs"] for r in report["results"]):  # every implementation skipped
        print(f"NOTHING RAN: none of --impl {' '.join(impls)} runs here (each shape's skip "
              f"reason is above)")
        return 1
    return 0


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _tune_before_bench(shapes, device, timing, args) -> None:
    """Tunes plan keys that are not in the cache yet, over their first --tune-candidates
    choices (timings are taken after tuning): the main job on a fresh GPU machine would
    otherwise compile and time every candidate of the anchor (150 on an H200) first."""
    from .tune import tune_shapes

    try:
        summaries = tune_shapes(shapes, device, timing, progress=not args.no_progress,
                                seed=args.seed, limit=args.tune_candidates)
    except (ImportError, ValueError, RuntimeError, OSError) as e:  # e.g. an unwritable cache
        print(f"  tuning skipped: {type(e).__name__}: {e}".splitlines()[0])
        return
    for s in summaries:
        if s["status"] == "tuned":
            kept = " (not stored: the cache's entry covers more candidates)" if s.get(
                "kept") else ""
            print(f"  tuned {s['label']}: {s['best']}{kept}")


def cmd_check(args) -> int:
    from .check import check_cases, format_check, run_check
    from .presets import dtype_name, parse_dtype

    device = _device(args.device)
    try:
        dtype = dtype_name(parse_dtype(args.dtype))
        base = BenchShape(mode="lstm", hidden=args.hidden, input_size=args.input_size,
                          batch=args.batch, time=args.time, dtype=dtype).validated()
    except ValueError as e:
        raise UsageError(str(e)) from None
    _check_interpreter(args.backend, device)
    modes = tuple(m for m in MODES if not args.mode or m in args.mode)
    rows = run_check(check_cases(base, modes), device, args.backend, args.seed,
                     progress=not args.no_progress)
    name = "CPU" if device.type == "cpu" else _cuda_name(device)
    print(format_check(rows, name, _effective_backend(args.backend, device, [base.torch_dtype]),
                       dtype))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def _cuda_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device)


def cmd_tune(args) -> int:
    from tritonrnn.rnn.planner import tuning_cache_path

    from .tune import format_tune, tune_shapes

    if args.max_candidates is not None and args.max_candidates < 1:
        raise UsageError(f"--max-candidates: expected an int >= 1, got {args.max_candidates}")
    device = _device(args.device)
    if device.type == "cpu" and not args.allow_cpu:
        raise UsageError("no CUDA GPU found: tuning times kernels on a GPU (interpreter "
                         "timings say nothing about GPU speed); --allow-cpu exercises the "
                         "tuner in the interpreter anyway")
    _check_interpreter("triton", device, option="--allow-cpu")  # tuning runs the kernels
    preset, shapes = resolve_shapes(args, "smoke" if device.type == "cpu" else "anchor")
    timing = _timing(args)
    # The tuner records every measurement there as it goes (tune._write_partial).
    _check_output(tuning_cache_path().parent, "TRITONRNN_CACHE_DIR (the tuning cache)")
    _note_ignored(args, device.type == "cpu")
    summaries = tune_shapes(shapes, device, timing, force=args.force,
                            progress=not args.no_progress, seed=args.seed,
                            limit=args.max_candidates)
    print(format_tune(summaries, tuning_cache_path()))
    return 0 if all(s["status"] != "failed" for s in summaries) else 1


def cmd_plan(args) -> int:
    from tritonrnn.rnn.planner import PRESETS as DEVICE_PRESETS
    from tritonrnn.rnn.planner import plan_constraints, plan_for

    choices = ("current", *sorted(DEVICE_PRESETS))
    if args.device_preset not in choices:
        raise UsageError(f"--device-preset: expected one of {list(choices)}, got "
                         f"{args.device_preset!r}")
    chunks = args.pipeline_chunks
    if chunks is not None and chunks < 1:
        raise UsageError(f"--pipeline-chunks: expected an int >= 1, got {chunks}")
    _, shapes = resolve_shapes(args, "anchor")
    props = None if args.device_preset == "current" else args.device_preset
    forced = {"pipeline_chunks": chunks} if chunks is not None else {}
    if args.split_k_bwd is not None:  # (argparse checked the value)
        forced["split_k_bwd"] = args.split_k_bwd
    for i, s in enumerate(shapes):
        with plan_constraints(**forced):
            plan = plan_for(rnn_mode=s.mode, input_size=s.input, num_units=s.hidden,
                            num_layers=s.layers, direction=s.direction, num_proj=s.proj,
                            batch=s.batch, max_time=s.time, dtype=s.torch_dtype,
                            device_properties=props)
        if i:
            print()
        print(plan.explain())
    return 0


_AOT_TILES = (("--block-h", "block_h", "a power of two >= 16"),
              ("--block-b", "block_b", "a power of two >= 16"),
              ("--block-k", "block_k", "0 (resident weights) or a power of two >= 16"),
              ("--num-warps", "num_warps", "a power of two in [1, 32]"),
              ("--num-warps-bwd", "num_warps_bwd", "a power of two in [1, 32]"),
              ("--num-stages", "num_stages", "an int >= 1"),
              ("--num-stages-bwd", "num_stages_bwd", "an int >= 1"))


# The planner's constraint keys as aot's options, for its refusals of a forced choice.
_AOT_OPTIONS = {key: opt for opt, key, _ in _AOT_TILES} | {"split_k_bwd": "--split-k-bwd"}


def _in_option_names(message: str) -> str:
    """A planner refusal of the forced choices ("plan_constraints: block_h = 16 cannot
    apply ...") in the names of the aot options that forced them ("--block-h 16 cannot
    apply ...")."""
    message = message.removeprefix("plan_constraints: ")
    for key, opt in _AOT_OPTIONS.items():
        message = re.sub(rf"\b{key} = ", f"{opt} ", message)
    return message


def _aot_constraints(args) -> dict:
    """plan_constraints from the aot override options (checked here so that the error names
    the option, not the planner's key)."""
    out = {"family": args.family} if args.family is not None else {}
    for opt, key, what in _AOT_TILES:
        v = getattr(args, key)
        if v is None:
            continue
        pow2 = v > 0 and v & (v - 1) == 0
        warps = pow2 and v <= 32
        ok = {"block_k": v == 0 or (pow2 and v >= 16), "num_warps": warps,
              "num_warps_bwd": warps, "num_stages": v >= 1,
              "num_stages_bwd": v >= 1}.get(key, pow2 and v >= 16)
        if not ok:
            raise UsageError(f"{opt}: expected {what}, got {v}")
        out[key] = v
    if args.split_k_bwd is not None:  # (argparse checked the value)
        out["split_k_bwd"] = args.split_k_bwd
    return out


def cmd_aot(args) -> int:
    import torch

    from .aot import (
        ARCHES,
        AotShape,
        ToolMissing,
        aot_report,
        aot_reports,
        check_json_target,
        device_preset,
        format_report,
        report_ok,
        write_json,
    )

    try:
        props = device_preset(args.device_preset)
    except ValueError as e:
        raise UsageError(f"--device-preset: {str(e).removeprefix('device preset: ')}") from None
    if args.arch is None:
        args.arch = props.arch
    if args.jobs < 1:
        raise UsageError(f"--jobs: expected an int >= 1, got {args.jobs}")
    if args.arch not in ARCHES:
        raise UsageError(f"--arch: expected a CUDA compute capability that Triton's ptxas "
                         f"compiles for, one of {', '.join(map(str, ARCHES))}, got {args.arch}")
    constraints = _aot_constraints(args)
    options = {}
    if args.maxnreg is not None:
        if not 16 <= args.maxnreg <= 255:
            raise UsageError(f"--maxnreg: expected an int in [16, 255], got {args.maxnreg}")
        options["maxnreg"] = args.maxnreg
    _, shapes = resolve_shapes(args, "anchor")
    aot_shapes = list(dict.fromkeys(
        AotShape(mode=s.mode, hidden=s.hidden, batch=s.batch, proj=s.proj, dtype=s.torch_dtype,
                 bidirectional=s.bidirectional, input_size=s.input) for s in shapes))
    if any(s.dtype == torch.float64 for s in aot_shapes):
        raise UsageError("--dtype fp64: the planner runs float64 on the reference family; "
                         "there is no Triton kernel to compile")
    if args.json is not None:
        _check_output(args.json, "--json", file=True)
        why = check_json_target(args.json)
        if why:
            raise UsageError(f"--json: expected a new file or an earlier aot report to replace, "
                             f"got '{args.json}' ({why})")
    if args.dump is not None:
        _check_output(args.dump, "--dump")
    reports = []
    try:
        if args.jobs > 1:
            reports = aot_reports([(s, constraints) for s in aot_shapes], args.device_preset,
                                  args.arch, args.dump, options, processes=args.jobs)
            print("\n\n".join(format_report(r) for r in reports), flush=True)
        else:  # one at a time, each printed as it is compiled
            for i, s in enumerate(aot_shapes):
                report = aot_report(s, args.device_preset, constraints, args.arch, args.dump,
                                    options)
                reports.append(report)
                if i:
                    print()
                print(format_report(report), flush=True)
    except ToolMissing as e:
        print(f"tritonrnn: error: {e}".splitlines()[0], file=sys.stderr)
        return 1
    except ValueError as e:  # the planner refuses a forced choice on a shape
        raise UsageError(_in_option_names(str(e).splitlines()[0])) from None
    if args.json is not None:
        write_json(reports, args.json)
        print(f"\nwrote {args.json}")
    bad = [r["shape"] for r in reports if not report_ok(r)]
    if bad:
        print(f"\nNOT OK ({len(bad)}): " + "; ".join(bad) + " (a kernel failed to compile, "
              "spills in its step loop, or exceeds the preset)")
        return 1
    return 0


def cmd_barrier(args, argv: list[str] | None = None) -> int:
    import datetime as _dt

    import torch

    from tritonrnn.rnn.planner import write_json_atomic

    from . import barrier
    from .barrier import format_rows, run
    from .harness import environment

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if args.dtype not in dtypes:
        raise UsageError(f"--dtype: expected one of {list(dtypes)}, got {args.dtype!r}")
    if args.time < 1:
        raise UsageError(f"--time: expected an int >= 1, got {args.time}")
    for name, values in (("--hidden", args.hidden), ("--batch", args.batch)):
        bad = [v for v in values or () if v < 1]
        if bad:
            raise UsageError(f"{name}: expected ints >= 1, got {bad[0]}")
    shapes = barrier.shapes(args.mode or barrier.MODES, args.hidden or barrier.HIDDEN,
                            args.batch or barrier.BATCH)
    if not torch.cuda.is_available():
        raise UsageError("barrier: needs a CUDA GPU (a grid barrier deadlocks in the "
                         "interpreter); none found")
    timing = _timing(args)
    device = torch.cuda.get_device_name()
    print(f"persistent-grid forward and backward steps (the plan's backward: the grid's or "
          f"the split-K kernel's) vs the bare grid barriers of each launch on {device}, "
          f"T={args.time}, {args.dtype} (target: ratio <= 2)")
    path = None
    if args.out is not None:
        _check_output(args.out, "--out")
        path = args.out / f"barrier-{device.replace(' ', '-')}-{_dt.date.today().isoformat()}.json"
    _note_ignored(args, cpu=False)
    # Tagged as the bench reports are (design: JSON with GPU, commit and versions): a row's
    # microseconds belong to the kernels of one commit on one GPU, timed one way.
    header = {"device": device, "environment": environment(torch.device("cuda")),
              "command": ["tritonrnn", *(argv or [])], "time": args.time,
              "dtype": args.dtype, "timing": timing.describe("cuda")}
    done: list[dict] = []

    def on_row(row: dict) -> None:
        print(format_rows([row]).splitlines()[1], flush=True)
        done.append(row)
        if path is not None:  # after every shape: a run cut short keeps what it finished
            write_json_atomic(path, {**header, "rows": done}, sort_keys=False)

    rows = run(args.time, dtypes[args.dtype], timing, shapes, on_row=on_row)
    print(format_rows(rows))
    if path is not None:
        print(f"wrote {path}")
    return 0


# ----------------------------------------------------------------------------- entry point


def _run(args, argv: list[str]) -> int:
    if args.command == "bench":
        return cmd_bench(args, argv)
    if args.command == "check":
        return cmd_check(args)
    if args.command == "tune":
        return cmd_tune(args)
    if args.command == "barrier":
        return cmd_barrier(args, argv)
    if args.command == "aot":
        return cmd_aot(args)
    return cmd_plan(args)


def _stdout_to_devnull() -> None:
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a test's capture): nothing flushes it later
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tritonrnn` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help
            return int(e.code or 0)
        if args.command is None:
            raise UsageError("expected a command: bench, check, tune, plan, aot or barrier (see "
                             "--help)")
        if getattr(args, "device", None) is not None:
            # First of all: the interpreter must be chosen before triton is imported.
            _device(args.device)
        rc = _run(args, argv)
        sys.stdout.flush()  # a closed pipe fails here, not at the interpreter's exit
        return rc
    except BrokenPipeError:
        # The reader went away (`tritonrnn plan | head -1`): no message, the exit status of
        # a process killed by SIGPIPE, and stdout pointed at /dev/null so that the flush at
        # the interpreter's exit does not fail again (Python's documented recipe).
        _stdout_to_devnull()
        return 128 + signal.SIGPIPE
    except UsageError as e:
        print(f"tritonrnn: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as e:
        # The library validates at its boundary; its message names the argument.
        print(f"tritonrnn: error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"tritonrnn: error: a required module is missing: {e}".splitlines()[0],
              file=sys.stderr)
        return 1
    except OSError as e:  # an output that failed after the up-front checks (a full disk)
        print(f"tritonrnn: error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tritonrnn: interrupted", file=sys.stderr)
        return 130

