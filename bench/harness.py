"""The benchmark harness: runs a sweep of shapes, times every implementation and pass, checks
correctness against the float64 oracle, and assembles the JSON report.

Per shape: build the data once (runners.Case); compute the float64 torch.nn oracle on the
same device; for each implementation run every pass once (warm-up, Triton compilation and the
correctness figures), then time each pass (timing.measure), then take its peak memory in one
more, separate call (torch.cuda.max_memory_allocated above what was allocated before it).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import runners
from .oracle import tolerance, uses_tf32
from .presets import BenchShape, dtype_name
from .roofline import PASSES, Ceilings, flops, measure_ceilings, min_bytes
from .timing import TimingConfig, measure, synchronize

SCHEMA = "tritonrnn.bench/1"
IMPLS = ("tritonrnn", "torch", "torch-graph", "torch-packed", "flashrnn")
# The cuDNN baselines a speedup is given against (`_derive`: speedup_vs_<name>).
BASELINES = ("torch", "torch-graph", "torch-packed")


# ----------------------------------------------------------------------------- environment


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def source_hash(root: Path | None = None) -> str:
    """sha256 over the package's Python sources (relative path and bytes of every .py file
    under kernels/, rnn/, tensorarray/ and bench/): names the code that ran even where git's
    HEAD does not (a copied work tree, an uncommitted change). `git archive` of a commit
    gives the same files to hash."""
    import hashlib

    root = root or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in ("kernels", "rnn", "tensorarray", "bench"):
        for f in sorted((root / sub).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cpu_model() -> str:
    """The host CPU's model name where Linux gives it (/proc/cpuinfo), else what `platform`
    knows (on Linux often only the architecture)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass  # not Linux: platform's answer below
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """Device, commit and versions that tag a report."""
    import triton

    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else f"CPU {platform.machine()}"
    status = _git("status", "--porcelain", "--untracked-files=no")
    try:
        import flashrnn  # noqa: F401

        flash = getattr(flashrnn, "__version__", "installed")
    except Exception:  # optional dependency, any failure means absent
        flash = None
    return {
        "device": name,
        "device_type": device.type,
        "gpu_found": torch.cuda.is_available(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "cpu": cpu_model(),
        "commit": _git("rev-parse", "HEAD") or "unknown",
        "dirty": bool(status) if status is not None else None,
        "source_sha256": source_hash(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        # The float32 math each side ran: cuDNN's RNNs in TF32 unless this is off (torch's
        # default: on), tritonrnn's kernels and the fp32 matmul ceiling IEEE unless
        # matmul_tf32 (default off). fp32 shapes compare the two as they are.
        "tf32": {"cudnn": bool(torch.backends.cudnn.allow_tf32),
                 "matmul": bool(torch.backends.cuda.matmul.allow_tf32)},
        "flashrnn": flash,
        "python": platform.python_version(),
        "platform": platform.platform(),
        # The kernel and planner switches set (kernels/NOTES.md, "Switches"): an ablation's
        # report says which variant ran. Not TRITONRNN_CACHE_DIR: a folder of this machine,
        # not a switch (each result's plan says whether a tuned entry chose it: "source").
        "switches": {k: v for k, v in sorted(os.environ.items())
                     if k.startswith("TRITONRNN_") and k != "TRITONRNN_CACHE_DIR"},
    }


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


# ----------------------------------------------------------------------------- running


@dataclass
class BenchOptions:
    device: torch.device
    backend: str = "auto"
    passes: tuple[str, ...] = PASSES
    impls: tuple[str, ...] = IMPLS
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0


def _peak_bytes(fn, device: torch.device, setup=None) -> int | None:
    """Bytes one call of fn allocates at its peak above what was held before it; with
    `setup`, setup() runs first, outside the window, and the call is fn(setup's result)."""
    if device.type != "cuda":
        return None
    state = setup() if setup is not None else None
    synchronize("cuda")
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = fn(state) if setup is not None else fn()
    synchronize("cuda")
    peak = torch.cuda.max_memory_allocated(device) - base
    del result, state
    return int(peak)


def _plan_summary(shape: BenchShape) -> dict:
    """The planner's choice for a shape on the current device (or why there is none)."""
    try:
        from tritonrnn.rnn.planner import plan_for

        plan = plan_for(
            rnn_mode=shape.mode, input_size=shape.input, num_units=shape.hidden,
            num_layers=shape.layers, direction=shape.direction, num_proj=shape.proj,
            batch=shape.batch, max_time=shape.time, dtype=shape.torch_dtype,
        )
    except Exception as e:  # reported in the JSON, never fatal to a run
        return {"error": f"{type(e).__name__}: {e}"}
    return {
        "key": plan.key,
        "source": plan.source,
        "families": sorted({lp.family for lp in plan.layers}),
        # Every recurrence gets the same choice: its tiles and warps say what was timed.
        "recurrence": asdict(plan.layers[0]),
        "reserve_bytes": plan.reserve_bytes,
        "peak_bytes": plan.peak_bytes,
        # The layer pipeline as planned at T = max_time (chunks 1: off, with the reason).
        "pipeline": (None if plan.pipeline is None else {
            "chunks": plan.pipeline.chunks, "width": plan.pipeline.width,
            "backward_width": plan.pipeline.backward_width,
            "source": plan.pipeline.source, "reason": plan.pipeline.reason,
            "extra_bytes": plan.pipeline_extra_bytes}),
    }


def _check_barriers(dev: torch.device) -> None:
    """Raises if a persistent-grid launch since the last check had a barrier time out (the
    launches report it asynchronously, kernels/grid_barrier.py)."""
    if dev.type == "cuda":
        from tritonrnn.kernels.grid_barrier import check_barriers

        check_barriers()


def _runner(impl: str, case: runners.Case, opts: BenchOptions) -> runners.Runner | str:
    """A runner, or the reason this implementation does not run on this case."""
    if impl == "torch-packed" and case.lengths is None:
        return "skip: fixed-length input (torch-packed is the varlen baseline)"
    why = {"flashrnn": runners.flashrnn_unsupported,
           "torch-graph": runners.graph_unsupported}.get(impl, lambda _case: None)(case)
    if why:
        return f"skip: {why}"
    try:
        if impl == "tritonrnn":
            return runners.tritonrnn_runner(case, opts.backend)
        if impl in ("torch", "torch-packed"):
            return runners.torch_runner(case, packed=impl == "torch-packed")
        if impl == "torch-graph":
            return runners.torch_graph_runner(case)
        return runners.flashrnn_runner(case)
    except Exception as e:  # one failing implementation must not end the run
        return f"error: {type(e).__name__}: {e}".splitlines()[0]


def run_shape(shape: BenchShape, opts: BenchOptions, ceilings: Ceilings, tick=None) -> dict:
    """Benchmarks one shape; returns its JSON record (see `SCHEMA` in the README)."""
    tick = tick or (lambda _msg: None)
    dev = opts.device
    case = runners.build_case(shape, dev, opts.seed)
    tick(f"{shape.label}: float64 oracle")
    runners.compute_oracle(case)
    record: dict = {
        "label": shape.label,
        "shape": shape.as_dict(),
        "tokens": case.tokens,
        "lengths": None if case.lengths is None else {
            "min": min(case.lengths), "max": max(case.lengths),
            "mean": sum(case.lengths) / len(case.lengths),
        },
        "plan": _plan_summary(shape),
        "implementations": {},
        "runs": [],
    }
    for impl in opts.impls:
        runner = _runner(impl, case, opts)
        entry: dict = {}
        record["implementations"][impl] = entry
        if isinstance(runner, str):
            entry["status"] = runner.split(":", 1)[0]
            entry["reason"] = runner.split(":", 1)[1].strip()
            for p in opts.passes:
                tick(f"{shape.label}: {impl} {p} ({entry['status']})")
            continue
        entry.update(status="ok", correctness=runner.correctness,
                     correctness_note=runner.correctness_note or None,
                     reserve_bytes=runner.reserve_bytes, reserve_note=runner.reserve_note,
                     **runner.info)
        if impl == "tritonrnn":
            entry["backend"] = opts.backend
        for p in opts.passes:
            tick(f"{shape.label}: {impl} {p}")
            fn = runner.passes[p]
            run = {"impl": impl, "pass": p}
            try:
                fn()  # one more warm-up, right before timing
                t = measure(fn, dev.type, opts.timing)
                if runner.peak_bytes is not None:
                    peak = runner.peak_bytes[p]
                elif p in runner.peak_runs:
                    setup, peak_run = runner.peak_runs[p]
                    peak = _peak_bytes(peak_run, dev, setup)
                else:
                    peak = _peak_bytes(fn, dev)
                _check_barriers(dev)  # a timed run whose grid barrier failed is no result
                run.update(status="ok", **t.as_dict(), peak_bytes=peak)
            except Exception as e:  # recorded, the sweep goes on
                run.update(status="error", reason=f"{type(e).__name__}: {e}".splitlines()[0])
            record["runs"].append(run)
        del runner
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    _record_replacements(record, shape, opts)
    _compare_with_baseline(record, case)
    _derive(record, case, ceilings)
    return record


def _record_replacements(record: dict, shape: BenchShape, opts: BenchOptions) -> None:
    """Names in the report's plan each pass whose planned kernel the device refused, and the
    plan that ran (and was timed) instead (`TritonRecurrence._run`): the planned
    `recurrence` alone would name a kernel that never ran."""
    if "tritonrnn" not in opts.impls or "error" in record["plan"]:
        return
    from tritonrnn.rnn.triton_backend import _BACKEND, _tiles

    done = _BACKEND.replacements(shape.mode, shape.hidden, shape.proj, shape.torch_dtype,
                                 shape.batch, opts.device)
    if done:
        record["plan"]["replaced"] = [
            {"pass": phase, "refused": asdict(refused), "ran": asdict(ran),
             "summary": f"{refused.family} ({_tiles(refused)}) refused by the device, ran "
                        f"{ran.family} ({_tiles(ran)})"}
            for phase, refused, ran in done]


BASELINE_FACTOR = 4.0


def _compare_with_baseline(record: dict, case: runners.Case) -> None:
    """Holds tritonrnn's errors to the baseline's (torch.nn in the same dtype, on the same
    data): each scaled error must be <= max(4 x the baseline's, one step's rounding bound).

    The dtype bound alone grows with sqrt(T) and is vacuous for bf16 at T = 1024 (the cells'
    contraction keeps real errors far below it); an implementation that is a few times less
    accurate than cuDNN in the same dtype is a bug worth a failure."""
    tr = record["implementations"].get("tritonrnn", {})
    name = "torch-packed" if case.lengths is not None else "torch"
    base = record["implementations"].get(name, {})
    if not (tr.get("correctness") and base.get("correctness")):
        return
    s = case.shape
    K = max(s.input, s.num_dirs * s.out_size) + s.out_size
    floor = tolerance(s.torch_dtype, K=K, steps=1, tf32=uses_tf32(case.device))
    verdicts = {}
    for key, err in tr["correctness"]["scaled_error"].items():
        b = base["correctness"]["scaled_error"].get(key)
        if b is not None:
            verdicts[key] = {"ratio": err / b if b > 0 else None,
                             "ok": err <= max(BASELINE_FACTOR * b, floor)}
    ok = all(v["ok"] for v in verdicts.values())
    tr["correctness"]["vs_baseline"] = {
        "baseline": name, "factor": BASELINE_FACTOR, "floor": floor, "tensors": verdicts,
        "ok": ok,
    }
    tr["correctness"]["ok"] = tr["correctness"]["ok"] and ok


def _derive(record: dict, case: runners.Case, ceilings: Ceilings) -> None:
    """TFLOP/s, % of roofline and speedups of every timed run."""
    shape = case.shape
    impls = record["implementations"]
    mine = impls.get("tritonrnn", {}).get("reserve_bytes")
    record["reserve_ratio"] = {
        base: mine / impls[base]["reserve_bytes"]
        for base in ("torch", "torch-packed")
        if mine and impls.get(base, {}).get("reserve_bytes")
    }
    # torch's padded run keeps T * B rows in its reserve where tritonrnn keeps the N =
    # sum(lengths) rows that run, so on varlen shapes its ratio includes N / (T * B); per row
    # it is the same configuration's (torch-packed, where it runs cuDNN, keeps N rows too).
    rows = shape.time * shape.batch
    if "torch" in record["reserve_ratio"] and case.tokens != rows:
        record["reserve_ratio_per_row"] = {
            "torch": record["reserve_ratio"]["torch"] * rows / case.tokens}
    by_key = {(r["impl"], r["pass"]): r for r in record["runs"] if r["status"] == "ok"}
    for run in record["runs"]:
        if run["status"] != "ok":
            continue
        f = flops(shape, case.tokens, run["pass"])
        b = min_bytes(shape, case.tokens, run["pass"])
        roof_ms, bound = ceilings.roofline(f, b, shape.dtype)
        run["flops"] = f
        run["bytes"] = b
        run["tflops"] = f / (run["ms"] * 1e-3) / 1e12
        run["roofline_ms"] = roof_ms
        run["bound"] = bound
        run["pct_roofline"] = 100.0 * roof_ms / run["ms"]
        for base in BASELINES:
            other = by_key.get((base, run["pass"]))
            key = "speedup_vs_" + base.replace("-", "_")
            run[key] = other["ms"] / run["ms"] if other else None


def run_benchmark(shapes: list[BenchShape], opts: BenchOptions, *, progress: bool = True,
                  preset: str = "custom", argv: list[str] | None = None,
                  checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Runs every shape and returns the whole report.

    `checkpoint`, when given, receives the report of the shapes done so far (with
    "partial": true) after each shape, so that a run cut off (a lease or a time limit) still
    leaves its finished shapes behind (write_report puts it in <stem>.partial.json).
    """
    from .progress import progress_bar

    dtypes = sorted({s.torch_dtype for s in shapes}, key=str)
    per_shape = 1 + len(opts.impls) * len(opts.passes)
    bar = progress_bar(1 + per_shape * len(shapes), "tritonrnn bench", progress, unit="step")

    def tick(msg: str) -> None:
        bar.set_postfix_str(msg[:60], refresh=False)
        bar.update(1)

    # One time for the run: its checkpoints and the final report carry it, and the report's
    # file name its date (a run past midnight UTC writes over its own checkpoints).
    created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    try:
        tick("measuring the roofline (copy, matmul)")
        ceilings = measure_ceilings(opts.device, dtypes, opts.timing)
        env = environment(opts.device)
        results = []
        for shape in shapes:
            results.append(run_shape(shape, opts, ceilings, tick))
            if checkpoint is not None and len(results) < len(shapes):
                checkpoint({**_report(results, opts, ceilings, env, dtypes, preset, argv,
                                      created), "partial": True})
    finally:
        bar.close()
    return _report(results, opts, ceilings, env, dtypes, preset, argv, created)


def _report(results: list[dict], opts: BenchOptions, ceilings: Ceilings, env: dict,
            dtypes: list, preset: str, argv: list[str] | None, created: str) -> dict:
    failures = []
    for r in results:
        if "tritonrnn" not in r["implementations"]:
            continue  # not selected (--impl): only the baselines ran, nothing of ours failed
        tr = r["implementations"]["tritonrnn"]
        if tr.get("status") != "ok":
            failures.append(f"{r['label']}: tritonrnn {tr.get('status')}: {tr.get('reason')}")
        elif tr["correctness"] and not tr["correctness"]["ok"]:
            c = tr["correctness"]
            why = []
            if c.get("missing"):
                why.append(f"without {', '.join(c['missing'])}")
            if not c["within_tolerance"]:
                why.append("outside the dtype tolerance")
            if c.get("vs_baseline") and not c["vs_baseline"]["ok"]:
                why.append("more than 4x the baseline's error")
            failures.append(f"{r['label']}: tritonrnn {' and '.join(why)}")
        failures += [f"{r['label']}: tritonrnn {run['pass']} {run['reason']}"
                     for run in r["runs"] if run["impl"] == "tritonrnn"
                     and run["status"] != "ok"]
    return {
        "schema": SCHEMA,
        "created": created,
        "command": ["tritonrnn", *(argv or [])],
        "preset": preset,
        "environment": env,
        "backend": opts.backend,
        "dtypes": [dtype_name(d) for d in dtypes],
        "timing": opts.timing.describe(opts.device.type),
        "roofline": ceilings.as_dict(),
        "formulas": {
            "flops": "fwd = sum over layers, directions of 2*N*G*H*(in_l + Hout) + 2*N*P*H; "
            "bwd = 2*fwd; fwdbwd = 3*fwd; N = sum(lengths) (padding is not useful work)",
            "bytes": "compulsory traffic: inputs, outputs, LSTM cell states, params (and "
            "their gradients), states; see tritonrnn.bench.roofline",
            "pct_roofline": "100 * max(flops/matrix_peak, bytes/memory_peak) / measured time",
            "speedup": "baseline ms / implementation ms, same pass (speedup_vs_<baseline>: "
            "torch = cuDNN through torch.nn, launched eagerly; torch_graph = the same passes "
            "replayed from CUDA graphs, no host launches; torch_packed = PackedSequence input, "
            "which torch runs with its native kernels, not cuDNN, in bfloat16: see each "
            "implementation's rnn_backend)",
            "peak_bytes": "torch.cuda.max_memory_allocated during one call, above the "
            "memory allocated before it (null on the CPU); torch-graph: what the pass's "
            "capture allocated (its graph's memory pool)",
            "reserve_ratio": "tritonrnn's reserve_space bytes / cuDNN's reserve (from "
            "CudnnRnnBackward0._saved_result3); the design's target is <= 0.3",
        },
        "results": results,
        "failures": failures,
    }


def _options_slug(options: dict) -> str:
    """{"time": 2, "pass": "fwd"} -> "-time-2-pass-fwd" (a report file name's options)."""
    return "-" + device_slug("-".join(f"{k}-{v}" for k, v in options.items()))


def report_path(report: dict, out_dir: Path, *, partial: bool = False) -> Path:
    """Where write_report puts `report`: <device>-<date>-<preset>.json under out_dir. A custom
    shape (no preset) adds its label, <device>-<date>-custom-<label>.json: two custom runs into
    one directory (gpu_session.sh's `vector` stage, LSTM then GRU) must not overwrite each
    other's report; a preset whose shape options were overridden adds them
    (<device>-<date>-anchor-dtype-fp16.json), never over the preset's own report. A run of
    fewer passes, other implementations or another backend than the defaults adds them too
    (<device>-<date>-grid-pass-fwdbwd.json, ...-impl-torch-backend-reference.json): a
    `--pass fwd` run and a `--pass bwd` run of one preset used to share a file, the second
    replacing the first. partial: the checkpoint file beside it, <stem>.partial.json."""
    date = report["created"][:10]
    stem = f"{device_slug(report['environment']['device'])}-{date}-{report['preset']}"
    if report["preset"] == "custom" and report["results"]:
        stem += "-" + device_slug(report["results"][0]["label"])
    elif report.get("overrides"):  # a preset with shape options overridden
        stem += _options_slug(report["overrides"])
    if report.get("selection"):  # run options other than the defaults
        stem += _options_slug(report["selection"])
    return out_dir / f"{stem}{'.partial' if partial else ''}.json"


def write_report(report: dict, out_dir: Path) -> Path:
    """Writes `report` under out_dir (report_path); returns its path.

    A checkpoint ("partial": true) goes to <stem>.partial.json, never over <stem>.json: a
    rerun cut short (Ctrl-C, a time limit) leaves the finished report of an earlier run of
    the same name as it was. The complete report is written to <stem>.json, then the
    checkpoint file is removed."""
    from tritonrnn.rnn.planner import write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    partial = bool(report.get("partial"))
    path = report_path(report, out_dir, partial=partial)
    # Replaced whole (each checkpoint too): a write cut short (a kill, a full disk) leaves
    # the last complete file, never a truncated one.
    write_json_atomic(path, report, sort_keys=False)
    if not partial:
        report_path(report, out_dir, partial=True).unlink(missing_ok=True)
    return path


# ----------------------------------------------------------------------------- table


def _fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ran_cudnn(impl: str, report: dict) -> bool | None:
    """Whether every run of a torch.nn baseline in the report went through cuDNN (True),
    none did (False) or some did (None). torch sends a bfloat16 PackedSequence to its native
    CUDA kernels, not cuDNN (the padded path takes cuDNN; an H200 run of the varlen shapes
    found no CudnnRnnBackward node): the runners record it as `rnn_backend`. Reports from
    before that field count as cuDNN."""
    ran = {e.get("rnn_backend", "cuDNN").startswith("cuDNN")
           for r in report["results"]
           if (e := r["implementations"].get(impl, {})).get("status") == "ok"}
    return None if len(ran) > 1 else (ran.pop() if ran else True)


def display_name(impl: str, report: dict) -> str:
    gpu = report["environment"]["device_type"] == "cuda"
    if not gpu:
        return {"torch": "torch-cpu", "torch-packed": "torch-cpu-packed",
                "torch-graph": "cuDNN-graph"}.get(impl, impl)
    if impl in ("torch", "torch-packed"):
        cudnn = _ran_cudnn(impl, report)
        base = "cuDNN" if cudnn else ("torch-native" if cudnn is False else "torch")
        return base + ("-packed" if impl == "torch-packed" else "")
    return {"torch-graph": "cuDNN-graph"}.get(impl, impl)


def format_table(report: dict) -> str:
    """The human-readable summary printed after a run."""
    lines = []
    header = (f"{'pass':<7}{'impl':<17}{'ms (p20-p80)':>24}{'TFLOP/s':>9}{'%roof':>7}"
              f"{'speedup':>9}{'vs graph':>9}{'peak mem':>11}")
    for r in report["results"]:
        lines.append("")
        lines.append(f"== {r['label']}  (N={r['tokens']} tokens)")
        lines.append(header)
        for run in r["runs"]:
            name = display_name(run["impl"], report)
            if run["status"] != "ok":
                lines.append(f"{run['pass']:<7}{name:<17}  error: {run['reason']}")
                continue
            ms = f"{run['ms']:.3f} ({run['ms_p20']:.3f}-{run['ms_p80']:.3f})"
            sp, sg = run.get("speedup_vs_torch"), run.get("speedup_vs_torch_graph")
            lines.append(
                f"{run['pass']:<7}{name:<17}{ms:>24}{run['tflops']:>9.3g}"
                f"{run['pct_roofline']:>6.1f}%{(f'{sp:.2f}x' if sp else '-'):>9}"
                f"{(f'{sg:.2f}x' if sg else '-'):>9}{_fmt_bytes(run['peak_bytes']):>11}"
            )
        unsettled = [f"{display_name(run['impl'], report)} {run['pass']}" for run in r["runs"]
                     if run.get("warmup_settled") is False]
        if unsettled:  # timing.measure's CPU warm-up stopped at its cap
            lines.append(f"  warm-up did not settle (timing.measure's cap): "
                         f"{', '.join(unsettled)}; their times may include warm-up")
        for impl, e in r["implementations"].items():
            name = display_name(impl, report)
            if e["status"] != "ok":
                lines.append(f"  {name}: {e['status']} ({e['reason']})")
                continue
            c = e.get("correctness")
            if c:
                verdict = "ok" if c["ok"] else "FAIL"
                acc = (f"max scaled error {c['max_scaled_error']:.2e} "
                       f"(tol out {c['tolerance']['output']:.1e} / grad "
                       f"{c['tolerance']['gradient']:.1e}")
                vs = c.get("vs_baseline")
                if vs:
                    ratios = [v["ratio"] for v in vs["tensors"].values() if v["ratio"]]
                    acc += (f"; <= max({vs['factor']:g}x {display_name(vs['baseline'], report)}"
                            f", {vs['floor']:.1e}), worst ratio {max(ratios, default=0):.2f}")
                acc += f") {verdict}"
            else:
                acc = e.get("correctness_note") or "not compared"
            algo = e.get("cudnn_algo")
            algo = f"; cuDNN algorithm fwd {algo['fwd']}, bwd {algo['bwd']}" if algo else ""
            lines.append(f"  {name}: reserve {_fmt_bytes(e.get('reserve_bytes'))}; {acc}{algo}")
        for base, ratio in r.get("reserve_ratio", {}).items():
            lines.append(f"  reserve tritonrnn / {display_name(base, report)}: {ratio:.3f}")
        plan = r["plan"]
        if "error" in plan:
            lines.append(f"  plan: n/a ({plan['error']})")
        else:
            from tritonrnn.bench.table import split_k_ran
            from tritonrnn.kernels.split_k import FORM_NAMES

            form = split_k_ran(plan)
            split = f", backward split-K ({FORM_NAMES[form]})" if form else ""
            lines.append(f"  plan: {', '.join(plan['families'])}{split} ({plan['source']}), "
                         f"planned reserve {_fmt_bytes(plan['reserve_bytes'])}")
            for replaced in plan.get("replaced", []):
                lines.append(f"  {replaced['pass']}: {replaced['summary']}")
    roof = report["roofline"]
    lines.append("")
    lines.append(
        "roofline: memory {:.1f} GB/s, matrix {}".format(
            roof["memory_bytes_per_s"] / 1e9,
            ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s"
                      for k, v in roof["matrix_flops_per_s"].items()),
        )
    )
    if report["environment"]["device_type"] != "cuda":
        lines.append("(CPU: tiny shapes run from caches that the ceilings do not measure, so "
                     "%roof can pass 100; no CPU figure says anything about GPU speed)")
    return "\n".join(lines)
