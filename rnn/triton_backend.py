"""The Triton engine backend: runs each recurrence with the kernel family the planner picks.

The engine (rnn/engine.py) calls `forward`/`backward` once per unidirectional layer with the
reference recurrence's contract, and `forward_bidir`/`backward_bidir` once per bidirectional
layer with both directions' tensors as pairs. This class asks the planner for that shape's
LayerPlan (cached) and dispatches to the persistent-CTA, persistent-grid/stepwise launchers, or
to the reference recurrence for float64. A bidirectional layer's two directions share each
launch (programs split between them: one launch for the persistent families, one per sub-step
for stepwise), except where the pair's persistent grid would not be co-resident: then each
direction gets its own persistent launch.
"""

from __future__ import annotations

import warnings

import torch

from . import reference
from .planner import LayerPlan, device_properties, recurrence_choice


def _dir(pair, d: int):
    """Direction d's tensor of a pair argument (None when absent)."""
    return pair[d] if pair is not None else None


class TritonRecurrence:
    name = "triton"

    def choose(self, cell: str, R: torch.Tensor, Pw, batch: int, num_dirs: int = 1) -> LayerPlan:
        H = R.shape[0] // {"lstm": 4, "gru": 3}.get(cell, 1)
        Hout = R.shape[1]
        P = Pw.shape[0] if Pw is not None else 0
        props = device_properties(R.device)
        return recurrence_choice(cell, H, Hout, P, R.dtype, batch, props, num_dirs)[0]

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

            cta_backward(*args, block_b=lp.block_b, num_warps=lp.backward_warps)
        else:
            from tritonrnn.kernels.persistent_grid import grid_backward

            _with_stepwise_fallback(grid_backward, args, lp, backward=True)

    def forward_bidir(self, cell, xg, R, bR, Pw, h0, c0, info, y, c_seq, hT, cT) -> None:
        """Both directions of a bidirectional layer; every tensor argument is a pair
        (direction 0, direction 1) with `forward`'s per-direction shapes, or None."""
        lp = self.choose(cell, R[0], _dir(Pw, 0), info.B, num_dirs=2)
        if not self._shares_launch(lp):
            for d in range(2):
                self.forward(cell, *(_dir(t, d) for t in (xg, R, bR, Pw, h0, c0)), info, d == 1,
                             *(_dir(t, d) for t in (y, c_seq, hT, cT)))
            return
        args = (cell, xg, R, bR, Pw, h0, c0, info, y, c_seq, hT, cT)
        if lp.family == "persistent_cta":
            from tritonrnn.kernels.persistent_cta import cta_forward_pair

            cta_forward_pair(*args, block_b=lp.block_b, num_warps=lp.num_warps)
        else:
            from tritonrnn.kernels.persistent_grid import grid_forward_pair

            _with_stepwise_fallback(grid_forward_pair, args, lp)

    def backward_bidir(self, cell, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT,
                       info, dpre_x, dpre_h, dh0, dc0, dh_total, m_seq) -> None:
        """Both directions' backward; pairs as in `forward_bidir`."""
        lp = self.choose(cell, R[0], _dir(Pw, 0), info.B, num_dirs=2)
        ins = (pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT)
        outs = (dpre_x, dpre_h, dh0, dc0, dh_total, m_seq)
        if not self._shares_launch(lp):
            for d in range(2):
                self.backward(cell, *(_dir(t, d) for t in ins), info, d == 1,
                              *(_dir(t, d) for t in outs))
            return
        args = (cell, *ins, info, *outs)
        if lp.family == "persistent_cta":
            from tritonrnn.kernels.persistent_cta import cta_backward_pair

            cta_backward_pair(*args, block_b=lp.block_b, num_warps=lp.backward_warps)
        else:
            from tritonrnn.kernels.persistent_grid import grid_backward_pair

            _with_stepwise_fallback(grid_backward_pair, args, lp, backward=True)

    @staticmethod
    def _shares_launch(lp: LayerPlan) -> bool:
        """Whether both directions go into one launch: the planner's pair decision
        (LayerPlan.num_dirs = 2; a persistent grid gets it only when both directions'
        programs are co-resident together, so a barrier never waits on a program that cannot
        start), never for the reference family."""
        return lp.family != "reference" and lp.num_dirs == 2


def _with_stepwise_fallback(launch, args, lp: LayerPlan, backward: bool = False) -> None:
    """Runs a grid-family launcher. A persistent launch that raises RuntimeError is rerun
    stepwise (every output is rewritten, so the result is the same): a cooperative launch the
    driver refuses, or, with TRITONRNN_BARRIER_CHECK=sync, a grid barrier that timed out
    (e.g. another process holding SMs). In the default deferred mode a timeout is reported by
    a later launch or `check_barriers()` instead (kernels/grid_barrier.py)."""
    tiles = dict(block_h=lp.block_h, block_b=lp.block_b, block_k=lp.block_k,
                 num_warps=lp.backward_warps if backward else lp.num_warps)
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
