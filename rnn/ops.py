"""Public ops: CudnnRNNV3 (`cudnn_rnn`) and CudnnRNNBackpropV3 (`cudnn_rnn_backprop`).

Both validate every argument here, at the public boundary, then hand packed time-major
tensors to the engine (rnn/engine.py) with the backend's recurrence. `cudnn_rnn` is also
differentiable with torch.autograd: its backward calls `cudnn_rnn_backprop` on the reserve.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd import forward_ad

from . import engine
from . import reserve as reserve_mod
from .config import RNNConfig, check_choice, check_int, make_config
from .interpreter import check_interpreter_in_effect, interpreter_requested
from .packing import MAX_ROWS, PackInfo, make_pack_info, pack, unpack
from .params import FLOAT_DTYPES, check_dense, check_params_tensor
from .planner import current_constraints, plan_constraints

BACKENDS = ("auto", "reference", "triton")


class CudnnRNNOutput(NamedTuple):
    output: torch.Tensor
    output_h: torch.Tensor
    output_c: torch.Tensor
    reserve_space: torch.Tensor
    host_reserved: torch.Tensor


class CudnnRNNBackpropOutput(NamedTuple):
    input_backprop: torch.Tensor
    input_h_backprop: torch.Tensor
    input_c_backprop: torch.Tensor
    params_backprop: torch.Tensor


# ----------------------------------------------------------------------------- validation


# autograd.grad(..., is_grads_batched=True) batches with torch's older vmap, whose tensors
# is_functorch_wrapped_tensor does not recognise.
_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)


def check_untransformed(name: str, t: object) -> None:
    """Refuses a tensor wrapped by a torch.func transform (grad, vmap, jacrev, ...) or by
    autograd.grad's is_grads_batched, or one carrying a forward-mode tangent
    (torch.autograd.forward_ad): the ops read lengths on the host and launch kernels on raw
    storage, and neither the custom ops nor their autograd have rules for those transforms
    or a forward-mode derivative. (A dual tensor's tangent was dropped without a word
    wherever no input needed a reverse-mode gradient.) A TypeError, as for every bad input
    (the spec's errors)."""
    if torch.compiler.is_compiling() or not isinstance(t, torch.Tensor):
        return  # Dynamo traces fake tensors, and cannot trace the functorch query
    functorch = torch._C._functorch
    if functorch.is_functorch_wrapped_tensor(t) or _legacy_batched(t):
        raise TypeError(
            f"{name}: expected a plain tensor, got one wrapped by a torch.func transform "
            f"(grad, vmap, jacrev, autograd.grad's is_grads_batched, ...); tritonrnn's ops "
            f"and modules do not compose with torch.func: differentiate with torch.autograd "
            f"(backward, torch.autograd.grad) and batch by concatenating along the batch axis"
        )
    if forward_ad.unpack_dual(t).tangent is not None:
        raise TypeError(
            f"{name}: expected a tensor without a forward-mode tangent, got a dual tensor "
            f"(torch.autograd.forward_ad); tritonrnn's ops have no forward-mode derivative: "
            f"differentiate in reverse mode (backward, torch.autograd.grad)"
        )


def _check_tensor(name: str, t: object, rank: int, dtype: torch.dtype | None = None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    check_untransformed(name, t)
    check_dense(name, t)
    if t.dim() != rank:
        raise ValueError(f"{name}: expected a rank-{rank} tensor, got shape {list(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (the input's), got {t.dtype}")
    return t


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)} ({what}), got {list(t.shape)}")


def _check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the input's), got {t.device}")


def check_ignored_state(name: str, t: object, rnn_mode: str) -> None:
    """A cell state argument of a non-LSTM mode: ignored, but None or a tensor."""
    if t is not None and not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name}: expected None or a tensor (ignored for rnn_mode={rnn_mode!r}), got "
            f"{type(t).__name__}"
        )


