"""tritonrnn.rnn.{LSTM, GRU, RNN} against torch.nn.{LSTM, GRU, RNN} in float64 on the CPU.

Both modules share one state dict, take the same inputs, and every output, final state and
gradient (input, initial states, every named parameter) must agree.

Tolerance: float64 has unit roundoff 1.1e-16. The deepest dependency chain here is
T=6 steps x 2 layers of dot products of <= 28 terms plus the backward's sums over <= 24 packed
rows: a few thousand roundings, i.e. errors around 1e-13 at worst (measured: <= 4e-15).
1e-10 keeps a 1000x margin and is still eight orders of magnitude below what a wrong gate,
a lost step or a misrouted gradient produces (>= 1e-2).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.nn.utils import parametrize, prune
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import tritonrnn.rnn.modules as modules_mod
from tritonrnn.rnn.modules import GRU, LSTM, RNN

TOL = dict(rtol=1e-10, atol=1e-10)
F64 = torch.float64
I, H, T = 5, 7, 6
LENGTHS = [3, 6, 1, 5]  # unsorted, with the full length present
MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]


def make_pair(mode: str, backend: str = "reference", dtype=F64, **kw):
    """(ours, torch.nn's) with the same weights; torch's is built first with its own init."""
    if mode == "lstm":
        theirs, cls = torch.nn.LSTM(I, H, dtype=dtype, **kw), LSTM
    elif mode == "gru":
        theirs, cls = torch.nn.GRU(I, H, dtype=dtype, **kw), GRU
    else:
        kw["nonlinearity"] = mode[4:]
        theirs, cls = torch.nn.RNN(I, H, dtype=dtype, **kw), RNN
    ours = cls(I, H, dtype=dtype, backend=backend, **kw)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def random_like_states(module, B, gen, dtype=F64):
    D = 2 if module.bidirectional else 1
    Hout = module.proj_size or module.hidden_size
    h0 = torch.randn(module.num_layers * D, B, Hout, generator=gen, dtype=dtype)
    if isinstance(module, (LSTM, torch.nn.LSTM)):
        c0 = torch.randn(module.num_layers * D, B, module.hidden_size, generator=gen,
                         dtype=dtype)
        return h0, c0
    return h0, None


def run(module, kind, x, h0, c0, lengths, batch_first):
    """Forward through `module` with input `kind` ('padded', 'lengths', 'packed', 'torch_packed'
    for torch.nn on variable lengths). Returns (padded output, h_n, c_n)."""
    hx = None if h0 is None else ((h0, c0) if c0 is not None else h0)
    if kind == "padded":
        out, hn = module(x, hx)
    elif kind == "lengths":
        out, hn = module(x, hx, lengths=lengths)
    else:  # packed: both modules get the same PackedSequence
        packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first,
                                      enforce_sorted=False)
        out_p, hn = module(packed, hx)
        assert isinstance(out_p, torch.nn.utils.rnn.PackedSequence)
        assert torch.equal(out_p.batch_sizes, packed.batch_sizes)
        assert torch.equal(out_p.sorted_indices, packed.sorted_indices)
        assert torch.equal(out_p.unsorted_indices, packed.unsorted_indices)
        out, _ = pad_packed_sequence(out_p, batch_first=batch_first,
                                     total_length=x.shape[1 if batch_first else 0])
    h_n, c_n = hn if isinstance(hn, tuple) else (hn, None)
    return out, h_n, c_n


def run_torch_without_empty(module, x, h0, c0, lengths, batch_first):
    """`run(module, "packed", ...)` for torch.nn, which takes no length-0 sequence: on the
    other sequences, with a length-0 sequence's output zero and its states h0 / c0 (zero
    without them), put back at its batch index differentiably (its dh0 / dc0 are its states'
    gradients, its dx zero)."""
    keep = torch.tensor([b for b, n in enumerate(lengths) if n > 0])
    bdim = 0 if batch_first else 1
    sub = [t.index_select(1, keep) if t is not None else None for t in (h0, c0)]
    out, h_n, c_n = run(module, "packed", x.index_select(bdim, keep), *sub,
                        [n for n in lengths if n > 0], batch_first)
    full = list(out.shape)
    full[bdim] = len(lengths)
    out = torch.index_copy(out.new_zeros(full), bdim, keep, out)

    def states(given, got):
        if got is None:
            return None
        base = given if given is not None else got.new_zeros(
            got.shape[0], len(lengths), got.shape[2])
        return torch.index_copy(base, 1, keep, got)

    return out, states(h0, h_n), states(c0, c_n)


def compare(mode, *, kind="lengths", layers=1, bidirectional=False, bias=True,
            batch_first=False, proj_size=0, with_hx=True, lengths=LENGTHS, backend="reference",
            dtype=F64, tol=TOL, train=True, dropout=0.0):
    """Ours in `dtype` against torch.nn in float64 on the same values (the weights and the
    inputs drawn in `dtype`, torch.nn's copies widened exactly): every output and gradient."""
    kw = dict(num_layers=layers, bidirectional=bidirectional, bias=bias,
              batch_first=batch_first, dropout=dropout)
    if proj_size:
        kw["proj_size"] = proj_size
    ours, theirs = make_pair(mode, backend=backend, dtype=dtype, **kw)
    theirs = theirs.double()
    ours.train(train)
    theirs.train(train)
    gen = torch.Generator().manual_seed(1)
    B = len(lengths)
    shape = (B, T, I) if batch_first else (T, B, I)
    x0 = torch.randn(shape, generator=gen, dtype=dtype)
    h00, c00 = random_like_states(ours, B, gen, dtype) if with_hx else (None, None)
    results = []
    for module in (ours, theirs):
        mdt = F64 if module is theirs else dtype
        fresh = lambda t, mdt=mdt: t.to(mdt, copy=True).requires_grad_(True)  # noqa: E731
        x = fresh(x0)
        h0 = fresh(h00) if h00 is not None else None
        c0 = fresh(c00) if c00 is not None else None
        # torch.nn takes variable lengths only as a PackedSequence.
        k = "packed" if (module is theirs and kind == "lengths") else kind
        if module is theirs and k == "packed" and 0 in lengths:
            out, h_n, c_n = run_torch_without_empty(module, x, h0, c0, lengths, batch_first)
        else:
            out, h_n, c_n = run(module, k, x, h0, c0, lengths, batch_first)
        g = torch.Generator().manual_seed(2)
        rnd = lambda t, g=g, mdt=mdt: torch.randn(  # noqa: E731
            t.shape, generator=g, dtype=dtype).to(mdt)
        loss = (out * rnd(out)).sum() + (h_n * rnd(h_n)).sum()
        if c_n is not None:
            loss = loss + (c_n * rnd(c_n)).sum()
        loss.backward()
        grads = {n: p.grad for n, p in module.named_parameters()}
        results.append(dict(out=out, h_n=h_n, c_n=c_n, dx=x.grad, grads=grads,
                            dh0=h0.grad if h0 is not None else None,
                            dc0=c0.grad if c0 is not None else None))
    got, want = results
    assert list(got["grads"]) == list(want["grads"]), "parameter names/order differ"
    for key in ("out", "h_n", "c_n", "dx", "dh0", "dc0"):
        if want[key] is None:
            assert got[key] is None, key
            continue
        assert got[key].shape == want[key].shape, key
        assert got[key].dtype == dtype, key
        torch.testing.assert_close(got[key].double(), want[key], **tol,
                                   msg=lambda m, k=key: f"{k}: {m}")
    for name, g in want["grads"].items():
        assert got["grads"][name] is not None, f"{name}: no gradient"
        torch.testing.assert_close(got["grads"][name].double(), g, **tol,
                                   msg=lambda m, n=name: f"grad {n}: {m}")
    if kind == "lengths":  # padding is exactly zero, and so is the input gradient there
        out = got["out"].transpose(0, 1) if batch_first else got["out"]
        dx = got["dx"].transpose(0, 1) if batch_first else got["dx"]
        for b, n in enumerate(lengths):
            assert (out[n:, b] == 0).all() and (dx[n:, b] == 0).all()
    return ours, theirs


# ----------------------------------------------------------------------------- equality


@pytest.mark.parametrize("kind", ["padded", "lengths", "packed"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("layers", [1, 2], ids=["L1", "L2"])
@pytest.mark.parametrize("mode", MODES)
def test_matches_torch(mode, layers, bidirectional, kind):
    compare(mode, kind=kind, layers=layers, bidirectional=bidirectional)


@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("mode", MODES)
def test_bias_and_batch_first(mode, bias, batch_first):
    ours, _ = compare(mode, kind="lengths", layers=2, bidirectional=True, bias=bias,
                      batch_first=batch_first)
    if not bias:
        assert not any("bias" in n for n, _ in ours.named_parameters())
        # The zero bias slices of the flat buffer belong to no parameter and stay zero.
        n_bias = 2 * 2 * 2 * ours._cfg.num_gates * H
        assert (ours._flat[-n_bias:] == 0).all()


@pytest.mark.parametrize("kind", ["padded", "lengths", "packed"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("proj_size", [1, 3])
def test_lstm_projection(proj_size, bidirectional, bias, kind):
    compare("lstm", kind=kind, layers=2, bidirectional=bidirectional, bias=bias,
            proj_size=proj_size, batch_first=kind == "packed")


@pytest.mark.parametrize("mode", MODES)
def test_default_states_batch1_and_full_lengths(mode):
    compare(mode, kind="lengths", layers=2, with_hx=False, lengths=[T])
    compare(mode, kind="padded", layers=1, with_hx=False, lengths=[T, T])


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_eval_mode_backward_and_no_dropout(mode):
    # dropout=0.5 is off in eval mode for both; the backward still works.
    ours, theirs = make_pair(mode, num_layers=2, bidirectional=True, dropout=0.5)
    ours.eval()
    theirs.eval()
    x = torch.randn(T, 3, I, dtype=F64, requires_grad=True)
    out, _ = ours(x)
    want, _ = theirs(x)
    torch.testing.assert_close(out, want, **TOL)
    (dx,) = torch.autograd.grad(out.pow(2).sum(), x)
    (dx_want,) = torch.autograd.grad(want.pow(2).sum(), x)
    torch.testing.assert_close(dx, dx_want, **TOL)
    # Every output and gradient (states, weights) of modules made with dropout, in eval mode.
    compare(mode, kind="lengths", layers=2, bidirectional=True, train=False, dropout=0.5)


def test_unbatched_input():
    for mode in MODES:
        ours, theirs = make_pair(mode, num_layers=2)
        x = torch.randn(T, I, dtype=F64)
        hx = torch.randn(2, H, dtype=F64)
        hx = (hx, torch.randn(2, H, dtype=F64)) if mode == "lstm" else hx
        out, hn = ours(x, hx)
        want, hn_want = theirs(x, hx)
        torch.testing.assert_close(out, want, **TOL)
        torch.testing.assert_close(hn, hn_want, **TOL)


def test_zero_length_sequence():
    """Length 0 (which torch.nn cannot take): zero output, the state passes through, and the
    other sequences are unaffected."""
    ours, theirs = make_pair("lstm", num_layers=2, bidirectional=True)
    x = torch.randn(T, 3, I, dtype=F64, requires_grad=True)
    h0, c0 = (torch.randn(4, 3, H, dtype=F64) for _ in range(2))
    out, (hn, cn) = ours(x, (h0, c0), lengths=[4, 0, T])
    assert (out[:, 1] == 0).all()
    assert torch.equal(hn[:, 1], h0[:, 1]) and torch.equal(cn[:, 1], c0[:, 1])
    keep = [0, 2]
    packed = pack_padded_sequence(x[:, keep], torch.tensor([4, T]), enforce_sorted=False)
    want, (hw, cw) = theirs(packed, (h0[:, keep], c0[:, keep]))
    want, _ = pad_packed_sequence(want, total_length=T)
    torch.testing.assert_close(out[:, keep], want, **TOL)
    torch.testing.assert_close(hn[:, keep], hw, **TOL)
    torch.testing.assert_close(cn[:, keep], cw, **TOL)
    (dx,) = torch.autograd.grad(out.sum() + hn.sum(), x)
    assert (dx[:, 1] == 0).all() and (dx[4:, 0] == 0).all()


@pytest.mark.parametrize("with_hx", [False, True], ids=["zero_hx", "hx"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
@pytest.mark.parametrize("mode", MODES)
def test_length_zero_sequences_match_torch(mode, batch_first, with_hx):
    """Length-0 sequences among others, every output and gradient against torch.nn run on
    the other sequences (`run_torch_without_empty`): zero output and dx, the states and
    their gradients passed through, the other sequences as without them."""
    compare(mode, layers=2, bidirectional=True, batch_first=batch_first, with_hx=with_hx,
            lengths=[3, 0, 6, 0, 1])


@pytest.mark.parametrize("with_hx", [False, True], ids=["zero_hx", "hx"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
@pytest.mark.parametrize("mode", [*MODES, "lstm_proj"])
def test_empty_batch_matches_torch(mode, batch_first, with_hx):
    """B = 0 (T >= 1): torch.nn's empty output and states, and its zero gradients (input,
    states and every parameter), without calling the op (which takes B >= 1)."""
    kw = dict(num_layers=2, bidirectional=True, batch_first=batch_first)
    if mode == "lstm_proj":
        mode, kw["proj_size"] = "lstm", 3
    ours, theirs = make_pair(mode, **kw)
    h00, c00 = random_like_states(ours, 0, torch.Generator().manual_seed(1))
    results = []
    for module in (ours, theirs):
        x = torch.randn((0, T, I) if batch_first else (T, 0, I), dtype=F64, requires_grad=True)
        states = [t.clone().requires_grad_(True) for t in (h00, c00)
                  if t is not None and with_hx]
        hx = (tuple(states) if len(states) == 2 else states[0]) if with_hx else None
        out, hn = module(x, hx)
        hn = hn if isinstance(hn, tuple) else (hn,)
        (out.sum() + sum(h.sum() for h in hn)).backward()
        grads = {n: p.grad for n, p in module.named_parameters()}
        results.append((out, hn, x.grad, [t.grad for t in states], grads))
    (out, hn, dx, dhx, grads), (out_t, hn_t, dx_t, dhx_t, grads_t) = results
    for a, b in zip((out, *hn, dx, *dhx), (out_t, *hn_t, dx_t, *dhx_t), strict=True):
        assert (a.shape, a.dtype, a.device, a.is_contiguous()) == \
            (b.shape, b.dtype, b.device, b.is_contiguous())
    assert list(grads) == list(grads_t)
    for name, g in grads_t.items():
        assert grads[name] is not None, f"{name}: no gradient"
        torch.testing.assert_close(grads[name], g, rtol=0, atol=0)


def test_empty_batch_never_calls_the_op(monkeypatch):
    def op(*args, **kw):
        raise AssertionError("the op was called for B = 0")

    monkeypatch.setattr(modules_mod.library, "cudnn_rnn", op)
    m = GRU(I, H, num_layers=2, dropout=0.5, backend="reference")  # training, dropout
    out, hn = m(torch.randn(T, 0, I), lengths=[])
    assert out.shape == (T, 0, H) and hn.shape == (2, 0, H) and out.requires_grad
    with torch.no_grad():
        assert not m.eval()(torch.randn(T, 0, I))[0].requires_grad
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the op's dtype, as for B >= 1
        out, hn = m(torch.randn(T, 0, I))
    assert out.dtype == hn.dtype == torch.bfloat16


def test_empty_batch_and_no_steps_is_rejected_like_torch():
    """T = 0 is an error for torch.nn whatever B is; it stays the op's error here."""
    m = LSTM(I, H, dtype=F64, backend="reference")
    with pytest.raises(ValueError, match="input: expected max time"):
        m(torch.randn(0, 0, I, dtype=F64))
    first = LSTM(I, H, batch_first=True, dtype=F64, backend="reference")
    with pytest.raises(ValueError, match=r"got shape \[2, 0, 5\] \(\[B, T, I\]\)$"):
        first(torch.randn(2, 0, I, dtype=F64))  # the shape as given, not time-major


def test_packed_enforce_sorted_and_lengths_as_tensor():
    ours, theirs = make_pair("gru", num_layers=2, bidirectional=True)
    x = torch.randn(T, 3, I, dtype=F64)
    packed = pack_padded_sequence(x, torch.tensor([T, 4, 2]))  # sorted, no indices
    out, hn = ours(packed)
    want, hn_want = theirs(packed)
    assert out.sorted_indices is None and out.unsorted_indices is None
    torch.testing.assert_close(out.data, want.data, **TOL)
    torch.testing.assert_close(hn, hn_want, **TOL)
    out2, hn2 = ours(x, lengths=torch.tensor([T, 4, 2], dtype=torch.int32))
    torch.testing.assert_close(pack_padded_sequence(out2, torch.tensor([T, 4, 2])).data,
                               want.data, **TOL)
    torch.testing.assert_close(hn2, hn_want, **TOL)


# ----------------------------------------------------------------------------- state dicts


@pytest.mark.parametrize("mode", MODES)
def test_same_names_shapes_and_init(mode):
    kw = dict(num_layers=2, bidirectional=True)
    if mode == "lstm":
        kw["proj_size"] = 3
    torch.manual_seed(5)
    theirs = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode, torch.nn.RNN)
    cls = {"lstm": LSTM, "gru": GRU}.get(mode, RNN)
    if mode.startswith("rnn"):
        kw["nonlinearity"] = mode[4:]
    theirs = theirs(I, H, **kw)
    torch.manual_seed(5)
    ours = cls(I, H, **kw)
    sd, sd_want = ours.state_dict(), theirs.state_dict()
    assert list(sd) == list(sd_want)
    for k, v in sd_want.items():
        # Same init under the same seed: same parameter order, same distribution.
        assert torch.equal(sd[k], v), k
    assert repr(ours) == repr(theirs)
    assert [[p.shape for p in ps] for ps in ours.all_weights] == \
        [[p.shape for p in ps] for ps in theirs.all_weights]
    assert ours._flat_weights_names == theirs._flat_weights_names
    assert all(a is getattr(ours, n) and torch.equal(a, b) for a, b, n in
               zip(ours._flat_weights, theirs._flat_weights, ours._flat_weights_names,
                   strict=True))


@pytest.mark.parametrize("mode", MODES)
def test_state_dict_round_trips(mode):
    ours, theirs = make_pair(mode, num_layers=2, bidirectional=True, bias=mode != "gru")
    assert ours._flat_is_current()  # load_state_dict copied into the views in place
    x = torch.randn(T, 2, I, dtype=F64)
    torch.testing.assert_close(ours(x)[0], theirs(x)[0], **TOL)
    # ours -> torch.nn, after changing ours
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(0.5)
    back = copy.deepcopy(theirs)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back(x)[0], ours(x)[0], **TOL)
    # assign=True replaces the parameters: the flat buffer is rebuilt once, on demand.
    fresh = make_pair(mode, num_layers=2, bidirectional=True, bias=mode != "gru")[0]
    fresh.load_state_dict(theirs.state_dict(), assign=True)
    assert not fresh._flat_is_current()
    torch.testing.assert_close(fresh(x)[0], theirs(x)[0], **TOL)
    assert fresh._flat_is_current()


# ----------------------------------------------------------------------------- flat buffer


def _spy_rebuilds(monkeypatch):
    calls = {"flatten": 0, "cat": 0}
    real_flatten = modules_mod._RNNBase.flatten_parameters
    real_cat = modules_mod._RNNBase._cat_weights

    def flatten(self):
        if not self._flat_is_current():
            calls["flatten"] += 1
        return real_flatten(self)

    def cat(self):
        calls["cat"] += 1
        return real_cat(self)

    monkeypatch.setattr(modules_mod._RNNBase, "flatten_parameters", flatten)
    monkeypatch.setattr(modules_mod._RNNBase, "_cat_weights", cat)
    return calls


def test_training_steps_make_no_copies_and_match_torch(monkeypatch):
    """Parameters are views of the flat buffer: SGD steps update it in place, no forward
    rebuilds or concatenates it, and the trained weights equal torch.nn's."""
    ours, theirs = make_pair("lstm", num_layers=2, bidirectional=True, proj_size=3)
    for name, p in ours.named_parameters():
        assert p.untyped_storage().data_ptr() == ours._flat.untyped_storage().data_ptr(), name
    flat_ptr = ours._flat.data_ptr()
    calls = _spy_rebuilds(monkeypatch)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(T, 4, I, generator=gen, dtype=F64)
        for module, o in ((ours, opt), (theirs, opt_t)):
            o.zero_grad()
            packed = pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False)
            out, (hn, _) = module(packed)
            (out.data.pow(2).mean() + hn.sum()).backward()
            o.step()
    assert calls == {"flatten": 0, "cat": 0}
    assert ours._flat.data_ptr() == flat_ptr
    for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL, msg=lambda m, n=n: f"{n}: {m}")


def test_replaced_parameter_and_conversions_rebuild(monkeypatch):
    ours, theirs = make_pair("gru", num_layers=2)
    calls = _spy_rebuilds(monkeypatch)
    x = torch.randn(T, 2, I, dtype=F64)
    new = torch.randn_like(theirs.weight_hh_l1)
    theirs.weight_hh_l1 = torch.nn.Parameter(new.clone())
    ours.weight_hh_l1 = torch.nn.Parameter(new.clone())
    out = ours(x)[0]
    assert calls["flatten"] == 1 and ours._flat_is_current()
    torch.testing.assert_close(out, theirs(x)[0], **TOL)
    ours(x)
    assert calls["flatten"] == 1  # rebuilt once, not per forward
    # .to(dtype): parameters get new storage, the buffer follows; same Parameter objects.
    params_before = list(ours.parameters())
    ours.float()
    assert ours._flat.dtype == torch.float32 and ours._flat_is_current()
    assert all(a is b for a, b in zip(params_before, ours.parameters(), strict=True))
    torch.testing.assert_close(ours(x.float())[0], theirs(x)[0].float(), rtol=1e-5, atol=1e-5)
    # deepcopy keeps the views-of-one-buffer structure.
    twin = copy.deepcopy(ours)
    assert twin._flat_is_current() and twin._flat.data_ptr() != ours._flat.data_ptr()
    torch.testing.assert_close(twin(x.float())[0], ours(x.float())[0], rtol=0, atol=0)


class Scale(torch.nn.Module):
    def forward(self, w):
        return 2.0 * w


@pytest.mark.parametrize("future", ["overwrite", "swap"])
def test_conversion_that_replaces_parameter_objects_still_flattens(monkeypatch, future):
    """torch.__future__ conversions that store new Parameter objects (overwrite) or swap
    their contents (swap): the module's Parameters stay its own and views of one buffer."""
    setter = getattr(torch.__future__, f"set_{future}_module_params_on_conversion")
    ours, theirs = make_pair("lstm", dtype=torch.float32, num_layers=2, proj_size=2)
    setter(True)
    try:
        ours.double()
    finally:
        setter(False)
    assert ours._flat.dtype == F64 and ours._flat_is_current()
    calls = _spy_rebuilds(monkeypatch)
    x = torch.randn(T, 2, I, dtype=F64)
    torch.testing.assert_close(ours(x)[0], theirs.double()(x)[0], **TOL)
    assert calls == {"flatten": 0, "cat": 0}


def test_parametrized_weight_falls_back_to_concatenation(monkeypatch):
    ours, theirs = make_pair("rnn_tanh", num_layers=2, bidirectional=True)
    calls = _spy_rebuilds(monkeypatch)
    for m in (ours, theirs):
        parametrize.register_parametrization(m, "weight_hh_l0", Scale())
    x = torch.randn(T, 2, I, dtype=F64)
    out, out_t = ours(x)[0], theirs(x)[0]
    assert calls["cat"] == 1
    torch.testing.assert_close(out, out_t, **TOL)
    out.sum().backward()
    out_t.sum().backward()
    g = ours.parametrizations.weight_hh_l0.original.grad
    torch.testing.assert_close(g, theirs.parametrizations.weight_hh_l0.original.grad, **TOL)


def _results(module, x0, h00):
    """Output, h_n and every gradient (input, h_0, each named parameter) of one forward and
    a weighted-sum backward, by name."""
    x, h0 = x0.clone().requires_grad_(True), h00.clone().requires_grad_(True)
    module.zero_grad()
    out, h_n = module(x, h0)
    g = torch.Generator().manual_seed(2)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
    (loss + (h_n * torch.randn(h_n.shape, generator=g, dtype=out.dtype)).sum()).backward()
    grads = {f"grad {n}": p.grad for n, p in module.named_parameters()}
    return dict(out=out, h_n=h_n, dx=x.grad, dh0=h0.grad, **grads)


def _assert_same_results(got, want):
    assert list(got) == list(want), "parameter names/order differ"
    for key, w in want.items():
        assert got[key] is not None, f"{key}: missing"
        torch.testing.assert_close(got[key], w, **TOL, msg=lambda m, k=key: f"{k}: {m}")


_WRAPS = {  # (apply, remove) of a weight that is computed from other tensors
    "parametrize": (
        lambda m: parametrize.register_parametrization(m, "weight_hh_l0", Scale()),
        lambda m: parametrize.remove_parametrizations(m, "weight_hh_l0"),
    ),
    "prune": (
        lambda m: prune.l1_unstructured(m, "weight_ih_l1_reverse", amount=0.3),
        lambda m: prune.remove(m, "weight_ih_l1_reverse"),
    ),
}


def _convert(m, how):
    if how == "double":
        return m.double()
    if how == "share_memory":
        return m.share_memory()
    if how == "deepcopy":  # torch.nn cannot pickle a parametrized module, only deepcopy it
        return copy.deepcopy(m)
    return pickle.loads(pickle.dumps(m))  # torch.nn cannot deepcopy a pruned module


@pytest.mark.parametrize(
    "wrap, how",
    [("parametrize", "double"), ("parametrize", "share_memory"),
     ("parametrize", "deepcopy"), ("prune", "double"), ("prune", "share_memory"),
     ("prune", "pickle")],
    ids=lambda v: v,
)
def test_computed_weights_survive_conversion_and_pickling_like_torch(wrap, how):
    """A parametrized or pruned weight is no Parameter of the module: conversions and
    unpickling leave it as torch.nn does, forwards concatenate, and once the weight is a
    Parameter again the module flattens its buffer again; torch.nn's results throughout."""
    apply, remove = _WRAPS[wrap]
    dtype = torch.float32 if how == "double" else F64
    ours, theirs = make_pair("gru", dtype=dtype, num_layers=2, bidirectional=True)
    for m in (ours, theirs):
        apply(m)
    ours, theirs = _convert(ours, how), _convert(theirs, how)
    assert all(p.dtype == F64 for p in ours.parameters())
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, 3, I, generator=gen, dtype=F64)
    h0 = torch.randn(4, 3, H, generator=gen, dtype=F64)
    _assert_same_results(_results(ours, x, h0), _results(theirs, x, h0))
    ours.flatten_parameters()  # quietly nothing to do, as torch.nn's
    for m in (ours, theirs):
        remove(m)
    _assert_same_results(_results(ours, x, h0), _results(theirs, x, h0))
    assert ours._flat_is_current()


def test_functional_call_leaves_the_callers_parameters_alone():
    """functional_call with another module's Parameters must not re-point them at this
    module's buffer: their storage, and the views the caller holds, stay theirs."""
    ours, theirs = make_pair("gru", num_layers=2, bidirectional=True)
    given = dict(theirs.named_parameters())
    ptrs = {n: p.data_ptr() for n, p in given.items()}
    aliases = {n: p.view(-1) for n, p in given.items()}
    own_ptrs = [p.data_ptr() for p in ours.parameters()]
    flat_before, flat_ptr = ours._flat.clone(), ours._flat.data_ptr()
    x = torch.randn(T, 2, I, dtype=F64)
    out = torch.func.functional_call(ours, given, (x,))[0]
    want = theirs(x)[0]
    torch.testing.assert_close(out, want, **TOL)
    got = torch.autograd.grad(out.pow(2).sum(), list(given.values()))
    exp = torch.autograd.grad(want.pow(2).sum(), list(given.values()))
    for n, a, b in zip(given, got, exp, strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=n: f"{n}: {m}")
    assert {n: p.data_ptr() for n, p in given.items()} == ptrs
    assert ours._flat.data_ptr() == flat_ptr and torch.equal(ours._flat, flat_before)
    assert [p.data_ptr() for p in ours.parameters()] == own_ptrs and ours._flat_is_current()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(1.0)
    for n, p in theirs.named_parameters():
        assert torch.equal(aliases[n], p.view(-1)), n


def test_functional_call_uses_the_given_tensors(monkeypatch):
    ours, theirs = make_pair("lstm", num_layers=2, proj_size=2)
    calls = _spy_rebuilds(monkeypatch)
    flat_before = ours._flat.clone()
    given = {n: (p.detach() * 1.5).requires_grad_(True) for n, p in theirs.named_parameters()}
    x = torch.randn(T, 2, I, dtype=F64)
    out = torch.func.functional_call(ours, given, (x,))[0]
    want = torch.func.functional_call(theirs, given, (x,))[0]
    torch.testing.assert_close(out, want, **TOL)
    assert calls == {"flatten": 0, "cat": 1}
    assert torch.equal(ours._flat, flat_before) and ours._flat_is_current()
    got = torch.autograd.grad(out.sum(), list(given.values()))
    exp = torch.autograd.grad(want.sum(), list(given.values()))
    for (n, _), a, b in zip(given.items(), got, exp, strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=n: f"{n}: {m}")


def test_frozen_parameters_get_no_gradient():
    ours, theirs = make_pair("lstm", num_layers=2)
    for m in (ours, theirs):
        m.weight_ih_l0.requires_grad_(False)
        m.bias_hh_l1.requires_grad_(False)
    x = torch.randn(T, 2, I, dtype=F64)
    ours(x)[0].sum().backward()
    theirs(x)[0].sum().backward()
    for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None, n
        else:
            torch.testing.assert_close(p.grad, q.grad, **TOL)


# ----------------------------------------------------------------------------- dropout


def test_dropout_reproducible_under_manual_seed():
    m = LSTM(I, H, num_layers=3, dropout=0.5, dtype=F64, backend="reference")
    x = torch.randn(T, 3, I, dtype=F64)

    def run_seeded(seed, grad=True):
        torch.manual_seed(seed)
        with torch.set_grad_enabled(grad):
            return m(x, lengths=[T, 2, 5])[0]

    a, b, c = run_seeded(0), run_seeded(0), run_seeded(1)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # No-grad training forwards still drop out (as torch.nn does), with the same masks.
    assert torch.equal(run_seeded(0, grad=False), a)
    m.eval()
    ev = m(x, lengths=[T, 2, 5])[0]
    assert not torch.equal(ev, a)
    assert torch.equal(ev, m(x, lengths=[T, 2, 5])[0])


def test_dropout_gradient_gradcheck():
    """Finite differences through the dropout masks (fixed by re-seeding every call)."""
    m = GRU(3, 4, num_layers=2, dropout=0.4, bidirectional=True, dtype=F64,
            backend="reference")
    x = torch.randn(4, 2, 3, dtype=F64, requires_grad=True)

    def f(x):
        torch.manual_seed(7)
        out, hn = m(x, lengths=[4, 3])
        return out.sum() + hn.sum()

    torch.autograd.gradcheck(f, (x,))
    # A weight gradient against a central difference along a random direction (the weights
    # are module state, so gradcheck cannot perturb them).
    w = m.weight_ih_l1
    w0 = w.detach().clone()
    f(x.detach()).backward()
    direction = torch.randn_like(w0)
    analytic = (w.grad * direction).sum()
    eps = 1e-6
    with torch.no_grad():
        w.copy_(w0 + eps * direction)
        hi = f(x.detach())
        w.copy_(w0 - eps * direction)
        lo = f(x.detach())
        w.copy_(w0)
    # Central difference: truncation O(eps^2) ~ 1e-12 plus roundoff ~ 1e-16 / eps = 1e-10.
    torch.testing.assert_close(analytic, (hi - lo) / (2 * eps), rtol=1e-7, atol=1e-7)


def test_inplace_update_between_forward_and_backward_is_caught():
    """Parameters share the flat buffer's version counter, so autograd still notices a
    parameter modified in place before the backward (as torch.nn does)."""
    m = LSTM(I, H, dtype=F64, backend="reference")
    out = m(torch.randn(T, 2, I, dtype=F64))[0]
    with torch.no_grad():
        m.weight_hh_l0.add_(1.0)
    with pytest.raises(RuntimeError, match="modified"):
        out.sum().backward()


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_final_states_edited_in_place_before_backward_like_torch(mode):
    """torch.nn lets a caller edit h_n (and c_n) in place before the backward: the op keeps
    no final state for its backward, so the gradients match torch.nn's."""
    ours, theirs = make_pair(mode, num_layers=2)
    x = torch.randn(T, 3, I, dtype=F64, generator=torch.Generator().manual_seed(3))
    grads = []
    for m in (ours, theirs):
        xi = x.clone().requires_grad_()
        out, hn = m(xi)
        states = hn if isinstance(hn, tuple) else (hn,)
        for s in states:
            s.mul_(2.0)
        loss = out.sum() + sum((s * s).sum() for s in states)
        grads.append(torch.autograd.grad(loss, [xi, *m.parameters()]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_no_grad_eval_keeps_no_reserve(monkeypatch):
    seen = []
    real = modules_mod.library.cudnn_rnn

    def spy(*args, **kw):
        seen.append(kw["is_training"])
        return real(*args, **kw)

    monkeypatch.setattr(modules_mod.library, "cudnn_rnn", spy)
    m = LSTM(I, H, num_layers=2, dropout=0.3, dtype=F64, backend="reference")
    x = torch.randn(T, 2, I, dtype=F64)
    m.eval()
    with torch.no_grad():
        m(x)
    m(x)  # eval with parameters requiring grad: reserve kept for backward
    m.train()
    with torch.no_grad():
        m(x)  # dropout needs the training forward
    assert seen == [False, True, True]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "ctor, exc, match",
    [
        (lambda: LSTM(0, H), ValueError, "input_size"),
        (lambda: LSTM(2.5, H), TypeError, "input_size"),
        (lambda: LSTM(I, -1), ValueError, "hidden_size"),
        (lambda: LSTM(I, H, 0), ValueError, "num_layers"),
        (lambda: LSTM(I, H, bias="yes"), TypeError, "bias"),
        (lambda: LSTM(I, H, batch_first=1), TypeError, "batch_first"),
        (lambda: LSTM(I, H, bidirectional=None), TypeError, "bidirectional"),
        (lambda: LSTM(I, H, 2, dropout=1.0), ValueError, "dropout"),
        (lambda: LSTM(I, H, 2, dropout=-0.1), ValueError, "dropout"),
        (lambda: LSTM(I, H, 2, dropout="0.1"), TypeError, "dropout"),
        (lambda: LSTM(I, H, proj_size=H), ValueError, "proj_size"),
        (lambda: LSTM(I, H, proj_size=-1), ValueError, "proj_size"),
        (lambda: GRU(I, H, proj_size=2), ValueError, r"^proj_size: expected no proj_size for "
         r"GRU .*got 2$"),
        (lambda: RNN(I, H, proj_size=2), ValueError, r"^proj_size: expected no proj_size for "
         r"RNN .*got 2$"),
        # torch.nn refuses the argument whatever its value
        (lambda: GRU(I, H, proj_size=0), ValueError, r"^proj_size: .*GRU .*got 0$"),
        (lambda: RNN(I, H, proj_size=0), ValueError, r"^proj_size: .*RNN .*got 0$"),
        (lambda: LSTM(I, H, 2.0), TypeError, "num_layers: expected an int, got float"),
        (lambda: RNN(I, H, nonlinearity="sigmoid"), ValueError, "nonlinearity"),
        (lambda: RNN(I, H, backend="cudnn"), ValueError, "backend"),
        (lambda: LSTM(I, H, dtype=torch.int64), TypeError, r"^dtype: expected float16, "),
        (lambda: GRU(I, H, dtype=torch.complex64), TypeError, r"^dtype: .* got torch.complex64"),
    ],
    ids=["input_size0", "input_size_float", "hidden_neg", "layers0", "bias_str",
         "batch_first_int", "bidir_none", "dropout1", "dropout_neg", "dropout_str",
         "proj_eq_hidden", "proj_neg", "gru_proj", "rnn_proj", "gru_proj0", "rnn_proj0",
         "layers_float", "nonlinearity",
         "backend", "dtype_int", "dtype_complex"],
)
def test_constructor_errors(ctor, exc, match):
    with pytest.raises(exc, match=match):
        ctor()


def test_numpy_sizes_and_a_meta_forward_as_torch_nn():
    """NumPy ints size a module as torch.nn's take them (stored as Python ints); on the meta
    device a forward gives torch.nn's shapes (autocast has no meta device: it was asked)."""
    import numpy as np

    m = LSTM(np.int64(I), np.int32(H), np.int64(2), proj_size=np.int64(3), dtype=F64)
    assert (m.input_size, m.hidden_size, m.num_layers, m.proj_size) == (I, H, 2, 3)
    assert all(type(v) is int for v in (m.input_size, m.hidden_size, m.num_layers))
    for ours, theirs in ((LSTM(I, H, 2, proj_size=3, device="meta"),
                          torch.nn.LSTM(I, H, 2, proj_size=3, device="meta")),
                         (GRU(I, H, bidirectional=True, device="meta"),
                          torch.nn.GRU(I, H, bidirectional=True, device="meta"))):
        x = torch.randn(T, 2, I, device="meta")
        got, want = ours(x), theirs(x)
        assert got[0].shape == want[0].shape and got[0].device.type == "meta"
        for a, b in zip(got[1] if isinstance(got[1], tuple) else (got[1],),
                        want[1] if isinstance(want[1], tuple) else (want[1],), strict=True):
            assert a.shape == b.shape and a.device.type == "meta"


def test_tied_weights_match_torch_without_rebuilding_a_buffer():
    """One Parameter in two slots, or shared with another module: torch.nn's results and
    gradients, and no buffer rebuilt on every forward (a Parameter can view one buffer slot:
    re-pointed back and forth, each forward copied the whole buffer). The module that holds
    the shared Parameter in its buffer keeps it there."""
    x = torch.randn(T, 2, I, dtype=F64)
    ours, theirs = make_pair("gru", bidirectional=True)
    for m in (ours, theirs):
        m.weight_hh_l0_reverse = m.weight_hh_l0
    for _ in range(2):
        got, want = ours(x)[0], theirs(x)[0]
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        got.sum().backward()
        want.sum().backward()
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12,
                                   msg=lambda m, n=n: f"{n}: {m}")
    a, b = (GRU(I, H, dtype=F64, backend="reference") for _ in range(2))
    b.weight_hh_l0 = a.weight_hh_l0
    flat = a._flat
    for _ in range(3):
        a(x)
        b(x)[0].sum().backward()
        assert a._flat is flat and a._flat_is_current()
    ref = torch.nn.GRU(I, H, dtype=F64)
    ref.load_state_dict(b.state_dict())
    torch.testing.assert_close(b(x)[0], ref(x)[0], rtol=1e-12, atol=1e-12)


def test_a_packed_sequence_is_run_without_reading_its_indices_on_the_host():
    """A PackedSequence runs in its sorted order, the states permuted on the device, as
    torch.nn does: its sorted_indices (on the data's device) are never read on the host,
    which on a GPU was a sync, plus a blocking copy of the rows back. On the meta device a
    host read raises; the shapes are torch.nn's."""
    m = LSTM(I, H, device="meta")
    x = torch.randn(T, 3, I, device="meta")
    packed = pack_padded_sequence(x, torch.tensor([2, T, 3]), enforce_sorted=False)
    h0 = torch.randn(1, 3, H, device="meta")
    with torch.no_grad():
        out, (h_n, c_n) = m(packed, (h0, h0))
    assert out.data.shape == (T + 5, H) and out.data.is_meta
    assert h_n.shape == c_n.shape == (1, 3, H)


@pytest.mark.gpu
def test_cuda_lengths_are_read_from_the_device_once(monkeypatch):
    """A training step with lengths on the GPU reads them on the host once (a sync): the
    module checks them and hands the op a host copy, which the op's forward and backward
    read again for free (three device reads before)."""
    reads = []
    tolist = torch.Tensor.tolist

    def counted(t):
        if t.is_cuda:
            reads.append(t.shape)
        return tolist(t)

    m = LSTM(I, H, backend="triton").cuda()
    x = torch.randn(T, 3, I, device="cuda", requires_grad=True)
    lengths = torch.tensor([T, 2, 4], device="cuda")
    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    m(x, lengths=lengths)[0].sum().backward()
    assert reads == [lengths.shape]


@pytest.mark.gpu
def test_a_packed_sequence_is_refused_by_name_during_a_capture():
    """Its padded rows are copied from pinned host memory, which a CUDA graph would read at
    each replay after the capture freed it: refused, naming the input."""
    m = LSTM(I, H, backend="triton").cuda()
    packed = pack_padded_sequence(torch.randn(T, 3, I, device="cuda"), torch.tensor([2, T, 3]),
                                  enforce_sorted=False)
    graph = torch.cuda.CUDAGraph()
    refused = pytest.raises(ValueError, match=r"^input: a PackedSequence cannot run while a "
                                              r"CUDA graph is captured")
    with torch.cuda.graph(graph), torch.no_grad(), refused:
        m(packed)


def test_modules_built_on_several_threads():
    """The map of flat buffers to their modules (`_FLAT_OWNERS`) is swept and extended
    under a lock: threads building modules at once raised "dictionary changed size during
    iteration" (or a KeyError) from the sweep of another thread's insertions. A tiny switch
    interval makes the threads interleave inside it."""
    import sys
    import threading

    errors, interval = [], sys.getswitchinterval()

    def build():
        try:
            kept = [LSTM(1, 1) for _ in range(150)]  # live entries: a longer sweep
            assert all(modules_mod._buffer_owner(m._flat) is m for m in kept)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(6)]
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def test_dropout_single_layer_warns_like_torch():
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        LSTM(I, H, 1, dropout=0.2)


def _forward_cases():
    x = torch.randn(T, 2, I, dtype=F64)
    h = torch.zeros(1, 2, H, dtype=F64)
    packed = pack_padded_sequence(x, torch.tensor([T, 3]))
    return [
        ("input_list", lambda m: m([1.0, 2.0]), TypeError, "input"),
        ("input_4d", lambda m: m(x[None]), ValueError, "input"),
        ("input_size", lambda m: m(x[..., :3]), ValueError, "input_size"),
        ("input_dtype", lambda m: m(x.float()), TypeError, "dtype"),
        ("hx_not_tuple", lambda m: m(x, h), TypeError, "hx"),
        ("hx_three_states", lambda m: m(x, (h, h, h)), TypeError,
         r"hx: expected a tuple \(h_0, c_0\) of 2 tensors for LSTM, got a tuple of 3 entries"),
        ("hx_shape", lambda m: m(x, (h[:, :1], h)), ValueError, r"hx\[0\]"),
        ("cx_dtype", lambda m: m(x, (h, h.float())), TypeError, r"hx\[1\]"),
        ("hx_2d_batched", lambda m: m(x, (h[0], h[0])), ValueError, r"hx\[0\]"),
        ("hx_device", lambda m: m(x, (h.to("meta"), h)), ValueError,
         r"^hx\[0\]: expected a tensor on cpu \(the input's\), got meta"),
        ("cx_device", lambda m: m(x, (h, h.to("meta"))), ValueError,
         r"^hx\[1\]: expected a tensor on cpu \(the input's\), got meta"),
        ("lengths_shape", lambda m: m(x, lengths=[T]), ValueError, "lengths"),
        ("lengths_float", lambda m: m(x, lengths=torch.ones(2)), TypeError, "lengths"),
        ("lengths_type", lambda m: m(x, lengths="6"), TypeError, "lengths"),
        ("lengths_too_long", lambda m: m(x, lengths=[T + 1, 2]), ValueError,
         r"^lengths\[0\]: expected a length in \[0, 6\] \(max time\), got 7"),
        ("lengths_negative", lambda m: m(x, lengths=[2, -1]), ValueError,
         r"^lengths\[1\]: expected a length in \[0, 6\] \(max time\), got -1"),
        ("lengths_with_packed", lambda m: m(packed, lengths=[T, 3]), ValueError, "lengths"),
        ("lengths_unbatched", lambda m: m(x[:, 0], lengths=[T]), ValueError, "lengths"),
        ("lengths_beyond_int64", lambda m: m(x, lengths=[2**70, 1]), ValueError,
         r"^lengths\[0\]: expected a length in \[0, 6\] \(max time\), got 1180591620717411303424"),
        ("lengths_meta", lambda m: m(x, lengths=torch.tensor([T, 2], device="meta")),
         ValueError, r"^lengths: expected a tensor with data .* got a meta tensor"),
        ("no_steps_unbatched", lambda m: m(x[:0, 0]), ValueError,
         r"^input: expected max time >= 1, got shape \[0, 5\] \(\[T, I\]\)"),
    ]


@pytest.mark.parametrize("case", _forward_cases(), ids=[c[0] for c in _forward_cases()])
def test_forward_errors(case):
    _, call, exc, match = case
    m = LSTM(I, H, dtype=F64, backend="reference")
    with pytest.raises(exc, match=match):
        call(m)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("name, value, exc, match", [
    ("weight_hh_l0", None, TypeError,
     r"^weight_hh_l0: expected a tensor of shape \[{G}, 7\], got NoneType$"),
    ("bias_ih_l0", None, TypeError,
     r"^bias_ih_l0: expected a tensor of shape \[{G}\], got NoneType$"),
    ("weight_ih_l0", torch.zeros(5, dtype=F64), ValueError,
     r"^weight_ih_l0: expected shape \[{G}, 5\], got \[5\]$"),
], ids=["weight_none", "bias_none", "weight_tensor_of_another_shape"])
def test_weights_replaced_by_what_a_forward_cannot_use_are_named(mode, name, value, exc,
                                                                  match):
    """torch.nn lets a weight be set to None or replaced by a plain tensor attribute; the
    forward then names the weight, its expected shape and what it found (torch.nn's own
    forward fails inside its C++ op without naming it)."""
    m = {"lstm": LSTM, "gru": GRU}[mode](I, H, dtype=F64, backend="reference")
    if value is not None:
        del m._parameters[name]  # a plain tensor attribute in the Parameter's place
    setattr(m, name, value)
    with pytest.raises(exc, match=match.format(G={"lstm": 4, "gru": 3}[mode] * H)):
        m(torch.randn(T, 2, I, dtype=F64))


def test_gru_hx_errors():
    m = GRU(I, H, dtype=F64, backend="reference")
    x = torch.randn(T, 2, I, dtype=F64)
    with pytest.raises(TypeError, match="hx"):
        m(x, (torch.zeros(1, 2, H, dtype=F64),))
    with pytest.raises(ValueError, match="hx"):
        m(x, torch.zeros(2, 2, H, dtype=F64))


# ----------------------------------------------------------------------------- triton


FP32_TOL = dict(rtol=2e-5, atol=2e-5)  # fp32 kernels vs float64 torch.nn: few ulps per op


@pytest.mark.parametrize("kind", ["lengths", "packed", "length-0"])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_triton_backend_matches_torch(mode, kind):
    """backend='triton' (the interpreter without a GPU) in float32 on tiny shapes; with
    length-0 sequences too (lengths only: a PackedSequence cannot hold one)."""
    lengths = [3, 0, 6, 1] if kind == "length-0" else LENGTHS
    compare(mode, kind="packed" if kind == "packed" else "lengths", layers=2,
            bidirectional=True, backend="triton", dtype=torch.float32, tol=FP32_TOL,
            batch_first=kind != "packed", lengths=lengths)


# ----------------------------------------------------------------------------- autocast


def test_autocast_bfloat16():
    """Under autocast the op runs in bfloat16 and the fp32 parameters get fp32 gradients.
    Tolerance: inputs and weights rounded to bf16 (2^-9 relative each) through ~10-term sums
    and 6 steps, outputs stored in bf16: within 8 x 2^-9 = 1.6e-2 of fp32 at |values| <= 1.
    The gradients against torch.nn in float64: each within 4 x the error of torch.nn's own
    bfloat16 module on the same rounded input (as bench's check holds the kernels to the
    baseline's error), or one bf16 rounding of the gradient's scale."""
    ours, theirs = make_pair("lstm", dtype=torch.float32, num_layers=2, bidirectional=True)
    x = torch.randn(T, 3, I, generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (hn, cn) = ours(x, (torch.zeros(4, 3, H), torch.zeros(4, 3, H)))
    assert out.dtype == hn.dtype == cn.dtype == torch.bfloat16
    want, _ = theirs(x)
    torch.testing.assert_close(out.float(), want, rtol=1.6e-2, atol=1.6e-2)
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in ours.parameters())
    exact, low = copy.deepcopy(theirs).double(), copy.deepcopy(theirs).bfloat16()
    exact(x.double())[0].sum().backward()
    low(x.bfloat16())[0].float().sum().backward()
    for (n, p), e, b in zip(ours.named_parameters(), exact.parameters(), low.parameters(),
                            strict=True):
        err = (p.grad.double() - e.grad).abs().max().item()
        base = (b.grad.double() - e.grad).abs().max().item()
        assert err <= max(4 * base, 2**-8 * e.grad.abs().max().item()), (n, err, base)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_autocast_runs_the_op_as_a_plain_call_in_its_dtype(mode):
    """Under autocast the op gets bfloat16 tensors and computes exactly what a bfloat16
    module computes (its own math is not re-cast by autocast), forward and backward."""
    ours, _ = make_pair(mode, dtype=torch.float32, num_layers=2, bidirectional=True)
    plain = copy.deepcopy(ours).bfloat16()
    x0 = torch.randn(T, 3, I, generator=torch.Generator().manual_seed(1))
    x, xb = x0.clone().requires_grad_(True), x0.bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours(x)[0]
        out.float().pow(2).sum().backward()
    want = plain(xb)[0]
    want.float().pow(2).sum().backward()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, xb.grad.float(), rtol=0, atol=0)
    for (n, p), q in zip(ours.named_parameters(), plain.parameters(), strict=True):
        assert p.grad.dtype == torch.float32, n
        torch.testing.assert_close(p.grad, q.grad.float(), rtol=0, atol=0,
                                   msg=lambda m, n=n: f"{n}: {m}")


# ----------------------------------------------------------------------------- example


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps: expected an int >= 1, got 0"),
    (["--batch-size", "0"], "--batch-size: expected an int >= 1, got 0"),
    (["--eval-batches", "0"], "--eval-batches: expected an int >= 1, got 0"),
    (["--max-len", "0"], "--max-len: expected an int >= 1, got 0"),
    (["--target", "5"], "--target: expected an accuracy in (0, 1], got 5.0"),
    (["--dropout", "1"], "--dropout: expected a float in [0, 1), got 1.0"),
    (["--device", "cuda"], "--device: expected cpu (torch sees no CUDA GPU here), got cuda"),
], ids=["steps", "batch", "eval", "max-len", "target", "dropout", "cuda"])
def test_example_refuses_bad_options_by_name(argv, message, capsys):
    """One usage line and exit 2 (a ZeroDivisionError, OneCycleLR's ValueError or an
    AssertionError before)."""
    from helpers import load_script

    if argv[0] == "--device" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: --device cuda is valid here")
    example = load_script("train_varlen", "examples")
    with pytest.raises(SystemExit) as exit_:
        example.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_example_trains_a_few_steps(capsys):
    from helpers import load_script

    example = load_script("train_varlen", "examples")
    results = example.main(["--device", "cpu", "--steps", "4", "--warmup", "1",
                            "--eval-batches", "1", "--batch-size", "8", "--hidden", "8",
                            "--layers", "2", "--bidirectional", "--dropout", "0.1",
                            "--backend", "reference", "--compare-torch", "--quiet"])
    assert set(results) == {"tritonrnn", "torch.nn"}
    for r in results.values():
        assert 0.0 <= r["accuracy"] <= 1.0 and r["tokens_per_s"] > 0
    printed = capsys.readouterr().out
    assert "tokens/s" in printed and "speedup" in printed
    # --packed feeds PackedSequences through the same model.
    packed = example.main(["--device", "cpu", "--steps", "2", "--warmup", "0",
                           "--eval-batches", "1", "--batch-size", "4", "--hidden", "8",
                           "--cell", "gru", "--packed", "--backend", "reference", "--quiet",
                           "--no-compare-torch"])
    assert set(packed) == {"tritonrnn"}


