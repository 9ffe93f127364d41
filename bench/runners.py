"""The implementations a benchmark compares, behind one small interface.

Every runner turns one `Case` (the data of one shape on one device) into three callables,
`fwd`, `bwd` and `fwdbwd`, each doing a whole pass, plus what it knows about correctness and
its reserve space:

- tritonrnn: the op API (cudnn_rnn with is_training=True, then cudnn_rnn_backprop) with the
  requested backend, on packed-by-lengths input (sequence_lengths).
- torch: torch.nn.LSTM/GRU/RNN in the same dtype (cuDNN on a GPU, torch's native kernels on
  the CPU) on the padded input: for variable lengths it runs every sequence to T.
- torch-packed: the same module on a PackedSequence (variable lengths only).
- flashrnn: NX-AI's FlashRNN when importable (LSTM/GRU, one unidirectional layer, no
  projection, no lengths), including the input projection GEMM that it leaves to the caller.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop
from tritonrnn.rnn.config import GATES

from .oracle import (
    OracleResult,
    cudnn_uses_tf32,
    make_torch_rnn,
    oracle,
    params_from_torch,
    scaled_error,
    tolerance,
    uses_tf32,
)
from .presets import BenchShape, make_lengths


@dataclass
class Case:
    """Inputs of one benchmark shape: same weights and data for every implementation.

    Weights are drawn by torch's default initialisation in float64, rounded to the benchmark
    dtype, and the float64 oracle uses the rounded values: every implementation and the
    oracle compute the same function of the same numbers."""

    shape: BenchShape
    device: torch.device
    lengths: list[int] | None
    module64: torch.nn.RNNBase
    params: torch.Tensor  # flat, benchmark dtype
    x: torch.Tensor  # [T, B, I]
    h0: torch.Tensor  # [L*D, B, Hout]
    c0: torch.Tensor | None  # [L*D, B, H]
    dy: torch.Tensor  # [T, B, D*Hout], zero at padding
    dhT: torch.Tensor
    dcT: torch.Tensor | None
    ref: OracleResult | None = None

    @property
    def tokens(self) -> int:
        """N = sum(lengths): the valid (time, batch) positions."""
        return sum(self.lengths) if self.lengths is not None else self.shape.time * self.shape.batch

    @property
    def seq_lengths(self) -> torch.Tensor | None:
        # On the host: the op reads lengths on the host once, and a device tensor would cost
        # a device-to-host sync per call that a caller holding host lengths never pays.
        if self.lengths is None:
            return None
        return torch.tensor(self.lengths, dtype=torch.int32)


def build_case(shape: BenchShape, device: torch.device, seed: int = 0,
               lengths: list[int] | None = None) -> Case:
    """Seeded data for a shape; `lengths` overrides the shape's length distribution."""
    dtype = shape.torch_dtype
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    module64 = make_torch_rnn(
        shape.mode, shape.input, shape.hidden, num_layers=shape.layers,
        bidirectional=shape.bidirectional, num_proj=shape.proj, dtype=torch.float64,
        device=device,
    )
    with torch.no_grad():
        for p in module64.parameters():
            p.copy_(p.to(dtype).to(torch.float64))
    params = params_from_torch(module64).to(dtype)
    T, B = shape.time, shape.batch
    LD = shape.layers * shape.num_dirs
    if lengths is None:
        lengths = make_lengths(shape.varlen, B, T, seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float32).to(device, dtype)

    x = randn(T, B, shape.input)
    h0 = randn(LD, B, shape.out_size)
    c0 = randn(LD, B, shape.hidden) if shape.mode == "lstm" else None
    dy = randn(T, B, shape.num_dirs * shape.out_size)
    if lengths is not None:
        # Gradients arriving at padded positions are ignored by the op; zero them so that
        # the padded torch run, which does read them, sees the same loss.
        valid = torch.arange(T).unsqueeze(1) < torch.tensor(lengths).unsqueeze(0)
        dy = dy * valid.to(device, dtype).unsqueeze(-1)
    dhT = randn(LD, B, shape.out_size)
    dcT = randn(LD, B, shape.hidden) if shape.mode == "lstm" else None
    return Case(shape, device, lengths, module64, params, x, h0, c0, dy, dhT, dcT)


def compute_oracle(case: Case) -> OracleResult:
    """The float64 torch.nn forward and backward of a case (cached on the case)."""
    if case.ref is None:
        case.ref = oracle(case.module64, case.x, case.h0, case.c0, case.lengths,
                          (case.dy, case.dhT, case.dcT))
    return case.ref


