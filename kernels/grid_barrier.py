"""In-kernel grid barrier for persistent multi-program kernels.

A launch whose programs are all co-resident (grid <= SM count, one program per SM) can
synchronise all of them inside the kernel: every program arrives on one global int32 counter
and spins until the counter reaches the barrier's target. The counter is monotonic within a
launch (zeroed by the launcher), so barrier k of the launch waits for (k + 1) * num_programs
arrivals and no reset or generation flag is needed. It is an int32: the recurrent kernels'
launchers split a run whose count would pass 2**31 - 1 into several launches
(`persistent_grid._launch_ranges`).

Memory ordering (the CUDA cooperative-groups pattern, expressed with Triton atomics):
- `tl.debug_barrier()` (bar.sync) first, so every warp of the program has issued its stores of
  this step before the arrival;
- arrival: one `atomic_add(+1, sem="release", scope="gpu")`: the program's stores become
  visible at GPU scope before the arrival can be observed;
- wait: `atomic_add(+0, sem="acquire", scope="gpu")` polls. Every arrival is a
  read-modify-write of the counter, so an acquire that reads a value >= target synchronises
  with all the releases counted in it; then a bar.sync hands that ordering to every warp.
  A scalar Triton atomic runs on one thread and broadcasts its result through shared memory,
  so the spin loop's condition is uniform across the program (no divergent bar.sync).
  In the sm_90 SASS (Triton 3.6, `tritonrnn aot --dump`) the arrival is MEMBAR.ALL.GPU then
  a fire-and-forget REDG.E.ADD.STRONG.GPU, and ptxas turns the +0 acquire poll into a plain
  load, LDG.E.STRONG.GPU followed by CCTL.IVALL (the L1 invalidation of an acquire): the
  polls do not queue as read-modify-writes behind the arrivals at the counter's L2 slice,
  and there is no atomic in the poll for an inline-PTX ld.acquire to replace.

Split phase: `grid_arrive` / `grid_wait` are the two halves of `grid_sync`. The recurrent
kernels publish their exchange slice, arrive, then issue the stores nobody waits for and the
loads of the next step's read-only inputs, and only then wait: that work leaves the per-step
critical path (arrival -> last arrival -> wait) instead of sitting in front of the release.

Bounded spin: a program that polls `max_spin` times without seeing the target (or that sees
the error flag set by another program) sets the error flag (sync[1]) and reports failure; the
caller stops its time loop and the host launcher raises instead of hanging the GPU.

Independent groups: programs that never exchange data need not wait for each other. A launch
may split its programs into groups, each with its own `sync` pair and `target` counted in the
group's programs only (the bidirectional pair launch of kernels/persistent_grid.py: one group
per direction, grid axis 1, so one direction's barrier never waits on the other's programs).
Every program of every group must still be co-resident.

`sync` is an int32 tensor [2]: counter, error flag. A barrier of several programs deadlocks
in the interpreter (programs run one after another): callers compile it out there (a
constexpr) and launch one step per launch instead. A group of one program never waits for
another, so the interpreter runs its barrier (the recurrent launchers' single-program
launches: their targets and timeout path are tested without a GPU).

Co-residency and error reporting (host side)
--------------------------------------------
Launchers refuse a grid larger than the SM count, and launch persistent kernels as
cooperative launches where Triton offers it (`cooperative_launch_options`): the driver then
starts all programs together or fails the launch at once, so a timeout is not expected in
normal operation. Reading the error flag right after a launch would cost one host sync per
launch, so by default (`TRITONRNN_BARRIER_CHECK=deferred`) `check_flags` queues an
asynchronous copy of the flag into pinned host memory and an event; every later check polls
the queue without waiting and raises `BarrierTimeoutError` for a failed earlier launch, and
`check_barriers()` waits for all of them (tests and benchmarks call it). A failed launch's
outputs are invalid. `TRITONRNN_BARRIER_CHECK=sync` reads the flag at once (one host sync per
launch): the launch itself raises, and the Triton backend then reruns it stepwise.

CUDA graphs: during a capture neither mode can check (an event query, a pinned allocation or
a host sync would invalidate the capture), so `check_flags` keeps the launch's device flags
instead (the captured launch zeroes its sync tensor first, so each replay rewrites them) and
`check_barriers()`, called after replays, raises for a launch that failed in its latest
replay.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import deque

import torch
import triton
import triton.language as tl

from .compile_options import FP_FUSION

# Polls before a barrier gives up. One poll is an L2 round trip (~0.5-1 us under contention),
# so this is several seconds: far above any legitimate wait (microseconds per step, or the
# duration of another kernel still holding some SMs), far below "hung forever".
DEFAULT_MAX_SPIN = 1 << 23

# How often a waiting program also reads the error flag (a power of two, in polls).
ERR_POLL_MASK = tl.constexpr(1023)


@triton.jit
def grid_arrive(sync_ptr):
    """First half of a split grid barrier: this program's stores so far (every warp's) become
    visible at GPU scope, then it counts itself in. Work that nobody else waits for (output
    stores, loads of the next step's read-only inputs) belongs between `grid_arrive` and
    `grid_wait`: it then overlaps the other programs' arrival instead of delaying this one's
    (the release fence waits for every earlier memory access of the program)."""
    # Every warp's stores of this step are issued before the (single-thread) release.
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")


@triton.jit
def grid_wait(sync_ptr, target, max_spin):
    """Second half of a split grid barrier: wait until `target` arrivals are counted.
    Returns an int32 scalar: 0 on success, 1 if the wait timed out or another program failed
    (the error flag is then set for everyone)."""
    seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    err = seen * 0
    spins = seen * 0
    while (seen < target) & (err == 0) & (spins < max_spin):
        seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
        if (spins & ERR_POLL_MASK) == 0:
            err = tl.atomic_add(sync_ptr + 1, 0, sem="relaxed", scope="gpu")
    failed = (seen < target).to(tl.int32)
    if failed != 0:
        tl.atomic_xchg(sync_ptr + 1, 1, sem="relaxed", scope="gpu")
    # The acquire above was done by one thread; bar.sync orders every warp's later loads.
    tl.debug_barrier()
    return failed


@triton.jit
def grid_sync(sync_ptr, target, max_spin):
    """Arrive at the grid barrier and wait until `target` arrivals are counted (no work in
    between). sync_ptr: int32 [2] (counter, error flag); target: int32 scalar.
    Returns an int32 scalar: 0 on success, 1 if the wait timed out or another program failed.
    """
    grid_arrive(sync_ptr)
    return grid_wait(sync_ptr, target, max_spin)


@triton.jit(do_not_specialize=["n_barriers", "max_spin"])
def _bare_barriers_kernel(SYNC, n_barriers, max_spin):
    """Only barriers: the per-step floor of a persistent-grid kernel on this GPU."""
    failed = n_barriers * 0
    k = n_barriers * 0
    while (k < n_barriers) & (failed == 0):
        failed = grid_sync(SYNC, (k + 1) * tl.num_programs(0), max_spin)
        k += 1


def run_bare_barriers(n_barriers: int, programs: int, device: torch.device, *,
                      num_warps: int = 4, max_spin: int = DEFAULT_MAX_SPIN) -> torch.Tensor:
    """Launches `programs` co-resident programs that meet at `n_barriers` grid barriers and do
    nothing else (benchmark floor and barrier test). Returns the int32 sync tensor [2]
    (counter, error flag) without synchronising; the counter ends at n_barriers * programs.
    GPU only: the programs must all be resident (programs <= SM count)."""
    if programs < 1 or n_barriers < 0 or n_barriers * programs > 2**31 - 1:
        raise ValueError(
            f"run_bare_barriers: expected programs >= 1 and 0 <= n_barriers <= (2**31 - 1) // "
            f"programs (the int32 counter), got programs={programs}, n_barriers={n_barriers}")
    if os.environ.get("TRITON_INTERPRET") == "1" or torch.device(device).type != "cuda":
        raise ValueError("run_bare_barriers needs a CUDA device (a barrier deadlocks in the "
                         "interpreter)")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if programs > sms:
        raise ValueError(f"{programs} programs cannot all be resident on {sms} SMs")
    sync = torch.zeros(2, dtype=torch.int32, device=device)
    with torch.cuda.device(device):  # Triton launches on the current device
        _bare_barriers_kernel[(programs,)](sync, n_barriers, max_spin, num_warps=num_warps,
                                           **FP_FUSION)
    return sync


# --------------------------------------------------------------------------------------------
# Host side: cooperative launches and the error flag
# --------------------------------------------------------------------------------------------


class BarrierTimeoutError(RuntimeError):
    """A persistent-grid launch's barrier timed out; that launch's outputs are invalid.
    earlier: the failed launch is not the one whose call reports it (the deferred check's
    report at a later launch, or at `check_barriers`): its outputs may have been read since,
    so rerunning the reporting launch cannot repair anything."""

    def __init__(self, message: str, earlier: bool = False):
        super().__init__(message)
        self.earlier = earlier


_TIMEOUT_MESSAGE = (
    "persistent-grid kernel: a grid barrier timed out (programs "
    "not co-resident, or the GPU is shared with a kernel that holds SMs); the outputs are "
    "invalid. Retry with "
    "persistent=False (stepwise)."
)
_CHECK_MODES = ("deferred", "sync")
# Flags of launches not yet known to have succeeded: (event, pinned host flags, launch name).
# Launchers of several threads (one per device under DataParallel) share it: `_poll` takes an
# entry off only under the lock, and only the one it checked.
_pending: deque = deque()
_pending_lock = threading.Lock()
# Flags of launches captured into CUDA graphs, (device flags, launch name), most recent last:
# every replay rewrites them (the capture zeroes the sync tensor before the launch), so they
# hold the latest replay's outcome; `check_barriers` reads them. Bounded: the oldest fall off.
_CAPTURED_KEPT = 4096
_captured: deque = deque(maxlen=_CAPTURED_KEPT)


def capturing(device: torch.device | None = None) -> bool:
    """Whether `device`'s current CUDA stream (default: the current device's) is capturing a
    graph: no event queries, host syncs or pinned allocations are allowed then, and work
    queued runs only at replay. False off a GPU. The one capture check of the library (the
    packed layouts' caches and the layer pipeline ask it too)."""
    if device is not None and device.type != "cuda" or not torch.cuda.is_available():
        return False
    if device is None:
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def barrier_check_mode() -> str:
    """TRITONRNN_BARRIER_CHECK: "deferred" (default) or "sync"."""
    mode = os.environ.get("TRITONRNN_BARRIER_CHECK", "deferred")
    if mode not in _CHECK_MODES:
        raise ValueError(
            f"TRITONRNN_BARRIER_CHECK: expected one of {list(_CHECK_MODES)}, got {mode!r}")
    return mode


@functools.lru_cache(maxsize=1)
def cooperative_launch_options() -> dict:
    """{"launch_cooperative_grid": True} where the installed Triton's CUDA backend takes the
    option (a cooperative launch: all programs resident together, or a launch error), else {}
    (older Triton: the SM-count check and the bounded spin remain the guards)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return {}
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return {"launch_cooperative_grid": True} if "launch_cooperative_grid" in fields else {}


def _raise_if_failed(flags: torch.Tensor, what: str, earlier: bool) -> None:
    if bool(flags.any()):
        when = "an earlier launch of " if earlier else ""
        raise BarrierTimeoutError(f"{when}{what}: {_TIMEOUT_MESSAGE}", earlier=earlier)


def _poll(wait: bool) -> None:
    """Checks the queued flags whose launches have finished (all of them when wait). Another
    thread may check the same entry meanwhile (the wait releases the GIL): whichever takes it
    off the queue reports it."""
    while True:
        with _pending_lock:
            if not _pending:
                return
            entry = _pending[0]
        event, flags, what = entry
        if wait:
            event.synchronize()
        elif not event.query():
            return
        with _pending_lock:
            if not _pending or _pending[0] is not entry:
                continue  # taken off by another thread, which reports it
            _pending.popleft()
        _raise_if_failed(flags, what, earlier=True)


def poll_earlier_launches(device: torch.device | None = None) -> None:
    """Raises BarrierTimeoutError for an earlier launch whose failure is known by now, without
    waiting (persistent launchers call it before they launch, with their tensors' device).
    Nothing while that device (default: the current one) captures a CUDA graph (an event
    query there would invalidate the capture)."""
    if not capturing(device):
        _poll(wait=False)


def check_flags(sync: torch.Tensor, what: str) -> None:
    """Error flags of a persistent launch just enqueued; sync: int32 [groups, 2] (counter,
    flag). "sync" mode (and tensors off the GPU, the interpreter): raises BarrierTimeoutError
    now if this launch failed (a host sync); "deferred": queues the flags for
    `poll_earlier_launches` / `check_barriers`. During a CUDA-graph capture (either mode):
    keeps the device flags, which each replay rewrites, for `check_barriers`."""
    flags = sync[:, 1]
    on_gpu = flags.device.type == "cuda"
    # On the flags' device (the launch's), whatever the current one: its capture state, and
    # the stream the copy below is issued on, which the event must follow.
    with torch.cuda.device_of(flags):
        if capturing():
            _captured.append((flags, what))
            return
        mode = barrier_check_mode()
        if mode == "sync" or not on_gpu:
            try:
                _raise_if_failed(flags.cpu(), what, earlier=False)
            except BarrierTimeoutError as err:
                # Only the sync mode keeps a backward's inputs for a rerun
                # (`planner.backward_writes_over_preacts`); off the GPU in the deferred
                # mode the launch may have written over them.
                err.after_launch = mode != "sync"
                raise
            return
        try:
            host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        except RuntimeError as err:
            # The launch ran (a backward may have written its gradients over its inputs):
            # no caller may rerun it (`rnn.triton_backend._persistent_or_stepwise`).
            err.after_launch = True
            raise
    with _pending_lock:
        _pending.append((event, host, what))


def check_barriers() -> None:
    """Waits for every persistent launch checked so far and raises BarrierTimeoutError if any
    of their barriers timed out (the deferred mode's explicit check point). Launches captured
    into CUDA graphs: raises if one failed in its latest replay (call it after the replays:
    it synchronises their devices; the flags stay kept, a later replay rewrites them). Not
    during a capture."""
    if capturing():
        raise RuntimeError("check_barriers: called during a CUDA-graph capture (it waits for "
                           "the GPU); call it after the graph's replays")
    _poll(wait=True)
    kept = list(_captured)
    # A replay may run on any stream of its device: wait for the whole device, not the
    # current stream alone (which `flags.any()` would).
    for dev in {flags.device for flags, _ in kept if flags.device.type == "cuda"}:
        torch.cuda.synchronize(dev)
    for flags, what in kept:
        if bool(flags.any()):
            raise BarrierTimeoutError(f"a CUDA-graph replay of {what}: {_TIMEOUT_MESSAGE}",
                                      earlier=True)