def _check_lengths_tensor(sequence_lengths: object, B: int, T: int) -> None:
    """sequence_lengths' type, dtype and shape (None: the rows T x B must fit the kernels'
    offsets); its values are `_lengths`' to read."""
    if sequence_lengths is None:
        if T * B > MAX_ROWS:  # (else make_pack_info's error, which names sequence_lengths)
            raise ValueError(f"input: expected max time x batch of at most {MAX_ROWS} (the "
                             f"kernels' int32 packed-row offsets), got {T} x {B} = {T * B}")
        return
    if not isinstance(sequence_lengths, torch.Tensor):
        raise TypeError(
            f"sequence_lengths: expected an int32/int64 tensor of shape [{B}] or None, got "
            f"{type(sequence_lengths).__name__}"
        )
    check_dense("sequence_lengths", sequence_lengths)
    if sequence_lengths.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"sequence_lengths: expected dtype int32 or int64, got {sequence_lengths.dtype}"
        )
    if tuple(sequence_lengths.shape) != (B,):
        raise ValueError(
            f"sequence_lengths: expected shape [{B}] (the batch), got "
            f"{list(sequence_lengths.shape)}"
        )


def _lengths(sequence_lengths: object, B: int, T: int) -> list[int]:
    """The lengths read on the host (their tensor checked by `_check_lengths_tensor`)."""
    if sequence_lengths is None:
        return [T] * B
    if sequence_lengths.is_meta:
        raise ValueError(
            "sequence_lengths: expected a tensor with data (the lengths are read on the host), "
            "got a tensor on the meta device"
        )
    lengths = sequence_lengths.tolist()
    check_length_values("sequence_lengths", lengths, T)
    return lengths


def check_length_values(name: str, values, T: int) -> None:
    """Each length in [0, T] (the modules' `lengths` too, before int64 could overflow)."""
    for b, n in enumerate(values):
        if not 0 <= n <= T:
            raise ValueError(f"{name}[{b}]: expected a length in [0, {T}] (max time), got {n}")


class _Call(NamedTuple):
    cfg: RNNConfig
    info: PackInfo
    T: int
    B: int


def _resolve_backend(backend: object, device: torch.device, dtype: torch.dtype):
    check_choice("backend", backend, BACKENDS)
    interpret = interpreter_requested()
    if backend == "auto":
        triton = device.type == "cuda" or (interpret and device.type == "cpu")
        backend = "triton" if triton else "reference"
    if backend == "reference":
        return engine.ReferenceRecurrence()
    if device.type == "meta":
        raise ValueError(
            "backend: 'triton' needs tensors with data, got tensors on the meta device (the "
            "'reference' backend, which 'auto' picks there, runs on meta tensors)"
        )
    if device.type != "cuda" and not interpret:
        raise ValueError(
            f"backend: 'triton' needs CUDA tensors or TRITON_INTERPRET=1, got tensors on "
            f"{device} without the interpreter"
        )
    if device.type == "cpu":
        check_interpreter_in_effect()
    from .triton_backend import triton_recurrence

    return triton_recurrence()


def _validate(input, input_h, input_c, params, sequence_lengths, **attrs) -> _Call:
    """Every argument checked (`validate_shapes`), then the lengths read on the host."""
    cfg, T, B = validate_shapes(input, input_h, input_c, params, sequence_lengths, **attrs)
    # Lengths may live on any device: they are read on the host once.
    lengths = _lengths(sequence_lengths, B, T)
    return _Call(cfg, make_pack_info(lengths, T, input.device), T, B)


