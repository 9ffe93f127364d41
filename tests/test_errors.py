"""Every bad input of the spec's Errors section: a ValueError/TypeError naming the argument,
the expected and the given value."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tritonrnn.rnn import (
    canonical_to_params,
    cudnn_rnn,
    cudnn_rnn_backprop,
    params_size,
    params_to_canonical,
)

T, B, I, H = 4, 3, 5, 6


def _good(mode="lstm", dtype=torch.float32):
    n = params_size(rnn_mode=mode, num_layers=1, num_units=H, input_size=I)
    return {
        "input": torch.randn(T, B, I, dtype=dtype),
        "input_h": torch.randn(1, B, H, dtype=dtype),
        "input_c": torch.randn(1, B, H, dtype=dtype),
        "params": torch.randn(n, dtype=dtype),
    }


def _call(mode="lstm", lengths=None, **changes):
    args = _good(mode)
    kw = {"rnn_mode": mode, "backend": "reference"}
    for k, v in changes.items():
        (args if k in args else kw)[k] = v
    return cudnn_rnn(args["input"], args["input_h"], args["input_c"], args["params"], lengths,
                     **kw)


# (changes, exception, regex naming the argument, the expected and the given value)
FORWARD_CASES = {
    "input_rank": ({"input": torch.randn(T, B)}, ValueError, r"input: expected a rank-3.*\[4, 3\]"),
    "input_not_tensor": ({"input": [1.0]}, TypeError, r"input: expected a tensor, got list"),
    "input_int_dtype": ({"input": torch.ones(T, B, I, dtype=torch.int32)}, TypeError,
                        r"input: expected dtype float16.*got torch.int32"),
    "input_h_rank": ({"input_h": torch.randn(B, H)}, ValueError, r"input_h: expected a rank-3"),
    "input_h_batch": ({"input_h": torch.randn(1, B + 1, H)}, ValueError,
                      r"input_h: expected batch 3.*got shape \[1, 4, 6\]"),
    "input_c_shape": ({"input_c": torch.randn(1, B, H + 1)}, ValueError,
                      r"input_c: expected last dimension 6, input_h's .*got shape \[1, 3, 7\] "
                      r"\(input_h \[1, 3, 6\]\)"),
    "input_c_batch": ({"input_c": torch.randn(1, B + 2, H)}, ValueError,
                      r"input_c: expected shape \[1, 3, 6\].*got \[1, 5, 6\]"),
    "input_c_missing": ({"input_c": None}, TypeError, r"input_c: expected a tensor, got NoneType"),
    "h_dtype": ({"input_h": torch.randn(1, B, H, dtype=torch.float64)}, TypeError,
                r"input_h: expected dtype torch.float32.*got torch.float64"),
    "params_dtype": ({"params": torch.randn(4 * H * (I + H) + 8 * H, dtype=torch.float16)},
                     TypeError, r"params: expected dtype torch.float32.*got torch.float16"),
    "params_int_dtype": ({"params": torch.ones(4 * H * (I + H) + 8 * H, dtype=torch.int64)},
                         TypeError, r"params: expected dtype float16, bfloat16, float32 or "
                         r"float64, got torch.int64"),
    "params_size": ({"params": torch.randn(10)}, ValueError,
                    r"params: expected 312 elements.*got 10"),
    # An input of another feature size: the params no longer fit, and the message says
    # where the sizes it was checked against came from.
    "input_features": ({"input": torch.randn(T, B, I + 1)}, ValueError,
                       r"params: expected 336 elements .*input_size=6, .*; input_size: the "
                       r"input's last dimension, num_layers: input_h's layer axis / 1, "
                       r"num_units: input_c's last dimension\), got 312"),
    "params_rank": ({"params": torch.randn(2, 156)}, ValueError,
                    r"params: expected a 1-D tensor, got shape \[2, 156\]"),
    "h_device": ({"input_h": torch.randn(1, B, H, device="meta")}, ValueError,
                 r"input_h: expected a tensor on cpu.*got meta"),
    "rnn_mode": ({"rnn_mode": "lstmx"}, ValueError, r"rnn_mode: expected one of .*got 'lstmx'"),
    "input_mode": ({"input_mode": "skip"}, ValueError, r"input_mode: expected one of.*'skip'"),
    "direction": ({"direction": "both"}, ValueError, r"direction: expected one of.*'both'"),
    "backend": ({"backend": "cuda"}, ValueError, r"backend: expected one of.*'cuda'"),
    "dropout_high": ({"dropout": 1.0}, ValueError, r"dropout: expected a float in \[0, 1\), got 1"),
    "dropout_negative": ({"dropout": -0.1}, ValueError, r"dropout: .*got -0.1"),
    "dropout_type": ({"dropout": "0.1"}, TypeError, r"dropout: expected a float.*got str"),
    "dropout_bool": ({"dropout": np.bool_(True)}, TypeError,
                     r"dropout: expected a float.*got bool"),
    "dropout_tensor": ({"dropout": torch.tensor(0.1)}, TypeError,
                       r"dropout: expected a float.*got Tensor"),
    "dropout_numpy_high": ({"dropout": np.float32(1.0)}, ValueError,
                           r"dropout: expected a float in \[0, 1\), got 1"),
    "skip_input_size": ({"input_mode": "skip_input"}, ValueError,
                        r"input_mode: 'skip_input' needs input size == num_units \(6\), got .*5"),
    "proj_too_big": ({"num_proj": 7, "input_h": torch.randn(1, B, 7)}, ValueError,
                     r"num_proj: expected a value in \(0, num_units=6\], got 7"),
    # num_proj above H with states of H: the projection is the error, not input_h.
    "proj_too_big_h_states": ({"num_proj": 7}, ValueError,
                              r"^num_proj: expected a value in \(0, num_units=6\], got 7 "
                              r"\(num_units: input_c's last dimension\)$"),
    "proj_state": ({"num_proj": 3}, ValueError,
                   r"input_h: expected last dimension num_proj=3.*got shape \[1, 3, 6\]"),
    "proj_negative": ({"num_proj": -1}, ValueError, r"num_proj: expected an int >= 0, got -1"),
    # A bad num_proj is named as such, not blamed on a state (input_h sized as a projection).
    "proj_negative_small_h": ({"num_proj": -1, "input_h": torch.randn(1, B, 3)}, ValueError,
                              r"num_proj: expected an int >= 0, got -1"),
    "proj_float": ({"num_proj": 3.0, "input_h": torch.randn(1, B, 3)}, TypeError,
                   r"num_proj: expected an int, got float 3.0"),
    "state_size_zero": ({"input_h": torch.randn(1, B, 0), "input_c": torch.randn(1, B, 0)},
                        ValueError, r"input_h: expected a last dimension >= 1 \(the state size\), "
                        r"got shape \[1, 3, 0\]"),
    "seed_past_int64": ({"seed": 2**63}, ValueError,
                        r"seed: expected an int in \[-9223372036854775808, 9223372036854775807\], "
                        r"got 9223372036854775808"),
    "is_training": ({"is_training": 1}, TypeError, r"is_training: expected a bool, got int"),
    "time_major": ({"time_major": "yes"}, TypeError, r"time_major: expected a bool, got str"),
    "seed_type": ({"seed": 1.5}, TypeError, r"seed: expected an int, got float"),
    "seed_numpy_float": ({"seed": np.float64(1.0)}, TypeError,
                         r"seed: expected an int, got float64"),
    "seed_bool": ({"seed": True}, TypeError, r"seed: expected an int, got bool True"),
    "layer_axis_bidir": ({"direction": "bidirectional"}, ValueError,
                         r"input_h: expected a layer axis that is a positive multiple of 2"),
    # Layouts the ops cannot reshape or launch on: named, not a RuntimeError from a reshape.
    "input_sparse": ({"input": torch.randn(T, B, I).to_sparse()}, TypeError,
                     r"^input: expected a dense tensor \(layout torch.strided\), got layout "
                     r"torch.sparse_coo$"),
    "input_h_sparse": ({"input_h": torch.randn(1, B, H).to_sparse()}, TypeError,
                       r"^input_h: expected a dense tensor .*got layout torch.sparse_coo$"),
    "input_c_sparse_csr": ({"input_c": torch.randn(1, B, H)[0].to_sparse_csr()}, TypeError,
                           r"^input_c: expected a dense tensor .*got layout torch.sparse_csr$"),
    "params_sparse": ({"params": torch.randn(312).to_sparse()}, TypeError,
                      r"^params: expected a dense tensor .*got layout torch.sparse_coo$"),
    "input_nested": ({"input": torch.nested.nested_tensor([torch.randn(2, I),
                                                          torch.randn(3, I)])},
                     TypeError, r"^input: expected a dense tensor .*got a nested tensor$"),
}


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_errors(case):
    changes, exc, pattern = FORWARD_CASES[case]
    with pytest.raises(exc, match=pattern):
        _call(**changes)


def test_num_proj_on_non_lstm():
    with pytest.raises(ValueError, match=r"num_proj: expected 0 for rnn_mode='gru'.*got 2"):
        _call("gru", num_proj=2, input_h=torch.randn(1, B, 2))


LENGTH_CASES = {
    "negative": (torch.tensor([4, -1, 2]), ValueError,
                 r"sequence_lengths\[1\]: expected a length in \[0, 4\].*got -1"),
    "too_long": (torch.tensor([4, 5, 2]), ValueError,
                 r"sequence_lengths\[1\]: expected a length in \[0, 4\].*got 5"),
    "shape": (torch.tensor([4, 4]), ValueError,
              r"sequence_lengths: expected shape \[3\].*got \[2\]"),
    "dtype": (torch.tensor([4.0, 4.0, 4.0]), TypeError,
              r"sequence_lengths: expected dtype int32 or int64, got torch.float32"),
    "list": ([4, 4, 4], TypeError, r"sequence_lengths: expected an int32/int64 tensor.*list"),
    "meta": (torch.tensor([4, 4, 4], device="meta"), ValueError,
             r"sequence_lengths: expected a tensor with data .*got a tensor on the meta device"),
    "sparse": (torch.tensor([4, 4, 4]).to_sparse(), TypeError,
               r"^sequence_lengths: expected a dense tensor .*got layout torch.sparse_coo$"),
}


@pytest.mark.parametrize("case", list(LENGTH_CASES))
def test_length_errors(case):
    lengths, exc, pattern = LENGTH_CASES[case]
    with pytest.raises(exc, match=pattern):
        _call(lengths=lengths)


def _backprop_args():
    a = _good()
    fwd = cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"], backend="reference")
    return [a["input"], a["input_h"], a["input_c"], a["params"], None, fwd.output,
            fwd.output_h, fwd.output_c, torch.ones_like(fwd.output),
            torch.ones_like(fwd.output_h), torch.ones_like(fwd.output_c), fwd.reserve_space,
            fwd.host_reserved]


BACKPROP_CASES = {
    "output_shape": (5, torch.randn(T, B, H + 1), r"output: expected shape \[4, 3, 6\]"),
    "output_backprop_shape": (8, torch.randn(T + 1, B, H),
                              r"output_backprop: expected shape \[4, 3, 6\].*got \[5, 3, 6\]"),
    "output_h_backprop_dtype": (9, torch.randn(1, B, H, dtype=torch.float64),
                                r"output_h_backprop: expected dtype torch.float32"),
    "output_c_shape": (7, torch.randn(1, B + 1, H), r"output_c: expected shape \[1, 3, 6\]"),
    "output_h_shape": (6, torch.randn(2, B, H), r"output_h: expected shape \[1, 3, 6\].*got "
                       r"\[2, 3, 6\]"),
    "output_h_backprop_shape": (9, torch.randn(1, B, H + 1), r"output_h_backprop: expected "
                                r"shape \[1, 3, 6\].*got \[1, 3, 7\]"),
    "reserve_type": (11, "reserve", r"reserve_space: expected a tensor, got str"),
    "host_reserved": (12, torch.zeros(3, dtype=torch.int8),
                      r"host_reserved: expected the 64-byte tensor"),
    "host_reserved_dtype": (12, torch.zeros(64), r"host_reserved: expected the 64-byte int8 "
                            r"tensor.*got dtype torch.float32"),
    "host_reserved_bool": (12, torch.zeros(64, dtype=torch.bool), r"host_reserved: expected the "
                           r"64-byte int8 tensor.*got dtype torch.bool"),
    "host_reserved_meta": (12, torch.zeros(64, dtype=torch.int8, device="meta"),
                           r"host_reserved: expected a tensor with data.*meta"),
    "reserve_meta": (11, torch.zeros(8, dtype=torch.uint8, device="meta"),
                     r"reserve_space: expected a tensor on cpu.*got meta"),
    "output_backprop_sparse": (8, torch.randn(T, B, H).to_sparse(),
                               r"^output_backprop: expected a dense tensor .*sparse_coo$"),
    "reserve_sparse": (11, torch.ones(300, dtype=torch.uint8).to_sparse(),
                       r"^reserve_space: expected a dense tensor .*sparse_coo$"),
    "host_reserved_sparse": (12, torch.ones(64, dtype=torch.int8).to_sparse(),
                             r"^host_reserved: expected a dense tensor .*sparse_coo$"),
}


@pytest.mark.parametrize("case", list(BACKPROP_CASES))
def test_backprop_errors(case):
    index, value, pattern = BACKPROP_CASES[case]
    args = _backprop_args()
    args[index] = value
    with pytest.raises((ValueError, TypeError), match=pattern):
        cudnn_rnn_backprop(*args, backend="reference")


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values in a tensor of stride 2."""
    out = torch.zeros(2 * t.numel(), dtype=t.dtype)[::2]
    return out.copy_(t)


