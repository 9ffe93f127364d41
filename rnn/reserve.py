"""The compact reserve space: tritonrnn's own documented format (version 1).

The backward recomputes every gate pre-activation with two large GEMMs (every h_{t-1} is
known after the forward), so the reserve holds only what cannot be recomputed cheaply:

- LSTM: c_t of every valid step for every layer and direction, [N, H] each;
- every layer but the last: its packed output Y_l = [h_fwd | h_bwd], [N, D*Hout] (the last
  layer's output is the op's `output`, which the backprop receives anyway).

Layout of the 1-D uint8 tensor:

    bytes [0, 64)      header: 8 little-endian int64 = MAGIC, VERSION, fingerprint, N,
                       payload elements, dtype code, 0, 0
    bytes [64, 256)    zero padding (keeps the payload 256-byte aligned)
    bytes [256, ...)   payload in the input dtype, in this order:
                       c_seq[l, d] for l in 0..L-1, d in 0..D-1   (LSTM only), [N, H] each
                       Y_l for l in 0..L-2,                        [N, D*Hout] each

Size in bytes, N = sum(sequence_lengths) (padding costs nothing):

    256 + itemsize * N * D * (L * H * [lstm] + (L - 1) * Hout)

i.e. LSTM <= N*D*(2L-1)*H and GRU/RNN = N*D*(L-1)*H elements plus the header: the budget of
the design. `host_reserved` is a copy of the 64 header bytes on the host (int8), so the
backprop checks a reserve without reading device memory first.

The fingerprint hashes the configuration, T, B, the lengths and the dtype: a reserve from
another configuration, or from a batch of other shape or lengths, is rejected with a clear
error. The dropout attributes (rate, seed, seed2) count only where a mask is applied
(dropout > 0, L > 1). It hashes no data: the reserve of another forward of the same
configuration, shape, lengths and dtype (other input values) is accepted, and the
gradients are computed from that forward's activations; so is, where T == B, one written in
the other layout (time_major). Telling them apart would take a pass over the inputs at
every forward.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import torch

from tritonrnn.kernels.buffers import poisoned
from tritonrnn.kernels.grid_barrier import capturing

from .config import RNNConfig
from .packing import PackInfo, derived
from .params import check_dense

MAGIC = 0x31564E5254495254  # "TRITRNV1" as little-endian bytes
VERSION = 1
HEADER_BYTES = 64
PAYLOAD_OFFSET = 256
_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}


@dataclass(frozen=True)
class ReserveLayout:
    """Element offsets (into the payload) of every reserve tensor."""

    dtype: torch.dtype
    N: int
    c_offsets: tuple[int, ...]  # per pseudo-layer l*D + d (LSTM), else empty
    y_offsets: tuple[int, ...]  # per layer 0..L-2
    H: int
    y_width: int  # D * Hout
    elements: int
    fingerprint: int

    @property
    def nbytes(self) -> int:
        return PAYLOAD_OFFSET + self.elements * self.dtype.itemsize


def fingerprint(cfg: RNNConfig, info: PackInfo, dtype: torch.dtype) -> int:
    if cfg.dropout == 0 or cfg.num_layers == 1:
        # No dropout mask is applied (one layer's output feeds no layer): the dropout
        # attributes change nothing in the reserve, so a backprop given other seeds is right.
        cfg = cfg.without_dropout()
    key = repr((cfg, info.T, info.B, info.lengths, str(dtype))).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little", signed=True)


def reserve_layout(cfg: RNNConfig, info: PackInfo, dtype: torch.dtype) -> ReserveLayout:
    """The reserve's layout for a call. Its offsets are kept with info (a forward's
    backward, and each call on a batch of the same lengths, reuse them), by the
    configuration without its dropout attributes; where a dropout mask is applied the
    fingerprint, which counts the seeds, is the call's own."""
    base = cfg.without_dropout()
    layout = derived(info, ("reserve_layout", base, dtype),
                     lambda: _reserve_layout(base, info, dtype), on_device=False)
    if cfg.dropout > 0 and cfg.num_layers > 1:
        layout = dataclasses.replace(layout, fingerprint=fingerprint(cfg, info, dtype))
    return layout


def _reserve_layout(cfg: RNNConfig, info: PackInfo, dtype: torch.dtype) -> ReserveLayout:
    N, D, H = info.N, cfg.num_dirs, cfg.num_units
    width = D * cfg.out_size
    pos = 0
    c_offsets = []
    if cfg.is_lstm:
        for _ in range(cfg.pseudo_layers):
            c_offsets.append(pos)
            pos += N * H
    y_offsets = []
    for _ in range(cfg.num_layers - 1):
        y_offsets.append(pos)
        pos += N * width
    return ReserveLayout(
        dtype=dtype,
        N=N,
        c_offsets=tuple(c_offsets),
        y_offsets=tuple(y_offsets),
        H=H,
        y_width=width,
        elements=pos,
        fingerprint=fingerprint(cfg, info, dtype),
    )


def _header(layout: ReserveLayout) -> torch.Tensor:
    fields = [MAGIC, VERSION, layout.fingerprint, layout.N, layout.elements,
              _DTYPE_CODES[layout.dtype], 0, 0]
    fields = [f - (1 << 64) if f >= 1 << 63 else f for f in fields]
    return torch.tensor(fields, dtype=torch.int64).view(torch.int8)


