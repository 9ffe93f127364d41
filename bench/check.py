"""`tritonrnn check`: every mode x direction x varlen combination against the float64 oracle.

Each combination runs the op API (cudnn_rnn with is_training=True, then cudnn_rnn_backprop)
on the current device with the chosen backend, and compares output, output_h, output_c and
every gradient (input, initial states, params) with torch.nn in float64 (cuDNN off) on the
same weights. Variable-length cases use unsorted lengths with a length-0 sequence and a
length-1 sequence. Tolerances come from the dtype's rounding (oracle.tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from . import runners
from .presets import MODES, BenchShape

COLUMNS = ("y", "hT", "cT", "dx", "dh0", "dc0", "dparams")


@dataclass(frozen=True)
class CheckCase:
    shape: BenchShape
    lengths: list[int] | None

    @property
    def label(self) -> tuple[str, ...]:
        s = self.shape
        return (s.mode, "bi" if s.bidirectional else "uni", str(s.layers), str(s.proj),
                "varlen" if self.lengths is not None else "full")


def check_lengths(batch: int, time: int) -> list[int]:
    """Unsorted lengths with a full, a 0 and a 1-step sequence (cycled over the batch)."""
    pattern = [max(time - 2, 1), 0, time, 1, max(time // 2, 1)]
    return [pattern[b % len(pattern)] for b in range(batch)]


def check_cases(base: BenchShape, modes: tuple[str, ...] = MODES) -> list[CheckCase]:
    """The combinations: every mode x {uni, bi} x {full, varlen}, plus LSTM with a projection
    and two-layer stacks (the paths between layers)."""
    lens = check_lengths(base.batch, base.time)
    base = replace(base, varlen="none")  # lengths come from the case, not a distribution
    out: list[CheckCase] = []
    for mode in modes:
        for bi in (False, True):
            for varlen in (False, True):
                s = replace(base, mode=mode, bidirectional=bi, proj=0, layers=1)
                out.append(CheckCase(s, lens if varlen else None))
    if "lstm" in modes:
        proj = max(base.hidden // 2, 1)
        for bi in (False, True):
            out.append(CheckCase(replace(base, mode="lstm", bidirectional=bi, proj=proj,
                                         layers=1), lens))
        out.append(CheckCase(replace(base, mode="lstm", bidirectional=True, proj=0,
                                     layers=2), lens))
    if "gru" in modes:
        out.append(CheckCase(replace(base, mode="gru", bidirectional=False, proj=0,
                                     layers=2), lens))
    return out


def run_check(cases: list[CheckCase], device: torch.device, backend: str, seed: int = 0,
              progress: bool = True) -> list[dict]:
    """Runs every case; each row has the scaled errors, the tolerances and ok/error."""
    from .progress import progress_bar

    rows = []
    bar = progress_bar(len(cases), "tritonrnn check", progress)
    for case in cases:
        row = {"case": case.label, "shape": case.shape.as_dict(), "lengths": case.lengths}
        try:
            data = runners.build_case(case.shape, device, seed, lengths=case.lengths)
            result = runners.tritonrnn_runner(data, backend).correctness
            if device.type == "cuda":
                from tritonrnn.kernels.grid_barrier import check_barriers

                check_barriers()  # a failed barrier makes the row an error, not a result
            row.update(status="ok" if result["ok"] else "FAIL", **result)
        except Exception as e:  # a crash is a failed row, the table goes on
            row.update(status="ERROR", reason=f"{type(e).__name__}: {e}".splitlines()[0])
        rows.append(row)
        bar.update(1)
    bar.close()
    return rows


def format_check(rows: list[dict], device: str, backend: str, dtype: str) -> str:
    head = f"{'mode':<9}{'dir':<4}{'L':>2}{'P':>4} {'lengths':<7}"
    head += "".join(f"{c:>10}" for c in COLUMNS) + f"{'tol out/grad':>18}  status"
    lines = [f"tritonrnn check on {device}, backend={backend}, dtype={dtype}: max |got - ref| "
             "/ max(1, max |ref|) against torch.nn float64", head]
    for row in rows:
        mode, d, L, P, lens = row["case"]
        line = f"{mode:<9}{d:<4}{L:>2}{P:>4} {lens:<7}"
        if row["status"] == "ERROR":
            lines.append(f"{line} ERROR {row['reason']}")
            continue
        errs = row["scaled_error"]
        line += "".join(f"{errs[c]:>10.1e}" if c in errs else f"{'-':>10}" for c in COLUMNS)
        tol = row["tolerance"]
        line += f"{tol['output']:>9.1e}/{tol['gradient']:.1e}  {row['status']}"
        lines.append(line)
    bad = sum(r["status"] != "ok" for r in rows)
    lines.append(f"{len(rows) - bad}/{len(rows)} combinations pass" + (
        f"; {bad} FAILED" if bad else ""))
    return "\n".join(lines)
