"""Packed (padding-free) time layout shared by every engine and kernel.

The batch is sorted once by length, longest first (stable, so ties keep their order);
`perm[j]` is the original batch index of sorted row j. At step s only the rows j with
len_j > s are active, and they form a prefix 0..batch_sizes[s]-1.

Packed row of (time t, sorted row j), valid iff t < len_j:

    row(t, j) = offsets[t] + j,    offsets[t] = batch_sizes[0] + ... + batch_sizes[t-1]

There are N = sum(lengths) rows. This is exactly torch's PackedSequence data layout.
Both directions use the same rows: the forward direction at step s visits t = s, the reverse
direction visits t = len_j - 1 - s (per-sequence reversal, tf.reverse_sequence), so a packed
tensor is shared by the two directions and by consecutive layers without any gather.
"""

from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass

import torch

from tritonrnn.kernels.grid_barrier import capturing

# The most packed rows a batch may have: `offsets` (int32 on the device) holds N.
MAX_ROWS = 2**31 - 1


@dataclass(frozen=True, eq=False)
class PackInfo:
    """Packed layout of one batch (host ints plus device index tensors)."""

    T: int  # padded time (the input's time axis)
    B: int  # batch
    N: int  # sum of lengths: number of packed rows
    max_len: int  # longest sequence (steps actually run)
    lengths: tuple[int, ...]  # original order, on the host
    batch_sizes: tuple[int, ...]  # active rows at step s, s < max_len
    perm: torch.Tensor  # [B] int64, sorted row -> original batch index
    inv_perm: torch.Tensor  # [B] int64, original batch index -> sorted row
    lengths_sorted: torch.Tensor  # [B] int32 (device): lengths in sorted order
    offsets: torch.Tensor  # [max(max_len, 1) + 1] int32 (device): packed offset of step t
    row_time: torch.Tensor  # [N] int64 (device): t of each packed row
    row_batch: torch.Tensor  # [N] int64 (device): original batch index of each packed row
    padded_index: torch.Tensor  # [N] int64 (device): t * B + b, to (un)pack time-major
    in_order: bool  # lengths already non-increasing: perm and inv_perm are the identity

    @property
    def device(self) -> torch.device:
        return self.perm.device

    @property
    def dense(self) -> bool:
        """Every sequence is T long: packed row t * B + b is padded (t, b), so packing and
        unpacking are reshapes (the batch is in order, every index tensor the identity)."""
        return self.N > 0 and self.N == self.T * self.B


def make_pack_info(lengths: list[int], T: int, device: torch.device) -> PackInfo:
    """The packed layout of a batch, cached by (lengths, T, device): a backprop after its
    forward, or a training loop that repeats a batch shape, reuses the index tensors. On a
    GPU the current stream waits for the copy that made them (queued, maybe on another
    stream, without the host waiting). "cuda" without an index means the current device,
    as torch does (the cache keys on the indexed device: another current device later gets
    its own layout, not this one's)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    info, ready = _make_pack_info(tuple(lengths), T, device)
    _wait(info.device, ready)
    return info


def _recorded(device: torch.device):
    """An event recorded on `device`'s current stream after the work queued so far (None
    off a GPU): what a cached value's users on other streams wait for."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _wait(device: torch.device, event) -> None:
    """The current stream waits for `event` (no host wait). Not while capturing: the cached
    value was made before the capture began, and a captured stream cannot wait on an event
    recorded outside it."""
    if event is not None and not capturing(device):
        torch.cuda.current_stream(device).wait_event(event)