def _unaligned(t: torch.Tensor) -> torch.Tensor:
    """t's values at byte offset 1 of a byte arena (contiguous, payload misaligned)."""
    arena = torch.zeros(t.numel() + 1, dtype=torch.uint8)
    return arena[1:].copy_(t)


@pytest.mark.parametrize("layout", [_strided, _unaligned], ids=["strided", "unaligned"])
def test_backprop_reads_a_strided_or_unaligned_reserve(layout):
    # The reserve is opaque bytes: wherever the caller kept it, the backward reads it (a copy
    # when it cannot be viewed as the payload dtype in place) and gives the same gradients.
    args = _backprop_args()
    want = cudnn_rnn_backprop(*args, backend="reference")
    args[11] = layout(args[11])
    args[12] = _strided(args[12])
    got = cudnn_rnn_backprop(*args, backend="reference")
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)


@pytest.mark.parametrize("layout", [_strided, _unaligned], ids=["strided", "unaligned"])
def test_backprop_names_a_foreign_strided_reserve(layout):
    args = _backprop_args()
    reserve = args[11].clone()
    reserve[16:24] = 7  # the fingerprint field (int64 at byte 16): 0x0707070707070707
    args[11], args[12] = layout(reserve), None
    with pytest.raises(ValueError, match=r"reserve_space: expected the header of a forward.*"
                                         r"got fingerprint 506381209866536711"):
        cudnn_rnn_backprop(*args, backend="reference")


