"""Ahead-of-time compiles of the planner's recurrent kernels for a GPU target, without a GPU.

`tritonrnn aot` answers "what does the planner's launch compile to on an H100?" on a CPU-only
machine: shared memory per program, registers, spills, the MMA instructions used, whether that
fits the device preset, and a static instruction profile of the time-step loop.

How a launch is obtained (captured, never re-derived)
-----------------------------------------------------
The planner's LayerPlan for the shape on the device preset (`recurrence_choice`, with
`plan_constraints` overrides) is handed to the real Triton backend (rnn/triton_backend.py),
which the real layer engine (rnn/engine.py) drives through one forward and one backward on
small dummy CPU tensors of the shape's real sizes (T = 2 steps: the time length is a runtime
argument and changes nothing in a compile). The launchers run with TRITON_INTERPRET=1 (how they
accept CPU tensors) while every @triton.jit object of the kernel modules is replaced by a
`_Recorder`: `kernel[grid](*args, **kwargs)` records the first launch of each kernel (grid,
positional arguments, constexpr keyword arguments, num_warps and other launch options) and runs
nothing. Only layer 0 is captured (every layer gets the same LayerPlan), and only the first
launch of each pass: direction 0 when a bidirectional layer's directions launch apart
(direction 1 differs only in REVERSE).

The compile signature is then built from the recorded call as Triton's JIT would build it on a
GPU (`build_signature`; a test checks it against the JIT's own binder): tensors ->
"*bf16"/"*fp32"/"*i32"..., ints -> "i32"/"i64" with the 16-divisibility hint, ints equal to 1
specialised to constexprs, both unless the kernel says `do_not_specialize`; constexpr
parameters (by keyword or by position) as constexprs.

What the launchers chose only because they ran in the interpreter is overridden by
`INTERPRETER_CONSTEXPRS`, one rule per constexpr name (whichever kernel has it), each derived
from the launchers' own logic with "on GPU" instead of "interpreting":
  DOT_DT       the weights' Triton dtype (interpreter: tl.float32, its half dot is wrong)
  FP32_DOT     DOT_DT == tl.float32, with the GPU DOT_DT
  VW           vector tiles' slice width, `grid_tiles.vector_width` of the GPU DOT_DT
               (interpreter: fp32's 128 columns; bf16 / fp16 on a GPU: 256)
  BARRIER      1 (grid barrier) for a persistent launch (the planner's persistent_grid
               family), else 0
  UPCAST       False (interpreter: weights upcast to fp32)
  IEEE         recorded IEEE and the data is fp32 (interpreter: IEEE = not allow_tf32)
  HOST_STEPS   -1: the kernel bounds its step loop itself (an interpreter that cannot loop
               to a tensor gets the bound from the host, `persistent_cta._host_steps`)
plus the launch option of a persistent launch (`cooperative_launch_options()`). When a kernel
gains another interpreter-dependent constexpr, add its rule there.

Compile and report
------------------
The kernel's own JIT compiles it for GPUTarget("cuda", arch, 32) (`warmup`, a stand-in
driver answering for the device), so the compile and its Triton cache entry are those of a GPU
run of the same launch; ptxas and cuobjdump are the backend's own (shipped in Triton's wheel).
Per kernel: `metadata.shared` (bytes of shared memory per program), `cuobjdump -res-usage`
(REG registers per thread; STACK and LOCAL bytes per thread: ptxas puts spills in the stack
frame, so either being non-zero means spills), the MMA kind from the PTX (wgmma / mma.sync /
fma), and whether it fits the preset: shared <= smem_per_program, no spill loaded or stored in
the step loop (`loop_spills`; a few bytes saved before the loop and restored after it, once
per launch, still fit, printed `yes*`), the program's registers (per-warp allocation in units
of 256) within the SM's register file, and (persistent launches) the grid within one program
per SM.

The step-loop profile is static: the control-flow graph of `cuobjdump -sass` is built and its
natural loops found (back edges to a dominating block); the kernels have one outer `while` over
(sub-)steps containing everything else, so the largest loop is the step loop. Its body includes
the out-of-line blocks the compiler moves past the loop (divergent-branch paths that jump back
in), which "the largest range closed by a backward branch" would get wrong. Nested loops (the
barrier's spin loop, streamed-weight K loops) are counted once, as instructions, not as
iterations; `inner_loops` says how many there are. Counted per iteration: global loads/stores
(LDG/STG), shared loads/stores (LDS/STS, LDSM), cp.async copies (LDGSTS), MMA instructions
(HMMA/HGMMA), fp32 FMAs, bar.sync (BAR), atomics (ATOM/ATOMG/ATOMS/RED), memory fences
(MEMBAR: a grid barrier's release; in the JSON, not in the printed table), local-memory loads
and stores (LDL/STL: register spills and their reloads, plus any per-thread array ptxas put in
local memory) and all instructions. LDL/STL are also counted outside the step loop
(`LDL_outside`/`STL_outside`: prologue, epilogue and anything not in the loop), so that a
kernel whose spills cost memory traffic every step (in-loop LDL/STL) can be told from one
that only saves and restores around the loop (spill bytes > 0, in-loop counts 0).
`MMA_chain` is the longest chain of mma.sync (HMMA) instructions in the step loop, in address
order, each taking as its accumulator the register the one before it wrote: the MMAs that
must wait for each other's results (~30 cycles each on an H100), a latency floor of the step
when a warp has too few independent chains to overlap them. (wgmma accumulates in place and
is not counted.)

Nothing is cached beyond Triton's own cache. A process that imported Triton or the kernels
under TRITON_INTERPRET=1 (the CPU test suite) holds interpreter objects, not JITFunctions, down
to triton.language's own @jit functions, and cannot compile: `aot_reports` then runs the whole
capture and compile in a fresh Python process without TRITON_INTERPRET (a few seconds more).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Modules whose @triton.jit objects are replaced by recorders during a capture (the launchers
# look their kernels up in these modules' globals).
KERNEL_MODULES = ("tritonrnn.kernels.persistent_cta", "tritonrnn.kernels.persistent_grid",
                  "tritonrnn.kernels.split_k")
# Target warp size of every NVIDIA GPU.
_WARP = 32
# The CUDA compute capabilities (>= 75: Triton's NVIDIA backend) that the ptxas builds in
# Triton's wheel compile for (`ptxas --help`, --gpu-name): any other --arch fails deep in
# the compiler.
ARCHES = (75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 107, 110, 120, 121)
# Time steps of the dummy batch: the step count is a runtime argument of every kernel.
_CAPTURE_T = 2

_TORCH_TO_TRITON = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.float64: "fp64", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
    torch.int64: "i64", torch.uint8: "u8", torch.bool: "u1",
}


# ----------------------------------------------------------------------------- recording


@dataclass
class Launch:
    """One recorded `kernel[grid](*args, **kwargs)` call (nothing was run)."""

    module: str  # where the launcher found the kernel, e.g. tritonrnn.kernels.persistent_grid
    name: str  # its attribute name there, e.g. _grid_fwd_kernel
    fn: object  # the Python function under the decorator
    grid: tuple
    args: tuple
    kwargs: dict  # constexprs by keyword and launch options (num_warps, ...)
    do_not_specialize: tuple[str, ...] = ()
    do_not_specialize_on_alignment: tuple[str, ...] = ()


def _raw_fn(kernel):
    """The decorated Python function of a JITFunction or an InterpretedFunction."""
    fn = getattr(kernel, "fn", None)
    if fn is None or not callable(fn):
        raise TypeError(f"not a Triton kernel object: {kernel!r}")
    return fn


def _names(kernel, fn, attr: str) -> tuple[str, ...]:
    """A kernel's do_not_specialize list as parameter names (JITFunction keeps indices or
    names, InterpretedFunction its decorator keywords: Triton <= 3.4 in its rewriter)."""
    value = getattr(kernel, attr, None)
    if value is None:
        value = getattr(kernel, "kwargs", {}).get(attr)
    if value is None:
        value = getattr(getattr(kernel, "rewriter", None), "kwargs", {}).get(attr)
    arg_names = list(inspect.signature(fn).parameters)
    return tuple(arg_names[v] if isinstance(v, int) else str(v) for v in (value or ()))


def _is_triton_kernel(obj) -> bool:
    kind = type(obj).__name__
    return kind in ("JITFunction", "InterpretedFunction") and callable(getattr(obj, "fn", None))


class _Sink(dict):
    """The recorded launches, keyed (module, attribute name), in launch order. With `stop`
    set, the next new launch recorded raises `_Recorded` once it is in."""

    stop = False


class _Recorded(Exception):
    """Raised by a recorded launch into a `_Sink` whose `stop` is set: the caller has what it
    came for and skips the rest of the host code (`capture`: the backward's weight-gradient
    GEMMs, minutes on a CPU at large batch)."""


class _Recorder:
    """Stands in for a @triton.jit object: `rec[grid](*args, **kwargs)` keeps the first call in
    `sink[(module, name)]` and runs nothing (raises `_Recorded` after keeping a new one where
    the sink's `stop` is set); calling it directly (a device-side helper called from the
    host) is an error."""

    def __init__(self, module: str, name: str, kernel, sink: _Sink):
        self.module, self.name, self.kernel, self.sink = module, name, kernel, sink
        self.fn = _raw_fn(kernel)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            key = (self.module, self.name)
            if key not in self.sink:
                self.sink[key] = Launch(
                    self.module, self.name, self.fn, tuple(grid) if not callable(grid) else grid,
                    tuple(args), dict(kwargs),
                    _names(self.kernel, self.fn, "do_not_specialize"),
                    _names(self.kernel, self.fn, "do_not_specialize_on_alignment"),
                )
                if self.sink.stop:
                    raise _Recorded(key)

        return launch

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name} is a Triton function: it was called from the host "
                           "during an aot capture")


@contextlib.contextmanager
def recording(modules: tuple[str, ...] = KERNEL_MODULES):
    """Inside the block every @triton.jit object of `modules` is a `_Recorder` and
    TRITON_INTERPRET=1 (the launchers take CPU tensors only then). Yields the `_Sink` (a
    dict) of recorded launches, keyed (module, attribute name), in launch order.
    Process-wide: no other thread should launch these kernels meanwhile.

    The modules are imported before the environment changes, so a process that was not
    interpreting keeps compiled-mode kernel objects. Nothing runs in the interpreter: the
    launchers' probe of it (`persistent_cta._interpreter_loops_to_tensors`, which only picks
    HOST_STEPS, overridden for the GPU anyway) answers True instead of launching its kernel,
    because Triton <= 3.5's interpreter leaves triton.language patched after a launch, and
    every later compile in the process fails."""
    from tritonrnn.kernels import persistent_cta

    mods = [importlib.import_module(m) for m in modules]
    sink = _Sink()
    swaps = []
    for mod in mods:
        for name, obj in list(vars(mod).items()):
            if _is_triton_kernel(obj):
                swaps.append((mod, name, obj))
    probe = persistent_cta._interpreter_loops_to_tensors
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for mod, name, obj in swaps:
            setattr(mod, name, _Recorder(mod.__name__, name, obj, sink))
        persistent_cta._interpreter_loops_to_tensors = lambda: True
        yield sink
    finally:
        persistent_cta._interpreter_loops_to_tensors = probe
        for mod, name, obj in swaps:
            setattr(mod, name, obj)
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


@dataclass(frozen=True)
class AotShape:
    """What decides a recurrence's kernels: cell, sizes, dtype, direction count."""

    mode: str = "lstm"
    hidden: int = 768
    batch: int = 16
    proj: int = 0
    dtype: torch.dtype = torch.bfloat16
    bidirectional: bool = False
    input_size: int = 0  # 0: hidden (does not change the recurrent kernels)

    @property
    def num_dirs(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def label(self) -> str:
        dt = _TORCH_TO_TRITON.get(self.dtype, str(self.dtype))
        parts = [self.mode, f"H{self.hidden}", f"B{self.batch}", dt]
        if self.proj:
            parts.insert(2, f"P{self.proj}")
        if self.bidirectional:
            parts.append("bi")
        return " ".join(parts)


def plan_layer(shape: AotShape, preset: str = "h100", constraints: dict | None = None):
    """(LayerPlan, source) the planner picks for the shape's recurrences on a device preset;
    `constraints` are plan_constraints keys (family, block_b, block_h, block_k, num_warps,
    num_warps_bwd, num_stages, num_stages_bwd, split_k_bwd)."""
    from tritonrnn.rnn.planner import plan_constraints, recurrence_choice

    props = device_preset(preset)
    H, P = shape.hidden, shape.proj
    with plan_constraints(**(constraints or {})):
        return recurrence_choice(shape.mode, H, P or H, P, shape.dtype, shape.batch, props,
                                 shape.num_dirs)


def device_preset(preset: str):
    """The planner DeviceProperties a preset name stands for: a GPU preset of
    `planner.PRESETS` (h100, h200, a100), or "current", the properties of this machine's CUDA
    device (on a GPU machine, compiles whose Triton cache entries its own runs then find)."""
    import torch

    from tritonrnn.rnn.planner import PRESETS, device_properties

    if preset == "current":
        if not torch.cuda.is_available():
            raise ValueError("device preset: 'current' needs a CUDA device and this machine "
                             "has none; name a preset: h100, h200 or a100")
        return device_properties()
    names = sorted(p for p, d in PRESETS.items() if not d.interpreter)
    if preset not in names:
        raise ValueError(f"device preset: expected current or one of {names}, got {preset!r}")
    return PRESETS[preset]


def capture(shape: AotShape, layer_plan, whole_backward: bool = False,
            props=None) -> dict[str, Launch]:
    """{"forward": Launch, "backward": Launch}: the first kernel launch of one training step's
    forward and backward recurrence of layer 0, as the Triton backend issues them for
    `layer_plan` (LayerPlan). Runs the real engine and launchers on dummy CPU tensors of the
    shape's sizes (T = 2); the kernels themselves do not run, and the backward stops at its
    first launch (a one-layer backward launches the recurrence alone; the weight-gradient
    GEMMs after it took minutes on a CPU at B = 4096). whole_backward: the backward runs to
    its end instead, and each pass must have launched exactly one kernel (the premise).
    props: the device preset's DeviceProperties, for what the backend derives from the device
    at launch rather than from the plan (the split-K backward's tiles, from the plan's form
    and the device); default, those of the dummy tensors' device (the interpreter preset)."""
    from tritonrnn.rnn import engine
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.packing import make_pack_info
    from tritonrnn.rnn.params import config_params_size
    from tritonrnn.rnn.triton_backend import TritonRecurrence

    if layer_plan.family == "reference":
        raise ValueError("the planner runs this shape on the reference family (float64): there "
                         "is no Triton kernel to compile")

    class Planned(TritonRecurrence):
        """The Triton backend with the recurrence choice fixed to `layer_plan`, on the
        preset's device properties."""

        def properties(self, device):
            return props if props is not None else super().properties(device)

        def plan_choice(self, shape):
            return layer_plan, "constrained"  # never replaced by a smaller plan

    cfg = make_config(rnn_mode=shape.mode, num_layers=1, num_units=shape.hidden,
                      input_size=shape.input_size or shape.hidden,
                      direction="bidirectional" if shape.bidirectional else "unidirectional",
                      num_proj=shape.proj)
    B, T, D, dt = shape.batch, _CAPTURE_T, cfg.num_dirs, shape.dtype
    info = make_pack_info([T] * B, T, torch.device("cpu"))
    z = dict(dtype=dt)
    x = torch.zeros(info.N, cfg.input_size, **z)
    params = torch.zeros(config_params_size(cfg), **z)
    h0 = torch.zeros(D, B, cfg.out_size, **z)
    c0 = torch.zeros(D, B, cfg.num_units, **z) if cfg.is_lstm else None
    rec = Planned()
    out = {}
    with recording() as sink:
        fwd = engine.forward(cfg, rec, x, h0, c0, params, info, training=True)
        out["forward"] = _only_new(sink, set())
        seen = set(sink)
        sink.stop = not whole_backward
        with contextlib.suppress(_Recorded):
            engine.backward(cfg, rec, x, h0, c0, params, info, fwd.y, torch.zeros_like(fwd.y),
                            torch.zeros_like(h0),
                            torch.zeros_like(c0) if c0 is not None else None, fwd.reserve)
        out["backward"] = _only_new(sink, seen)
    return out


def _only_new(sink: dict, seen: set) -> Launch:
    new = [v for k, v in sink.items() if k not in seen]
    if len(new) != 1:
        raise RuntimeError(f"expected one recurrent kernel launched per pass, recorded "
                           f"{[launch.name for launch in new]}")
    return new[0]


# ----------------------------------------------------------------------------- signature


def _is_constexpr_param(p: inspect.Parameter) -> bool:
    ann = p.annotation
    if isinstance(ann, str):  # `from __future__ import annotations`: "tl.constexpr"
        return "constexpr" in ann
    return getattr(ann, "__name__", "") == "constexpr"


def _tensor_type(t: torch.Tensor) -> str:
    if t.dtype not in _TORCH_TO_TRITON:
        raise ValueError(f"aot: no Triton pointer type for tensor dtype {t.dtype}")
    return "*" + _TORCH_TO_TRITON[t.dtype]


def _int_type(v: int) -> str:
    if -(2**31) <= v < 2**31:
        return "i32"
    if -(2**63) <= v < 2**63:
        return "i64"
    return "u64"


@dataclass
class Signature:
    """ASTSource's inputs built from a recorded call, by parameter index and by name."""

    signature: dict  # name -> "*bf16" | "i32" | ... | "constexpr"
    constexprs: dict  # (index,) -> value
    attrs: dict  # (index,) -> [["tt.divisibility", 16]]
    options: dict  # launch options: num_warps, num_stages, launch_cooperative_grid, ...
    names: list[str]

    def constexpr(self, name: str):
        return self.constexprs[(self.names.index(name),)]

    def constexprs_by_name(self) -> dict:
        return {self.names[k[0]]: v for k, v in self.constexprs.items()}


_DIVISIBILITY = [["tt.divisibility", 16]]


def build_signature(launch: Launch) -> Signature:
    """The compile signature of a recorded launch, as Triton's JIT specialises a GPU call:
    tensors -> pointer types from their dtype, divisible by 16 when their first element is
    16-byte aligned (a GPU allocation is; the offset of a view decides); ints -> i32 (i64, u64
    when large), divisible by 16 when a multiple of 16 and a constexpr when equal to 1 (neither
    for `do_not_specialize` parameters); floats -> fp32; constexpr parameters, None and launch
    keywords that are parameters -> constexprs; other keywords -> compile options."""
    params = list(inspect.signature(launch.fn).parameters.values())
    names = [p.name for p in params]
    if len(launch.args) > len(params):
        raise TypeError(f"{launch.name}: {len(launch.args)} positional arguments for "
                        f"{len(params)} parameters")
    bound = dict(zip(names, launch.args, strict=False))
    options = {}
    for k, v in launch.kwargs.items():
        if k in names:
            if k in bound:
                raise TypeError(f"{launch.name}: {k} given by position and by keyword")
            bound[k] = v
        else:
            options[k] = v
    sig, cons, attrs = {}, {}, {}
    for i, p in enumerate(params):
        if p.name not in bound:
            if p.default is inspect.Parameter.empty:
                raise TypeError(f"{launch.name}: missing argument {p.name}")
            bound[p.name] = p.default
        v = bound[p.name]
        specialize = p.name not in launch.do_not_specialize
        align = p.name not in launch.do_not_specialize_on_alignment
        if _is_constexpr_param(p) or v is None:
            sig[p.name], cons[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = _tensor_type(v)
            if align and (v.storage_offset() * v.element_size()) % 16 == 0:
                attrs[(i,)] = _DIVISIBILITY
        elif isinstance(v, bool):
            sig[p.name] = "u1"
        elif isinstance(v, int):
            if specialize and v == 1:
                sig[p.name], cons[(i,)] = "constexpr", 1
            else:
                sig[p.name] = _int_type(v)
                if specialize and align and v % 16 == 0:
                    attrs[(i,)] = _DIVISIBILITY
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{launch.name}: cannot type argument {p.name}={v!r}")
    return Signature(sig, cons, attrs, options, names)


# ----------------------------------------------------------------------------- GPU overrides


@dataclass(frozen=True)
class GpuContext:
    """What the interpreter-dependent choices depend on."""

    dtype: torch.dtype  # the layer's data (and weights') dtype
    persistent: bool  # a persistent (grid-barrier) launch on the GPU


def _tl_dtype(dtype: torch.dtype):
    import triton.language as tl

    return {torch.float32: tl.float32, torch.float16: tl.float16,
            torch.bfloat16: tl.bfloat16}[dtype]


def _gpu_dot_dt(recorded, ctx: GpuContext, gpu: dict):
    return _tl_dtype(ctx.dtype)


def _gpu_fp32_dot(recorded, ctx: GpuContext, gpu: dict):
    import triton.language as tl

    return gpu.get("DOT_DT", _tl_dtype(ctx.dtype)) == tl.float32


def _gpu_vector_width(recorded, ctx: GpuContext, gpu: dict):
    # A vector tile's slice width follows the dot dtype (interpreter: fp32's 128 columns).
    if not recorded:
        return recorded  # 0: MMA tiles
    from tritonrnn.kernels.grid_tiles import vector_width

    return vector_width(gpu.get("DOT_DT", _tl_dtype(ctx.dtype)))


def _gpu_barrier(recorded, ctx: GpuContext, gpu: dict):
    # 2 (count arrivals only) is a test hook, never planned.
    return 1 if ctx.persistent else 0


def _gpu_upcast(recorded, ctx: GpuContext, gpu: dict):
    return False


def _gpu_ieee(recorded, ctx: GpuContext, gpu: dict):
    # Interpreter: IEEE = (True or fp32) and not allow_tf32; GPU: fp32 and not allow_tf32.
    return bool(recorded) and ctx.dtype == torch.float32


def _gpu_host_steps(recorded, ctx: GpuContext, gpu: dict):
    return -1


# Constexprs whose value the launchers choose from "am I in the interpreter?": name -> rule
# (recorded value, context, GPU values decided so far) -> GPU value. Applied in this order to
# every kernel that has the name.
INTERPRETER_CONSTEXPRS = {
    "DOT_DT": _gpu_dot_dt,
    "FP32_DOT": _gpu_fp32_dot,
    "VW": _gpu_vector_width,
    "BARRIER": _gpu_barrier,
    "UPCAST": _gpu_upcast,
    "IEEE": _gpu_ieee,
    "HOST_STEPS": _gpu_host_steps,
}


def gpu_signature(sig: Signature, ctx: GpuContext) -> tuple[Signature, dict]:
    """(signature with the GPU values of INTERPRETER_CONSTEXPRS, {name: (interpreter value,
    GPU value)} of what changed). A persistent launch also gets the cooperative-launch option
    where this Triton has it (as the launchers pass it)."""
    cons = dict(sig.constexprs)
    changed = {}
    gpu = {}  # the GPU values decided so far (what a rule may read)
    for name, rule in INTERPRETER_CONSTEXPRS.items():
        if name not in sig.names or sig.signature[name] != "constexpr":
            continue
        key = (sig.names.index(name),)
        value = rule(cons[key], ctx, gpu)
        gpu[name] = value
        if value != cons[key]:
            changed[name] = (cons[key], value)
        cons[key] = value
    options = dict(sig.options)
    if ctx.persistent and "BARRIER" in gpu:  # as the launchers: a barrier
        from tritonrnn.kernels.grid_barrier import cooperative_launch_options

        options.update(cooperative_launch_options())
    return dataclasses.replace(sig, constexprs=cons, options=options), changed


# ----------------------------------------------------------------------------- compile


def _tool(name: str, arch: int = 90) -> str:
    """Path of the NVIDIA tool Triton uses (its TRITON_<NAME>_PATH or the wheel's copy; for
    ptxas the one Triton's CUDA backend picks for `arch`)."""
    from triton import knobs

    try:
        if name == "ptxas":
            with contextlib.suppress(ImportError):
                from triton.backends.nvidia.compiler import get_ptxas

                try:
                    return get_ptxas(arch).path
                except TypeError:  # Triton <= 3.5: one ptxas for every architecture
                    return get_ptxas().path
        return getattr(knobs.nvidia, name).path
    except (RuntimeError, AttributeError):
        raise ToolMissing(
            f"{name} not found (Triton ships it in triton/backends/nvidia/bin; "
            f"TRITON_{name.upper()}_PATH overrides)"
        ) from None


class ToolMissing(RuntimeError):
    """ptxas or cuobjdump is not available: nothing can be compiled for a GPU target."""


class _TargetDriver:
    """Stands in for Triton's active GPU driver while the JIT compiles for `arch` on a machine
    that may have no GPU: it answers the three queries a JIT compile makes (device, stream,
    target) and launches nothing. Its device is its own per architecture, so that the JIT's
    per-device caches never hand a kernel of one target to another."""

    def __init__(self, arch: int):
        self.arch = arch

    def get_current_device(self):
        return f"tritonrnn-aot-sm_{self.arch}"

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.arch, _WARP)


def compile_launch(launch: Launch, ctx: GpuContext, arch: int = 90,
                   compile_options: dict | None = None):
    """(Triton CompiledKernel for GPUTarget("cuda", arch, 32), GPU signature, changed
    constexprs). `compile_options` (e.g. {"maxnreg": 255}) go on top of the launch's options,
    for experiments. Needs ptxas (ToolMissing otherwise), no GPU.

    The compile goes through the kernel's own JIT (`warmup`, the recorded arguments with the
    GPU values of INTERPRETER_CONSTEXPRS), with `_TargetDriver` answering for the device: the
    specialisation, options and cache key are those of the same launch on a GPU of that
    architecture, so its Triton cache entry is the one such a GPU's run looks up."""
    import triton
    from triton.runtime import driver

    _tool("ptxas", arch)
    sig, changed = gpu_signature(build_signature(launch), ctx)
    kernel = getattr(importlib.import_module(launch.module), launch.name)
    if type(kernel).__name__ != "JITFunction":
        raise RuntimeError(f"aot: {launch.module}.{launch.name} is a {type(kernel).__name__}, "
                           "not a JITFunction: compile in a process without TRITON_INTERPRET=1 "
                           "(aot_reports does)")
    # The recorded call by name, every constexpr at its GPU value, then the launch options.
    kwargs = dict(zip(sig.names, launch.args, strict=False))
    kwargs.update(launch.kwargs)
    kwargs.update(sig.constexprs_by_name())
    kwargs.update(sig.options)
    kwargs.update(compile_options or {})
    # Afterwards the driver's own state is put back as it was, not `reset_active()`: from
    # Triton 3.5 on that creates the default driver at once, which fails without a GPU.
    saved = dict(vars(driver))
    driver.set_active(_TargetDriver(arch))
    try:
        compiled = kernel.warmup(grid=(1,), **kwargs)
    finally:
        vars(driver).update(saved)
    if compiled is None:  # pragma: no cover - depends on the installed Triton
        raise RuntimeError(f"aot: Triton {triton.__version__}'s JIT warmup returned no "
                           f"compiled kernel for {launch.name}")
    return compiled, sig, changed


# ----------------------------------------------------------------------------- analysis


def res_usage(cubin: bytes) -> dict:
    """{"regs", "stack", "local", "static_shared"} of the cubin's one kernel."""
    return parse_res_usage(_cuobjdump(cubin, "-res-usage"))


def parse_res_usage(text: str) -> dict:
    """`cuobjdump -res-usage` output -> {"regs": registers per thread, "stack": stack frame
    bytes per thread (where ptxas puts spills), "local": local memory bytes per thread,
    "static_shared": statically declared shared bytes (Triton's dynamic shared memory is
    metadata.shared, not this)}."""
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", text)
    if m is None:
        raise RuntimeError(f"aot: unexpected cuobjdump -res-usage output: {text[:200]!r}")
    regs, stack, shared, local = (int(g) for g in m.groups())
    return {"regs": regs, "stack": stack, "local": local, "static_shared": shared}


def _cuobjdump(cubin: bytes, flag: str) -> str:
    tool = _tool("cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([tool, flag, path], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"aot: cuobjdump {flag} failed: {res.stderr.strip()[:200]}")
    return res.stdout


def mma_kind(ptx: str) -> str:
    """tcgen05 (Blackwell's tensor-memory MMA, sm_100), wgmma (Hopper warpgroup MMA), mma
    (mma.sync tensor cores), fma (no tensor cores), or those found joined by '+' (e.g.
    'wgmma+mma')."""
    kinds = [k for k, pat in (("tcgen05", "tcgen05.mma"), ("wgmma", "wgmma.mma_async"),
                              ("mma", "mma.sync")) if pat in ptx]
    return "+".join(kinds) or "fma"


_SASS_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.+?)\s*;")
_SASS_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
# A uniform predicate as an instruction's first operand (`BRA.U !UP0, 0x1450`), as sm_100's
# SASS writes a branch on a value uniform across the warp, rather than an `@P0` guard.
_UNIFORM_PREDICATE = re.compile(r"!?UP\d,$")
# Branch targets: absolute addresses (cuobjdump) or labels (nvdisasm).
_SASS_TARGET = re.compile(r"\s(0x[0-9a-f]+)\s*$|`\((\.L_x_\d+)\)")
# Profile columns -> SASS opcodes (the part before the first '.').
PROFILE_OPS = {
    "LDG": ("LDG",),
    "STG": ("STG",),
    "LDS": ("LDS",),
    "STS": ("STS",),
    "LDSM": ("LDSM",),
    "LDGSTS": ("LDGSTS",),
    "MMA": ("HMMA", "HGMMA", "UTCHMMA"),  # mma.sync, wgmma, tcgen05 (16-bit and tf32)
    "FFMA": ("FFMA",),
    "BAR": ("BAR",),
    "ATOM": ("ATOM", "ATOMG", "ATOMS", "RED", "REDG"),
    # Memory fences (a grid barrier's release; not in the printed table).
    "MEMBAR": ("MEMBAR",),
    # Local memory (per-thread, off-chip behind L1): where ptxas spills registers.
    "LDL": ("LDL",),
    "STL": ("STL",),
}
# Profile columns also counted outside the step loop, as "<column>_outside".
OUTSIDE_OPS = ("LDL", "STL")


@dataclass(frozen=True)
class SassInsn:
    addr: int
    op: str  # opcode with modifiers, predicate stripped, e.g. "BRA.DIV", "LDG.E.128"
    target: int | None  # branch target address
    predicated: bool  # guarded by a predicate other than PT (may fall through)

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


def parse_sass(sass: str) -> list[SassInsn]:
    """The instructions of the (first) function in `cuobjdump -sass` or nvdisasm output."""
    raw, labels, pending = [], {}, []
    for line in sass.splitlines():
        lm = _SASS_LABEL.match(line)
        if lm:
            pending.append(lm.group(1))
            continue
        m = _SASS_INSN.search(line)
        if not m:
            continue
        addr, text = int(m.group(1), 16), m.group(2).strip()
        for name in pending:
            labels[name] = addr
        pending = []
        tokens = text.split()
        predicated = bool(tokens) and tokens[0].startswith("@")
        if predicated:
            predicated = tokens[0] != "@PT"
            tokens = tokens[1:]
        op = tokens[0] if tokens else ""
        if len(tokens) > 1 and _UNIFORM_PREDICATE.match(tokens[1]):
            predicated = True  # BRA.U UP0, target (sm_100 and later): may fall through
        tm = _SASS_TARGET.search(text) if op.split(".")[0] == "BRA" else None
        raw.append((addr, op, (tm.group(1) or tm.group(2)) if tm else None, predicated))
    return [SassInsn(a, op, _address(t, labels), p) for a, op, t, p in raw]


def _address(target: str | None, labels: dict) -> int | None:
    if target is None:
        return None
    return int(target, 16) if target.startswith("0x") else labels.get(target)


def _cfg(insns: list[SassInsn]) -> tuple[list[list[SassInsn]], list[set[int]]]:
    """(basic blocks, successor block indices). A BRA goes to its target and, when predicated
    or a .DIV/.CONV (divergence) branch, also falls through; EXIT/RET end a block without a
    successor unless predicated; indirect branches (BRX/JMX) have no known successor."""
    index = {ins.addr: i for i, ins in enumerate(insns)}
    leaders = {0}
    for i, ins in enumerate(insns):
        if ins.base in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET"):
            leaders.add(i + 1)
            if ins.target in index:
                leaders.add(index[ins.target])
    starts = sorted(x for x in leaders if x < len(insns))
    blocks = [insns[a:b] for a, b in zip(starts, starts[1:] + [len(insns)], strict=True)]
    block_of = {blk[0].addr: k for k, blk in enumerate(blocks)}
    succ: list[set[int]] = []
    for k, blk in enumerate(blocks):
        last, out = blk[-1], set()
        mods = set(last.op.split(".")[1:])
        falls = True
        if last.base in ("BRA", "JMP"):
            if last.target in block_of:
                out.add(block_of[last.target])
            falls = last.predicated or bool(mods & {"DIV", "CONV"})
        elif last.base in ("EXIT", "RET", "BRX", "JMX"):
            falls = last.predicated
        if falls and k + 1 < len(blocks):
            out.add(k + 1)
        succ.append(out)
    return blocks, succ


def natural_loops(insns: list[SassInsn]) -> list[tuple[list[SassInsn], set[int]]]:
    """Natural loops of the control-flow graph, largest first: (blocks, body block indices)
    per loop header (back edges u -> h where h dominates u, merged by header). The body
    includes out-of-line blocks the compiler placed after the loop (divergent-branch paths
    that jump back), which an address range would miss."""
    if not insns:
        return []
    blocks, succ = _cfg(insns)
    n = len(blocks)
    pred: list[set[int]] = [set() for _ in range(n)]
    for u, vs in enumerate(succ):
        for v in vs:
            pred[v].add(u)
    # Reachable blocks, then iterative dominators.
    reach, stack = {0}, [0]
    while stack:
        for v in succ[stack.pop()]:
            if v not in reach:
                reach.add(v)
                stack.append(v)
    dom = {b: set(reach) for b in reach}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in sorted(reach - {0}):
            ps = [dom[p] for p in pred[b] if p in reach]
            new = set.intersection(*ps) | {b} if ps else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    bodies: dict[int, set[int]] = {}
    for u in reach:
        for h in succ[u]:
            if h in dom[u]:  # back edge u -> h
                body, work = bodies.setdefault(h, {h}), [u]
                while work:
                    x = work.pop()
                    if x not in body:
                        body.add(x)
                        work.extend(p for p in pred[x] if p in reach)
    loops = [(blocks, body) for body in bodies.values()]
    return sorted(loops, key=lambda lb: -sum(len(lb[0][b]) for b in lb[1]))


_HMMA = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?HMMA\.\S+\s+(R\d+),\s*R\d+"
                   r"(?:\.reuse)?,\s*R\d+(?:\.reuse)?,\s*(R\d+|RZ)")