@functools.lru_cache(maxsize=32)
def _make_pack_info(lengths: tuple[int, ...], T: int, device: torch.device):
    """(layout, the event after its copy) built from host lengths (each in [0, T]) with
    tensor ops on the host (O(N) vectorised work, no Python loop over rows), the index
    tensors then moved in one copy."""
    if capturing(device):
        raise ValueError(
            "sequence_lengths: a new set of lengths cannot be prepared while a CUDA graph is "
            "captured (its index tensors are copied from the host); run the call once before "
            "the capture, with the same lengths, to prepare them")
    B = len(lengths)
    lens = torch.tensor(lengths, dtype=torch.int64)
    order = torch.argsort(-lens, stable=True)
    sorted_lens = lens[order]
    max_len = int(sorted_lens[0]) if B else 0
    # batch_sizes[s] = #{b : len_b > s} = reversed cumulative count of lengths above s.
    counts = torch.bincount(lens, minlength=max_len + 1)
    batch_sizes = counts.flip(0).cumsum(0).flip(0)[1:]
    offsets = torch.zeros(max(max_len, 1) + 1, dtype=torch.int64)
    offsets[1 : max_len + 1] = batch_sizes.cumsum(0)
    N = int(offsets[max_len]) if max_len else 0
    if N > MAX_ROWS:  # before any O(N) tensor: the kernels' offsets are int32
        raise ValueError(f"sequence_lengths: expected a total of at most {MAX_ROWS} packed "
                         f"rows (the kernels' int32 offsets), got {N}")
    row_time = torch.repeat_interleave(torch.arange(max_len), batch_sizes)
    row_sorted = torch.arange(N) - offsets[row_time]
    row_batch = order[row_sorted]
    # One copy to the device for all six (a GPU's: from pinned memory, without waiting):
    # six blocking copies were six stream syncs on every new set of lengths, which a varlen
    # training loop makes at nearly every step.
    parts = (order, torch.argsort(order), sorted_lens, offsets, row_time, row_batch)
    host = torch.cat(parts)
    on_gpu = device.type == "cuda"
    moved = (host.pin_memory() if on_gpu else host).to(device, non_blocking=on_gpu)
    perm, inv_perm, lens_sorted, offs, rt, rb = moved.split([len(t) for t in parts])
    info = PackInfo(
        T=T,
        B=B,
        N=N,
        max_len=max_len,
        lengths=tuple(lengths),
        batch_sizes=tuple(batch_sizes.tolist()),
        perm=perm,
        inv_perm=inv_perm,
        lengths_sorted=lens_sorted.to(torch.int32),
        offsets=offs.to(torch.int32),
        row_time=rt,
        row_batch=rb,
        padded_index=rt * B + rb,
        in_order=bool((lens[:-1] >= lens[1:]).all()),
    )
    return info, _recorded(device)


def window(info: PackInfo, s0: int, s1: int) -> PackInfo:
    """The packed layout of the step window [s0, s1) of `info` (forward direction), cached.

    A window of a packed layout is itself one: its rows are info's rows offsets[s0] ..
    offsets[s1] (contiguous), and the sorted batch stays sorted, so a recurrence run on the
    window with h0 = the state after step s0 - 1 (rows that finished earlier keep theirs)
    gives exactly the full layout's rows and, as hT, the state after step s1 - 1. This is
    what lets the layer pipeline (rnn/pipeline.py) run a layer chunk by chunk.

    Fields of the window, all consistent with one another except the two noted:
      B          info.B: every sorted row, finished ones with length 0 (they carry state)
      N, max_len offsets[s1] - offsets[s0] rows, s1 - s0 steps
      lengths, lengths_sorted   clamp(len - s0, 0, s1 - s0) in info's sorted order
      batch_sizes, offsets      info's for steps s0..s1-1, offsets rebased to the window
      perm, inv_perm            identity: the window's batch IS info's sorted order
      row_time, row_batch       window step and window (= info's sorted) row of each row
      T, padded_index           info's (NOT the window's): a row's padded index t * B + b
                                in info's [T, B] grid and original batch order, i.e. its
                                dropout counter, so a window's dropout masks are exactly
                                info's masks on those rows (and pack/unpack with a window
                                address info's padded grid)
    Built with device ops on info's tensors (no host sync, no host-to-device copy)."""
    if not (0 <= s0 < s1 <= info.max_len):
        raise ValueError(
            f"window: expected 0 <= s0 < s1 <= max_len = {info.max_len}, got [{s0}, {s1})"
        )
    return derived(info, ("window", s0, s1), lambda: _window(info, s0, s1))


# layout -> what is derived from it (windows, previous-row indices, reserve layouts), by
# key; it lives as long as the layout does. A cache keyed by the layout itself (an
# lru_cache) kept up to its size of evicted layouts alive, with their device index tensors,
# in a varlen training loop where each batch makes a new layout.
_DERIVED: weakref.WeakKeyDictionary[PackInfo, dict] = weakref.WeakKeyDictionary()
_DERIVED_LOCK = threading.Lock()