def test_flatten_parameters_with_mixed_dtypes_returns_quietly_like_torch():
    """A weight of another dtype: flatten_parameters does nothing, as torch.nn's (it raised);
    the forward, which needs one dtype, names the weight."""
    ours, theirs = make_pair("lstm", dtype=torch.float32)
    for m in (ours, theirs):
        m.weight_hh_l0.data = m.weight_hh_l0.data.double()
        assert m.flatten_parameters() is None
    with pytest.raises(TypeError, match=r"^weight_hh_l0: expected dtype torch.float32 on cpu "
                                        r"like weight_ih_l0, got torch.float64 on cpu$"):
        ours(torch.randn(T, 2, I))
    ours.weight_hh_l0.data = ours.weight_hh_l0.data.float()  # one dtype again: it runs
    ours.flatten_parameters()
    assert ours._flat_is_current() and ours(torch.randn(T, 2, I))[0].shape == (T, 2, H)


@pytest.mark.parametrize("arg", ["input", "nested_input", "hx", "lengths"])
def test_a_sparse_or_nested_argument_is_named(arg):
    """The modules' arguments are checked dense at the boundary, as the ops' are: a sparse
    or nested one failed inside (NestedTensorImpl has no sizes, a sparse reshape)."""
    m = LSTM(I, H, backend="reference")
    x, lengths = torch.randn(T, 2, I), torch.tensor([T, 3])
    hx = (torch.zeros(1, 2, H), torch.zeros(1, 2, H))
    if arg == "input":
        x, want = x.to_sparse(), r"^input: expected a dense tensor .*got layout torch.sparse_coo$"
    elif arg == "nested_input":
        x = torch.nested.nested_tensor([torch.randn(T, I), torch.randn(3, I)])
        want, lengths = r"^input: expected a dense tensor .*got a nested tensor$", None
    elif arg == "hx":
        hx, want = (hx[0].to_sparse(), hx[1]), r"^hx\[0\]: expected a dense tensor .*sparse_coo$"
    else:
        lengths, want = lengths.to_sparse(), r"^lengths: expected a dense tensor .*sparse_coo$"
    with pytest.raises(TypeError, match=want):
        m(x, hx, lengths=lengths)
