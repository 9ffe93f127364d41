"""The Triton engine backend: runs each recurrence with the kernel family the planner picks.

The engine (rnn/engine.py) calls `forward`/`backward` once per unidirectional layer with the
reference recurrence's contract, and `forward_bidir`/`backward_bidir` once per bidirectional
layer with both directions' tensors as pairs. This class asks the planner for that shape's
LayerPlan (cached) and dispatches to the persistent-CTA, persistent-grid/stepwise launchers, or
to the reference recurrence for float64. A bidirectional layer's two directions share each
launch (programs split between them: one launch for the persistent families, one per sub-step
for stepwise), except where the pair's persistent grid would not be co-resident: then each
direction gets its own persistent launch. A kernel that Triton refuses at launch for needing
more of the device than it has is replaced by a smaller plan (`TritonRecurrence._run`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from triton.runtime.errors import OutOfResources

from . import reference
from .config import GATES
from .planner import (
    DeviceProperties,
    LayerPlan,
    _bucket,
    device_properties,
    recurrence_choice,
    smaller_choice,
    split_k_launch,
)


def _dir(pair, d: int):
    """Direction d's tensor of a pair argument (None when absent)."""
    return pair[d] if pair is not None else None


class TritonRecurrence:
    name = "triton"

    def __init__(self) -> None:
        # (pass, shape, plan) -> the plan run instead, once `plan`'s kernel was refused for
        # needing more of the device than it has (`_run`). Process-wide, like Triton's own
        # kernel cache: a refused compile is never launched again.
        self._smaller: dict[tuple, LayerPlan] = {}

    def properties(self, device: torch.device) -> DeviceProperties:
        """The device properties this backend plans for (`planner.device_properties` of the
        tensors' device). Tools that plan for another device (`tritonrnn aot`'s presets)
        override this, and `plan_choice`."""
        return device_properties(device)

    def plan_choice(self, shape: tuple) -> tuple[LayerPlan, str]:
        """(plan, source): the planner's choice for a recurrence given as `_shape` makes it
        (`recurrence_choice`; source is heuristic, tuned or constrained). Tools that fix the
        plan override this."""
        return recurrence_choice(*shape)

    def _choice(self, cell, R, Pw, batch, num_dirs, phase) -> tuple[LayerPlan, str, tuple]:
        """(plan, source, shape) for `_run`: the plan that runs `phase` of this recurrence is
        the planner's, or what replaced it after a launch needed more than the device has
        (not a plan forced with plan_constraints: that one runs, or its error is raised)."""
        shape = _shape(cell, R, Pw, batch, num_dirs, self.properties(R.device))
        lp, source = self.plan_choice(shape)
        if source != "constrained":
            lp = self._replaced(phase, shape, lp)
        return lp, source, shape

    def _replaced(self, phase: str, shape: tuple, lp: LayerPlan) -> LayerPlan:
        """lp, or the plan that replaced it for `phase` of `shape` (`_run`), transitively."""
        while (key := _replaced_key(phase, shape, lp)) in self._smaller:
            lp = self._smaller[key]
        return lp

    def plans_run(self, shape: tuple) -> tuple[LayerPlan, LayerPlan]:
        """The plans that run the forward and the backward of a recurrence given as `_shape`
        makes it: the planner's choice, or what replaced it after a launch needed more than
        the device has. The layer pipeline bounds the layers it keeps in flight by their
        programs (`pipeline.stack_plans`): a replacement may be another family with more
        programs (a refused persistent CTA runs as a persistent grid). A plan forced with
        plan_constraints is never replaced (`_choice`)."""
        lp, source = self.plan_choice(shape)
        if source == "constrained":
            return lp, lp
        return self._replaced("forward", shape, lp), self._replaced("backward", shape, lp)

    def replacements(self, cell: str, H: int, P: int, dtype: torch.dtype, batch: int,
                     device: torch.device) -> list[tuple[str, LayerPlan, LayerPlan]]:
        """(pass, refused plan, plan run instead) for every replacement made so far in this
        process for recurrences of this cell, size, dtype and batch bucket on `device`'s
        properties (either direction count), in the order they were made: what a report of
        those runs must name as run."""
        want = (cell, H, P or H, P, dtype, _bucket(batch), self.properties(device))
        out = []
        for key, ran in list(self._smaller.items()):  # another thread's _run may add one
            phase, *shape, _num_dirs, refused = key  # `_replaced_key`'s fields
            if tuple(shape) == want:
                out.append((phase, refused, ran))
        return out

    def _run(self, phase: str, choice: tuple[LayerPlan, str, tuple],
             launch: Callable[[LayerPlan], None]) -> None:
        """Launches `choice`'s plan. A kernel that Triton refuses at launch for needing more
        shared memory (or threads) than the device has (OutOfResources: the planner's
        estimates are calibrated on one compiler, `planner.smaller_choice`) is replaced by
        the next smaller plan, with a warning, and the replacement is kept for later calls of
        the same pass and shape. Nothing ran before the refusal (it comes at the first
        launch's load), so the outputs are written once, by the plan that ran. A plan forced
        with plan_constraints is not replaced: the error names it."""
        lp, source, shape = choice
        cell, H, _, P, dtype, batch, _, _ = shape
        while True:
            try:
                launch(lp)
                return
            except OutOfResources as err:
                smaller = None if source == "constrained" else smaller_choice(lp, *shape)
                what = (f"the {lp.family} {phase} kernel ({_tiles(lp)}) for {cell} H={H}"
                        f"{f' P={P}' if P else ''} {dtype} B={batch}")
                if smaller is None:
                    err.add_note(f"tritonrnn: {what}" + (", forced by plan_constraints"
                                 if source == "constrained" else ": no smaller plan is left"))
                    raise
                warnings.warn(f"tritonrnn: {what} needs more than this device has ({err}); "
                              f"running {smaller.family} ({_tiles(smaller)}) instead",
                              RuntimeWarning, stacklevel=4)
                self._smaller[_replaced_key(phase, shape, lp)] = smaller
                lp = smaller

    def forward(self, cell, xg, R, bR, Pw, h0, c0, info, reverse, y, c_seq, hT, cT) -> None:
        args = (cell, xg, R, bR, Pw, h0, c0, info, reverse, y, c_seq, hT, cT)
        self._run("forward", self._choice(cell, R, Pw, info.B, 1, "forward"),
                  lambda lp: _forward_launch(lp, args))

    def backward(self, cell, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info,
                 reverse, dpre_x, dpre_h, dh0, dc0, dh_total, m_seq) -> None:
        args = (cell, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info,
                reverse, dpre_x, dpre_h, dh0, dc0, dh_total, m_seq)
        choice = self._choice(cell, R, Pw, info.B, 1, "backward")
        self._run("backward", choice, lambda lp: _backward_launch(lp, choice[2], args))

    # A bidirectional layer runs the pair key's plan (the planner's choice for num_dirs = 2,
    # its tuning entry or constraints): both directions in one launch where it says so
    # (LayerPlan.num_dirs = 2), else one launch per direction on that same plan, not the
    # one-direction key's (whose tuning entry, or heuristic, may differ from what a tuning run
    # of the pair key timed).

    def forward_bidir(self, cell, xg, R, bR, Pw, h0, c0, info, y, c_seq, hT, cT) -> None:
        """Both directions of a bidirectional layer; every tensor argument is a pair
        (direction 0, direction 1) with `forward`'s per-direction shapes, or None."""
        args = (cell, xg, R, bR, Pw, h0, c0, info, y, c_seq, hT, cT)

        def launch(lp: LayerPlan) -> None:
            if not self._shares_launch(lp):
                for d in range(2):
                    _forward_launch(lp, (cell, *(_dir(t, d) for t in (xg, R, bR, Pw, h0, c0)),
                                         info, d == 1,
                                         *(_dir(t, d) for t in (y, c_seq, hT, cT))))
            elif lp.family == "persistent_cta":
                from tritonrnn.kernels.persistent_cta import cta_forward_pair

                cta_forward_pair(*args, block_b=lp.block_b, num_warps=lp.num_warps)
            else:
                from tritonrnn.kernels.persistent_grid import grid_forward_pair

                _with_stepwise_fallback(grid_forward_pair, args, lp)

        self._run("forward", self._choice(cell, R[0], _dir(Pw, 0), info.B, 2, "forward"),
                  launch)

    def backward_bidir(self, cell, pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT,
                       info, dpre_x, dpre_h, dh0, dc0, dh_total, m_seq) -> None:
        """Both directions' backward; pairs as in `forward_bidir`, and one launch per
        direction where the plan's backward is the split-K kernel's."""
        ins = (pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT)
        outs = (dpre_x, dpre_h, dh0, dc0, dh_total, m_seq)
        args = (cell, *ins, info, *outs)
        choice = self._choice(cell, R[0], _dir(Pw, 0), info.B, 2, "backward")

        def launch(lp: LayerPlan) -> None:
            if not self._shares_launch(lp) or lp.split_k_bwd:
                for d in range(2):
                    _backward_launch(lp, choice[2], (cell, *(_dir(t, d) for t in ins), info,
                                                     d == 1, *(_dir(t, d) for t in outs)))
            elif lp.family == "persistent_cta":
                from tritonrnn.kernels.persistent_cta import cta_backward_pair

                cta_backward_pair(*args, block_b=lp.block_b, num_warps=lp.backward_warps)
            else:
                from tritonrnn.kernels.persistent_grid import grid_backward_pair

                _with_stepwise_fallback(grid_backward_pair, args, lp, backward=True)

        self._run("backward", choice, launch)

    @staticmethod
    def _shares_launch(lp: LayerPlan) -> bool:
        """Whether both directions go into one launch: the planner's pair decision
        (LayerPlan.num_dirs = 2; a persistent grid gets it only when both directions'
        programs are co-resident together, so a barrier never waits on a program that cannot
        start), never for the reference family."""
        return lp.family != "reference" and lp.num_dirs == 2


