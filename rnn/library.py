"""torch.library registration of the CudnnRNN V3 ops, so torch.compile traces them.

`tritonrnn.rnn.cudnn_rnn` (rnn/ops.py) reads the sequence lengths on the host and picks its
work from them, which a compiler cannot trace. Registered as custom ops they are opaque nodes
of the graph instead: Dynamo and AOTAutograd see only their schema, a fake implementation that
gives the output shapes, and the autograd formula (which calls the backprop op, itself a
custom op). Eager calls go through the same ops, so compiled and eager runs share one path;
the ops' bodies run with autocast off on the input's device (a compiled graph runs them
outside autocast too), so the dtype of a call is that of its inputs, eager or compiled.

Ops (namespace `tritonrnn`):

- `tritonrnn::cudnn_rnn`: forward; returns (output, output_h, output_c, reserve_space,
  host_reserved) exactly as `rnn.ops.cudnn_rnn`, with two differences that keep compiled graphs
  whole (no graph break): the dropout seeds may come as an int64 tensor `seeds` = [seed,
  seed2] (read inside the op, by the forward and again by the backward op: on a GPU a host
  sync each, as the lengths' reads are; the modules pass both on the CPU), and every output
  is materialized in the layout the fake gives (contiguous time-major tensors; batch-major
  ones are transposed views of contiguous time-major storage, which is what the op returns
  anyway).
- `tritonrnn::cudnn_rnn_backprop`: the gradients, from the forward's saved tensors.

The reserve space's size is 256 + itemsize * N * D * (L * H * [lstm] + (L - 1) * Hout) bytes
(rnn/reserve.py) with N = sum(sequence_lengths): a data-dependent size when lengths are given,
so the fake allocates it with an unbacked symbolic size (`new_dynamic_size`).

Use `cudnn_rnn` below (same arguments as `rnn.ops.cudnn_rnn`, plus `seeds`).
"""

from __future__ import annotations

import contextlib
import json

import torch

from . import ops
from .config import (
    DIRECTIONS,
    GATES,
    RNN_MODES,
    check_choice,
    check_dropout,
    check_int,
    check_int64,
)
from .params import check_dense
from .planner import current_constraints, plan_constraints
from .reserve import HEADER_BYTES, PAYLOAD_OFFSET


def _batch_major_like(t: torch.Tensor) -> torch.Tensor:
    """t ([B, X, C], batch-major) as a transposed view of contiguous [X, B, C] storage."""
    if t.transpose(0, 1).is_contiguous():
        return t
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def _layout(t: torch.Tensor, time_major: bool) -> torch.Tensor:
    """The layout the fake implementation promises for 3-D outputs."""
    return t.contiguous() if time_major else _batch_major_like(t)


def _empty_layout(shape: tuple, time_major: bool, like: torch.Tensor) -> torch.Tensor:
    if time_major:
        return like.new_empty(shape)
    return like.new_empty((shape[1], shape[0], *shape[2:])).transpose(0, 1)


def _seeds(seeds: torch.Tensor | None, seed: int, seed2: int) -> tuple[int, int]:
    if seeds is None:
        return seed, seed2
    if seeds.dtype != torch.int64 or tuple(seeds.shape) != (2,):
        raise ValueError(
            f"seeds: expected an int64 tensor [seed, seed2] of shape [2], got "
            f"{seeds.dtype} of shape {list(seeds.shape)}"
        )
    a, b = seeds.tolist()
    return int(a), int(b)


