"""The Triton engine backend: runs each recurrence with the kernel family the planner picks.

The engine (rnn/engine.py) calls `forward`/`backward` once per layer and direction with the
reference recurrence's contract; this class asks the planner for that shape's LayerPlan
(cached) and dispatches to the persistent-CTA, persistent-grid/stepwise launchers, or to the
reference recurrence for float64.
"""

from __future__ import annotations

import warnings

import torch

from . import reference
from .planner import LayerPlan, device_properties, recurrence_choice


class TritonRecurrence:
    name = "triton"

    def choose(self, cell: str, R: torch.Tensor, Pw, batch: int) -> LayerPlan:
        H = R.shape[0] // {"lstm": 4, "gru": 3}.get(cell, 1)
        Hout = R.shape[1]
        P = Pw.shape[0] if Pw is not None else 0
        props = device_properties(R.device)
        return recurrence_choice(cell, H, Hout, P, R.dtype, batch, props)[0]

    def forward(self, cell, xg, R, bR, Pw, h0, c0, info, reverse, y, c_seq, hT, cT) -> None:
        lp = self.choose(cell, R, Pw, info.B)
        args = (cell, xg, R, bR, Pw, h0, c0, info, reverse, y, c_seq, hT, cT)
        if lp.family == "reference":
            reference.recurrence_forward(*args)
        elif lp.family == "persistent_cta":
            from tritonrnn.kernels.persistent_cta import cta_forward

            cta_forward(*args, block_b=lp.block_b, num_warps=lp.num_warps)
        else:
            from tritonrnn.kernels.persistent_grid import grid_forward

            _with_stepwise_fallback(grid_forward, args, lp)

    def backward(self, cell, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info,
                 reverse, dpre_x, dpre_h, dh0, dc0, dh_total, m_seq) -> None:
        lp = self.choose(cell, R, Pw, info.B)
        args = (cell, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info,
                reverse, dpre_x, dpre_h, dh0, dc0, dh_total, m_seq)
        if lp.family == "reference":
            reference.recurrence_backward(*args)
        elif lp.family == "persistent_cta":
            from tritonrnn.kernels.persistent_cta import cta_backward

            cta_backward(*args, block_b=lp.block_b, num_warps=lp.num_warps)
        else:
            from tritonrnn.kernels.persistent_grid import grid_backward

            _with_stepwise_fallback(grid_backward, args, lp)


def _with_stepwise_fallback(launch, args, lp: LayerPlan) -> None:
    """Runs a grid-family launcher. A persistent launch whose grid barrier timed out (the
    launcher raises RuntimeError instead of hanging, e.g. when another process occupies SMs)
    is rerun stepwise: every output is rewritten, so the result is the same."""
    tiles = dict(block_h=lp.block_h, block_b=lp.block_b, num_warps=lp.num_warps)
    if lp.family != "persistent_grid":
        launch(*args, persistent=False, **tiles)
        return
    try:
        launch(*args, persistent=True, **tiles)
    except RuntimeError as err:
        warnings.warn(f"tritonrnn: persistent-grid launch failed ({err}); rerunning stepwise",
                      RuntimeWarning, stacklevel=3)
        launch(*args, persistent=False, **tiles)


_BACKEND = TritonRecurrence()


def triton_recurrence() -> TritonRecurrence:
    return _BACKEND