def test_ignored_cell_state_of_a_non_lstm_mode_is_none_or_a_tensor():
    with pytest.raises(TypeError, match=r"input_c: expected None or a tensor \(ignored for "
                                        r"rnn_mode='gru'\), got str"):
        _call(mode="gru", input_c="nonsense")
    assert _call(mode="gru", input_c=torch.zeros(1)).output.shape == (T, B, H)
    a = _good("gru")
    fwd = cudnn_rnn(a["input"], a["input_h"], None, a["params"], rnn_mode="gru",
                    backend="reference")
    args = [a["input"], a["input_h"], None, a["params"], None, fwd.output, fwd.output_h,
            None, torch.ones_like(fwd.output), torch.ones_like(fwd.output_h), None,
            fwd.reserve_space, fwd.host_reserved]
    for index, name in ((7, "output_c"), (10, "output_c_backprop")):
        bad = list(args)
        bad[index] = 1.0
        with pytest.raises(TypeError, match=rf"{name}: expected None or a tensor.*got float"):
            cudnn_rnn_backprop(*bad, rnn_mode="gru", backend="reference")


def test_meta_tensors_run_on_the_reference_backend_only(monkeypatch):
    # Under the interpreter "auto" means Triton for CPU tensors; meta tensors have no data
    # for Triton, so "auto" takes the reference path and an explicit "triton" is refused.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    meta = {k: v.to("meta") for k, v in _good().items()}
    out = cudnn_rnn(meta["input"], meta["input_h"], meta["input_c"], meta["params"],
                    backend="auto")
    assert out.output.is_meta and out.output.shape == (T, B, H)
    with pytest.raises(ValueError, match=r"backend: 'triton' needs tensors with data, got "
                                         r"tensors on the meta device"):
        cudnn_rnn(meta["input"], meta["input_h"], meta["input_c"], meta["params"],
                  backend="triton")


