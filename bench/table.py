"""Markdown table of committed benchmark JSON files (for the README's results section).

    python -m tritonrnn.bench.table bench/results/*.json
    python -m tritonrnn.bench.table --plot DIR bench/results/X.json   # and X.png in DIR again

`--plot DIR` also renders each report's sweep plot again (what `tritonrnn bench` wrote beside
it; a report brought back without its PNG, or one to view on another machine) as
DIR/<report's file stem>.png; it needs matplotlib (the `bench` extra).

Exit codes: 0 success, 1 --plot without matplotlib (after the table), 2 a file that cannot
be read, is not JSON, or is a tritonrnn.bench/1 report without a field the table needs, no
`tritonrnn bench` report among the files, or a --plot folder that does not exist (one line on
stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _ms(run: dict) -> str:
    """A run's median, or - where it did not run (reports from before torch-graph)."""
    return f"{run['ms']:.2f}" if run.get("status") == "ok" else "-"


def _x(speedup: float | None) -> str:
    return "-" if speedup is None else f"{speedup:.2f}x"


def split_k_ran(plan: dict) -> int:
    """The split-K form (LayerPlan.split_k_bwd) a report's backward ran: the planned
    recurrence's, unless the device refused that backward and another plan ran it (the
    plan's "replaced" records, whose last backward one is what ran)."""
    form = (plan.get("recurrence") or {}).get("split_k_bwd", 0)
    for replaced in plan.get("replaced", []):
        if replaced["pass"] == "backward":
            form = replaced["ran"].get("split_k_bwd", 0)
    return form


def _families(result: dict, pas: str = "fwd") -> str:
    """The family column: the plan's families (with "+ split-K bwd" for a pass with a
    backward where the split-K kernel ran it, `split_k_ran`), "plan error" where the
    planner refused the shape (the report's plan is {"error": ...}), - where the report has
    no plan."""
    plan = result.get("plan") or {}
    if "families" in plan:
        split = pas != "fwd" and split_k_ran(plan)
        return ",".join(plan["families"]) + (" + split-K bwd" if split else "")
    return "plan error" if "error" in plan else "-"


def rows(path: str) -> list[str]:
    """The table rows of one `tritonrnn bench` report file (ValueError: unreadable, not JSON)."""
    return report_rows(load(path))


def report_rows(report: dict) -> list[str]:
    """The table rows of a loaded `tritonrnn bench` report: one per tritonrnn run."""
    device = report["environment"]["device"]
    out = []
    for r in report["results"]:
        runs = {(x["impl"], x["pass"]): x for x in r["runs"]}
        for (impl, pas), run in sorted(runs.items()):
            if impl != "tritonrnn":
                continue
            base = runs.get(("torch", pas), {})
            graph = runs.get(("torch-graph", pas), {})
            fam = _families(r, pas)
            ratio = (r.get("reserve_ratio") or {}).get("torch")
            # varlen: against cuDNN's padded T * B rows, and per row (reports since
            # 2026-11-30 carry it)
            per_row = (r.get("reserve_ratio_per_row") or {}).get("torch")
            reserve = ("-" if ratio is None else f"{ratio:.2f}" if per_row is None
                       else f"{ratio:.2f} ({per_row:.2f} per row)")
            if run["status"] != "ok":
                out.append(f"| {device} | {r['label']} | {pas} | {fam} | failed | "
                           f"{_ms(base)} | - | {_ms(graph)} | - | - |")
                continue
            out.append(
                f"| {device} | {r['label']} | {pas} | {fam} | {run['ms']:.2f} | "
                f"{_ms(base)} | {_x(run.get('speedup_vs_torch'))} | {_ms(graph)} | "
                f"{_x(run.get('speedup_vs_torch_graph'))} | {reserve} |"
            )
    return out


def checked_rows(path: str, report: dict) -> list[str]:
    """report_rows of a loaded report; ValueError naming the file and the field when the report
    lacks one the table reads (or has one of another type)."""
    try:
        return report_rows(report)
    except KeyError as e:
        raise ValueError(f"{path}: expected a complete tritonrnn.bench/1 report, got one "
                         f"without the field {e}") from None
    except (TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{path}: expected a tritonrnn.bench/1 report, got a field of "
                         f"another type ({type(e).__name__}: {e})") from None


def load(path: str) -> object:
    """A JSON file's contents; ValueError naming the file when it cannot be read or parsed."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: expected a readable JSON file ({e.strerror or e})") from None
    except ValueError as e:  # json.JSONDecodeError, or bytes that are not UTF-8
        raise ValueError(f"{path}: expected a JSON file, got invalid JSON ({e})") from None


def _is_bench_report(report: object) -> bool:
    """`tritonrnn bench` reports only (barrier and ablation JSON files have other schemas)."""
    return isinstance(report, dict) and report.get("schema") == "tritonrnn.bench/1"


def main(argv: list[str] | None = None) -> int:
    """Prints the table; returns the exit code (2 with one line on stderr for a bad file,
    checked for every file before the table starts)."""
    ap = argparse.ArgumentParser(
        prog="python -m tritonrnn.bench.table",
        description="Markdown table of `tritonrnn bench` JSON reports (other JSON files are "
                    "skipped).")
    ap.add_argument("paths", nargs="+", metavar="JSON")
    ap.add_argument("--plot", metavar="DIR", type=Path,
                    help="also write each report's sweep plot as DIR/<file stem>.png")
    args = ap.parse_args(argv)
    try:
        reports = [(p, load(p)) for p in args.paths]
        lines = [line for p, report in reports if _is_bench_report(report)
                 for line in checked_rows(p, report)]
        if not any(_is_bench_report(report) for _, report in reports):
            raise ValueError(f"expected at least one tritonrnn.bench/1 report (`tritonrnn "
                             f"bench` JSON), got none among {len(reports)} file(s)")
        if args.plot is not None and not args.plot.is_dir():
            raise ValueError(f"--plot: expected an existing directory, got {args.plot}")
    except ValueError as e:
        print(f"{ap.prog}: error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    print("| device | shape | pass | family | tritonrnn ms | cuDNN ms | speedup "
          "| cuDNN-graph ms | speedup vs graph | reserve / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in lines:
        print(line)
    if args.plot is not None:
        return _plot(args.plot, [(p, r) for p, r in reports if _is_bench_report(r)], ap.prog)
    return 0


def _plot(folder: Path, reports: list[tuple[str, dict]], prog: str) -> int:
    """Each report's sweep plot as folder/<stem>.png; 1 without matplotlib (the table is
    printed by then)."""
    try:
        from .plot import plot_report

        for path, report in reports:
            print(f"wrote {plot_report(report, folder / (Path(path).stem + '.png'))}",
                  file=sys.stderr)
    except ImportError as e:
        print(f"{prog}: error: --plot needs matplotlib (pip install matplotlib): {e}"
              .splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
