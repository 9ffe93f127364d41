"""Chooses tests/version_probes.txt: the interpreter tests CI's Triton-version jobs run
(scripts/version_test_selection.sh), a small set that runs every line of kernels/ the whole
pool runs.

Those jobs run the kernels under an older Triton's interpreter (3.6, the GPU machines'; 3.4,
the oldest admitted) for what differs between releases: a `triton.language` API or behaviour
one of them lacks fails on the line that uses it. Every line the pool executes is one such
chance, and one test executing it is enough for that purpose (the main suite checks the
numerics on every case, under the newest Triton). The pool is the earlier rule: the kernel
test files whole, the grid, pair-launch and backend tests in their LSTM cases in forward time
order. The choice: run the pool once under coverage (a context per test) with its durations,
then greedily take the test that adds the most uncovered lines per second until every line
the pool covers is covered.

    .venv/bin/python -m pip install -e ".[probes]"   # coverage and pytest-cov
    PYTHONPATH=.triton36 TRITON_INTERPRET=1 .venv/bin/python scripts/version_probes.py

writes tests/version_probes.txt (run it again after a change to kernels/ or to the pool's
tests). Takes about 8 minutes on two cores (`--workers`). The file also lists every function
of kernels/ then, each marked with whether the pool ran it. tests/test_harness.py checks that
every listed test still exists and that kernels/ still has the listed functions, no more and
no fewer: a function added (or renamed) since would otherwise run under the older releases'
interpreters only if a probe happened to reach it. A line added inside a listed function is
not caught.
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "version_probes.txt"
POOL_FILES = [
    "tests/test_kernels_cta.py", "tests/test_cells.py", "tests/test_kernels_dropout.py",
    "tests/test_kernels_grid.py", "tests/test_bidir_launch.py", "tests/test_triton_backend.py",
    "tests/test_split_k.py",
]
POOL_K = ("not (test_kernels_grid or test_bidir_launch or test_triton_backend) or (lstm and "
          "not rev_dir and (test_kernels_grid or pair_launch or engine_pair or "
          "unidirectional_varlen_zero_lengths))")


FUNCTION_MARK = "# function "


def kernel_functions(root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """Every function and method of kernels/*.py (nested ones too), as "path::qualified.name"
    -> (first line, last line), the decorators included."""
    found: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    found[f"{path}::{name}"] = (first, child.end_lineno or child.lineno)
                visit(child, f"{name}.", path)

    for file in sorted((root / "kernels").glob("*.py")):
        path = file.relative_to(root).as_posix()
        visit(ast.parse(file.read_text(), filename=path), "", path)
    return found


def recorded_functions(text: str) -> dict[str, bool]:
    """The functions a probe list records: name -> whether the pool ran it."""
    recorded = {}
    for line in text.splitlines():
        if line.startswith(FUNCTION_MARK):
            mark, name = line[len(FUNCTION_MARK):].split(" ", 1)
            recorded[name] = mark == "+"
    return recorded


def functions_run(covered: set[tuple[str, int]]) -> dict[str, bool]:
    """Each function of kernels/ -> whether the pool ran one of its lines (a def or decorator
    line runs at import, outside every test's context, so in effect: one of its body's)."""
    lines_of: dict[str, list[int]] = collections.defaultdict(list)
    for path, line in covered:
        lines_of[path].append(line)
    ran = {}
    for name, (first, last) in kernel_functions().items():
        path = name.split("::", 1)[0]
        ran[name] = any(first <= line <= last for line in lines_of[path])
    return ran


def run_pool(data_dir: Path, workers: int) -> dict[str, float]:
    """Runs the pool under coverage; returns each test's seconds (setup, call, teardown)."""
    rc = data_dir / "coveragerc"
    rc.write_text(f"[run]\nsource = {ROOT / 'kernels'}\ndata_file = {data_dir / '.coverage'}\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
           "--cov", f"--cov-config={rc}", "--cov-context=test", "--cov-report=",
           "--durations=0", *POOL_FILES, "-k", POOL_K]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"the pool failed (exit {res.returncode}):\n{res.stdout[-3000:]}"
                 f"{res.stderr[-2000:]}")
    seconds: collections.Counter[str] = collections.Counter()
    for line in res.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)", line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    return seconds


def lines_per_test(data_file: Path) -> dict[str, set[tuple[str, int]]]:
    from coverage import CoverageData

    data = CoverageData(str(data_file))
    data.read()
    per: dict[str, set[tuple[str, int]]] = collections.defaultdict(set)
    for path in data.measured_files():
        name = os.path.relpath(path, ROOT)
        for line, contexts in data.contexts_by_lineno(path).items():
            for context in contexts:
                if context:  # "" is the code run outside any test (imports)
                    per[context.rsplit("|", 1)[0]].add((name, line))
    return per


def choose(per: dict[str, set], seconds: dict[str, float]) -> list[str]:
    """Greedy weighted set cover: most new lines per second (+0.5 s for a test's start)."""
    left = set().union(*per.values())
    chosen = []
    while left:
        best = max(sorted(per), key=lambda t: len(per[t] & left) / (seconds.get(t, 0) + 0.5))
        chosen.append(best)
        left -= per[best]
    return sorted(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1: the probes are interpreter runs")
    import triton

    with tempfile.TemporaryDirectory() as tmp:
        seconds = run_pool(Path(tmp), args.workers)
        per = lines_per_test(Path(tmp) / ".coverage")
    chosen = choose(per, seconds)
    lines = len(set().union(*per.values()))
    pool_s, chosen_s = sum(seconds.values()), sum(seconds.get(t, 0) for t in chosen)
    header = (
        f"# Written by scripts/version_probes.py ({datetime.date.today()}, Triton "
        f"{triton.__version__}): {len(chosen)} of the pool's {len(per)} tests, which run all "
        f"{lines} lines of kernels/ the pool runs\n# ({chosen_s:.0f} of {pool_s:.0f} "
        "test-seconds under coverage). Run by scripts/version_test_selection.sh's jobs.\n")
    ran = functions_run(set().union(*per.values()))
    header += (f"# The functions of kernels/ then, + where the pool ran them ({sum(ran.values())} "
               f"of {len(ran)}): tests/test_harness.py checks that kernels/ still has these.\n")
    OUT.write_text(header + "".join(f"{t}\n" for t in chosen)
                   + "".join(f"{FUNCTION_MARK}{'+' if r else '-'} {n}\n" for n, r in ran.items()))
    print(header, end="")


if __name__ == "__main__":
    main()