def validate_shapes(
    input,
    input_h,
    input_c,
    params,
    sequence_lengths,
    *,
    rnn_mode,
    input_mode,
    direction,
    dropout,
    seed,
    seed2,
    num_proj,
    time_major,
) -> tuple[RNNConfig, int, int]:
    """(config, T, B): every check of the forward's arguments that reads no tensor's data
    (types, ranks, dtypes, shapes, devices, attributes, the params' size; the lengths' dtype
    and shape but not their values). What a shape-only call can check too: the custom ops'
    fake implementations (torch.compile's tracing, meta tensors) run it, so that a bad
    argument is the same named error there as in eager mode."""
    check_choice("rnn_mode", rnn_mode, ("lstm", "gru", "rnn_tanh", "rnn_relu"))
    check_choice("direction", direction, ("unidirectional", "bidirectional"))
    if not isinstance(time_major, bool):
        raise TypeError(f"time_major: expected a bool, got {type(time_major).__name__}")
    # (input, input_h and input_c are checked by _check_tensor)
    for name, t in (("params", params), ("sequence_lengths", sequence_lengths)):
        check_untransformed(name, t)
    _check_tensor("input", input, 3)
    if input.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"input: expected dtype float16, bfloat16, float32 or float64, got {input.dtype}"
        )
    dtype, dev = input.dtype, input.device
    T, B, I = input.shape if time_major else (input.shape[1], input.shape[0], input.shape[2])
    if T < 1 or B < 1 or I < 1:
        raise ValueError(
            f"input: expected max time, batch and input size >= 1, got shape {list(input.shape)}"
        )
    D = 2 if direction == "bidirectional" else 1
    _check_tensor("input_h", input_h, 3, dtype)
    _check_device("input_h", input_h, dev)
    LD, Bh, Hout = input_h.shape if time_major else (
        input_h.shape[1], input_h.shape[0], input_h.shape[2]
    )
    layout = "[L*D, B, Hout]" if time_major else "[B, L*D, Hout]"
    if Bh != B:
        raise ValueError(
            f"input_h: expected batch {B} (the input's) in layout {layout}, got shape "
            f"{list(input_h.shape)}"
        )
    if LD < 1 or LD % D:
        raise ValueError(
            f"input_h: expected a layer axis that is a positive multiple of {D} ({direction}) "
            f"in layout {layout}, got shape {list(input_h.shape)}"
        )
    L = LD // D
    H = Hout
    if rnn_mode == "lstm":
        _check_tensor("input_c", input_c, 3, dtype)
        _check_device("input_c", input_c, dev)
        H = input_c.shape[2]
        expect = (LD, B, H) if time_major else (B, LD, H)
        _check_shape("input_c", input_c, expect, "layer axis and batch of input_h")
    else:
        check_ignored_state("input_c", input_c, rnn_mode)
    num_proj = check_int("num_proj", num_proj, minimum=0)  # before the state checks
    if rnn_mode == "lstm" and num_proj > H:  # before input_h is held to it
        raise ValueError(f"num_proj: expected a value in (0, num_units={H}], got {num_proj} "
                         f"(num_units: input_c's last dimension)")
    for name, state in (("input_h", input_h), ("input_c", input_c if rnn_mode == "lstm" else None)):
        if state is not None and state.shape[2] < 1:
            raise ValueError(f"{name}: expected a last dimension >= 1 (the state size), got "
                             f"shape {list(state.shape)}")
    if num_proj > 0:
        if rnn_mode == "lstm" and Hout != num_proj:
            raise ValueError(
                f"input_h: expected last dimension num_proj={num_proj} (LSTM projection), "
                f"got shape {list(input_h.shape)}"
            )
    elif rnn_mode == "lstm" and Hout != H:
        raise ValueError(
            f"input_c: expected last dimension {Hout}, input_h's (without num_proj both state "
            f"sizes are num_units), got shape {list(input_c.shape)} (input_h "
            f"{list(input_h.shape)})"
        )
    cfg = make_config(
        rnn_mode=rnn_mode, num_layers=L, num_units=H, input_size=I, input_mode=input_mode,
        direction=direction, num_proj=num_proj, dropout=dropout, seed=seed, seed2=seed2,
    )
    check_params_tensor(cfg, params, sizes_from=(
        f"input_size: the input's last dimension, num_layers: input_h's layer axis / {D}, "
        f"num_units: {'input_c' if rnn_mode == 'lstm' else 'input_h'}'s last dimension"))
    if params.dtype != dtype:
        raise TypeError(f"params: expected dtype {dtype} (the input's), got {params.dtype}")
    _check_device("params", params, dev)
    _check_lengths_tensor(sequence_lengths, B, T)
    return cfg, T, B