def _shape(cell: str, R: torch.Tensor, Pw, batch: int, num_dirs: int,
           props: DeviceProperties) -> tuple:
    """A recurrence as the planner takes it (`recurrence_choice`'s and `smaller_choice`'s
    arguments): (cell, H, Hout, P, dtype, batch, device properties, num_dirs)."""
    H = R.shape[0] // GATES[cell]
    P = Pw.shape[0] if Pw is not None else 0
    return cell, H, R.shape[1], P, R.dtype, batch, props, num_dirs


def _replaced_key(phase: str, shape: tuple, lp: LayerPlan) -> tuple:
    """TritonRecurrence._smaller's key: the pass, the shape as the planner keys it (the batch
    by its power-of-two bucket) and the plan that was refused."""
    cell, H, Hout, P, dtype, batch, props, num_dirs = shape
    return phase, cell, H, Hout, P, dtype, _bucket(batch), props, num_dirs, lp


def _forward_launch(lp: LayerPlan, args: tuple) -> None:
    """One direction's forward (`TritonRecurrence.forward`'s arguments) on lp's kernel."""
    if lp.family == "reference":
        reference.recurrence_forward(*args)
    elif lp.family == "persistent_cta":
        from tritonrnn.kernels.persistent_cta import cta_forward

        cta_forward(*args, block_b=lp.block_b, num_warps=lp.num_warps)
    else:
        from tritonrnn.kernels.persistent_grid import grid_forward

        _with_stepwise_fallback(grid_forward, args, lp)


