"""torch.compile over models using tritonrnn modules: fullgraph=True (no graph break), and the
compiled forward and backward equal eager ones (CPU, reference backend, float64).

Tolerance: compiled graphs run the same custom ops on the same data; only the ops around them
(embedding, linear, cat) may be fused or reordered by the compiler, so results agree to
float64 rounding of a few dozen operations: 1e-12 (measured: <= 1e-15).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo.testing
from torch import nn
from torch.torch_version import TorchVersion

from tritonrnn.rnn import library
from tritonrnn.rnn.modules import GRU, LSTM, RNN

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-12)
V, I, H, C = 11, 5, 6, 3


# With lengths, in training, the reserve space's byte count is data (library.py's fake gives
# it an unbacked size). torch 2.10 and newer let fullgraph=True trace such an op by
# themselves; torch 2.8 and 2.9 (pyproject admits 2.8) need this flag, as the README says.
FULLGRAPH_NEEDS_FLAG = TorchVersion(torch.__version__) < "2.10"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=FULLGRAPH_NEEDS_FLAG):
        yield
    torch._dynamo.reset()


class Classifier(nn.Module):
    """Embedding -> 2-layer bidirectional RNN over padded tokens with lengths -> linear."""

    def __init__(self, cell: str, dropout: float = 0.0):
        super().__init__()
        cls = {"lstm": LSTM, "gru": GRU, "rnn": RNN}[cell]
        self.emb = nn.Embedding(V, I, dtype=F64)
        self.rnn = cls(I, H, num_layers=2, bidirectional=True, batch_first=True,
                       dropout=dropout, dtype=F64, backend="reference")
        self.head = nn.Linear(2 * H, C, dtype=F64)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out, hn = self.rnn(self.emb(tokens), lengths=lengths)
        h = hn[0] if isinstance(hn, tuple) else hn
        return self.head(torch.cat([h[-2], h[-1]], dim=-1)) + out.mean(dim=1)[:, :C]


def _batch(B=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    return tokens, lengths


def _loss_and_grads(model, fn, tokens, lengths):
    model.zero_grad()
    loss = fn(tokens, lengths).pow(2).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_fullgraph_aot_eager_matches_eager(cell):
    torch.manual_seed(0)
    model = Classifier(cell)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    tokens, lengths = _batch()
    want_loss, want = _loss_and_grads(model, model, tokens, lengths)
    got_loss, got = _loss_and_grads(model, compiled, tokens, lengths)
    torch.testing.assert_close(got_loss, want_loss, **TOL)
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_fullgraph_inductor_training_steps_match_eager():
    """Three Adam steps compiled by inductor (fullgraph) land on eager's weights."""
    torch.manual_seed(0)
    eager = Classifier("lstm")
    model = Classifier("lstm")
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (eager, model)]
    for step in range(3):
        tokens, lengths = _batch(seed=step)
        for fn, opt in ((eager, opts[0]), (compiled, opts[1])):
            opt.zero_grad()
            nn.functional.cross_entropy(fn(tokens, lengths), tokens[:, 0] % C).backward()
            opt.step()
    for (n, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        # Adam normalizes by sqrt(v): 1e-12 gradient differences stay ~1e-12 relative.
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-9, msg=lambda m, n=n: f"{n}: {m}")


def test_varlen_training_without_the_flag():
    """The README's statement, on the torch that runs this: without the flag, fullgraph=True
    traces varlen training from torch 2.10 on and names the flag before it; a compile without
    fullgraph breaks the graph at the op (every torch) and matches eager."""
    torch.manual_seed(0)
    model = Classifier("lstm")
    tokens, lengths = _batch()
    want_loss, want = _loss_and_grads(model, model, tokens, lengths)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False):
        strict = torch.compile(model, backend="aot_eager", fullgraph=True)
        if FULLGRAPH_NEEDS_FLAG:
            with pytest.raises(Exception, match="capture_dynamic_output_shape_ops"):
                _loss_and_grads(model, strict, tokens, lengths)
        else:
            got_loss, _ = _loss_and_grads(model, strict, tokens, lengths)
            torch.testing.assert_close(got_loss, want_loss, **TOL)
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        loose = torch.compile(model, backend=counter)
        got_loss, got = _loss_and_grads(model, loose, tokens, lengths)
    torch.testing.assert_close(got_loss, want_loss, **TOL)
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    assert counter.frame_count > 1, counter.frame_count  # the graphs before and after the op