def _time_major(t: torch.Tensor, time_major: bool) -> torch.Tensor:
    return t if time_major else t.transpose(0, 1)


def _own_state(t: torch.Tensor, time_major: bool) -> torch.Tensor:
    """A final state in the caller's layout, not a view: batch-major, a copy with the
    transposed view's strides ([L*D, B, H] is small). Autograd refuses in-place changes to
    an output that is a view, and users edit final states in place (torch.nn allows it)."""
    return t if time_major else t.transpose(0, 1).clone()


# ----------------------------------------------------------------------------- forward


def _forward(call: _Call, rec, input, input_h, input_c, params, time_major, training):
    cfg, info = call.cfg, call.info
    x = pack(_time_major(input, time_major), info)
    h0 = _time_major(input_h, time_major)
    c0 = _time_major(input_c, time_major) if cfg.is_lstm else None
    # A dense batch's packed output rows are the padded output's: written there, not copied.
    output = rows = None
    if info.dense:
        output, rows = engine.padded_buffer(info, cfg.num_dirs * cfg.out_size, input.dtype,
                                            input.device, time_major)
    res = engine.forward(cfg, rec, x, h0, c0, params, info, training, y_out=rows)
    output_c = (
        _own_state(res.cT, time_major) if cfg.is_lstm
        else torch.empty(0, dtype=input.dtype, device=input.device)
    )
    return CudnnRNNOutput(
        output if output is not None else unpack(res.y, info, time_major),
        _own_state(res.hT, time_major),
        output_c,
        res.reserve,
        res.host_reserved,
    )


SECOND_ORDER_ERROR = (
    "cudnn_rnn: its gradients (CudnnRNNBackpropV3) are not differentiable; as in "
    "TensorFlow, the backprop op has no gradient of its own, so a loss built from them (a "
    "gradient penalty, a double backward, a Hessian-vector product) cannot be differentiated. "
    "For a first-order approximation (as first-order MAML) detach the gradients or pass "
    "create_graph=False; for exact higher-order gradients use torch.nn's RNN modules"
)