def _backward_launch(lp: LayerPlan, shape: tuple, args: tuple) -> None:
    """One direction's backward (`TritonRecurrence.backward`'s arguments) on lp's kernel:
    the split-K kernel's where lp names it (`planner.split_k_launch`; shape: the recurrence
    as `_shape` gives it)."""
    cell, H, _, _, dtype, batch, props, _ = shape
    if lp.family == "reference":
        reference.recurrence_backward(*args)
    elif lp.family == "persistent_cta":
        from tritonrnn.kernels.persistent_cta import cta_backward

        cta_backward(*args, block_b=lp.block_b, num_warps=lp.backward_warps)
    elif (split := split_k_launch(lp, cell, H, batch, dtype, props)) is not None:
        _split_k_backward(lp, split, args)
    else:
        from tritonrnn.kernels.persistent_grid import grid_backward

        _with_stepwise_fallback(grid_backward, args, lp, backward=True)


def _split_k_backward(lp: LayerPlan, split, args: tuple) -> None:
    """One direction's backward (args: `TritonRecurrence.backward`'s, without a projection:
    Pw, dh_total and m_seq None) on the split-K kernel: `split`, lp's launch
    (`planner.split_k_launch`), on lp's backward warps, persistent for a persistent_grid plan
    (rerun stepwise where that launch fails, `_persistent_or_stepwise`), stepwise for a
    stepwise one."""
    from tritonrnn.kernels.split_k import split_k_backward

    (cell, pre_x, pre_h, R, _Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info, reverse, dpre_x,
     dpre_h, dh0, dc0, _dh_total, _m_seq) = args
    _persistent_or_stepwise(lambda persistent: split_k_backward(
        cell, pre_x, pre_h, R, y, h_prev, c_seq, c_prev, dy, dhT, dcT, info, reverse, dpre_x,
        dpre_h, dh0, dc0, units=split.units, kblock=split.kblock, btile=split.btile,
        one_barrier=split.one_barrier, num_warps=lp.backward_warps, persistent=persistent),
        lp.family)


