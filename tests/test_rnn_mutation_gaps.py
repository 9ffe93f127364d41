"""Mutation round over the host-side modules of rnn/ (planner, pipeline, reserve, packing,
params, config, dropout, modules, library; 49 mutants, 10 of them let through by the whole
suite and not equivalent): one test per such mutant, each failing on it and passing on the
code as it is."""

from __future__ import annotations

import pytest
import torch

from tritonrnn.rnn import reserve as reserve_mod
from tritonrnn.rnn.planner import (
    plan_constraints,
    plan_for,
    store_tuning_entry,
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))


def _plan(mode="lstm", H=64, B=16, T=1024, dtype=torch.bfloat16, device="h100", **kw):
    return plan_for(rnn_mode=mode, input_size=H, num_units=H, batch=B, max_time=T, dtype=dtype,
                    device_properties=device, **kw)


# ----------------------------------------------------------------------------- planner


def test_a_resident_tile_of_exactly_the_resident_limit_stays_resident():
    """`_grid_fit` streams the weights past _RESIDENT_TILE (1024) elements of tile; a 16 x 64
    tile is exactly that and keeps them resident (LSTM H=512 B=256 on an H100)."""
    lp = _plan(H=512, B=256).layer(0)
    assert (lp.family, lp.block_h, lp.block_b, lp.block_k, lp.num_programs) == (
        "persistent_grid", 16, 64, 0, 128)


def test_a_projection_has_its_own_tuning_key():
    """The tuning key names P: an entry timed without a projection does not apply to the
    same H with one."""
    plain, projected = _plan(H=256), _plan(H=256, num_proj=128)
    assert "|P0|" in plain.key and "|P128|" in projected.key
    store_tuning_entry(plain.key, {"family": "stepwise", "block_b": 16, "block_h": 32,
                                   "num_warps": 8}, 1.0, "h100")
    assert _plan(H=256).source == "tuned"
    assert _plan(H=256, num_proj=128).source == "heuristic"


def test_planned_reserve_counts_projected_layer_outputs():
    """Plan.reserve_bytes = 256 + itemsize * N * D * (L * H + (L - 1) * Hout) for LSTM
    (rnn/reserve.py): the layer outputs are Hout = P wide, and the op's reserve agrees."""
    from tritonrnn.rnn import cudnn_rnn, params_size

    L, D, H, P, B, T = 2, 2, 64, 32, 3, 5
    p = _plan(H=H, B=B, T=T, num_layers=L, num_proj=P, direction="bidirectional")
    N = B * T
    assert p.reserve_bytes == reserve_mod.PAYLOAD_OFFSET + 2 * N * D * (L * H + (L - 1) * P)
    g = torch.Generator().manual_seed(0)
    n = params_size(rnn_mode="lstm", num_layers=L, num_units=H, input_size=H,
                    direction="bidirectional", num_proj=P)
    out = cudnn_rnn(torch.randn(T, B, H, generator=g).bfloat16(),
                    torch.zeros(L * D, B, P, dtype=torch.bfloat16),
                    torch.zeros(L * D, B, H, dtype=torch.bfloat16),
                    (torch.randn(n, generator=g) * 0.1).bfloat16(), rnn_mode="lstm",
                    direction="bidirectional", num_proj=P, backend="reference")
    assert out.reserve_space.numel() == p.reserve_bytes


def test_vector_tiles_are_not_planned_on_the_interpreter_preset():
    """`_vector_fit`: batch 1 runs vector tiles on a GPU preset, not on the interpreter's
    (whose NumPy programs make them several times slower): MMA tiles there."""
    def layer(device):
        return plan_for(rnn_mode="lstm", input_size=512, num_units=512, batch=1, max_time=16,
                        dtype=torch.bfloat16, device_properties=device).layer(0)

    gpu, cpu = layer("h100"), layer("interpreter")
    assert (gpu.family, gpu.block_b, gpu.block_h) == ("persistent_grid", 1, 8)
    assert cpu.family == "persistent_grid" and cpu.block_b == 16


# ----------------------------------------------------------------------------- pipeline


def test_a_single_layer_pipeline_has_no_dropout_workspace():
    """Dropout applies between layers only: a forced one-layer pipeline with dropout > 0
    allocates (and plans) no `dropped` workspace, as without dropout."""
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.pipeline import forward_workspaces

    cfg = make_config(rnn_mode="lstm", num_layers=1, num_units=32, input_size=32, dropout=0.25)
    assert "dropped" not in forward_workspaces(cfg, 64, 4, True)
    kw = dict(mode="rnn_tanh", H=32, B=4, T=64, num_layers=1)
    with plan_constraints(pipeline_chunks=2):
        dry, wet = _plan(**kw), _plan(**kw, dropout=0.25)
    assert wet.pipeline.chunks == 2
    assert [(b.phase, b.name, b.nbytes) for b in wet.buffers] == [
        (b.phase, b.name, b.nbytes) for b in dry.buffers]


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