class _FirstOrderOnly(torch.autograd.Function):
    """Passes the backprop op's gradients through, tied to the tensors they were computed
    from, so that differentiating them raises instead of treating them as constants."""

    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(t.detach() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(SECOND_ORDER_ERROR)


def _first_order_only(grads: tuple, sources: tuple) -> tuple:
    """`grads` unchanged when nothing differentiable produced them; else marked as outputs of
    a non-differentiable op (an error on backward, never a silently missing term)."""
    live = [t for t in sources if isinstance(t, torch.Tensor) and t.requires_grad]
    if not torch.is_grad_enabled() or not live:
        return grads
    return _FirstOrderOnly.apply(len(grads), *grads, *live)


class _CudnnRNNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, input_h, input_c, params, call, rec, attrs, training):
        out = _forward(call, rec, input, input_h, input_c, params, attrs["time_major"], training)
        ctx.call, ctx.rec, ctx.attrs, ctx.training = call, rec, attrs, training
        # Autograd may run the backward on another thread, where the caller's
        # plan_constraints context is not set: carry it over explicitly.
        ctx.constraints = current_constraints()
        ctx.lstm = call.cfg.is_lstm
        ctx.save_for_backward(input, input_h, input_c if ctx.lstm else None, params,
                              out.output, out.reserve_space)
        ctx.host_reserved = out.host_reserved
        ctx.mark_non_differentiable(out.reserve_space, out.host_reserved)
        if not ctx.lstm:
            ctx.mark_non_differentiable(out.output_c)
        # Gradients the loss does not give stay None: autograd would fill a reserve-sized
        # zero tensor (and the host header's) for every backward, only to be ignored.
        ctx.set_materialize_grads(False)
        return tuple(out)

    @staticmethod
    def backward(ctx, d_output, d_h, d_c, _d_reserve, _d_host):
        if not ctx.training:
            raise ValueError(
                "is_training: expected True for a forward whose outputs are differentiated, "
                "got False (no reserve space was kept for backprop)"
            )
        for name, g in (("output_backprop", d_output), ("output_h_backprop", d_h),
                        ("output_c_backprop", d_c)):
            check_untransformed(name, g)  # e.g. autograd.grad(..., is_grads_batched=True)
        input, input_h, input_c, params, output, reserve = ctx.saved_tensors
        with plan_constraints(**ctx.constraints):
            grads = _backprop(
                ctx.call, ctx.rec, input, input_h, input_c, params, output,
                d_output, d_h, d_c if ctx.lstm else None, reserve, ctx.attrs["time_major"],
            )
        dx, dh, dc, dp = grads
        return (dx, dh, dc if ctx.lstm else None, dp, None, None, None, None)


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
    num_proj: int = 0,
    is_training: bool = True,
    time_major: bool = True,
    backend: str = "auto",
) -> CudnnRNNOutput:
    """CudnnRNNV3: a multi-layer LSTM/GRU/RNN over a (variable-length) batch.

    Shapes (time_major=True; batch-major swaps the first two axes of every tensor):
    input [T, B, I], input_h [L*D, B, Hout], input_c [L*D, B, H] (LSTM), params 1-D
    (`params_size`), sequence_lengths [B] int32/int64 or None.
    Returns (output [T, B, D*Hout], output_h, output_c (empty unless LSTM), reserve_space
    (1-D uint8, empty unless is_training), host_reserved (int8 header copy)).
    Differentiable with torch.autograd when is_training=True, to first order: as in
    TensorFlow the gradients have no gradient of their own, and differentiating them (a
    gradient penalty through create_graph=True) raises RuntimeError.
    """
    if not isinstance(is_training, bool):
        raise TypeError(f"is_training: expected a bool, got {type(is_training).__name__}")
    call = _validate(
        input, input_h, input_c, params, sequence_lengths, rnn_mode=rnn_mode,
        input_mode=input_mode, direction=direction, dropout=dropout, seed=seed, seed2=seed2,
        num_proj=num_proj, time_major=time_major,
    )
    rec = _resolve_backend(backend, input.device, input.dtype)
    tensors = [input, input_h, params] + ([input_c] if call.cfg.is_lstm else [])
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        out = _CudnnRNNFunction.apply(
            input, input_h, input_c if call.cfg.is_lstm else None, params, call, rec,
            {"time_major": time_major}, is_training,
        )
        return CudnnRNNOutput(*out)
    with torch.no_grad():
        return _forward(call, rec, input, input_h, input_c, params, time_major, is_training)


# ----------------------------------------------------------------------------- backprop


def _backprop(call, rec, input, input_h, input_c, params, output, d_output, d_h, d_c,
              reserve, time_major) -> CudnnRNNBackpropOutput:
    cfg, info = call.cfg, call.info
    tm = lambda t: _time_major(t, time_major)  # noqa: E731
    x = pack(tm(input), info)
    y = pack(tm(output), info)
    # Gradients autograd did not give (None): zeros, already packed for the output's.
    dy = pack(tm(d_output), info) if d_output is not None else y.new_zeros(y.shape)
    c0 = tm(input_c) if cfg.is_lstm else None
    dcT = None
    if cfg.is_lstm:
        dcT = tm(d_c) if d_c is not None else torch.zeros_like(c0)
    # A dense batch's time-major input gradient is written straight into the padded rows;
    # batch-major, it is one transposing copy (.contiguous() below) of the packed rows.
    dinput = dx_out = None
    if info.dense and time_major:
        dinput, dx_out = engine.padded_buffer(info, cfg.input_size, input.dtype, input.device)
    with torch.no_grad():
        res = engine.backward(
            cfg, rec, x, tm(input_h), c0, params, info, y, dy,
            tm(d_h) if d_h is not None else torch.zeros_like(tm(input_h)), dcT, reserve,
            dx_out=dx_out,
        )
        if dinput is None:
            dinput = tm(res.dx.view(info.T, info.B, -1) if info.dense else unpack(res.dx, info))
        dinput_c = (
            tm(res.dc0) if cfg.is_lstm
            else torch.empty(0, dtype=input.dtype, device=input.device)
        )
        grads = (dinput.contiguous(), tm(res.dh0).contiguous(), dinput_c.contiguous(),
                 res.dparams)
    sources = (input, input_h, input_c, params, output, d_output, d_h, d_c)
    return CudnnRNNBackpropOutput(*_first_order_only(grads, sources))