def _tiles(lp: LayerPlan) -> str:
    """A plan's tiles in a few words, for messages."""
    from tritonrnn.kernels.split_k import FORM_NAMES

    if lp.family == "persistent_cta":
        return f"block_b={lp.block_b}"
    weights = f"streamed/{lp.block_k}" if lp.block_k else "resident"
    if lp.num_stages:
        weights += f" on {lp.num_stages} stages" + (
            f" (backward {lp.backward_stages})" if lp.backward_stages != lp.num_stages else "")
    bwd = (f" (backward {lp.backward_block_h} x {lp.backward_block_b})"
           if lp.own_backward_tiles else "")
    split = f", split-K backward ({FORM_NAMES[lp.split_k_bwd]})" if lp.split_k_bwd else ""
    return f"{lp.block_h} x {lp.block_b} tiles{bwd}, weights {weights}{split}"


def _with_stepwise_fallback(launch, args, lp: LayerPlan, backward: bool = False) -> None:
    """Runs a grid-family launcher. A persistent launch that raises RuntimeError is rerun
    stepwise (every output is rewritten, so the result is the same): a cooperative launch the
    driver refuses, or, with TRITONRNN_BARRIER_CHECK=sync, a grid barrier that timed out
    (e.g. another process holding SMs). In the default deferred mode a timeout is reported by
    a later launch or `check_barriers()` instead (kernels/grid_barrier.py); reported by this
    launch's call, an earlier launch's timeout propagates (its outputs are invalid and may
    have been read since: rerunning this launch would hide that behind a warning), and so
    does an error raised after this launch ran (`_persistent_or_stepwise`)."""
    tiles = dict(block_h=lp.block_h, block_b=lp.block_b, block_k=lp.block_k,
                 num_warps=lp.num_warps, num_stages=lp.num_stages)
    if backward:  # the backward's own tiles (and stages) where the plan gives it some
        tiles.update(block_h=lp.backward_block_h, block_b=lp.backward_block_b,
                     num_warps=lp.backward_warps, num_stages=lp.backward_stages,
                     pair_gates=lp.pair_gates)
    _persistent_or_stepwise(lambda persistent: launch(*args, persistent=persistent, **tiles),
                            lp.family)


class StepwiseFallbackWarning(RuntimeWarning):
    """A persistent-grid launch failed and its pass ran stepwise (`_persistent_or_stepwise`):
    its outputs are right, its time is the stepwise kernels' (tune refuses such a timing)."""


def _persistent_or_stepwise(run: Callable[[bool], None], family: str) -> None:
    """run(persistent) for a grid-family plan: stepwise for the stepwise family; persistent
    for persistent_grid, rerun stepwise where it raises RuntimeError (`_with_stepwise_fallback`
    says when), an earlier launch's barrier timeout excepted, and an error raised after the
    launch ran (`grid_barrier.check_flags`' bookkeeping: the kernel may have written over its
    inputs, so a rerun would compute from them)."""
    if family != "persistent_grid":
        run(False)
        return
    try:
        run(True)
    except RuntimeError as err:
        if getattr(err, "earlier", False) or getattr(err, "after_launch", False):
            raise  # another launch's barrier timeout, or this launch ran
        warnings.warn(f"tritonrnn: persistent-grid launch failed ({err}); rerunning stepwise",
                      StepwiseFallbackWarning, stacklevel=4)
        run(False)


_BACKEND = TritonRecurrence()


def triton_recurrence() -> TritonRecurrence:
    return _BACKEND
