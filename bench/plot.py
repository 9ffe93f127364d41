"""PNG plot of a benchmark sweep: time per shape for every implementation, one panel per pass,
and tritonrnn's speedup over the torch.nn (cuDNN) baseline."""

from __future__ import annotations

from pathlib import Path


def plot_report(report: dict, path: Path) -> Path:
    """Writes the sweep plot of `report` (harness.run_benchmark) to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    from .harness import display_name

    results = report["results"]
    labels = [r["label"] for r in results]
    passes = [p for p in ("fwd", "bwd", "fwdbwd")
              if any(run["pass"] == p for r in results for run in r["runs"])]
    impls = [i for i in ("tritonrnn", "torch", "torch-graph", "torch-packed", "flashrnn")
             if any(run["impl"] == i and run["status"] == "ok"
                    for r in results for run in r["runs"])]
    fig, axes = plt.subplots(2, max(len(passes), 1), squeeze=False,
                             figsize=(4.5 * max(len(passes), 1) + 1, 7.5))
    x = list(range(len(labels)))
    width = 0.8 / max(len(impls), 1)
    for col, p in enumerate(passes):
        ax, sp_ax = axes[0][col], axes[1][col]
        for k, impl in enumerate(impls):
            ms = []
            for r in results:
                run = next((q for q in r["runs"] if q["impl"] == impl and q["pass"] == p
                            and q["status"] == "ok"), None)
                ms.append(run["ms"] if run else float("nan"))
            ax.bar([i + (k - (len(impls) - 1) / 2) * width for i in x], ms, width,
                   label=display_name(impl, report))
        ax.set_title(f"{p}: median time")
        ax.set_ylabel("ms (lower is better)")
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        ax.legend(fontsize=7)
        bases = [b for b in ("torch", "torch-graph") if b in impls]
        bw = 0.6 / max(len(bases), 1)
        for k, base in enumerate(bases):
            speedups = []
            for r in results:
                run = next((q for q in r["runs"] if q["impl"] == "tritonrnn"
                            and q["pass"] == p and q["status"] == "ok"), None)
                sp = run.get("speedup_vs_" + base.replace("-", "_")) if run else None
                speedups.append(sp if sp is not None else float("nan"))
            sp_ax.bar([i + (k - (len(bases) - 1) / 2) * bw for i in x], speedups, bw,
                      label=f"vs {display_name(base, report)}")
        sp_ax.axhline(1.0, color="grey", linewidth=0.8)
        if bases:
            sp_ax.legend(fontsize=7)
        sp_ax.set_title(f"{p}: tritonrnn speedup vs cuDNN")
        sp_ax.set_ylabel("x (higher is better)")
        sp_ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
    env = report["environment"]
    note = "" if env["device_type"] == "cuda" else "  (CPU: timings say nothing about GPU speed)"
    fig.suptitle(f"tritonrnn bench '{report['preset']}' on {env['device']} "
                 f"@ {str(env['commit'])[:10]}{note}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