def test_backprop_reserve_of_other_lengths_rejected():
    # (dropout on one layer applies no mask: the same forward, the reserve taken)
    args = _backprop_args()
    want = cudnn_rnn_backprop(*args, backend="reference")
    got = cudnn_rnn_backprop(*args, backend="reference", num_proj=0, dropout=0.5)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    args[4] = torch.tensor([T] * (B - 1) + [T - 1])
    with pytest.raises(ValueError, match=r"host_reserved: expected the header of a forward "
                                         r"with this configuration, lengths and dtype"):
        cudnn_rnn_backprop(*args, backend="reference")


def test_params_helper_errors():
    kw = dict(rnn_mode="gru", num_layers=1, num_units=2, input_size=3)
    w, b = params_to_canonical(torch.zeros(params_size(**kw)), **kw)
    with pytest.raises(ValueError, match=r"weights: expected 6 tensors, got 5"):
        canonical_to_params(w[:5], b, **kw)
    with pytest.raises(ValueError, match=r"biases\[0\]: expected shape \[2\], got \[3\]"):
        canonical_to_params(w, [torch.zeros(3)] + b[1:], **kw)
    with pytest.raises(ValueError, match=r"params: expected 42 elements.*got 41"):
        params_to_canonical(torch.zeros(41), **kw)
    with pytest.raises(ValueError, match=r"num_layers: expected an int >= 1, got 0"):
        params_size(**{**kw, "num_layers": 0})
    with pytest.raises(ValueError, match=r"rnn_mode: expected one of.*'lstm2'"):
        params_size(**{**kw, "rnn_mode": "lstm2"})
    with pytest.raises(TypeError, match=r"weights\[0\]: expected a tensor, got list"):
        canonical_to_params([[0.0]] + w[1:], b, **kw)
    with pytest.raises(TypeError, match=r"biases\[0\]: expected dtype torch.float32 on cpu "
                       r"\(weights\[0\]'s\), got torch.float64"):
        canonical_to_params(w, [b[0].double()] + b[1:], **kw)
    with pytest.raises(TypeError, match=r"weights\[2\]: expected dtype torch.float32"):
        canonical_to_params(w[:2] + [w[2].half()] + w[3:], b, **kw)
    with pytest.raises(TypeError, match=r"weights\[0\]: expected dtype float16, bfloat16, "
                       r"float32 or float64, got torch.int64"):
        canonical_to_params([t.long() for t in w], [t.long() for t in b], **kw)
    with pytest.raises(TypeError, match=r"params: expected dtype float16, bfloat16, float32 "
                       r"or float64, got torch.int32"):
        params_to_canonical(torch.zeros(42, dtype=torch.int32), **kw)
    with pytest.raises(TypeError, match=r"^params: expected a dense tensor .*sparse_coo$"):
        params_to_canonical(torch.ones(42).to_sparse(), **kw)
    with pytest.raises(TypeError, match=r"^biases\[1\]: expected a dense tensor .*sparse_coo$"):
        canonical_to_params(w, [b[0], b[1].to_sparse()] + b[2:], **kw)


