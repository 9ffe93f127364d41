"""The torch.library wrapper (rnn/library.py) at its boundary: every tensor on the input's
device, a meta tensor beside real ones refused (the dispatcher would otherwise run the op's
shape-only implementation and return uninitialised tensors), and arguments named in each
error as rnn.ops names them."""

from __future__ import annotations

import pytest
import torch

from tritonrnn.rnn import params_size
from tritonrnn.rnn.library import cudnn_rnn as library_cudnn_rnn

T, B, I, H = 3, 2, 3, 4


def _lstm_args(device="cpu"):
    g = torch.Generator().manual_seed(3)
    n = params_size(rnn_mode="lstm", num_layers=1, num_units=H, input_size=I)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return {"input": rnd(T, B, I), "input_h": rnd(1, B, H), "input_c": rnd(1, B, H),
            "params": rnd(n)}


# ----------------------------------------------------------------------------- library op


@pytest.mark.parametrize("rnn_mode", [["lstm"], {"gru": 1}], ids=["list", "dict"])
def test_library_names_an_unhashable_rnn_mode(rnn_mode):
    # The library wrapper looked the mode up in a dict before checking it is a string: an
    # unhashable value raised "unhashable type" without naming the argument.
    a = _lstm_args()
    with pytest.raises(ValueError, match=r"rnn_mode: expected a string, got "):
        library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"],
                          rnn_mode=rnn_mode, backend="reference")


META_CASES = {
    # argument on the meta device beside real tensors: (argument, regex)
    "input_h": ("input_h", r"input_h: expected a tensor on cpu \(the input's\), got meta"),
    "input_c": ("input_c", r"input_c: expected a tensor on cpu \(the input's\), got meta"),
    "params": ("params", r"params: expected a tensor on cpu \(the input's\), got meta"),
    "input": ("input", r"input_h: expected a tensor on meta \(the input's\), got cpu"),
    "seeds": ("seeds", r"seeds: expected a tensor with data .*got a tensor on the meta device"),
    "sequence_lengths": ("sequence_lengths", r"sequence_lengths: expected a tensor with data "
                         r".*got a tensor on the meta device"),
}


@pytest.mark.parametrize("case", list(META_CASES))
def test_library_rejects_a_meta_tensor_beside_real_ones(case):
    # A custom op dispatches to its fake (shape-only) implementation as soon as one argument
    # is on the meta device: the library returned uninitialised real tensors (output, states,
    # a reserve without a header) instead of the error rnn.ops.cudnn_rnn gives.
    name, pattern = META_CASES[case]
    a = _lstm_args()
    a["seeds"] = torch.tensor([5, 6])
    a["sequence_lengths"] = torch.tensor([T, 1])
    a[name] = a[name].to("meta")
    with pytest.raises(ValueError, match=pattern):
        library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"],
                          a["sequence_lengths"], seeds=a["seeds"], dropout=0.5,
                          backend="reference")


def test_library_all_meta_still_gives_shapes():
    # The meta device as a whole stays a shape-only run (the fake), as before.
    a = _lstm_args("meta")
    out = library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"],
                            backend="reference")
    assert out.output.is_meta and tuple(out.output.shape) == (T, B, H)


@pytest.mark.parametrize("lengths_device", ["cpu", "meta"])
def test_library_all_meta_with_lengths_is_named(lengths_device):
    # A meta call's reserve size depends on sum(lengths), which the fake cannot read: named as
    # sequence_lengths instead of torch's RuntimeError about data-dependent meta outputs.
    a = _lstm_args("meta")
    lens = torch.tensor([T, 1], device=lengths_device)
    with pytest.raises(ValueError, match=r"sequence_lengths: expected None for meta tensors "
                                         r"with is_training=True.*got a tensor"):
        library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"], lens,
                          backend="reference")
    out = library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"], lens,
                            is_training=False, backend="reference")
    assert out.output.is_meta and out.reserve_space.numel() == 0


