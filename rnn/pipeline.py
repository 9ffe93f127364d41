"""Layer pipeline: consecutive layers of a unidirectional stack overlapped over time chunks.

Layer l's recurrence over steps [s0, s1) needs only layer l-1's outputs of those steps (its
input projection is a GEMM over that chunk's packed rows, after the inter-layer dropout of
those rows), so layer l can run chunk k while layer l-1 runs chunk k+1: a wavefront over
(layer, chunk). The steps [0, max_len) are split into C chunks (`step_bounds`); a chunk is
itself a packed layout (`packing.window`), so every backend's recurrence runs on it unchanged,
with h0 = the state after the previous chunk and hT handed to the next one. The backward is
the mirror image: chunks in reverse time order, layer l's chunk k after layer l+1's chunk k
(whose input gradient rows are layer l's output gradient rows). Each pass keeps as many
layers in flight as its own launches allow (a split-K backward can take more programs than
its forward); a backward that allows one runs unpipelined, on the reserve the pipelined
forward wrote (laid out as an unpipelined forward lays it out).

Scheduling (`run`): layers are enqueued one after another (layer-major, a topological order of
the chunk dependencies), layer l on stream slot l mod W, each chunk waiting on an event that
the previous layer recorded after the same chunk. On CUDA the W slots are side streams forked
from and joined back into the caller's stream, so up to W recurrence kernels run at once; on
the CPU (and under the Triton interpreter) the same calls run in the same order, one after
another, with identical math. The engine (rnn/engine.py) supplies the per-chunk work.

The rule (`decide`, `concurrent_layers`) decides C and W and says why; `plan_constraints(
pipeline_chunks=k)` forces C = k (on any device, clamped to max_len steps; k = 1 turns the
pipeline off). The engine and Plan.explain() both ask `decide`; the workspaces a pipelined
run adds (`extra_workspaces`) come from the shapes the engine allocates
(`forward_workspaces`, `backward_workspaces`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from tritonrnn.kernels.grid_barrier import capturing

from . import reference
from .config import RNNConfig
from .planner import (
    DeviceProperties,
    LayerPlan,
    current_constraints,
    device_properties,
    recurrence_choice,
)

PERSISTENT = ("persistent_cta", "persistent_grid")
# Time model of the rule (microseconds). T_STEP_US: one recurrence step of a persistent
# kernel. The H100 persistent-grid forward measured 9 to 15 us per step (README, T = 1024);
# the persistent-CTA step and the design target are shorter, so 5 us is the conservative end:
# a shorter step makes the fill cost relatively larger and the pipeline pay later.
# T_LAUNCH_US: the fixed cost of one (layer, chunk): its input-projection GEMM, dropout and
# recurrence launches and the event record/wait.
T_STEP_US = 5.0
T_LAUNCH_US = 10.0
# Chunks of at least this many steps: a chunk's GPU time (>= 32 steps, >= 160 us) then stays
# well above the host time to enqueue it, so the GPU never waits on Python.
MIN_CHUNK_STEPS = 32
# The pipeline must win by 10% in the model, so the model's error never makes it a loss.
MIN_GAIN = 0.9


@dataclass(frozen=True)
class Pipeline:
    """A decided layer pipeline: C time chunks, W layers in flight at once."""

    chunks: int  # C >= 2
    width: int  # W >= 1: stream slots; layer l runs on slot l mod W
    bounds: tuple[int, ...]  # C + 1 step boundaries, 0 = bounds[0] < ... < bounds[C] = max_len


def step_bounds(max_len: int, chunks: int) -> tuple[int, ...]:
    """C + 1 boundaries splitting [0, max_len) into `chunks` near-equal non-empty chunks."""
    if not 1 <= chunks <= max_len:
        raise ValueError(f"chunks: expected 1..max_len = {max_len}, got {chunks}")
    return tuple(k * max_len // chunks for k in range(chunks + 1))


def stack_plans(cfg: RNNConfig, backend: object, batch: int, dtype: torch.dtype,
                props: DeviceProperties, *,
                backward: bool | None = None) -> tuple[LayerPlan, ...]:
    """The recurrence plans of the stack as `backend` (a backend, or its name) will run them:
    for a backend with `plans_run` (TritonRecurrence) each layer's forward and backward plan
    (one pass's alone where `backward` names it), the planner's choice or what replaced it
    after a launch the device refused (a refused persistent CTA runs as a persistent grid of
    more programs); for the name "triton" the planner's choice (the call
    TritonRecurrence.plan_choice makes); a "reference" plan for any other backend (torch
    ops: never pipelined by the rule). Every layer of a unidirectional stack has the same
    (H, Hout, P, B), hence the same plans."""
    name = backend if isinstance(backend, str) else getattr(backend, "name", "")
    if name != "triton":
        return (LayerPlan("reference"),) * cfg.num_layers
    shape = (cfg.rnn_mode, cfg.num_units, cfg.out_size, cfg.num_proj, dtype, batch, props, 1)
    plans_run = getattr(backend, "plans_run", None)
    if plans_run is not None:
        forward, backward_plan = plans_run(shape)
        run = ((forward, backward_plan) if backward is None
               else (backward_plan,) if backward else (forward,))
        return run * cfg.num_layers
    return (recurrence_choice(*shape)[0],) * cfg.num_layers


def concurrent_layers(num_layers: int, plans: Sequence[LayerPlan],
                      props: DeviceProperties, *, backward: bool = True) -> int:
    """W: how many layers of one pass may run at once (stream slots): the backward's
    (backward, the default: its launches counted as the larger of the two passes',
    LayerPlan.num_programs) or the forward's (its own launches, `LayerPlan.pass_programs`:
    a split-K backward of 128 programs under a 64-program forward leaves the forward two
    layers in flight on 132 SMs, the backward one).

    Persistent families: the most layers whose programs are co-resident together,
    W = min(L, SMs // programs). Why this avoids a deadlock: a persistent-grid program spins
    at a grid barrier every step until all programs of its launch arrive, so a launch only
    progresses once all its programs are resident, and a resident program never gives its SM
    back before the launch ends. Two launches in flight that do not fit together could each
    get part of their programs placed, every placed program spinning for ones that can only
    be placed on SMs held by the other launch's spinning programs: neither ever finishes.
    With at most W launches in flight (W slots; the layers of one slot run one after another
    on its stream) and W * programs <= SMs, every launch in flight can be resident at once
    whatever order the hardware places programs in; the other kernels in flight (GEMMs,
    dropout) wait on nothing, so they finish and free their SMs. Persistent-CTA programs
    never wait on each other (no deadlock possible); for them the bound is what makes the
    overlap real instead of two kernels time-slicing the same SMs.

    Other families (stepwise, reference) never spin: W = min(L, 2) when forced and none of
    the plans is persistent. Where some are (plans given for both passes, one of them
    stepwise), the persistent ones bound W as above: their launches still spin.
    """
    persistent = [p for p in plans if p.family in PERSISTENT]
    if persistent:
        programs = max(max(p.pass_programs(backward) for p in persistent), 1)
        return max(1, min(num_layers, props.sm_count // programs))
    return min(num_layers, 2)


def model_time_us(num_layers: int, max_len: int, chunks: int, width: int) -> float:
    """Modelled time of the stack's recurrences: (ceil(L / W) * T + (W - 1) * T / C) steps
    (each slot runs ceil(L / W) layers of T steps; the wavefront fills in W - 1 chunks) plus
    C * L chunk overheads. chunks = width = 1 is the unpipelined L * T steps + L launches."""
    steps = math.ceil(num_layers / width) * max_len + (width - 1) * max_len / chunks
    return steps * T_STEP_US + chunks * num_layers * T_LAUNCH_US


OFF, FORCED, AUTOMATIC = "off", "forced", "automatic"


@dataclass(frozen=True)
class Decision:
    """Whether a stack runs as a layer pipeline, with how many chunks, and why (`decide`)."""

    chunks: int  # C; 1: the layers run one after another
    width: int  # W: the forward's layers in flight (stream slots); 1 when off
    source: str  # FORCED (plan_constraints), AUTOMATIC (the rule) or OFF
    reason: str  # one line saying why, for Plan.explain()
    max_len: int  # the steps [0, max_len) it was decided for
    # The backward's layers in flight: width or fewer, where its launches take more programs
    # (`concurrent_layers(backward=True)`); 1 when off, and where it is 1 the backward runs
    # unpipelined (`backward_pipeline`).
    backward_width: int = 1

    @property
    def pipeline(self) -> Pipeline | None:
        """The engine's forward schedule, or None when off."""
        if self.chunks <= 1:
            return None
        return Pipeline(self.chunks, self.width, step_bounds(self.max_len, self.chunks))

    @property
    def backward_pipeline(self) -> Pipeline | None:
        """The engine's backward schedule (backward_width slots), or None when off or when
        one backward layer at a time fits the SMs: its chunks would then only add launches
        and chunk-state buffers (the forward's pipeline writes the reserve that the
        unpipelined backward reads)."""
        if self.chunks <= 1 or self.backward_width < 2:
            return None
        return Pipeline(self.chunks, self.backward_width,
                        step_bounds(self.max_len, self.chunks))


def decide(cfg: RNNConfig, batch: int, max_len: int, device: torch.device | str,
           plans: Sequence[LayerPlan] | None = None, *, dtype: torch.dtype = torch.float32,
           props: DeviceProperties | None = None, backend: object = "triton",
           automatic: bool | None = None) -> Decision:
    """The layer-pipeline decision for a stack (the one place it is made: the engine, through
    `plan_pipeline`, `pipeline_chunks` and Plan.explain() all call this).

    Forced: `plan_constraints(pipeline_chunks=k)` gives C = min(k, max_len) on any device (a
    chunk has at least one step); k > 1 on a bidirectional stack raises ValueError (a reverse
    direction needs the whole output of the layer below before its first step).

    Otherwise (automatic: default TRITONRNN_PIPELINE=1 in the environment, the opt-in until
    the side-stream overlap has been measured on a GPU) C > 1 only when all of these hold,
    checked in this order, cheapest first (no planning before the shape checks pass):
      - the device is CUDA (elsewhere nothing runs concurrently), the stack unidirectional
        with L >= 2 layers, max_len >= 2 * MIN_CHUNK_STEPS (two chunks of >= 32 steps);
      - every layer's recurrence is persistent (persistent_cta / persistent_grid; `plans`, by
        default `stack_plans(cfg, backend, ...)`; backend: a backend or its name) and at
        least two layers' programs are co-resident together (`concurrent_layers` W >= 2; see
        there why this also rules out a barrier deadlock);
      - the model (`model_time_us`, T_STEP_US = 5 us per step, T_LAUNCH_US = 10 us per
        (layer, chunk)) of the best C in [2, T // 32] (chunks of >= 32 steps) beats the
        unpipelined time by 10%. With W = L the best C is near sqrt((L - 1) T t_step /
        (L t_launch)): L = 2, T = 1024 gives C = 16 (64-step chunks), modelled 5.76 ms
        against 10.26 ms; T = 64 gives C = 2.

    W (when C > 1) is `concurrent_layers` of each pass's plans, the forward's of the plans
    that run the forward, the backward's of those that run the backward (fewer where its
    launches take more programs: Decision.backward_width); the rule asks the forward's for
    W >= 2 and the model. plans: one LayerPlan per layer, for both passes (default: each
    pass's `stack_plans`); props: device properties (default: `device`'s; tests pass
    planner.PRESETS entries)."""
    L, D = cfg.num_layers, cfg.num_dirs

    def off(reason: str) -> Decision:
        return Decision(1, 1, OFF, reason, max_len)

    def resolved() -> tuple[DeviceProperties, Sequence[LayerPlan], Sequence[LayerPlan]]:
        """(props, the forward's plans, the backward's plans)."""
        p = props if props is not None else device_properties(device)
        if plans is not None:
            return p, plans, plans
        return p, *(stack_plans(cfg, backend, batch, dtype, p, backward=b)
                    for b in (False, True))

    def widths(p, fwd_pl, bwd_pl) -> tuple[int, int]:
        return (concurrent_layers(L, fwd_pl, p, backward=False),
                concurrent_layers(L, bwd_pl, p))

    forced = current_constraints().get("pipeline_chunks")
    if forced is not None:
        if forced > 1 and D != 1:
            raise ValueError(
                f"pipeline_chunks: expected 1 for a bidirectional stack (the reverse "
                f"direction needs the whole output of the layer below), got {forced}"
            )
        how = f"forced by plan_constraints(pipeline_chunks={forced})"
        chunks = max(1, min(forced, max_len))
        if chunks == 1:
            return off(how if forced == 1 else f"{how}, but T = {max_len} < 2 steps")
        p, fwd_pl, bwd_pl = resolved()
        if chunks < forced:
            how += f", clamped to T = {max_len} steps"
        width, backward_width = widths(p, fwd_pl, bwd_pl)
        return Decision(chunks, width, FORCED, how, max_len, backward_width)
    if automatic is None:
        automatic = os.environ.get("TRITONRNN_PIPELINE", "0") == "1"
    if not automatic:
        return off("the automatic choice is opt-in and TRITONRNN_PIPELINE=1 is not set")
    if torch.device(device).type != "cuda":
        return off("not a CUDA device: nothing would run concurrently")
    if D != 1:
        return off("bidirectional: the reverse direction needs the whole output of the "
                   "layer below")
    if L < 2:
        return off("a single layer: nothing to overlap")
    if max_len < 2 * MIN_CHUNK_STEPS:
        return off(f"T = {max_len} < {2 * MIN_CHUNK_STEPS} steps: no two chunks of >= "
                   f"{MIN_CHUNK_STEPS} steps")
    p, fwd_pl, bwd_pl = resolved()
    other = [lp.family for lp in (*fwd_pl, *bwd_pl) if lp.family not in PERSISTENT]
    if other:
        return off(f"{other[0]} recurrences: only persistent launches "
                   f"({' / '.join(PERSISTENT)}) are overlapped")
    width, backward_width = widths(p, fwd_pl, bwd_pl)
    if width < 2:
        programs = max(lp.pass_programs(False) for lp in fwd_pl)
        return off(f"co-residency: two layers' programs (2 x {programs}) exceed the "
                   f"{p.sm_count} SMs")
    serial = model_time_us(L, max_len, 1, 1)
    # The first C with the least modelled time (fewer chunks on a tie: less overhead).
    best = min(range(2, max_len // MIN_CHUNK_STEPS + 1),
               key=lambda c: (model_time_us(L, max_len, c, width), c))
    best_us = model_time_us(L, max_len, best, width)
    model = f"{best_us / 1e3:.2f} ms vs {serial / 1e3:.2f} ms unpipelined"
    if best_us > MIN_GAIN * serial:
        return off(f"the model gains under {100 * (1 - MIN_GAIN):.0f}% (best {best} chunks: "
                   f"{model})")
    return Decision(best, width, AUTOMATIC, f"automatic (TRITONRNN_PIPELINE=1), model: {model}",
                    max_len, backward_width)


def pipeline_chunks(cfg: RNNConfig, batch: int, max_len: int, device: torch.device | str,
                    plans: Sequence[LayerPlan] | None = None, *,
                    dtype: torch.dtype = torch.float32,
                    props: DeviceProperties | None = None) -> int:
    """C, the number of time chunks of the layer pipeline (1: layers run one after another):
    `decide`'s rule whatever TRITONRNN_PIPELINE says (the engine's opt-in is applied in
    `plan_pipeline`), for the Triton backend's plans by default."""
    return decide(cfg, batch, max_len, device, plans, dtype=dtype, props=props,
                  automatic=True).chunks


def plan_pipeline(cfg: RNNConfig, backend: object, info, dtype: torch.dtype,
                  device: torch.device, *, backward: bool = False) -> Pipeline | None:
    """The engine's entry: the pipeline of one pass (the forward's, or the backward's with its
    own width) for this stack and batch (info: its PackInfo), or None to run the layers one
    after another (`decide` on the batch's longest sequence, the plans of the backend named
    backend.name). Cheap when it cannot apply (no planning).

    The automatic choice is opt-in with TRITONRNN_PIPELINE=1 until the overlap has been
    measured on a GPU: the side-stream schedule has only run on the CPU so far (same calls,
    in order). `plan_constraints(pipeline_chunks=k)` always applies to the forward; the
    backward pipelines where two of its layers can be in flight (`Decision.backward_pipeline`:
    not for a single layer, nor where its launches fill the SMs)."""
    d = decide(cfg, info.B, info.max_len, device, dtype=dtype,
               backend=backend if backend is not None else "")
    return d.backward_pipeline if backward else d.pipeline


# ----------------------------------------------------------------------------- workspaces

# The pipelined backward's buffers private to a stream slot ([W, N, C], W layers in flight):
# what the whole-layer weight-gradient GEMMs after a layer's last chunk read.
SLOT_PRIVATE = ("h_prev", "dpre_x", "dpre_h", "dh_total", "m_seq", "dropped")
# The states carried between chunks ([L, 2, B, C]: chunk k writes slot k % 2 and reads the
# one its neighbour chunk wrote), which the unpipelined engine does not have.
CHUNK_STATES = ("h_mid", "c_mid", "dh_mid", "dc_mid")


class Workspace(NamedTuple):
    name: str
    shape: tuple[int, ...]  # elements of the run's dtype: bytes = prod(shape) * itemsize
    phase: str  # "forward" or "backward"


def forward_workspaces(cfg: RNNConfig, N: int, B: int,
                       training: bool) -> dict[str, tuple[int, ...]]:
    """Shapes of the pipelined forward's workspaces (`engine._forward_pipelined` allocates
    exactly these): xg [N, G*H] (one for all layers in flight: chunk k's rows pass from layer
    to layer in order), dropped [N, Hout] (training with dropout > 0 and L > 1), the states
    between chunks h_mid [L, 2, B, Hout] and c_mid [L, 2, B, H] (LSTM). N: packed rows."""
    L, G, H, Hout = cfg.num_layers, cfg.num_gates, cfg.num_units, cfg.out_size
    ws = {"xg": (N, G * H)}
    if training and cfg.dropout > 0 and L > 1:
        ws["dropped"] = (N, Hout)
    ws["h_mid"] = (L, 2, B, Hout)
    if cfg.is_lstm:
        ws["c_mid"] = (L, 2, B, H)
    return ws


def backward_workspaces(cfg: RNNConfig, N: int, B: int,
                        width: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the pipelined backward's workspaces (`engine._backward_pipelined` allocates
    exactly these). Shared by every layer in flight (row-partitioned by chunk): pre_x and
    pre_h [N, G*H] (LSTM, GRU: `reference.backward_preacts`), c_prev [N, H] (LSTM), dy
    [N, Hout] (the gradient rows passed down, L > 1), dx [N, I]. Private to each of the W
    stream slots (SLOT_PRIVATE, [W, N, C]): h_prev (Hout),
    dpre_x (G*H), dpre_h (G*H, GRU), dh_total (Hout) and m_seq (H) with a projection,
    dropped (Hout, dropout > 0 and L > 1). Between chunks: dh_mid [L, 2, B, Hout], dc_mid
    [L, 2, B, H] (LSTM). Bytes: the sum of the products times the dtype's itemsize."""
    L, G, H, Hout, W = cfg.num_layers, cfg.num_gates, cfg.num_units, cfg.out_size, width
    lstm, gru, proj = cfg.is_lstm, cfg.rnn_mode == "gru", cfg.num_proj > 0
    wants_x, wants_h = reference.backward_preacts(cfg.rnn_mode)
    ws = {}
    if wants_x:
        ws["pre_x"] = (N, G * H)
    if wants_h:
        ws["pre_h"] = (N, G * H)
    if lstm:
        ws["c_prev"] = (N, H)
    if L > 1:
        ws["dy"] = (N, Hout)
    ws["dx"] = (N, cfg.input_size)
    ws["h_prev"] = (W, N, Hout)
    ws["dpre_x"] = (W, N, G * H)
    if gru:
        ws["dpre_h"] = (W, N, G * H)
    if proj:
        ws["dh_total"] = (W, N, Hout)
        ws["m_seq"] = (W, N, H)
    if cfg.dropout > 0 and L > 1:
        ws["dropped"] = (W, N, Hout)
    ws["dh_mid"] = (L, 2, B, Hout)
    if lstm:
        ws["dc_mid"] = (L, 2, B, H)
    return ws


def extra_workspaces(cfg: RNNConfig, N: int, B: int, width: int) -> tuple[Workspace, ...]:
    """What a pipelined run allocates on top of the unpipelined engine's per-layer buffers:
    the W - 1 more stream slots of each SLOT_PRIVATE backward buffer ([W - 1, N, C]; the
    unpipelined backward has one [N, C] of each) and the CHUNK_STATES (forward h_mid/c_mid,
    backward dh_mid/dc_mid). Named "pipeline.<buffer>"."""
    out = [Workspace(f"pipeline.{k}", s, "forward")
           for k, s in forward_workspaces(cfg, N, B, True).items() if k in CHUNK_STATES]
    for k, s in backward_workspaces(cfg, N, B, width).items():
        if k in SLOT_PRIVATE and width > 1:
            out.append(Workspace(f"pipeline.{k}", (width - 1, *s[1:]), "backward"))
        elif k in CHUNK_STATES:
            out.append(Workspace(f"pipeline.{k}", s, "backward"))
    return tuple(out)


# ----------------------------------------------------------------------------- streams


@functools.cache
def _side_streams(index: int, width: int) -> tuple:
    """W side streams of CUDA device `index`, created once and reused by every call."""
    return tuple(torch.cuda.Stream(device=index) for _ in range(width))


# layout -> the stream tuples its tensors were recorded on (`_used_on`). Weak keys: a window
# its cache evicted is freed as soon as no run holds it (a cache of its own here would keep
# it, and its parent layout's index tensors, alive).
_RECORDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RECORDED_LOCK = threading.Lock()


def _used_on(layout, streams: tuple) -> None:
    """record_stream of every device tensor of `layout` on every stream, once per
    (layout, streams) while the layout lives."""
    with _RECORDED_LOCK:
        seen = _RECORDED.setdefault(layout, set())
        if streams in seen:
            return
        seen.add(streams)
    for f in dataclasses.fields(layout):
        t = getattr(layout, f.name)
        if isinstance(t, torch.Tensor) and t.is_cuda:
            for s in streams:
                t.record_stream(s)


class _Slots:
    """The W stream slots of one pipelined run: side streams forked from the caller's stream
    on CUDA, nothing elsewhere (the work runs in enqueue order on the current stream)."""

    def __init__(self, device: torch.device, width: int):
        self.cuda = device.type == "cuda"
        if not self.cuda:
            return
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.caller = torch.cuda.current_stream(index)
        self.streams = _side_streams(index, width)
        # Every side stream starts after what the caller enqueued before (the inputs and the
        # workspaces allocated and written on the caller's stream).
        for s in self.streams:
            s.wait_stream(self.caller)

    def on(self, slot: int):
        return torch.cuda.stream(self.streams[slot]) if self.cuda else contextlib.nullcontext()

    def record(self):
        """An event after the work enqueued so far on the current slot (None on the CPU)."""
        return torch.cuda.current_stream().record_event() if self.cuda else None

    def wait(self, event) -> None:
        if event is not None:
            torch.cuda.current_stream().wait_event(event)

    def keep(self, layouts: Iterable) -> None:
        """Marks the device tensors of `layouts` (cached PackInfo windows, allocated on some
        caller's stream) as used by the side streams, so the caching allocator never hands
        their memory to another stream while side work may still read it (a window evicted
        from its cache after a run from another caller stream). Once per (layout, streams):
        the allocator remembers the streams for the block's lifetime. Not during graph
        capture, where the graph's private pool keeps them."""
        if self.cuda and not capturing(self.device):
            for layout in layouts:
                _used_on(layout, self.streams)

    def join(self) -> None:
        """The caller's stream waits for every side stream: whatever the caller enqueues next
        (including reuse of the workspaces it frees) runs after the pipeline."""
        if self.cuda:
            for s in self.streams:
                self.caller.wait_stream(s)


def run(pipe: Pipeline, device: torch.device, layers: Sequence[int], chunks: Sequence[int],
        work: Callable[[int, int, int], None],
        finish: Callable[[int, int], None] | None = None,
        keep: Iterable = ()) -> None:
    """Runs the wavefront: for each layer of `layers` in order, work(layer, chunk, slot) for
    each chunk of `chunks` in order, then finish(layer, slot), all on stream slot
    i mod pipe.width (i: the layer's position in `layers`). work(layer, chunk) starts after
    work(previous layer, chunk) has finished (an event on CUDA); nothing else is ordered
    across slots, so each slot's buffers must be private to it (slot = i mod W) or touched
    by chunk k only after the previous layer's chunk k.

    forward: layers 0..L-1, chunks 0..C-1; backward: layers L-1..0, chunks C-1..0. The
    caller's stream waits for all of it before this returns (also when work raises).
    keep: the PackInfo windows the work reads (see `_Slots.keep`)."""
    slots = _Slots(device, pipe.width)
    slots.keep(keep)
    done: dict[int, object] = {}  # chunk -> event after the previous layer's work on it
    try:
        for i, layer in enumerate(layers):
            slot = i % pipe.width
            with slots.on(slot):
                for k in chunks:
                    if i:
                        slots.wait(done[k])
                    work(layer, k, slot)
                    done[k] = slots.record()
                if finish is not None:
                    finish(layer, slot)
    finally:
        slots.join()
