"""The RNN <-> TensorArray link: the RNN output is the forward array's slab, and the
gradient array's slab (allocated by the planner's hook) is the backward's output_backprop."""

from __future__ import annotations

import pytest
import torch
from helpers import make_case, params_from_module

from tritonrnn.rnn import cudnn_rnn, ops, output_tensor_array, planner


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gradient_slab_is_output_backprop(backend, monkeypatch):
    module, x, h0, c0, lens = make_case("lstm", 3, 16, 1, False, 0, 5, [5, 2, 4], True)
    dtype = torch.float32
    p = params_from_module(module).to(dtype).requires_grad_(True)
    x, h0, c0 = (t.to(dtype) for t in (x, h0, c0))
    seen: list[torch.Tensor] = []
    real = ops._backprop

    def spy(call, rec, input, input_h, input_c, params, output, d_output, *rest):
        seen.append(d_output)
        return real(call, rec, input, input_h, input_c, params, output, d_output, *rest)

    monkeypatch.setattr(ops, "_backprop", spy)
    slabs: list[torch.Tensor] = []
    planner_allocator = planner.tensorarray_allocator

    def recording_allocator(shape, dtype, device):
        slabs.append(planner_allocator(shape, dtype, device))
        return slabs[-1]

    monkeypatch.setattr(planner, "tensorarray_allocator", recording_allocator)
    out = cudnn_rnn(x, h0, c0, p, lens, backend=backend)
    ta = output_tensor_array(out.output)
    assert ta.slab.data_ptr() == out.output.data_ptr()
    w = torch.randn(out.output.shape)
    loss = sum((ta.read(t) * w[t]).sum() for t in range(5) if t != 1)
    (dp,) = torch.autograd.grad(loss, [p])
    (grad_slab,) = seen
    assert len(slabs) == 1 and grad_slab.data_ptr() == slabs[0].data_ptr()  # no copy
    expect_w = w.clone()
    expect_w[1] = 0
    torch.testing.assert_close(grad_slab, expect_w, rtol=0, atol=0)
    assert grad_slab.is_contiguous() and grad_slab.shape == out.output.shape
    # The same gradient as differentiating the output directly.
    monkeypatch.undo()
    out2 = cudnn_rnn(x, h0, c0, p, lens, backend=backend)
    (dp2,) = torch.autograd.grad((out2.output * expect_w).sum(), [p])
    torch.testing.assert_close(dp, dp2, rtol=0, atol=0)


def test_output_tensor_array_needs_time_major_output():
    with pytest.raises(ValueError, match=r"output: expected a contiguous time-major"):
        output_tensor_array(torch.zeros(4, 3, 2).transpose(0, 1))
    with pytest.raises(ValueError, match=r"output: expected the time-major \[T, B, D\*Hout\]"):
        output_tensor_array(torch.zeros(4, 3))