# A bad argument in a shape-only call (the op's fake: meta tensors, torch.compile's tracing)
# is the eager call's named error; the fake indexed the states' shapes unchecked (an
# IndexError for a rank-2 input_h) and took a params buffer of any size, any rnn_mode, an
# integer input.
SHAPE_ONLY_CASES = {
    "input_h_rank": ({"input_h": (B, H)}, {}),
    "input_rank": ({"input": (T, B)}, {}),
    "params_size": ({"params": (7,)}, {}),
    "input_c_batch": ({"input_c": (1, B + 1, H)}, {}),
    "rnn_mode": ({}, {"rnn_mode": "bogus"}),
    "direction": ({}, {"direction": "both"}),
    "int_input": ({"input": (T, B, I, torch.int64)}, {}),
    "skip_input_size": ({}, {"input_mode": "skip_input"}),  # input size 3, num_units 4
}


@pytest.mark.parametrize("case", list(SHAPE_ONLY_CASES))
def test_library_meta_call_names_a_bad_argument_as_eager_does(case):
    shapes, attrs = SHAPE_ONLY_CASES[case]
    calls = {}
    for device in ("cpu", "meta"):
        a = _lstm_args(device)
        for name, shape in shapes.items():
            dtype = shape[-1] if isinstance(shape[-1], torch.dtype) else torch.float32
            dims = shape[:-1] if isinstance(shape[-1], torch.dtype) else shape
            a[name] = torch.zeros(dims, dtype=dtype, device=device)
        with pytest.raises((ValueError, TypeError)) as err:
            library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"],
                              backend="reference", **attrs)
        calls[device] = (type(err.value), str(err.value))
    assert calls["meta"] == calls["cpu"]


def test_compiled_call_names_a_bad_argument():
    """Under torch.compile the op's fake runs at trace time, before the real op: its error
    (which Dynamo reports wrapped) names the argument, not an IndexError of the fake's."""
    a = _lstm_args()
    fn = torch.compile(lambda x, h, c, p: library_cudnn_rnn(x, h, c, p,
                                                            backend="reference").output,
                       backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"input_h: expected a rank-3 tensor, got shape "
                                        r"\[2, 4\]") as err:
        fn(a["input"], a["input_h"][0], a["input_c"], a["params"])
    assert not isinstance(err.value, IndexError)


def test_backprop_fake_names_a_bad_argument():
    a = _lstm_args("meta")
    out = library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"],
                            backend="reference")
    good = [a["input"], a["input_h"], a["input_c"], a["params"], None, out.output,
            out.output_h, out.output_c, torch.zeros_like(out.output),
            torch.zeros_like(out.output_h), torch.zeros_like(out.output_c), out.reserve_space,
            out.host_reserved, None, "lstm", "linear_input", "unidirectional", 0.0, 0, 0, 0,
            True, "reference"]
    dx, dh, dc, dp = torch.ops.tritonrnn.cudnn_rnn_backprop(*good)
    assert dx.shape == a["input"].shape and dp.shape == a["params"].shape
    bad = list(good)
    bad[8] = torch.zeros(T + 1, B, H, device="meta")
    with pytest.raises(ValueError, match=r"^output_backprop: expected shape \[3, 2, 4\] "):
        torch.ops.tritonrnn.cudnn_rnn_backprop(*bad)


@pytest.mark.parametrize("arg", ["nested_input", "seeds", "sequence_lengths"])
def test_library_names_a_sparse_or_nested_argument(arg):
    """Checked before the dispatcher, which has no kernel of the op for a nested or sparse
    tensor (NotImplementedError) and whose real op read sparse seeds' data pointer."""
    a = _lstm_args()
    seeds, lens = torch.tensor([1, 2]), torch.tensor([T, 1])
    if arg == "nested_input":
        a["input"] = torch.nested.nested_tensor([torch.randn(T, I), torch.randn(T, I)])
        want = r"^input: expected a dense tensor .*got a nested tensor$"
    elif arg == "seeds":
        seeds, want = seeds.to_sparse(), r"^seeds: expected a dense tensor .*sparse_coo$"
    else:
        lens, want = lens.to_sparse(), r"^sequence_lengths: expected a dense tensor .*sparse_coo$"
    with pytest.raises(TypeError, match=want):
        library_cudnn_rnn(a["input"], a["input_h"], a["input_c"], a["params"], lens,
                          seeds=seeds, dropout=0.5, backend="reference")