def test_dynamic_shapes_do_not_recompile():
    torch.manual_seed(0)
    model = Classifier("gru")
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for B, T in ((4, 6), (3, 5), (5, 7)):
        tokens, lengths = _batch(B, T, seed=B)
        torch.testing.assert_close(compiled(tokens, lengths), model(tokens, lengths), **TOL)
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames == [frames[0]] * 3, frames


def test_dropout_compiles_fullgraph_and_is_seeded():
    torch.manual_seed(0)
    model = Classifier("lstm", dropout=0.5).train()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    tokens, lengths = _batch()
    torch.manual_seed(3)
    a = compiled(tokens, lengths)
    torch.manual_seed(3)
    b = compiled(tokens, lengths)
    c = compiled(tokens, lengths)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    a.sum().backward()
    assert all(p.grad is not None for p in model.rnn.parameters())
    model.eval()
    torch.testing.assert_close(compiled(tokens, lengths), model(tokens, lengths), **TOL)


def test_padded_input_without_lengths_and_eval_no_grad():
    torch.manual_seed(0)
    m = LSTM(I, H, num_layers=2, proj_size=2, dtype=F64, backend="reference").eval()
    fn = torch.compile(lambda x: m(x)[1][1], backend="aot_eager", fullgraph=True)
    x = torch.randn(5, 3, I, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x)[1][1], **TOL)


def test_packed_sequence_fullgraph():
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    m = GRU(I, H, num_layers=2, bidirectional=True, dtype=F64, backend="reference")
    fn = torch.compile(lambda p: m(p), backend="aot_eager", fullgraph=True)
    x = torch.randn(6, 3, I, dtype=F64, requires_grad=True)
    pack = lambda: pack_padded_sequence(x, torch.tensor([6, 2, 4]), enforce_sorted=False)  # noqa: E731
    (out, hn), (out_e, hn_e) = fn(pack()), m(pack())
    torch.testing.assert_close(out.data, out_e.data, **TOL)
    assert torch.equal(out.batch_sizes, out_e.batch_sizes)
    torch.testing.assert_close(hn, hn_e, **TOL)
    (dx,) = torch.autograd.grad(out.data.sum() + hn.sum(), x)
    (dx_e,) = torch.autograd.grad(out_e.data.sum() + hn_e.sum(), x)
    torch.testing.assert_close(dx, dx_e, **TOL)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_autocast_eager_equals_compiled_and_plain_bfloat16(cell):
    """Under CPU autocast the op's bodies run with autocast off, as a compiled graph runs
    them: eager and compiled (aot_eager, fullgraph) outputs and gradients are the same
    numbers, and those of the module converted to bfloat16 (float32 masters' gradients are
    the cast of its bfloat16 ones). Exact: the same ops on the same bfloat16 data."""
    torch.manual_seed(0)
    rnn = {"lstm": LSTM, "gru": GRU}[cell](8, 8, 2, bidirectional=True, backend="reference")
    plain = copy.deepcopy(rnn).bfloat16()
    compiled = torch.compile(rnn, backend="aot_eager", fullgraph=True)
    x0 = torch.randn(5, 3, 8)
    results = []
    for fn in (rnn, compiled):
        rnn.zero_grad()
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(x)[0]
            out.float().pow(2).sum().backward()
        results.append((out, x.grad, [p.grad for p in rnn.parameters()]))
    xb = x0.bfloat16().requires_grad_(True)
    out = plain(xb)[0]
    out.float().pow(2).sum().backward()
    results.append((out, xb.grad.float(), [p.grad.float() for p in plain.parameters()]))
    (out, dx, grads), *others = results
    assert out.dtype == torch.bfloat16
    for who, (out_o, dx_o, grads_o) in zip(("compiled", "bfloat16"), others, strict=True):
        torch.testing.assert_close(out_o, out, rtol=0, atol=0,
                                   msg=lambda m, w=who: f"{w} output: {m}")
        torch.testing.assert_close(dx_o, dx, rtol=0, atol=0,
                                   msg=lambda m, w=who: f"{w} input grad: {m}")
        for (n, _), a, b in zip(rnn.named_parameters(), grads_o, grads, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0,
                                       msg=lambda m, n=n, w=who: f"{w} grad {n}: {m}")


