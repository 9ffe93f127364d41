"""Markdown table of committed benchmark JSON files (for the README's results section).

    python -m tritonrnn.bench.table bench/results/*.json
"""

from __future__ import annotations

import argparse
import json


def _ms(run: dict) -> str:
    """A run's median, or - where it did not run (reports from before torch-graph)."""
    return f"{run['ms']:.2f}" if run.get("status") == "ok" else "-"


def _x(speedup: float | None) -> str:
    return "-" if speedup is None else f"{speedup:.2f}x"


def rows(path: str) -> list[str]:
    with open(path) as f:
        report = json.load(f)
    device = report["environment"]["device"]
    out = []
    for r in report["results"]:
        runs = {(x["impl"], x["pass"]): x for x in r["runs"]}
        for (impl, pas), run in sorted(runs.items()):
            if impl != "tritonrnn":
                continue
            base = runs.get(("torch", pas), {})
            graph = runs.get(("torch-graph", pas), {})
            fam = ",".join(r["plan"]["families"]) if r.get("plan") else "-"
            ratio = (r.get("reserve_ratio") or {}).get("torch")
            if run["status"] != "ok":
                out.append(f"| {device} | {r['label']} | {pas} | {fam} | failed | "
                           f"{_ms(base)} | - | {_ms(graph)} | - | - |")
                continue
            out.append(
                f"| {device} | {r['label']} | {pas} | {fam} | {run['ms']:.2f} | "
                f"{_ms(base)} | {_x(run.get('speedup_vs_torch'))} | {_ms(graph)} | "
                f"{_x(run.get('speedup_vs_torch_graph'))} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} |"
            )
    return out


def _is_bench_report(path: str) -> bool:
    """`tritonrnn bench` reports only (barrier and ablation JSON files have other schemas)."""
    with open(path) as f:
        report = json.load(f)
    return isinstance(report, dict) and report.get("schema") == "tritonrnn.bench/1"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m tritonrnn.bench.table",
        description="Markdown table of `tritonrnn bench` JSON reports (other JSON files are "
                    "skipped).")
    ap.add_argument("paths", nargs="+", metavar="JSON")
    args = ap.parse_args(argv)
    print("| device | shape | pass | family | tritonrnn ms | cuDNN ms | speedup "
          "| cuDNN-graph ms | speedup vs graph | reserve / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in args.paths:
        if not _is_bench_report(p):
            continue
        for line in rows(p):
            print(line)


if __name__ == "__main__":
    main()
