"""Micro-benchmarks of the CPU-side overhead (pytest-benchmark), run in CI without timing
assertions: the planner's cached call, the op launch path on tiny shapes with the reference
backend, the packed-layout construction, and TensorArray write/read/stack.

Each benchmark also checks what its call returned, so a broken path fails here rather than
being timed. Under pytest-xdist pytest-benchmark disables timing and runs each body once.
"""

from __future__ import annotations

import pytest
import torch

from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop, params_size
from tritonrnn.rnn.packing import make_pack_info

T, B, I, H = 3, 2, 4, 8


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))


def _plan(**kw):
    from tritonrnn.rnn.planner import plan_for

    return plan_for(rnn_mode="lstm", input_size=256, num_units=256, batch=16, max_time=128,
                    dtype=torch.bfloat16, device_properties="h100", **kw)


def test_plan_for_cached_call(benchmark):
    first = _plan()
    plan = benchmark(_plan)
    assert plan is first  # the cached Plan itself, not one made again
    assert plan.reserve_bytes > 0


def _op_inputs(mode: str):
    n = params_size(rnn_mode=mode, num_layers=1, num_units=H, input_size=I)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g)
    h0 = torch.randn(1, B, H, generator=g)
    c0 = torch.randn(1, B, H, generator=g) if mode == "lstm" else None
    params = torch.randn(n, generator=g) * 0.1
    return x, h0, c0, params


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_op_forward_launch_path_reference(benchmark, mode):
    x, h0, c0, params = _op_inputs(mode)
    lengths = torch.tensor([T, 1])
    out = benchmark(cudnn_rnn, x, h0, c0, params, lengths, rnn_mode=mode,
                    backend="reference")
    assert out.output.shape == (T, B, H)
    assert torch.count_nonzero(out.output[1:, 1]) == 0  # padding of the length-1 sequence


def test_op_backprop_launch_path_reference(benchmark):
    x, h0, c0, params = _op_inputs("lstm")
    out = cudnn_rnn(x, h0, c0, params, backend="reference")
    dy = torch.ones_like(out.output)

    def backprop():
        return cudnn_rnn_backprop(
            x, h0, c0, params, None, out.output, out.output_h, out.output_c, dy,
            torch.zeros_like(h0), torch.zeros_like(c0), out.reserve_space, out.host_reserved,
            backend="reference",
        )

    grads = benchmark(backprop)
    assert grads.params_backprop.shape == params.shape
    assert torch.isfinite(grads.input_backprop).all()


@pytest.mark.parametrize(("batch", "time"), [(64, 64), (16, 1024)],
                         ids=["B64-T64-varlen", "B16-T1024-anchor"])
def test_pack_info_construction(benchmark, batch, time):
    """Built on the host for every forward and every backprop: at the anchor shape this is
    per-call overhead next to cuDNN's ~2 ms forward."""
    lengths = [time - (7 * b) % (time // 2) for b in range(batch)]
    info = benchmark(make_pack_info, lengths, time, torch.device("cpu"))
    assert sum(lengths) == info.N
    assert info.max_len == max(lengths)


def _tensorarray():
    import tritonrnn.tensorarray as ta_mod

    if not hasattr(ta_mod, "TensorArray"):
        pytest.skip("tritonrnn.tensorarray does not export TensorArray")
    return ta_mod


def test_tensorarray_write_read(benchmark):
    ta_mod = _tensorarray()
    registry = ta_mod.TensorArrayRegistry()
    values = [torch.full((16,), float(i)) for i in range(8)]

    def write_read():
        ta = ta_mod.TensorArray(torch.float32, size=8, element_shape=[16], registry=registry)
        for i, v in enumerate(values):
            ta = ta.write(i, v)
        out = [ta.read(i) for i in range(8)]
        ta.close()
        return out

    out = benchmark(write_read)
    assert all(torch.equal(o, v) for o, v in zip(out, values, strict=True))


def test_tensorarray_unstack_stack(benchmark):
    ta_mod = _tensorarray()
    registry = ta_mod.TensorArrayRegistry()
    value = torch.randn(32, 4, 8)

    def unstack_stack():
        ta = ta_mod.TensorArray(torch.float32, size=32, element_shape=[4, 8],
                                registry=registry)
        out = ta.unstack(value).stack()
        ta.close()
        return out

    assert torch.equal(benchmark(unstack_stack), value)
