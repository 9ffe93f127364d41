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
from dataclasses import dataclass

import torch


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

    @property
    def device(self) -> torch.device:
        return self.perm.device


def make_pack_info(lengths: list[int], T: int, device: torch.device) -> PackInfo:
    """The packed layout of a batch, cached by (lengths, T, device): a backprop after its
    forward, or a training loop that repeats a batch shape, reuses the index tensors."""
    return _make_pack_info(tuple(lengths), T, torch.device(device))


@functools.lru_cache(maxsize=32)
def _make_pack_info(lengths: tuple[int, ...], T: int, device: torch.device) -> PackInfo:
    """Builds the packed layout from host lengths (each in [0, T]) with tensor ops on the host
    (O(N) vectorised work, no Python loop over rows), then moves the index tensors once."""
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
    row_time = torch.repeat_interleave(torch.arange(max_len), batch_sizes)
    row_sorted = torch.arange(N) - offsets[row_time]
    row_batch = order[row_sorted]
    as_dev = lambda t, dtype=torch.int64: t.to(device=device, dtype=dtype)  # noqa: E731
    rt, rb = as_dev(row_time), as_dev(row_batch)
    return PackInfo(
        T=T,
        B=B,
        N=N,
        max_len=max_len,
        lengths=tuple(lengths),
        batch_sizes=tuple(batch_sizes.tolist()),
        perm=as_dev(order),
        inv_perm=as_dev(torch.argsort(order)),
        lengths_sorted=as_dev(sorted_lens, torch.int32),
        offsets=as_dev(offsets, torch.int32),
        row_time=rt,
        row_batch=rb,
        padded_index=rt * B + rb,
    )


def pack(x: torch.Tensor, info: PackInfo) -> torch.Tensor:
    """[T, B, C] time-major padded -> [N, C] packed."""
    return x.reshape(info.T * info.B, -1).index_select(0, info.padded_index)


def unpack(x: torch.Tensor, info: PackInfo) -> torch.Tensor:
    """[N, C] packed -> [T, B, C] time-major padded, exact zeros at padding."""
    out = x.new_zeros(info.T * info.B, x.shape[1])
    out.index_copy_(0, info.padded_index, x)
    return out.view(info.T, info.B, x.shape[1])


def prev_rows(info: PackInfo, reverse: bool) -> torch.Tensor:
    """[N] int64 index of each row's previous step in the direction's order.

    Entries point into cat([state0 (B rows, sorted order), packed rows]): the previous row
    of (t, j) is row(t-1, j) (forward) or row(t+1, j) (reverse), or the initial state j when
    (t, j) is the direction's first step.
    """
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