def tolerances(case: Case, *, tf32: bool | None = None) -> dict[str, float]:
    """Tolerances of `scaled_error` for outputs and gradients (oracle.tolerance); `tf32`:
    whether the implementation's float32 products run in tf32 (default: torch's GEMM switch,
    which tritonrnn's kernels follow; the cuDNN runners pass `cudnn_uses_tf32`)."""
    s = case.shape
    K = max(s.input, s.num_dirs * s.out_size) + s.out_size
    steps = s.time * s.layers
    if tf32 is None:
        tf32 = uses_tf32(case.device)
    out = tolerance(s.torch_dtype, K=K, steps=steps, tf32=tf32)
    # Weight gradients sum over all N packed rows: dot products of length N.
    grad = tolerance(s.torch_dtype, K=max(K, case.tokens), steps=steps, tf32=tf32)
    return {"output": out, "gradient": grad}


def compare(case: Case, got: dict[str, torch.Tensor | None], *,
            tf32: bool | None = None) -> dict:
    """Scaled errors of every tensor in `got` against the oracle, with the verdict
    (`tf32`: as for `tolerances`)."""
    ref = compute_oracle(case)
    tols = tolerances(case, tf32=tf32)
    errors: dict[str, float] = {}
    missing = []  # what the oracle has and the implementation did not give: a failure
    within = True  # every tensor given is within its tolerance (whatever is missing)
    for name, tensor in got.items():
        expected = getattr(ref, name)
        if expected is None:
            continue
        if tensor is None:
            missing.append(name)
            continue
        err = scaled_error(tensor, expected)
        errors[name] = err
        kind = "gradient" if name.startswith("d") else "output"
        if not err <= tols[kind]:
            within = False
    return {"scaled_error": errors, "max_scaled_error": max(errors.values(), default=0.0),
            "tolerance": tols, "ok": within and not missing, "within_tolerance": within,
            "missing": missing}


@dataclass
class Runner:
    """Callables of one implementation on one case (see the module docstring)."""

    impl: str
    passes: dict[str, Callable[[], object]] = field(default_factory=dict)
    correctness: dict | None = None
    correctness_note: str = ""
    reserve_bytes: int | None = None
    reserve_note: str = ""
    info: dict = field(default_factory=dict)
    # Bytes each pass holds, where a timed call cannot show them (a CUDA graph's replay
    # allocates nothing: its memory was taken at capture); None: measured around one call.
    peak_bytes: dict[str, int] | None = None
    # Passes whose peak is measured on another call than the timed one: (setup, run), setup()
    # before the peak's window (its tensors count as held before), run(setup's result) in it.
    peak_runs: dict[str, tuple[Callable[[], object], Callable[[object], object]]] = field(
        default_factory=dict)


# ----------------------------------------------------------------------------- tritonrnn


def tritonrnn_runner(case: Case, backend: str) -> Runner:
    s = case.shape
    attrs = dict(rnn_mode=s.mode, direction=s.direction, num_proj=s.proj)
    sl = case.seq_lengths

    def fwd():
        return cudnn_rnn(case.x, case.h0, case.c0, case.params, sl, is_training=True,
                         backend=backend, **attrs)

    def bwd_of(out):
        return cudnn_rnn_backprop(
            case.x, case.h0, case.c0, case.params, sl, out.output, out.output_h,
            out.output_c if s.mode == "lstm" else None, case.dy, case.dhT, case.dcT,
            out.reserve_space, out.host_reserved, backend=backend, **attrs,
        )

    with torch.no_grad():
        out = fwd()
        grads = bwd_of(out)
    runner = Runner("tritonrnn")
    runner.passes = {
        "fwd": fwd,
        "bwd": lambda: bwd_of(out),
        "fwdbwd": lambda: bwd_of(fwd()),
    }
    runner.correctness = compare(case, {
        "y": out.output, "hT": out.output_h,
        "cT": out.output_c if s.mode == "lstm" else None,
        "dx": grads.input_backprop, "dh0": grads.input_h_backprop,
        "dc0": grads.input_c_backprop if s.mode == "lstm" else None,
        "dparams": grads.params_backprop,
    })
    runner.reserve_bytes = int(out.reserve_space.numel() * out.reserve_space.element_size())
    runner.reserve_note = "reserve_space returned by cudnn_rnn (format v1)"
    return runner