def mma_chain(sass: str, addresses: set[int] | None = None) -> int:
    """Longest dependent HMMA chain (destination -> accumulator input, address order) among
    the instructions at `addresses` (all when None)."""
    depth: dict[str, int] = {}
    best = 0
    for m in _HMMA.finditer(sass):
        if addresses is not None and int(m.group(1), 16) not in addresses:
            continue
        dst, acc = m.group(2), m.group(3)
        depth[dst] = (0 if acc == "RZ" else depth.get(acc, 0)) + 1
        best = max(best, depth[dst])
    return best


def loop_profile(sass: str) -> dict:
    """Static counts over the step loop, the outermost (largest) natural loop of the SASS:
    {PROFILE_OPS column: count, "instructions" (NOPs excluded), "inner_loops" (other loop
    headers inside it), "MMA_chain" (`mma_chain` in the loop)}, all zero when the kernel has
    no loop; plus "<col>_outside" for each
    OUTSIDE_OPS column: its count in the rest of the function (prologue, epilogue, code after
    EXIT), the whole function when there is no loop."""
    out = dict.fromkeys(PROFILE_OPS, 0)
    out.update(instructions=0, inner_loops=0, MMA_chain=0)
    out.update(dict.fromkeys((f"{c}_outside" for c in OUTSIDE_OPS), 0))
    insns = parse_sass(sass)
    loops = natural_loops(insns)
    root = {op: col for col, ops in PROFILE_OPS.items() for op in ops}
    in_loop: set[int] = set()  # addresses of the step loop's instructions
    if loops:
        blocks, body = loops[0]
        for b in body:
            for ins in blocks[b]:
                in_loop.add(ins.addr)
                if ins.base == "NOP":
                    continue
                out["instructions"] += 1
                if ins.base in root:
                    out[root[ins.base]] += 1
        out["inner_loops"] = sum(1 for _, other in loops[1:] if other <= body)
        out["MMA_chain"] = mma_chain(sass, in_loop)
    for ins in insns:
        col = root.get(ins.base)
        if col in OUTSIDE_OPS and ins.addr not in in_loop:
            out[f"{col}_outside"] += 1
    return out


