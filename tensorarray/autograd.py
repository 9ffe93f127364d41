"""Autograd for TensorArray ops: TensorFlow's gradient rules, ordered by the flow edge.

Each recorded op is a ``torch.autograd.Function`` whose inputs include the array's newest flow
(and, for writes, the value) and whose output is a new flow (writes) or the value (reads):

===================  ==============================================================
forward op           backward, on the gradient array of this backward pass
===================  ==============================================================
write(i, v)          ``dv = grad.read(i)``
read(i)              ``grad.write(i, dy)`` (adds to earlier writes)
scatter(idx, v)      ``dv = grad.gather(idx)``
gather(idx)          ``grad.scatter(idx, dy)`` (duplicate indices add)
unstack(v)           ``dv = grad.gather(range(n))`` (== stack)
stack()              ``grad.scatter(range(size), dy)`` (== unstack)
split(v, lengths)    ``dv = grad.concat()``
concat()             ``grad.split(dy, lengths)``
===================  ==============================================================

Every read consumes a flow produced by (or after) the write it reads, so PyTorch's engine runs
every read's backward, which writes into the gradient array, before the backward of the write,
which reads it: exactly the order TensorFlow's flow imposes.

The gradient array of a backward pass is keyed by a source derived from that pass's autograd
graph task, created by the first backward node that needs it and closed when the pass ends. Two
passes over one graph (``retain_graph=True``) therefore use separate accumulators and each gets
the exact gradient, never a sum of both.

Higher-order gradients are not supported (TensorFlow refuses the gradient of a gradient array):
a backward pass with ``create_graph=True`` through a TensorArray op raises.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd import Function

from .errors import TensorArrayGradError
from .resource import ArrayResource, new_flow

__all__ = [
    "AUTOGRAD_SOURCE_PREFIX",
    "ConcatFn",
    "GatherFn",
    "ReadFn",
    "ScatterFn",
    "SplitFn",
    "WriteFn",
    "autograd_source",
    "grad_resource",
]

AUTOGRAD_SOURCE_PREFIX = "autograd_pass_"


def autograd_source() -> str:
    """The gradient source of the running backward pass: unique per autograd graph task."""
    return f"{AUTOGRAD_SOURCE_PREFIX}{torch._C._current_graph_task_id()}"


class _ReleaseAtPassEnd:
    """Closes the gradient array of ``source`` when the backward pass ends, either way: the
    autograd engine calls its queued callbacks when a pass completes, and drops them
    uncalled with the pass when a node raises, which deletes this object."""

    __slots__ = ("res", "source")

    def __init__(self, res: ArrayResource, source: str) -> None:
        self.res, self.source = res, source

    def __call__(self) -> None:
        res, self.res = self.res, None
        if res is not None:
            res.release_grad(self.source)

    __del__ = __call__


def grad_resource(res: ArrayResource) -> ArrayResource:
    """The gradient array of ``res`` for the running backward pass (created on first use).

    It is closed when the pass ends (`_ReleaseAtPassEnd`), also when the pass fails, so its
    memory is freed and a later pass starts from a fresh accumulator.
    """
    source = autograd_source()
    with res.lock:
        handle = res.grads.get(source)
        if handle is None:
            handle = res.make_grad(source)
            torch.autograd.Variable._execution_engine.queue_callback(
                _ReleaseAtPassEnd(res, source))
    return handle._res


def _first_order(backward):
    """Refuse ``create_graph=True`` instead of silently dropping the second-order terms
    (gradient arrays store detached data). Otherwise grad mode is already off in a backward."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            raise TensorArrayGradError(
                f"TensorArray {ctx.res.name!r}: backward with create_graph=True expected "
                "first-order gradients only, got a request for a differentiable gradient; "
                "higher-order gradients through a TensorArray are not supported"
            )
        return backward(ctx, *grads)

    return wrapper


class WriteFn(Function):
    """flow_out = write(flow_in, value) at ``index``."""

    @staticmethod
    def forward(ctx, flow, value, res: ArrayResource, index: int):
        res.write(index, value, hist=True)
        ctx.res = res
        ctx.index = index
        return new_flow(flow)

    @staticmethod
    @_first_order
    def backward(ctx, grad_flow):
        g = grad_resource(ctx.res)
        grad = g.read(ctx.index)
        return grad_flow, grad, None, None


class ReadFn(Function):
    """value = read(flow, index)."""

    @staticmethod
    def forward(ctx, flow, res: ArrayResource, index: int):
        ctx.res = res
        ctx.index = index
        return res.read(index)

    @staticmethod
    @_first_order
    def backward(ctx, grad):
        g = grad_resource(ctx.res)
        g.write(ctx.index, grad)
        return None, None, None


class GatherFn(Function):
    """value = gather(flow, indices); ``indices=None`` is stack()."""

    @staticmethod
    def forward(ctx, flow, res: ArrayResource, indices: list[int] | None, op: str):
        ctx.res = res
        if indices is None:
            ctx.indices = list(range(res.size))
            return res.stack()
        ctx.indices = indices
        return res.gather(indices, op)

    @staticmethod
    @_first_order
    def backward(ctx, grad):
        g = grad_resource(ctx.res)
        g.scatter(ctx.indices, grad, op="scatter (gradient of gather/stack)")
        return None, None, None, None


class ScatterFn(Function):
    """flow_out = scatter(flow_in, indices, value); ``indices=None`` is unstack(value)."""

    @staticmethod
    def forward(ctx, flow, value, res: ArrayResource, indices: list[int] | None, op: str):
        ctx.res = res
        if indices is None:
            res.unstack(value, hist=True)
            indices = list(range(value.shape[0]))
        else:
            res.scatter(indices, value, op=op, hist=True)
        ctx.indices = indices
        return new_flow(flow)

    @staticmethod
    @_first_order
    def backward(ctx, grad_flow):
        if not ctx.indices:
            return grad_flow, None, None, None, None
        g = grad_resource(ctx.res)
        grad = g.gather(ctx.indices, op="gather (gradient of scatter/unstack)")
        return grad_flow, grad, None, None, None


class ConcatFn(Function):
    """value = concat(flow)."""

    @staticmethod
    def forward(ctx, flow, res: ArrayResource):
        value, lengths = res.concat()
        ctx.res = res
        ctx.lengths = lengths
        return value

    @staticmethod
    @_first_order
    def backward(ctx, grad):
        g = grad_resource(ctx.res)
        if len(ctx.lengths) != g.size:
            # The array grew after the concat (a dynamic array; the gradient array has its
            # size at the start of the backward). TensorFlow's rule, split of the gradient
            # array, fails the same way; say why in terms of the forward array.
            raise TensorArrayGradError(
                f"TensorArray {ctx.res.name!r}: gradient of concat(): expected the array's "
                f"size at the concat, {len(ctx.lengths)}, got {g.size} elements in its "
                "gradient array: it grew after the concat, and the concat's gradient (a split "
                "of the gradient array, as in TensorFlow) needs one length per element"
            )
        g.split(grad, ctx.lengths)
        return None, None


class SplitFn(Function):
    """flow_out = split(flow_in, value, lengths)."""

    @staticmethod
    def forward(ctx, flow, value, res: ArrayResource, lengths: list[int]):
        res.split(value, lengths, hist=True)
        ctx.res = res
        ctx.count = len(lengths)
        return new_flow(flow)

    @staticmethod
    @_first_order
    def backward(ctx, grad_flow):
        if ctx.count == 0:
            return grad_flow, None, None, None
        g = grad_resource(ctx.res)
        grad, _ = g.concat(count=ctx.count)
        return grad_flow, grad, None, None