# ----------------------------------------------------------------------------- torch.nn


def cudnn_reserve_bytes(outputs: list[torch.Tensor]) -> tuple[int | None, str]:
    """cuDNN's reserve space, read from the autograd graph of a torch.nn RNN forward.

    torch's _cudnn_rnn returns (output, hy, cy, reserve, weight_buf) and its backward node
    CudnnRnnBackward0 saves `reserve` as result3, exposed as `_saved_result3`."""
    stack = [o.grad_fn for o in outputs if o is not None and o.grad_fn is not None]
    seen: set[int] = set()
    total, found = 0, 0
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__.startswith("CudnnRnnBackward"):
            reserve = getattr(node, "_saved_result3", None)
            if isinstance(reserve, torch.Tensor):
                total += reserve.numel() * reserve.element_size()
                found += 1
        stack.extend(fn for fn, _ in node.next_functions)
    if found:
        return total, "CudnnRnnBackward0._saved_result3 in the autograd graph (cuDNN reserve)"
    if not outputs or outputs[0].device.type != "cuda":
        return None, "n/a: torch ran its native CPU kernels (no cuDNN, no reserve space)"
    return None, "n/a: no CudnnRnnBackward node in the autograd graph (cuDNN not used here)"


def expected_cudnn_algo(shape: BenchShape, packed: bool, major: int, minor: int,
                        sm_count: int) -> dict[str, str]:
    """The cuDNN RNN algorithm torch asks for, per pass ("fwd", "bwd"): "standard" (kernels
    launched every time step), "persist_static" or "persist_static_small_h" (persistent
    kernels). A mirror of torch's `get_algo` (aten/src/ATen/native/cudnn/RNN.cpp, unchanged in
    substance across torch 2.x; read for this function in November 2026), for the report:
    not a query of the library, so a torch that changes its rules makes this stale.

    torch's rules: a projection, packed input or float64 -> standard. Persistent small-H
    (compute capability >= 6.0): forward H <= 384 for tanh / relu cells, <= 192 for LSTM /
    GRU; backward <= 256 / <= 128. Persistent static: fp16 only, one unidirectional layer,
    H <= 1024, H and the input size multiples of 128, and the device rule: compute
    capability 8.x or later (not 8.6) with >= 98 SMs, LSTM with B % 8 == 0 and B <= 128,
    tanh / relu likewise and (B < 96 or H < 896), never GRU; Volta (7.0) has its own batch
    rule. Otherwise standard: so bf16 and fp32 run the standard algorithm at H > 192 (LSTM,
    GRU), and every `targets` shape does."""
    dtype = shape.torch_dtype
    one_gate = shape.mode in ("rnn_tanh", "rnn_relu")
    out = {}
    for name, fwd in (("fwd", True), ("bwd", False)):
        algo = "standard"
        if not shape.proj and not packed and dtype != torch.float64:
            small = (384 if one_gate else 192) if fwd else (256 if one_gate else 128)
            if major >= 6 and shape.hidden <= small:
                algo = "persist_static_small_h"
            elif dtype == torch.float16 and _persist_static(shape, major, minor, sm_count):
                algo = "persist_static"
        out[name] = algo
    return out


def _persist_static(shape: BenchShape, major: int, minor: int, sm_count: int) -> bool:
    """torch's use_persist_common_heuristics and use_persist_device_heuristics."""
    H, B = shape.hidden, shape.batch
    if not (shape.layers == 1 and not shape.bidirectional and H <= 1024 and H % 128 == 0
            and shape.input % 128 == 0):
        return False
    if major == 7:
        return minor != 5 and ((B % 16 == 0 and B not in (80, 112)) or B == 8) and (
            (shape.time >= 40 and B <= 128) or (shape.time >= 20 and B <= 96)
            or (shape.time >= 10 and B <= 32))
    if major < 8 or sm_count < 98 or minor == 6 or shape.mode == "gru":
        return False
    if shape.mode == "lstm":
        return B % 8 == 0 and B <= 128
    return B % 8 == 0 and B <= 128 and (B < 96 or H < 896)


def _cudnn_algo_info(case: Case, packed: bool) -> dict:
    if case.device.type != "cuda":
        return {}
    p = torch.cuda.get_device_properties(case.device)
    return {"cudnn_algo": expected_cudnn_algo(case.shape, packed, p.major, p.minor,
                                              p.multi_processor_count),
            "cudnn_algo_note": "expected from torch's rules (bench.runners.expected_cudnn_algo),"
                               " not queried"}