# ----------------------------------------------------------------------------- report


@dataclass
class KernelReport:
    """One compiled kernel of a plan (sizes in bytes)."""

    phase: str  # forward | backward
    kernel: str
    grid: list
    programs: int  # product of the grid
    num_warps: int
    num_stages: int = 0  # the launch's num_stages (0: none given, Triton's default)
    constexprs: dict = field(default_factory=dict)  # as compiled (GPU values), as strings
    interpreter_overrides: dict = field(default_factory=dict)  # name -> [interp, gpu]
    shared: int = 0  # metadata.shared: shared memory per program
    regs: int = 0  # registers per thread
    stack: int = 0  # stack frame per thread (spills)
    local: int = 0  # local memory per thread
    mma: str = ""  # wgmma | mma | fma | wgmma+mma
    regs_per_program: int = 0  # allocated (per warp in units of 256)
    # Resident programs per SM by shared memory (the preset's per-program limit stands for the
    # SM's), registers and threads (2048).
    programs_per_sm: int = 0
    fits_smem: bool = False
    fits_regs: bool = False
    spills: bool = False  # any stack or local bytes
    # Spills whose loads or stores are in the step loop (paid every step); spills without them
    # are saved and restored around the loop, once per launch, and do not fail `fits`.
    loop_spills: bool = False
    co_resident: bool | None = None  # persistent launches: programs <= SMs and >= 1 per SM
    fits: bool = False  # all of the above
    profile: dict = field(default_factory=dict)  # loop_profile of the step loop
    compile_s: float = 0.0
    error: str | None = None  # the compile's error (one line), when it failed