def cudnn_rnn_backprop(
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
    *,
    rnn_mode: str = "lstm",
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
    num_proj: int = 0,
    time_major: bool = True,
    backend: str = "auto",
) -> CudnnRNNBackpropOutput:
    """CudnnRNNBackpropV3: gradients of cudnn_rnn from its reserve space.

    Takes the forward's inputs and outputs, the gradients of output, output_h and output_c
    (output_c_backprop may be None for non-LSTM modes, or zeros-by-None for LSTM), and the
    reserve. Returns (input_backprop, input_h_backprop, input_c_backprop (empty unless LSTM),
    params_backprop), fresh tensors shaped like input, input_h, input_c and params. They are
    not differentiable (TensorFlow's op has no gradient): when grad mode is on and an argument
    requires grad, they carry a grad_fn whose backward raises RuntimeError.
    """
    call = _validate(
        input, input_h, input_c, params, sequence_lengths, rnn_mode=rnn_mode,
        input_mode=input_mode, direction=direction, dropout=dropout, seed=seed, seed2=seed2,
        num_proj=num_proj, time_major=time_major,
    )
    cfg, dtype, dev = call.cfg, input.dtype, input.device
    check_backprop_shapes(cfg, call.T, call.B, input, input_h, input_c, output, output_h,
                          output_c, output_backprop, output_h_backprop, output_c_backprop,
                          time_major)
    layout = reserve_mod.reserve_layout(cfg, call.info, dtype)
    reserve_space = reserve_mod.check(reserve_space, host_reserved, layout, dev)
    rec = _resolve_backend(backend, dev, dtype)
    return _backprop(
        call, rec, input, input_h, input_c, params, output, output_backprop,
        output_h_backprop, output_c_backprop if cfg.is_lstm else None, reserve_space, time_major,
    )


def check_backprop_shapes(cfg: RNNConfig, T: int, B: int, input, input_h, input_c, output,
                          output_h, output_c, output_backprop, output_h_backprop,
                          output_c_backprop, time_major: bool) -> None:
    """The backprop's outputs and their gradients against the forward's arguments (types,
    ranks, dtypes, devices, shapes: no data read; the backprop op's fake runs it too)."""
    dtype, dev = input.dtype, input.device
    D, Hout = cfg.num_dirs, cfg.out_size
    out_shape = (T, B, D * Hout) if time_major else (B, T, D * Hout)
    for name, t in (("output", output), ("output_backprop", output_backprop)):
        _check_tensor(name, t, 3, dtype)
        _check_device(name, t, dev)
        _check_shape(name, t, out_shape, "time, batch, D*Hout")
    for name, t in (("output_h", output_h), ("output_h_backprop", output_h_backprop)):
        _check_tensor(name, t, 3, dtype)
        _check_device(name, t, dev)
        _check_shape(name, t, tuple(input_h.shape), "input_h's shape")
    if cfg.is_lstm:
        names = (("output_c", output_c), ("output_c_backprop", output_c_backprop))
        for name, t in names:
            if name == "output_c_backprop" and t is None:
                continue
            _check_tensor(name, t, 3, dtype)
            _check_device(name, t, dev)
            _check_shape(name, t, tuple(input_c.shape), "input_c's shape")
    else:
        check_ignored_state("output_c", output_c, cfg.rnn_mode)
        check_ignored_state("output_c_backprop", output_c_backprop, cfg.rnn_mode)