@dataclass
class _TorchSetup:
    """A torch.nn copy of the case's module in the benchmark dtype, with fresh leaf inputs."""

    module: torch.nn.RNNBase
    x: torch.Tensor
    h0: torch.Tensor
    c0: torch.Tensor | None
    inputs: list[torch.Tensor]  # x, h0 (, c0): the inputs whose gradients are taken
    names: list[str]
    params: list[torch.Tensor]


def _flatten_for_cudnn(module: torch.nn.RNNBase) -> None:
    """Module.to() leaves the weights in separate buffers; without one flat buffer torch
    copies them into one on every cuDNN call (with a UserWarning), which is not cuDNN's
    cost. flatten_parameters() does it for float32 / float16 but returns without a word for
    bfloat16 (torch.backends.cudnn.is_acceptable leaves bfloat16 out), though cuDNN runs
    bfloat16 RNNs, flattening their weights on every call (an H200's GPU test found 16
    storages at GRU bf16 2 layers bidirectional); those get the same flattening op
    flatten_parameters() calls. A no-op off CUDA."""
    module.flatten_parameters()
    weights = module._flat_weights
    if (not weights or not all(isinstance(w, torch.Tensor) and w.is_cuda for w in weights)
            or len({w.untyped_storage().data_ptr() for w in weights}) == 1
            or weights[0].dtype != torch.bfloat16 or not torch.backends.cudnn.enabled
            or not torch._use_cudnn_rnn_flatten_weight()):
        return
    from torch.backends.cudnn import rnn as cudnn_rnn

    with torch.cuda.device_of(weights[0]), torch.no_grad():
        torch._cudnn_rnn_flatten_weight(
            weights, (4 if module.bias else 2) + (1 if module.proj_size > 0 else 0),
            module.input_size, cudnn_rnn.get_cudnn_mode(module.mode), module.hidden_size,
            module.proj_size, module.num_layers, module.batch_first,
            bool(module.bidirectional))


def _torch_setup(case: Case) -> _TorchSetup:
    module = copy.deepcopy(case.module64).to(case.shape.torch_dtype).train()
    _flatten_for_cudnn(module)
    leaf = lambda t: None if t is None else t.detach().clone().requires_grad_()  # noqa: E731
    x, h0, c0 = leaf(case.x), leaf(case.h0), leaf(case.c0)
    names, params = zip(*module.named_parameters(), strict=True)
    return _TorchSetup(module, x, h0, c0, [t for t in (x, h0, c0) if t is not None],
                       list(names), list(params))


def torch_runner(case: Case, packed: bool) -> Runner:
    impl = "torch-packed" if packed else "torch"
    t = _torch_setup(case)
    module, x, h0, c0, inputs, names, params = (t.module, t.x, t.h0, t.c0, t.inputs, t.names,
                                                t.params)
    lengths = case.lengths if packed else None

    def fwd():
        from .oracle import torch_forward

        y, hT, cT = torch_forward(module, x, h0, c0, lengths)
        return [t for t in (y, hT, cT) if t is not None]

    grad_outs = [t for t in (case.dy, case.dhT, case.dcT) if t is not None]

    def grads_of(outs, retain):
        return torch.autograd.grad(outs, inputs + params, grad_outs, retain_graph=retain,
                                   allow_unused=True)

    outs = fwd()
    reserve, note = cudnn_reserve_bytes(outs)
    grads = grads_of(outs, retain=True)
    runner = Runner(impl)
    runner.passes = {
        "fwd": fwd,
        # retain_graph keeps the forward for the next repetition; cuDNN's backward then
        # clones its reserve once per call (torch's retain_variables path), a small extra.
        "bwd": lambda: grads_of(outs, retain=True),
        "fwdbwd": lambda: grads_of(fwd(), retain=False),
    }
    # That clone is a whole reserve alive at the backward's peak (126 MB of 330 at the anchor
    # on an H200), which a training step's backward does not hold: the peak is measured on a
    # fresh forward's backward without retain_graph.
    runner.peak_runs["bwd"] = (fwd, lambda fresh: grads_of(fresh, retain=False))
    runner.reserve_bytes, runner.reserve_note = reserve, note
    runner.info["rnn_backend"] = (
        f"cuDNN {torch.backends.cudnn.version()}" if reserve is not None
        else ("native CPU" if case.device.type == "cpu" else "torch native CUDA")
    )
    runner.info.update(_cudnn_algo_info(case, packed))
    if case.lengths is not None and not packed:
        runner.correctness_note = (
            "not compared: padded input runs every sequence to T (not the varlen semantics)"
        )
        return runner
    n_in = len(inputs)
    pgrads = dict(zip(names, grads[n_in:], strict=True))
    runner.correctness = compare(case, {
        "y": outs[0], "hT": outs[1], "cT": outs[2] if c0 is not None else None,
        "dx": grads[0], "dh0": grads[1], "dc0": grads[2] if c0 is not None else None,
        "dparams": params_from_torch(module, pgrads),
    }, tf32=cudnn_uses_tf32(case.device))
    return runner