def _grid_programs(grid) -> int:
    n = 1
    for g in grid:
        n *= int(g)
    return n


def _regs_per_program(regs: int, num_warps: int) -> int:
    # Registers are allocated per warp in units of 256 (8 per thread).
    per_warp = -(-regs * _WARP // 256) * 256
    return per_warp * num_warps


def spill_kinds(stack: int, local: int, profile: dict) -> tuple[bool, bool]:
    """(spills, loop_spills) of a kernel with `stack` and `local` bytes per thread and step-loop
    profile `profile` (loop_profile): any spill bytes, and spills the step loop loads or stores
    (a profile without local-memory counts counts as one that does)."""
    spills = stack > 0 or local > 0
    in_loop = profile.get("LDL", 1) + profile.get("STL", 1)
    return spills, spills and in_loop > 0


def report_kernel(phase: str, launch: Launch, ctx: GpuContext, props, arch: int = 90,
                  dump_dir: Path | None = None,
                  compile_options: dict | None = None) -> KernelReport:
    """Compiles one recorded launch and measures it against the device preset `props`
    (planner DeviceProperties). A compile error is reported in `error`, not raised (except a
    missing ptxas/cuobjdump: ToolMissing)."""
    grid = list(launch.grid) if not callable(launch.grid) else []
    num_warps = int(launch.kwargs.get("num_warps", 4))
    rep = KernelReport(phase, launch.name, grid, _grid_programs(grid), num_warps,
                       int(launch.kwargs.get("num_stages", 0)))
    t0 = time.perf_counter()
    try:
        compiled, sig, changed = compile_launch(launch, ctx, arch, compile_options)
    except ToolMissing:
        raise
    except Exception as e:  # a compile failure is a finding about the kernel
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
        # Triton's messages start with a location and end with the cause: keep both, and
        # the innermost chained exception's message (nested jit helpers chain one
        # CompilationError per call level, each ending in its source excerpt's caret).
        text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        root = e
        while (root.__cause__ or root.__context__) is not None:
            root = root.__cause__ or root.__context__
        if root is not e:  # the innermost exception says what went wrong
            cause = (str(root).strip().splitlines() or [""])[-1]
            text += f" <- {type(root).__name__}: {cause}"
        rep.error = f"{type(e).__name__}: {text}"[:500]
        rep.compile_s = time.perf_counter() - t0
        return rep
    rep.compile_s = time.perf_counter() - t0
    rep.constexprs = {k: str(v) for k, v in sig.constexprs_by_name().items()}
    rep.interpreter_overrides = {k: [str(a), str(b)] for k, (a, b) in changed.items()}
    cubin = compiled.asm["cubin"]
    usage = res_usage(cubin)
    rep.shared = int(compiled.metadata.shared)
    rep.regs, rep.stack, rep.local = usage["regs"], usage["stack"], usage["local"]
    rep.mma = mma_kind(compiled.asm["ptx"])
    sass = _cuobjdump(cubin, "-sass")
    rep.profile = loop_profile(sass)
    rep.regs_per_program = _regs_per_program(rep.regs, num_warps)
    rep.spills, rep.loop_spills = spill_kinds(rep.stack, rep.local, rep.profile)
    rep.fits_smem = rep.shared <= props.smem_per_program
    rep.fits_regs = rep.regs_per_program <= props.regs_per_sm
    by_smem = props.smem_per_program // rep.shared if rep.shared else 32
    by_regs = props.regs_per_sm // max(rep.regs_per_program, 1)
    by_threads = 2048 // (num_warps * _WARP)
    rep.programs_per_sm = max(0, min(by_smem, by_regs, by_threads, 32))
    if ctx.persistent:
        rep.co_resident = rep.programs <= props.sm_count and rep.programs_per_sm >= 1
    rep.fits = (rep.fits_smem and rep.fits_regs and not rep.loop_spills
                and rep.co_resident is not False)
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            if ext in compiled.asm:
                (dump_dir / f"{launch.name}.{ext}").write_text(compiled.asm[ext])
        (dump_dir / f"{launch.name}.sass").write_text(sass)
    return rep


def aot_report(shape: AotShape, preset: str = "h100", constraints: dict | None = None,
               arch: int = 90, dump_dir: Path | None = None,
               compile_options: dict | None = None) -> dict:
    """The plan of `shape` on the device preset and its compiled kernels, as a JSON-able dict:
    {"shape", "preset", "device", "arch", "triton", "plan", "source", "compile_options",
    "kernels": [KernelReport as a dict, forward then backward]}. `dump_dir`: also write each
    kernel's TTGIR, PTX and SASS there; `compile_options`: extra Triton compile options on top
    of the launch's (experiments, e.g. {"maxnreg": 255})."""
    return aot_reports([(shape, constraints)], preset, arch, dump_dir, compile_options)[0]


def aot_reports(jobs: list[tuple[AotShape, dict | None]], preset: str = "h100", arch: int = 90,
                dump_dir: Path | None = None, compile_options: dict | None = None,
                processes: int = 1) -> list[dict]:
    """`aot_report` of each (shape, plan constraints) job, in the jobs' order. With
    `processes` > 1 the jobs are dealt round-robin to that many fresh Python processes that
    compile at the same time (Triton's cache takes concurrent writers); else in one fresh
    process when this one holds interpreter kernel objects, or here. Raises ValueError for a
    shape the planner refuses under its constraints (checked here first), ToolMissing without
    ptxas/cuobjdump."""
    if processes < 1:
        raise ValueError(f"processes: expected an int >= 1, got {processes}")
    for shape, constraints in jobs:
        plan_layer(shape, preset, constraints)
    _tool("ptxas", arch)
    _tool("cuobjdump")
    processes = min(processes, len(jobs))
    if processes > 1:
        from concurrent.futures import ThreadPoolExecutor

        shares = [jobs[i::processes] for i in range(processes)]
        with ThreadPoolExecutor(processes) as pool:
            done = list(pool.map(lambda share: _reports_in_fresh_process(
                share, preset, arch, dump_dir, compile_options), shares))
        return [done[i % processes][i // processes] for i in range(len(jobs))]
    if _interpreted_process():
        return _reports_in_fresh_process(jobs, preset, arch, dump_dir, compile_options)
    return [_report(s, preset, c, arch, dump_dir, compile_options) for s, c in jobs]


def _interpreted_process() -> bool:
    """Whether triton.language or the kernel modules were imported under TRITON_INTERPRET=1
    (their @jit functions are then InterpretedFunction objects, which cannot be compiled)."""
    import triton.language.standard as std

    mods = [std] + [importlib.import_module(m) for m in KERNEL_MODULES]
    return any(type(o).__name__ == "InterpretedFunction" for m in mods for o in vars(m).values())


def _reports_in_fresh_process(jobs, preset, arch, dump_dir, compile_options) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "reports.json")
        spec = {"jobs": [[_shape_to_json(s), c or {}] for s, c in jobs], "preset": preset,
                "arch": arch, "compile_options": compile_options or {},
                "dump_dir": str(dump_dir) if dump_dir is not None else None, "out": out}
        res = subprocess.run(
            [sys.executable, "-c", "from tritonrnn.bench.aot import _child_main; _child_main()",
             json.dumps(spec)], env=env, capture_output=True, text=True, check=False)
        if not os.path.exists(out):
            tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"aot: the compile process failed (exit {res.returncode}): {tail}")
        with open(out) as f:
            result = json.load(f)
    if "error" in result:
        kind = {"ToolMissing": ToolMissing, "ValueError": ValueError, "TypeError": TypeError}
        raise kind.get(result["error"]["type"], RuntimeError)(result["error"]["message"])
    return result["reports"]


def _shape_to_json(shape: AotShape) -> dict:
    d = dataclasses.asdict(shape)
    d["dtype"] = str(shape.dtype).replace("torch.", "")
    return d


def _child_main() -> None:
    """Entry point of the fresh compile process: argv[1] is the JSON spec; writes {"reports"}
    or {"error": {"type", "message"}} to spec["out"]."""
    spec = json.loads(sys.argv[1])
    try:
        dump = Path(spec["dump_dir"]) if spec["dump_dir"] else None
        result = {"reports": [
            _report(AotShape(**{**d, "dtype": getattr(torch, d["dtype"])}), spec["preset"], c,
                    spec["arch"], dump, spec["compile_options"]) for d, c in spec["jobs"]]}
    except Exception as e:  # handed to the parent, which raises it
        result = {"error": {"type": type(e).__name__, "message": str(e)}}
    with open(spec["out"], "w") as f:
        json.dump(result, f)


def _report(shape: AotShape, preset: str, constraints: dict | None, arch: int,
            dump_dir: Path | None, compile_options: dict | None = None) -> dict:
    import triton

    lp, source = plan_layer(shape, preset, constraints)
    props = device_preset(preset)
    out = {"shape": shape.label, "preset": preset, "device": props.name, "arch": arch,
           "triton": triton.__version__, "plan": dataclasses.asdict(lp), "source": source,
           "compile_options": dict(compile_options or {}), "kernels": []}
    if lp.family == "reference":
        out["note"] = "family reference (float64): no Triton kernel"
        return out
    ctx = GpuContext(shape.dtype, persistent=lp.family == "persistent_grid")
    launches = capture(shape, lp, props=props)
    for phase, launch in launches.items():
        sub = dump_dir / shape.label.replace(" ", "_") / phase if dump_dir else None
        rep = report_kernel(phase, launch, ctx, props, arch, sub, compile_options)
        out["kernels"].append(dataclasses.asdict(rep))
    return out


def report_ok(report: dict) -> bool:
    return all(k["error"] is None and k["fits"] for k in report["kernels"])


_PROFILE_COLS = ("LDG", "LDGSTS", "STG", "LDS", "STS", "LDSM", "LDL", "STL", "MMA", "MMA_chain",
                 "BAR", "ATOM", "instructions")
_SHORT = {"LDGSTS": "LDGST", "instructions": "instr", "MMA_chain": "chain"}


def format_report(report: dict) -> str:
    """A table of one shape's kernels (what `tritonrnn aot` prints)."""
    lp = report["plan"]
    own = (f"(backward {lp.get('block_h_bwd') or lp['block_h']} x "
           f"{lp.get('block_b_bwd') or lp['block_b']}) "
           if lp.get("block_h_bwd") or lp.get("block_b_bwd") else "")
    stages = lp.get("num_stages")
    staged = (f"stages={stages}"
              + (f" (backward {lp['num_stages_bwd']})" if lp.get("num_stages_bwd") else "")
              + " " if stages else "")
    lines = [
        f"{report['shape']} on the {report['preset']} preset ({report['device']}), "
        f"sm_{report['arch']}, Triton {report['triton']}",
        f"  plan ({report['source']}): {lp['family']} block_b={lp['block_b']} "
        f"block_h={lp['block_h'] or '-'} {own}block_k={lp['block_k']} {staged}"
        f"warps={lp['num_warps']}"
        f"{' (backward ' + str(lp['num_warps_bwd']) + ')' if lp.get('num_warps_bwd') else ''} "
        f"programs={lp['num_programs']}"
        f"{' (forward ' + str(lp['forward_programs']) + ')' if lp.get('forward_programs') else ''}"
        f"{' (pair launch)' if lp['num_dirs'] == 2 else ''} "
        f"planner on-chip estimate={lp['onchip_bytes']} B",
    ]
    if report.get("compile_options"):
        lines.append(f"  extra compile options: {report['compile_options']}")
    if "note" in report:
        return "\n".join([*lines, "  " + report["note"]])
    head = (f"  {'pass':<8} {'kernel':<20} {'grid':<7} {'warps':>5} {'smem B':>7} {'regs':>4} "
            f"{'spill':>5} {'mma':<9} {'/SM':>3} {'fits':<10}")
    loop = " ".join(f"{_SHORT.get(c, c):>5}" for c in (*_PROFILE_COLS, "inner"))
    outside = " ".join(f"{c:>5}" for c in OUTSIDE_OPS)
    # A group line above the column names: which columns count the step loop, which the rest.
    lines.append(f"{'':<{len(head)}}| {'step loop':<{len(loop)}} | outside loop")
    lines.append(f"{head}| {loop} | {outside}")
    for k in report["kernels"]:
        grid = "x".join(str(g) for g in k["grid"])
        if k["error"]:
            lines.append(f"  {k['phase']:<8} {k['kernel']:<20} {grid:<7} {k['num_warps']:>5} "
                         f"COMPILE FAILED: {k['error']}")
            continue
        why = []
        if not k["fits_smem"]:
            why.append("smem")
        if k["loop_spills"]:
            why.append("spills")
        if not k["fits_regs"]:
            why.append("regs")
        if k["co_resident"] is False:
            why.append("grid")
        fits = ("yes" + ("*" if k["spills"] else "")) if k["fits"] else "NO:" + ",".join(why)
        prof = k["profile"]
        loop = " ".join(f"{prof.get(c, 0):>5}" for c in (*_PROFILE_COLS, "inner_loops"))
        outside = " ".join(f"{prof.get(f'{c}_outside', 0):>5}" for c in OUTSIDE_OPS)
        lines.append(
            f"  {k['phase']:<8} {k['kernel']:<20} {grid:<7} {k['num_warps']:>5} "
            f"{k['shared']:>7} {k['regs']:>4} {k['stack'] + k['local']:>5} {k['mma']:<9} "
            f"{k['programs_per_sm']:>3} {fits:<10}| {loop} | {outside}"
        )
    lines.append("  (smem: bytes per program; spill: stack + local bytes per thread; /SM: programs "
                 "per SM by smem, registers and threads; step loop: static instruction counts "
                 "in the time-step loop, nested loops counted once;")
    lines.append("   LDL/STL: local-memory loads/stores (register spills), paid every step when in "
                 "the step loop, once per launch outside it; chain: the longest run of mma.sync "
                 "each waiting for the one before; yes*: fits, its spills saved and restored "
                 "around the step loop only)")
    over = {n: v for k in report["kernels"] for n, v in k["interpreter_overrides"].items()}
    if over:
        lines.append("  GPU values of interpreter-dependent constexprs: " + ", ".join(
            f"{n}={v[1]}" for n, v in over.items()))
    return "\n".join(lines)


JSON_KEYS = ("host", "reports")  # write_json's top level


def check_json_target(path: Path) -> str | None:
    """Why `path` must not be replaced by write_json (None: it may): an existing file is
    replaced only when it is an earlier aot report (a JSON object with exactly JSON_KEYS), so
    a mistyped --json never writes over another file (a bench report, a source file,
    /etc/passwd)."""
    if not path.exists():
        return None
    if not path.is_file():  # a device (/dev/null), a FIFO: never replaced by a report
        return "it exists and is not a regular file"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return "it exists and is not JSON"
    if not isinstance(data, dict) or set(data) != set(JSON_KEYS):
        keys = sorted(data) if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        return f"it exists and is not an aot report (keys {list(JSON_KEYS)}; it has {keys})"
    return None


def write_json(reports: list[dict], path: Path) -> None:
    """{"host": where it was compiled (commit, source hash, Triton version, switches), "reports":
    one per shape}: a compile's figures belong to the source and Triton that produced them."""
    from tritonrnn.rnn.planner import write_json_atomic

    from .harness import environment

    write_json_atomic(path, {"host": environment(torch.device("cpu")), "reports": reports},
                      sort_keys=False)