def _autocast_off(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast disabled on t's device for the op's body. The caller picks the op's dtype by
    casting its inputs (the modules do under autocast); a caller's autocast left on inside
    would re-cast the body's own math (the reference recurrence's float32 GEMMs) to its dtype,
    so eager calls would differ from compiled ones, whose graphs run the op outside autocast."""
    if torch.amp.is_autocast_available(t.device.type):
        return torch.autocast(t.device.type, enabled=False)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- forward op


@torch.library.custom_op("tritonrnn::cudnn_rnn", mutates_args=())
def _cudnn_rnn_op(
    input: torch.Tensor,
    input_h: torch.Tensor,
    input_c: torch.Tensor | None,
    params: torch.Tensor,
    sequence_lengths: torch.Tensor | None,
    seeds: torch.Tensor | None,
    rnn_mode: str,
    input_mode: str,
    direction: str,
    dropout: float,
    seed: int,
    seed2: int,
    num_proj: int,
    is_training: bool,
    time_major: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    seed, seed2 = _seeds(seeds, seed, seed2)
    with _autocast_off(input):
        out = ops.cudnn_rnn(
            input, input_h, input_c, params, sequence_lengths, rnn_mode=rnn_mode,
            input_mode=input_mode, direction=direction, dropout=dropout, seed=seed,
            seed2=seed2, num_proj=num_proj, is_training=is_training, time_major=time_major,
            backend=backend,
        )
    output_c = _layout(out.output_c, time_major) if rnn_mode == "lstm" else out.output_c
    return (
        _layout(out.output, time_major),
        _layout(out.output_h, time_major),
        output_c,
        out.reserve_space,
        out.host_reserved,
    )


def _static(*tensors) -> bool:
    """Whether every size of `tensors` (None skipped) is a plain int: a fake traced with
    dynamic shapes (torch.compile's dynamic=True, or after a recompile) holds symbols."""
    return all(type(d) is int for t in tensors if isinstance(t, torch.Tensor) for d in t.shape)


def _check_fake(input, input_h, input_c, params, sequence_lengths, **attrs):
    """`ops.validate_shapes` where the sizes are plain ints (returns its (config, T, B)), else
    None after the checks that symbolic sizes allow: the attributes' choices and the states'
    ranks (a wrong rank would be an IndexError in the fake's indexing). The real op checks
    the rest when it runs."""
    if _static(input, input_h, input_c, params, sequence_lengths):
        return ops.validate_shapes(input, input_h, input_c, params, sequence_lengths, **attrs)
    check_choice("rnn_mode", attrs["rnn_mode"], RNN_MODES)
    check_choice("direction", attrs["direction"], DIRECTIONS)
    ops._check_tensor("input", input, 3)
    ops._check_tensor("input_h", input_h, 3)
    if attrs["rnn_mode"] == "lstm":
        ops._check_tensor("input_c", input_c, 3)
    return None


@_cudnn_rnn_op.register_fake
def _cudnn_rnn_fake(
    input, input_h, input_c, params, sequence_lengths, seeds, rnn_mode, input_mode, direction,
    dropout, seed, seed2, num_proj, is_training, time_major, backend,
):
    # Shapes only: the checks that read no data (a fake cannot read lengths or seeds), so that
    # a bad argument is the eager call's named error under torch.compile and on meta tensors.
    _check_fake(input, input_h, input_c, params, sequence_lengths, rnn_mode=rnn_mode,
                input_mode=input_mode, direction=direction, dropout=dropout, seed=seed,
                seed2=seed2, num_proj=num_proj, time_major=time_major)
    lstm = rnn_mode == "lstm"
    D = 2 if direction == "bidirectional" else 1
    if time_major:
        T, B = input.shape[0], input.shape[1]
        LD, Hout = input_h.shape[0], input_h.shape[2]
    else:
        B, T = input.shape[0], input.shape[1]
        LD, Hout = input_h.shape[1], input_h.shape[2]
    H = input_c.shape[2] if lstm else Hout
    L = LD // D
    out_shape = (T, B, D * Hout) if time_major else (B, T, D * Hout)
    output = _empty_layout(out_shape, time_major, input)
    output_h = _empty_layout(tuple(input_h.shape), time_major, input_h)
    output_c = (
        _empty_layout(tuple(input_c.shape), time_major, input_c) if lstm
        else input.new_empty((0,))
    )
    if not is_training:
        reserve = input.new_empty((0,), dtype=torch.uint8)
        host = torch.empty((0,), dtype=torch.int8, device="cpu")
        return output, output_h, output_c, reserve, host
    per_row = D * (L * H * int(lstm) + (L - 1) * Hout) * input.element_size()
    if per_row == 0:
        nbytes = PAYLOAD_OFFSET
    elif sequence_lengths is None:
        nbytes = PAYLOAD_OFFSET + per_row * T * B
    else:
        # N = sum(lengths) is data, so the byte count is an unbacked size. It must be a bare
        # symbol (not 256 + k * N) for the compiler to bind it from the real output.
        nbytes = torch.library.get_ctx().new_dynamic_size(min=PAYLOAD_OFFSET)
        torch._check(nbytes <= PAYLOAD_OFFSET + per_row * T * B)
    reserve = input.new_empty((nbytes,), dtype=torch.uint8)
    host = torch.empty((HEADER_BYTES,), dtype=torch.int8, device="cpu")
    return output, output_h, output_c, reserve, host


# ----------------------------------------------------------------------------- backprop op


@torch.library.custom_op("tritonrnn::cudnn_rnn_backprop", mutates_args=())
def _cudnn_rnn_backprop_op(
    input: torch.Tensor,
    input_h: torch.Tensor,
    input_c: torch.Tensor | None,
    params: torch.Tensor,
    sequence_lengths: torch.Tensor | None,
    output: torch.Tensor,
    output_h: torch.Tensor,
    output_c: torch.Tensor | None,
    output_backprop: torch.Tensor,
    output_h_backprop: torch.Tensor,
    output_c_backprop: torch.Tensor | None,
    reserve_space: torch.Tensor,
    host_reserved: torch.Tensor | None,
    seeds: torch.Tensor | None,
    rnn_mode: str,
    input_mode: str,
    direction: str,
    dropout: float,
    seed: int,
    seed2: int,
    num_proj: int,
    time_major: bool,
    backend: str,
    constraints: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # constraints: the forward's plan_constraints as JSON, which the autograd backward
    # passes (it may run on another thread, and a compiled graph calls the op outside any
    # Python context of the backward's); "" for the caller's own.
    seed, seed2 = _seeds(seeds, seed, seed2)
    forced = (plan_constraints(**json.loads(constraints)) if constraints
              else contextlib.nullcontext())
    with _autocast_off(input), torch.no_grad(), forced:
        g = ops.cudnn_rnn_backprop(
            input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
            output_backprop, output_h_backprop, output_c_backprop, reserve_space,
            host_reserved, rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
            dropout=dropout, seed=seed, seed2=seed2, num_proj=num_proj,
            time_major=time_major, backend=backend,
        )
    d_c = g.input_c_backprop.contiguous() if rnn_mode == "lstm" else g.input_c_backprop
    # Fresh tensors: a gradient may not alias an input of the op.
    return (
        g.input_backprop.contiguous(),
        g.input_h_backprop.contiguous(),
        d_c,
        g.params_backprop.contiguous(),
    )


@_cudnn_rnn_backprop_op.register_fake
def _cudnn_rnn_backprop_fake(
    input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
    output_backprop, output_h_backprop, output_c_backprop, reserve_space, host_reserved, seeds,
    rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, time_major, backend,
    constraints="",
):
    checked = _check_fake(input, input_h, input_c, params, sequence_lengths,
                          rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
                          dropout=dropout, seed=seed, seed2=seed2, num_proj=num_proj,
                          time_major=time_major)
    if checked is not None and _static(output, output_h, output_c, output_backprop,
                                       output_h_backprop, output_c_backprop):
        ops.check_backprop_shapes(checked[0], checked[1], checked[2], input, input_h, input_c,
                                  output, output_h, output_c, output_backprop,
                                  output_h_backprop, output_c_backprop, time_major)
    d_c = (
        input_c.new_empty(input_c.shape) if rnn_mode == "lstm" else input.new_empty((0,))
    )
    return (
        input.new_empty(input.shape),
        input_h.new_empty(input_h.shape),
        d_c,
        params.new_empty(params.shape),
    )


def _backprop_backward(ctx, *grads):
    raise RuntimeError(ops.SECOND_ORDER_ERROR)


# The gradients have no gradient (TensorFlow's CudnnRNNBackpropV3 has none): an error, not
# torch's generic "no autograd formula", when a loss built from them is differentiated.
_cudnn_rnn_backprop_op.register_autograd(_backprop_backward)


# ----------------------------------------------------------------------------- autograd

_ATTRS = ("rnn_mode", "input_mode", "direction", "dropout", "seed", "seed2", "num_proj")


def _setup_context(ctx, inputs, output):
    (input, input_h, input_c, params, lengths, seeds, rnn_mode, input_mode, direction,
     dropout, seed, seed2, num_proj, is_training, time_major, backend) = inputs
    lstm = rnn_mode == "lstm"
    out, _, _, reserve, host = output
    ctx.attrs = dict(
        rnn_mode=rnn_mode, input_mode=input_mode, direction=direction, dropout=dropout,
        seed=seed, seed2=seed2, num_proj=num_proj, time_major=time_major, backend=backend,
    )
    ctx.is_training = is_training
    ctx.lstm = lstm
    # Autograd may run the backward on another thread (a CUDA backward: the device's), where
    # the caller's plan_constraints context is not set: carry it over, as rnn.ops does, as an
    # argument of the backprop op (a compiled graph keeps it; it keeps no Python context).
    ctx.constraints = json.dumps(current_constraints(), sort_keys=True)
    # Not output_h / output_c: the backprop op only checks their shapes (those of input_h /
    # input_c), and a saved final state could not be edited in place before backward, which
    # torch.nn allows.
    ctx.save_for_backward(
        input, input_h, input_c if lstm else None, params, lengths, seeds, out, reserve, host,
    )
    ctx.mark_non_differentiable(reserve, host)
    ctx.set_materialize_grads(False)  # no reserve-sized zeros for the backward to ignore


def _backward(ctx, d_out, d_h, d_c, _d_reserve, _d_host):
    if not ctx.is_training:
        raise ValueError(
            "is_training: expected True for a forward whose outputs are differentiated, "
            "got False (no reserve space was kept for backprop)"
        )
    input, input_h, input_c, params, lengths, seeds, out, reserve, host = ctx.saved_tensors
    d_out = torch.zeros_like(out) if d_out is None else d_out
    d_h = torch.zeros_like(input_h) if d_h is None else d_h
    if ctx.lstm:
        d_c = torch.zeros_like(input_c) if d_c is None else d_c
    else:
        d_c = None
    a = ctx.attrs
    # input_h / input_c stand for output_h / output_c (same shapes; see _setup_context).
    dx, dh, dc, dp = torch.ops.tritonrnn.cudnn_rnn_backprop(
        input, input_h, input_c, params, lengths, out, input_h, input_c, d_out, d_h, d_c,
        reserve, host, seeds, a["rnn_mode"], a["input_mode"], a["direction"], a["dropout"],
        a["seed"], a["seed2"], a["num_proj"], a["time_major"], a["backend"], ctx.constraints,
    )
    return (dx, dh, dc if ctx.lstm else None, dp) + (None,) * 12


_cudnn_rnn_op.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------- public API


def _check_devices(input, input_h, input_c, params, sequence_lengths, seeds,
                   is_training: bool) -> None:
    """The op's tensors on the input's device (lengths and seeds anywhere, but with data when
    the input has data). Checked before the op is called: the dispatcher runs a custom op's
    fake (shape-only) implementation as soon as one argument is on the meta device, which
    would return uninitialised tensors for a real input instead of rnn.ops' error."""
    dev = input.device
    for name, t in (("input", input), ("input_h", input_h), ("input_c", input_c),
                    ("params", params), ("sequence_lengths", sequence_lengths),
                    ("seeds", seeds)):
        ops.check_untransformed(name, t)
        if isinstance(t, torch.Tensor):  # (before the dispatcher, which has no sparse or
            check_dense(name, t)         # nested kernel of the op to name it)
    for name, t in (("input_h", input_h), ("input_c", input_c), ("params", params)):
        if t is not None:
            ops._check_device(name, t, dev)
    if dev.type == "meta":
        if is_training and sequence_lengths is not None:
            # The fake sizes the reserve from sum(lengths), which meta tensors cannot give.
            raise ValueError(
                "sequence_lengths: expected None for meta tensors with is_training=True (the "
                "reserve's size depends on the lengths, which a meta call cannot read), got a "
                "tensor"
            )
        return
    for name, t in (("sequence_lengths", sequence_lengths), ("seeds", seeds)):
        if t is not None and t.device.type == "meta":
            raise ValueError(
                f"{name}: expected a tensor with data (read on the host), got a tensor on the "
                f"meta device"
            )


def cudnn_rnn(
    input: torch.Tensor,
    input_h: torch.Tensor,
    input_c: torch.Tensor | None,
    params: torch.Tensor,
    sequence_lengths: torch.Tensor | None = None,
    *,
    rnn_mode: str = "lstm",
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
    seeds: torch.Tensor | None = None,
    num_proj: int = 0,
    is_training: bool = True,
    time_major: bool = True,
    backend: str = "auto",
) -> ops.CudnnRNNOutput:
    """`rnn.ops.cudnn_rnn` through the registered custom op: traceable by torch.compile
    (fullgraph) and differentiable with torch.autograd.

    Shapes as `rnn.ops.cudnn_rnn`: input [T, B, I] (time_major) or [B, T, I]; input_h
    [L*D, B, Hout] (or [B, L*D, Hout]); input_c likewise with H (LSTM, else None or ignored);
    params 1-D; sequence_lengths [B] int32/int64 or None. `seeds`, when given, is an int64
    tensor [seed, seed2] that replaces `seed`/`seed2` (read inside the op, so a compiled graph
    can draw fresh dropout seeds with torch.randint without a graph break).
    Returns CudnnRNNOutput(output, output_h, output_c, reserve_space, host_reserved).
    """
    if isinstance(rnn_mode, str) and rnn_mode != "lstm" and rnn_mode in GATES:
        ops.check_ignored_state("input_c", input_c, rnn_mode)
        input_c = None  # ignored for non-LSTM modes; None keeps it out of the graph
    seed = check_int64("seed", seed)  # the schema's int64 (as the op's), before torch's cast
    seed2 = check_int64("seed2", seed2)
    num_proj = check_int("num_proj", num_proj, minimum=0)
    for name, value in (("is_training", is_training), ("time_major", time_major)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    dropout = check_dropout(dropout)
    for name, value in (("rnn_mode", rnn_mode), ("input_mode", input_mode),
                        ("direction", direction), ("backend", backend)):
        if not isinstance(value, str):
            raise ValueError(f"{name}: expected a string, got {value!r}")
    for name, t in (("input", input), ("input_h", input_h), ("params", params)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if rnn_mode == "lstm" and not isinstance(input_c, torch.Tensor):
        raise TypeError(f"input_c: expected a tensor for rnn_mode='lstm', got "
                        f"{type(input_c).__name__}")
    if sequence_lengths is not None and not isinstance(sequence_lengths, torch.Tensor):
        raise TypeError(
            f"sequence_lengths: expected an int32/int64 tensor or None, got "
            f"{type(sequence_lengths).__name__}"
        )
    if seeds is not None and not isinstance(seeds, torch.Tensor):
        raise TypeError(f"seeds: expected an int64 tensor of shape [2] or None, got "
                        f"{type(seeds).__name__}")
    _check_devices(input, input_h, input_c if rnn_mode == "lstm" else None, params,
                   sequence_lengths, seeds, is_training)
    out = torch.ops.tritonrnn.cudnn_rnn(
        input, input_h, input_c, params, sequence_lengths, seeds, rnn_mode, input_mode,
        direction, dropout, seed, seed2, num_proj, is_training, time_major, backend,
    )
    return ops.CudnnRNNOutput(*out)