# ----------------------------------------------------------------------------- torch.nn, graphed


def graph_unsupported(case: Case) -> str | None:
    """Why the CUDA-graph baseline cannot run this case, or None."""
    if case.device.type != "cuda":
        return "CUDA graphs need a GPU"
    return None


# Eager calls of a pass on the capture stream before it is captured: cuDNN's and the caching
# allocator's first-call work (descriptors, workspace, autograd's setup) must not be captured.
_GRAPH_WARMUP = 2


def _capture(fn: Callable[[], list], stream: torch.cuda.Stream):
    """fn captured once into a CUDA graph on `stream` (after `_GRAPH_WARMUP` eager calls there).
    Returns (replay, outputs, pool_bytes): replay() reruns the captured kernels and returns
    `outputs`, fn's results as the capture allocated them (rewritten by every replay);
    pool_bytes is what the capture allocated (the graph's private memory pool holds it for the
    graph's lifetime, so a replay allocates nothing and this is the pass's memory)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(_GRAPH_WARMUP):
            fn()
    stream.synchronize()
    dev = stream.device
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outputs = fn()
    pool_bytes = int(torch.cuda.max_memory_allocated(dev) - base)

    def replay():
        graph.replay()
        return outputs

    replay.graph = graph  # keeps the graph (and its pool) alive with the callable
    return replay, outputs, pool_bytes


def torch_graph_runner(case: Case) -> Runner:
    """torch.nn (cuDNN) on the padded input, each pass captured once into a CUDA graph and
    timed as graph replays: cuDNN's GPU time without the host's kernel launches.

    cuDNN's standard RNN algorithm (what torch asks for in bf16 and fp32 past small H, and
    in fp16 outside its persistent-kernel rules: `expected_cudnn_algo`) launches kernels
    every time step, so the eager `torch` runner times the host's launch rate as much as the
    GPU wherever the host is the slower of the two (the eager anchor's cuDNN medians moved
    between 26.9 and 46.8 ms across runs on one H100). A replay issues the same kernels with
    one launch. tritonrnn itself runs eagerly: this baseline is the stricter one.

    Every pass is captured on one side stream, and the `bwd` pass's forward runs eagerly on
    that stream too: autograd runs each backward kernel on its forward's stream, which must be
    the capturing one. Correctness: the outputs and gradients of replays (outputs first filled
    with NaN, so that a replay that wrote nothing fails) against the float64 oracle."""
    t = _torch_setup(case)
    module, x, h0, c0, inputs, names, params = (t.module, t.x, t.h0, t.c0, t.inputs, t.names,
                                                t.params)
    grad_outs = [g for g in (case.dy, case.dhT, case.dcT) if g is not None]
    stream = torch.cuda.Stream(device=case.device)

    def fwd():
        from .oracle import torch_forward

        return list(torch_forward(module, x, h0, c0, None))

    def grads_of(outs, retain):
        return list(torch.autograd.grad([o for o in outs if o is not None], inputs + params,
                                        grad_outs, retain_graph=retain, allow_unused=True))

    with torch.cuda.stream(stream):
        saved = fwd()  # the forward whose saved tensors the captured backward reads
    replays, outputs, pools = {}, {}, {}
    for name, fn in (("fwd", fwd), ("bwd", lambda: grads_of(saved, retain=True)),
                     ("fwdbwd", lambda: grads_of(fwd(), retain=False))):
        replays[name], outputs[name], pools[name] = _capture(fn, stream)
    # The captured backward reads `saved`'s outputs and autograd's saved tensors (cuDNN's
    # reserve) at their addresses on every replay: they live as long as the replay does.
    replays["bwd"].saved = saved
    torch.cuda.synchronize(case.device)

    def replayed(name):
        with torch.no_grad():  # the forward's outputs are autograd outputs
            for t in outputs[name]:
                if t is not None:
                    t.fill_(float("nan"))
        replays[name]()
        torch.cuda.synchronize(case.device)
        return outputs[name]

    runner = Runner("torch-graph")
    runner.passes = dict(replays)
    runner.peak_bytes = pools
    runner.info["peak_note"] = (
        "bwd: the captured backward retains its graph (each replay reuses one forward), so its "
        "pool holds cuDNN's clone of the reserve (torch's retain_variables path), which "
        "torch's eager bwd peak does not count")
    runner.info["rnn_backend"] = f"cuDNN {torch.backends.cudnn.version()} (CUDA graph replay)"
    runner.info.update(_cudnn_algo_info(case, packed=False))
    runner.reserve_note = "the same cuDNN reserve as torch (same module and algorithm)"
    if case.lengths is not None:
        runner.correctness_note = (
            "not compared: padded input runs every sequence to T (not the varlen semantics)"
        )
        return runner
    y, hT, cT = replayed("fwd")
    grads = replayed("fwdbwd")
    n_in = len(inputs)
    runner.correctness = compare(case, {
        "y": y, "hT": hT, "cT": cT,
        "dx": grads[0], "dh0": grads[1], "dc0": grads[2] if c0 is not None else None,
        "dparams": params_from_torch(module, dict(zip(names, grads[n_in:], strict=True))),
    }, tf32=cudnn_uses_tf32(case.device))
    return runner


# ----------------------------------------------------------------------------- FlashRNN


def _import_flashrnn():
    try:
        from flashrnn import flashrnn
    except ImportError:
        from flashrnn.flashrnn import flashrnn
    return flashrnn


def flashrnn_unsupported(case: Case) -> str | None:
    """Why FlashRNN cannot run this case, or None."""
    s = case.shape
    if case.device.type != "cuda":
        return "FlashRNN needs CUDA"
    if s.mode not in ("lstm", "gru"):
        return f"FlashRNN has no {s.mode} cell in this comparison (LSTM/GRU only)"
    if s.layers > 1 or s.bidirectional or s.proj or s.varlen != "none":
        return "FlashRNN runs one unidirectional layer without projection or lengths"
    if s.dtype == "float64":
        return "FlashRNN has no float64 kernels"
    try:
        _import_flashrnn()
    except Exception as e:  # any import failure means "not available"
        return f"FlashRNN not importable ({type(e).__name__}: {e})"
    return None


def flashrnn_runner(case: Case) -> Runner:
    """FlashRNN's fused CUDA backend, timed only: its weights follow its own gate layout, so
    its outputs are not compared with the oracle."""
    flashrnn = _import_flashrnn()
    s = case.shape
    G = GATES[s.mode]
    H, I, B, T = s.hidden, s.input, s.batch, s.time
    dtype, dev = s.torch_dtype, case.device
    gen = torch.Generator(device="cpu").manual_seed(1)
    W = (torch.randn(G * H, I, generator=gen) / math.sqrt(I)).to(dev, dtype).requires_grad_()
    R = (torch.randn(G, 1, H, H, generator=gen) / math.sqrt(H)).to(dev, dtype).requires_grad_()
    b = torch.zeros(G, 1, H, device=dev, dtype=dtype, requires_grad=True)
    x = case.x.transpose(0, 1).contiguous().requires_grad_()  # FlashRNN is batch-first
    dtype_arg = str(dtype).replace("torch.", "")

    def fwd():
        wx = (x @ W.t()).view(B, T, G, 1, H)
        h, _ = flashrnn(wx, R, b, function=s.mode, backend="cuda_fused", dtype=dtype_arg)
        return h[0]

    out = fwd()
    g = torch.randn_like(out)

    def grads_of(o, retain):
        return torch.autograd.grad(o, [x, W, R, b], g, retain_graph=retain)

    runner = Runner("flashrnn")
    runner.passes = {
        "fwd": fwd,
        "bwd": lambda: grads_of(out, retain=True),
        "fwdbwd": lambda: grads_of(fwd(), retain=False),
    }
    runner.correctness_note = "not compared: FlashRNN uses its own weight layout (timed only)"
    runner.reserve_note = "n/a: FlashRNN keeps its states for the backward (no reserve API)"
    return runner