def test_params_helpers_default_to_lstm():
    """rnn_mode defaults to "lstm" in the params helpers as in the ops (TensorFlow's
    CudnnRNNParamsSize / ...Canonical attribute default)."""
    kw = dict(num_layers=2, num_units=3, input_size=4)
    n = params_size(**kw)
    assert n == params_size(rnn_mode="lstm", **kw) != params_size(rnn_mode="gru", **kw)
    p = torch.arange(n, dtype=torch.float32)
    w, b = params_to_canonical(p, **kw)
    assert [t.shape for t in w] == [t.shape for t in
                                    params_to_canonical(p, rnn_mode="lstm", **kw)[0]]
    assert torch.equal(canonical_to_params(w, b, **kw), p)


# TensorFlow's attributes take NumPy scalars as well as Python numbers: the same call, the
# same results (the op and its torch.library form), and the helpers' sizes likewise.
@pytest.mark.parametrize("op", ["ops", "library"])
def test_numpy_scalar_attributes_act_as_python_numbers(op):
    from tritonrnn.rnn import library

    call = cudnn_rnn if op == "ops" else library.cudnn_rnn
    a = _good()
    py = dict(dropout=0.25, seed=3, seed2=-4, num_proj=0, rnn_mode="lstm", backend="reference")
    npy = dict(py, dropout=np.float32(0.25), seed=np.int64(3), seed2=np.int32(-4),
               num_proj=np.int64(0))
    want = call(a["input"], a["input_h"], a["input_c"], a["params"], **py)
    got = call(a["input"], a["input_h"], a["input_c"], a["params"], **npy)
    for x, y in zip(want, got, strict=True):
        assert torch.equal(x, y)
    kw = dict(rnn_mode="gru", num_layers=2, num_units=3, input_size=2)
    assert params_size(**{k: np.int64(v) if isinstance(v, int) else v
                          for k, v in kw.items()}) == params_size(**kw)


