"""Mutation round over the host-side modules of rnn/ (planner, pipeline, reserve, packing,
params, config, dropout, modules, library; 49 mutants, 10 of them let through by the whole
suite and not equivalent): one test per such mutant, each failing on it and passing on the
code as it is. The planner's and the pipeline plan's five are in tests/test_planner.py
(its "mutation round over rnn/" section)."""

from __future__ import annotations

import pytest
import torch

from tritonrnn.rnn import reserve as reserve_mod


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))


# ----------------------------------------------------------------------------- reserve


def _forward(lengths, T=4, H=8, L=2, seed=0):
    from tritonrnn.rnn import cudnn_rnn, params_size

    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    x = torch.randn(T, B, H, generator=g)
    h0, c0 = torch.randn(L, B, H, generator=g), torch.randn(L, B, H, generator=g)
    n = params_size(rnn_mode="lstm", num_layers=L, num_units=H, input_size=H)
    params = torch.randn(n, generator=g) * 0.3
    lens = torch.tensor(lengths, dtype=torch.int32)
    out = cudnn_rnn(x, h0, c0, params, lens, rnn_mode="lstm", backend="reference")
    return (x, h0, c0, params, lens), out


def test_reserve_header_fields_are_in_the_documented_order():
    """Header: 8 little-endian int64 = MAGIC, VERSION, fingerprint, N, payload elements,
    dtype code, 0, 0 (rnn/reserve.py), in the reserve and in host_reserved."""
    lengths, H, L = [4, 2, 3], 8, 2
    _, out = _forward(lengths, H=H, L=L)
    N = sum(lengths)
    elements = N * (L * H + (L - 1) * H)  # LSTM c of each layer, the first layer's output
    for header in (out.reserve_space[:64].view(torch.int64), out.host_reserved.view(torch.int64)):
        fields = header.tolist()
        assert fields[:2] == [reserve_mod.MAGIC, reserve_mod.VERSION]
        assert fields[3:] == [N, elements, 3, 0, 0]  # float32: dtype code 3
    assert out.reserve_space.numel() == reserve_mod.PAYLOAD_OFFSET + 4 * elements


def test_a_reserve_from_another_forward_is_refused_on_the_cpu_despite_its_host_copy():
    """Two forwards whose lengths differ but sum alike have reserves of one size; on the CPU
    the reserve's own header is read even when host_reserved matches, so the other forward's
    reserve is refused by name instead of giving wrong gradients."""
    from tritonrnn.rnn import cudnn_rnn_backprop

    (x, h0, c0, params, lens), mine = _forward([3, 2, 4])
    _, other = _forward([4, 3, 2])
    assert other.reserve_space.numel() == mine.reserve_space.numel()
    grads = (torch.ones_like(mine.output), torch.zeros_like(h0), torch.zeros_like(c0))
    args = (x, h0, c0, params, lens, mine.output, mine.output_h, mine.output_c, *grads)
    cudnn_rnn_backprop(*args, mine.reserve_space, mine.host_reserved, rnn_mode="lstm",
                       backend="reference")  # its own reserve: accepted
    with pytest.raises(ValueError, match=r"reserve_space: expected the header of a forward "
                                         r"with this configuration.*got fingerprint"):
        cudnn_rnn_backprop(*args, other.reserve_space, mine.host_reserved, rnn_mode="lstm",
                           backend="reference")


# ----------------------------------------------------------------------------- packing


def test_tied_lengths_keep_their_order_in_a_wide_batch():
    """The batch is sorted by length with a stable sort (ties keep their order) also past
    16 rows, where an unstable sort reorders ties."""
    from tritonrnn.rnn.packing import make_pack_info

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 3, (32,), generator=g).tolist()
    info = make_pack_info(lengths, 3, torch.device("cpu"))
    want = sorted(range(32), key=lambda b: -lengths[b])
    assert info.perm.tolist() == want
    assert info.inv_perm.tolist() == [want.index(b) for b in range(32)]


# ----------------------------------------------------------------------------- modules


@pytest.mark.parametrize("batch_first", [False, True])
def test_an_empty_unbatched_input_is_refused_whatever_batch_first(batch_first):
    """An unbatched input is [T, I] whatever batch_first says (torch.nn): T = 0 is refused by
    name, with the time axis read from the first dimension."""
    from tritonrnn.rnn import LSTM

    rnn = LSTM(4, 3, batch_first=batch_first, backend="reference")
    with pytest.raises(ValueError, match=r"input: expected max time >= 1, got shape \[0, 4\] "
                                         r"\(\[T, I\]\)"):
        rnn(torch.zeros(0, 4))


# ----------------------------------------------------------------------------- library


@pytest.mark.parametrize("layers", [1, 2])
def test_opcheck_forward_op_with_a_projection_and_full_lengths(layers):
    """The fake's reserve size without lengths, 256 + itemsize * T * B * D * (L * H +
    (L - 1) * Hout) bytes, counts the layer outputs Hout = P wide (torch.library.opcheck:
    fake against real)."""
    from tritonrnn.rnn import params_size

    g = torch.Generator().manual_seed(0)
    L, D, B, T, I, H, P = layers, 2, 3, 4, 5, 6, 2
    n = params_size(rnn_mode="lstm", num_layers=L, num_units=H, input_size=I,
                    direction="bidirectional", num_proj=P)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    args = (rnd(T, B, I), rnd(L * D, B, P), rnd(L * D, B, H), rnd(n), None, None, "lstm",
            "linear_input", "bidirectional", 0.0, 0, 0, P, True, True, "reference")
    torch.library.opcheck(torch.ops.tritonrnn.cudnn_rnn.default, args,
                          test_utils=["test_schema", "test_faketensor"])
    out = torch.ops.tritonrnn.cudnn_rnn(*args)
    assert out[3].numel() == 256 + 8 * T * B * D * (L * H + (L - 1) * P)