def _sample_args(mode, lengths, training, time_major=True):
    g = torch.Generator().manual_seed(0)
    L, D, B, T = 2, 2, 3, 4
    Hout = 2 if mode == "lstm" else H
    tm = (lambda a, b, c: (a, b, c)) if time_major else (lambda a, b, c: (b, a, c))
    rnd = lambda *s: torch.randn(*tm(*s), generator=g, dtype=F64, requires_grad=True)  # noqa: E731
    from tritonrnn.rnn import params_size

    n = params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=I,
                    direction="bidirectional", num_proj=2 if mode == "lstm" else 0)
    params = torch.randn(n, generator=g, dtype=F64, requires_grad=True)
    return (
        rnd(T, B, I), rnd(L * D, B, Hout), rnd(L * D, B, H) if mode == "lstm" else None,
        params, torch.tensor(lengths) if lengths else None,
        torch.tensor([5, 9]), mode, "linear_input", "bidirectional", 0.3, 0, 0,
        2 if mode == "lstm" else 0, training, time_major, "reference",
    )


@pytest.mark.parametrize(
    "mode, lengths, training, time_major",
    [("lstm", [4, 0, 2], True, True), ("gru", None, True, True),
     ("rnn_tanh", [1, 4, 3], False, True), ("lstm", [3, 4, 1], True, False)],
    ids=["lstm-varlen", "gru-full", "tanh-inference", "lstm-batch-major"],
)
def test_opcheck_forward_op(mode, lengths, training, time_major):
    """torch.library.opcheck: schema, fake implementation (shapes and strides) vs real,
    autograd registration, and AOT dispatch with dynamic shapes."""
    args = _sample_args(mode, lengths, training, time_major)
    tests = ["test_schema", "test_faketensor", "test_autograd_registration"]
    if training:
        tests.append("test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.tritonrnn.cudnn_rnn.default, args, test_utils=tests)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_opcheck_backprop_op(mode):
    args = _sample_args(mode, [4, 1, 3], True)
    with torch.no_grad():
        fwd = torch.ops.tritonrnn.cudnn_rnn(*args)
    x, h0, c0, p, lens, seeds = (a.detach() if isinstance(a, torch.Tensor) else a
                                 for a in args[:6])
    out, out_h, out_c, reserve, host = fwd
    grads = [torch.randn_like(t) for t in (out, out_h)]
    d_c = torch.randn_like(out_c) if mode == "lstm" else None
    bp_args = (x, h0, c0, p, lens, out, out_h, out_c if mode == "lstm" else None, *grads, d_c,
               reserve, host, seeds, *args[6:13], args[14], args[15])
    torch.library.opcheck(torch.ops.tritonrnn.cudnn_rnn_backprop.default, bp_args,
                          test_utils=["test_schema", "test_faketensor"])


@pytest.mark.parametrize("time_major", [True, False], ids=["time-major", "batch-major"])
@pytest.mark.parametrize("api", ["ops", "library"])
def test_final_states_can_be_edited_in_place_before_backward(api, time_major):
    """output_h / output_c are neither views (batch-major: a multi-output function's views
    refuse in-place changes) nor saved for the backward (a saved one would fail autograd's
    version check): editing them in place, as torch.nn allows, leaves the gradients as they
    were."""
    from tritonrnn.rnn import ops

    fn = ops.cudnn_rnn if api == "ops" else library.cudnn_rnn
    x, h0, c0, p, lens = _sample_args("lstm", [4, 1, 3], True, time_major)[:5]
    kw = dict(rnn_mode="lstm", direction="bidirectional", num_proj=2, time_major=time_major,
              backend="reference")
    grads = []
    for edit in (False, True):
        out = fn(x, h0, c0, p, lens, **kw)
        h, c = out.output_h, out.output_c
        assert h._base is None and c._base is None
        if edit:
            h.add_(1.0)
            c.add_(1.0)
        loss = out.output.sum() + h.sum() + c.sum()
        grads.append(torch.autograd.grad(loss, [x, h0, c0, p]))
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("time_major", [True, False], ids=["time-major", "batch-major"])
@pytest.mark.parametrize("api", ["ops", "library"])
def test_output_is_its_own_tensor_and_saved(api, time_major):
    """output is not a view (autograd's error for an edited view among a function's outputs
    named no argument), in the layout the fake promises (batch-major: a transposed time-major
    tensor's strides). The backward reads it, as cuDNN's does: an in-place edit before
    backward fails autograd's version check, naming it; without grad it is free to edit."""
    from tritonrnn.rnn import ops

    fn = ops.cudnn_rnn if api == "ops" else library.cudnn_rnn
    x, h0, c0, p, lens = _sample_args("lstm", [4, 1, 3], True, time_major)[:5]
    kw = dict(rnn_mode="lstm", direction="bidirectional", num_proj=2, time_major=time_major,
              backend="reference")
    out = fn(x, h0, c0, p, lens, **kw)
    y = out.output
    assert y._base is None
    T, B = (y.shape[0], y.shape[1]) if time_major else (y.shape[1], y.shape[0])
    assert y.stride() == ((B * 4, 4, 1) if time_major else (4, B * 4, 1))
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*output 0"):
        y.sum().backward()
    with torch.no_grad():
        free = fn(x, h0, c0, p, lens, **kw).output
    free.mul_(2.0)
    assert torch.equal(free, y.detach())


def test_library_op_matches_ops_and_rejects_inference_backward():
    from tritonrnn.rnn import ops

    args = _sample_args("lstm", [4, 1, 3], True)
    x, h0, c0, p, lens = args[:5]
    kw = dict(rnn_mode="lstm", direction="bidirectional", num_proj=2, dropout=0.3, seed=5,
              seed2=9, backend="reference")
    got = library.cudnn_rnn(x, h0, c0, p, lens, **kw)
    want = ops.cudnn_rnn(x, h0, c0, p, lens, **kw)
    seeded = library.cudnn_rnn(x, h0, c0, p, lens, seeds=torch.tensor([5, 9]),
                               **{k: v for k, v in kw.items() if k not in ("seed", "seed2")})
    for a, b, c in zip(got[:3], want[:3], seeded[:3], strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    g_got = torch.autograd.grad(got.output.sum() + got.output_c.sum(), [x, h0, c0, p])
    g_want = torch.autograd.grad(want.output.sum() + want.output_c.sum(), [x, h0, c0, p])
    for a, b in zip(g_got, g_want, strict=True):
        assert torch.equal(a, b)
    inference = library.cudnn_rnn(x, h0, c0, p, lens, is_training=False, **kw)
    assert inference.reserve_space.numel() == 0
    with pytest.raises(ValueError, match="is_training"):
        inference.output.sum().backward()
    with pytest.raises(ValueError, match="seeds"):
        library.cudnn_rnn(x, h0, c0, p, lens, seeds=torch.tensor([1, 2, 3]),
                          **{k: v for k, v in kw.items() if k not in ("seed", "seed2")})
    with pytest.raises(TypeError, match="sequence_lengths"):
        library.cudnn_rnn(x, h0, c0, p, [4, 1, 3], **kw)
    for bad in (2**63, -(2**63) - 1):  # the op schema's int64, checked before it (as ops')
        with pytest.raises(ValueError, match=rf"seed2: expected an int in \[.*\], got {bad}"):
            library.cudnn_rnn(x, h0, c0, p, lens, **{**kw, "seed2": bad})