def test_library_op_checks_the_ignored_cell_state():
    from tritonrnn.rnn import library

    a = _good("gru")
    with pytest.raises(TypeError, match=r"input_c: expected None or a tensor \(ignored for "
                                        r"rnn_mode='gru'\), got str"):
        library.cudnn_rnn(a["input"], a["input_h"], "junk", a["params"], rnn_mode="gru",
                          backend="reference")


def test_triton_backend_needs_cuda_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"backend: 'triton' needs CUDA tensors or "
                                         r"TRITON_INTERPRET=1, got tensors on cpu"):
        _call(backend="triton")


_LATE_INTERPRETER = """
import os, torch
import triton  # imported before the variable is set, as a user's earlier import would
os.environ["TRITON_INTERPRET"] = "1"
from tritonrnn.rnn import cudnn_rnn, params_size
n = params_size(rnn_mode="gru", num_layers=2, num_units=8, input_size=8)
x, h, p = torch.randn(3, 2, 8), torch.zeros(2, 2, 8), torch.randn(n) * 0.1
for backend, dropout in (("triton", 0.0), ("auto", 0.0), ("reference", 0.5),
                         ("reference", 0.0)):
    try:
        out = cudnn_rnn(x, h, None, p, rnn_mode="gru", dropout=dropout, backend=backend)
        print(backend, dropout, "ran", tuple(out.output.shape))
    except RuntimeError as e:
        print(backend, dropout, "error", str(e).splitlines()[0])
"""


def test_an_interpreter_asked_for_after_tritons_import_is_named():
    """TRITON_INTERPRET=1 set after `import triton` leaves Triton's library functions
    compiled-mode, and an interpreted kernel fails inside its launch on calling one: every
    path that would launch a kernel on the CPU (the Triton backend, "auto", the fused
    dropout of the reference backend) names the variable instead; the reference path
    without dropout, which launches nothing, runs. In a fresh process (this one imported
    triton under the interpreter)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _LATE_INTERPRETER], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    why = ("error TRITON_INTERPRET: expected it set to 1 before triton was first imported "
           "(Triton decides at that import whether @triton.jit functions are interpreted), "
           "got it set afterwards in this process: export TRITON_INTERPRET=1 before starting "
           "Python, or set os.environ before anything imports triton")
    assert res.stdout.splitlines() == [
        f"triton 0.0 {why}", f"auto 0.0 {why}", f"reference 0.5 {why}",
        "reference 0.0 ran (3, 2, 8)"], res.stdout