def allocate(layout: ReserveLayout, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh (reserve_space, host_reserved) pair with the header written."""
    header = _header(layout)
    reserve = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
    poisoned(reserve[PAYLOAD_OFFSET:].view(layout.dtype))
    reserve[:PAYLOAD_OFFSET].zero_()
    _write_header(reserve[:HEADER_BYTES], header)
    return reserve, header.clone()


def _write_header(dst: torch.Tensor, header: torch.Tensor) -> None:
    """The header's 64 bytes into the reserve without a host sync. A GPU copies them from
    pinned memory (from pageable memory the copy may wait for the stream); under a CUDA
    graph capture a host copy would be replayed from a buffer the capture does not keep, so
    device fills write the fields instead (the values are the captured call's)."""
    if capturing(dst.device):
        fields = dst.view(torch.int64)
        for i, value in enumerate(header.view(torch.int64).tolist()):
            fields[i].fill_(value)
    elif dst.device.type == "cuda":
        dst.copy_(header.view(torch.uint8).pin_memory(), non_blocking=True)
    else:
        dst.copy_(header.view(torch.uint8))


def views(reserve: torch.Tensor, layout: ReserveLayout):
    """(c_seq views per pseudo-layer, Y views per layer < L-1) into a reserve tensor."""
    payload = reserve[PAYLOAD_OFFSET:].view(layout.dtype)
    N, H, W = layout.N, layout.H, layout.y_width
    cs = [payload[o : o + N * H].view(N, H) for o in layout.c_offsets]
    ys = [payload[o : o + N * W].view(N, W) for o in layout.y_offsets]
    return cs, ys


def _header_mismatch(what: str, got: torch.Tensor, layout: ReserveLayout) -> ValueError:
    """The error for a header (``got``: 64 int8) that is not this configuration's."""
    fields = got.contiguous().view(torch.int64).tolist()
    if fields[0] != MAGIC:  # < 2**63: stored as is
        return ValueError(f"{what}: expected a tritonrnn reserve header, got no valid header")
    return ValueError(
        f"{what}: expected the header of a forward with this configuration, lengths and dtype "
        f"(fingerprint {layout.fingerprint}, version {VERSION}, N={layout.N}, "
        f"{layout.elements} payload elements), got fingerprint {fields[2]} (version "
        f"{fields[1]}, N={fields[3]}, {fields[4]} payload elements): it is from another forward"
    )


def check(
    reserve: object, host_reserved: object, layout: ReserveLayout, device: torch.device
) -> torch.Tensor:
    """Raises ValueError/TypeError unless reserve_space belongs to this configuration.

    Returns the reserve to read: ``reserve`` itself, or a contiguous copy when it is strided
    or its payload is not 16-byte aligned (a reserve copied into a byte arena at an odd
    offset): the payload is reinterpreted in place as the layout's dtype.
    """
    if not isinstance(reserve, torch.Tensor):
        raise TypeError(f"reserve_space: expected a tensor, got {type(reserve).__name__}")
    check_dense("reserve_space", reserve)
    if reserve.dtype != torch.uint8:
        raise TypeError(f"reserve_space: expected a 1-D uint8 tensor from cudnn_rnn, got "
                        f"{reserve.dtype} of shape {list(reserve.shape)}")
    if reserve.dim() != 1:
        raise ValueError(f"reserve_space: expected a 1-D uint8 tensor from cudnn_rnn, got "
                         f"{reserve.dtype} of shape {list(reserve.shape)}")
    if reserve.device != device:
        raise ValueError(
            f"reserve_space: expected a tensor on {device} (the input's), got {reserve.device}"
        )
    if reserve.is_meta:
        raise ValueError(
            "reserve_space: expected a tensor with data (its header is read), got a tensor on "
            "the meta device"
        )
    if reserve.numel() == 0:
        raise ValueError(
            "reserve_space: expected the reserve of a training forward, got an empty tensor "
            "(the forward ran with is_training=False, which keeps no reserve for backprop)"
        )
    expected = _header(layout)
    host_ok = False
    if isinstance(host_reserved, torch.Tensor):
        check_dense("host_reserved", host_reserved)
    if isinstance(host_reserved, torch.Tensor) and host_reserved.numel() == HEADER_BYTES:
        if host_reserved.dtype not in (torch.int8, torch.uint8):  # bytes, read as int8
            raise TypeError(
                f"host_reserved: expected the {HEADER_BYTES}-byte int8 tensor returned by "
                f"cudnn_rnn (or a uint8 copy), got dtype {host_reserved.dtype}"
            )
        if host_reserved.is_meta:
            raise ValueError(
                "host_reserved: expected a tensor with data (its header is read), got a "
                "tensor on the meta device"
            )
        got = host_reserved.cpu().reshape(-1).view(torch.int8)
        if not torch.equal(got, expected):
            raise _header_mismatch("host_reserved", got, layout)
        host_ok = True
    elif host_reserved is not None:
        raise ValueError(
            f"host_reserved: expected the {HEADER_BYTES}-byte tensor returned by cudnn_rnn, "
            f"got {getattr(host_reserved, 'shape', type(host_reserved).__name__)}"
        )
    if reserve.numel() != layout.nbytes:
        raise ValueError(
            f"reserve_space: expected {layout.nbytes} bytes for this configuration and "
            f"lengths, got {reserve.numel()} (it belongs to another configuration)"
        )
    if not reserve.is_contiguous() or reserve.data_ptr() % 16:
        reserve = reserve.clone(memory_format=torch.contiguous_format)
    if host_ok and reserve.device.type != "cpu":
        # The host copy matched and the size matches: reading the device header would cost a
        # device-to-host sync in every backward (and break CUDA graph capture).
        return reserve
    got = reserve[:HEADER_BYTES].cpu().view(torch.int8)
    if not torch.equal(got, expected):
        raise _header_mismatch("reserve_space", got, layout)
    return reserve