def derived(info: PackInfo, key: tuple, build, on_device: bool = True):
    """info's value for `key`, built once (`build()`) and kept while info lives. The values
    are shared: callers must not change them in place. on_device: `build` queues device
    work, which a GPU's current stream waits for (it may have been queued on another);
    under a CUDA graph capture such work would run only at replay, so it is built for the
    capture alone, not kept."""
    dev = info.device
    if on_device and capturing(dev):
        return build()
    with _DERIVED_LOCK:
        values = _DERIVED.setdefault(info, {})
        entry = values.get(key)
        if entry is None:
            value = build()
            entry = values[key] = (value, _recorded(dev) if on_device else None)
    if entry[1] is not None:  # (not capturing: checked above)
        torch.cuda.current_stream(dev).wait_event(entry[1])
    return entry[0]


def _window(info: PackInfo, s0: int, s1: int) -> PackInfo:
    bs = info.batch_sizes
    o0 = sum(bs[:s0])
    o1 = o0 + sum(bs[s0:s1])
    w = s1 - s0
    dev = info.perm.device
    lens_sorted = sorted(info.lengths, reverse=True)
    offsets = info.offsets[s0 : s1 + 1] - o0
    row_time = info.row_time[o0:o1] - s0
    return PackInfo(
        T=info.T,
        B=info.B,
        N=o1 - o0,
        max_len=w,
        lengths=tuple(min(max(n - s0, 0), w) for n in lens_sorted),
        batch_sizes=tuple(bs[s0:s1]),
        perm=torch.arange(info.B, device=dev),
        inv_perm=torch.arange(info.B, device=dev),
        lengths_sorted=(info.lengths_sorted.clamp(s0, s1) - s0).to(torch.int32),
        offsets=offsets,
        row_time=row_time,
        row_batch=torch.arange(o1 - o0, device=dev) - offsets.long()[row_time],
        padded_index=info.padded_index[o0:o1],
        in_order=True,
    )


def pack(x: torch.Tensor, info: PackInfo) -> torch.Tensor:
    """[T, B, C] time-major padded -> [N, C] packed, contiguous. A dense layout's is x
    itself where x is contiguous (a view, no copy): callers only read it."""
    rows = x.reshape(info.T * info.B, -1)
    if info.dense:
        return rows.contiguous()
    return rows.index_select(0, info.padded_index)


def unpack(x: torch.Tensor, info: PackInfo, time_major: bool = True) -> torch.Tensor:
    """[N, C] packed -> [T, B, C] time-major padded, exact zeros at padding; time_major=False:
    [B, T, C] with the strides of a transposed time-major tensor. Either is a tensor of its
    own, not a view (autograd refuses in-place changes to a view among a function's outputs).
    A dense layout's callers skip this copy: `padded` gives the rows to write x into."""
    out, rows = padded(info, x.shape[1], x.dtype, x.device, time_major)
    rows.zero_()
    rows.index_copy_(0, info.padded_index, x)
    return out


def padded(info: PackInfo, C: int, dtype: torch.dtype, device: torch.device,
           time_major: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, rows): an uninitialised padded tensor as `unpack` returns it ([T, B, C], or
    [B, T, C] with a transposed time-major tensor's strides) and its [T * B, C] time-major
    rows, a contiguous view. Of a dense layout, the rows are its packed rows: an engine
    writing its packed output there makes `out` without a copy."""
    T, B = info.T, info.B
    if time_major:
        out = torch.empty((T, B, C), dtype=dtype, device=device)
        return out, out.view(T * B, C)
    out = torch.empty_strided((B, T, C), (C, B * C, 1), dtype=dtype, device=device)
    return out, out.transpose(0, 1).view(T * B, C)


def prev_rows(info: PackInfo, reverse: bool) -> torch.Tensor:
    """[N] int64 index of each row's previous step in the direction's order (cached with
    info: shared, not to be changed in place).

    Entries point into cat([state0 (B rows, sorted order), packed rows]): the previous row
    of (t, j) is row(t-1, j) (forward) or row(t+1, j) (reverse), or the initial state j when
    (t, j) is the direction's first step.
    """
    return derived(info, ("prev_rows", reverse), lambda: _prev_rows(info, reverse))


def _prev_rows(info: PackInfo, reverse: bool) -> torch.Tensor:
    dev = info.row_time.device
    t = info.row_time
    j = torch.arange(info.N, device=dev) - info.offsets.long()[t]
    lens = info.lengths_sorted.long()[j]
    offs = info.offsets.long()
    if reverse:
        first = t == lens - 1
        tp = torch.clamp(t + 1, max=max(info.max_len - 1, 0))
    else:
        first = t == 0
        tp = torch.clamp(t - 1, min=0)
    return torch.where(first, j, info.B + offs[tp] + j)
