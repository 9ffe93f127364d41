"""Random bad inputs to the CudnnRNN ops: drawn configurations, one argument corrupted.

tests/test_errors.py checks each error of the spec's Errors section on one configuration,
message by message. Here each seed draws a configuration (cell, layers, direction, projection,
time-major or batch-major, dtype, lengths or none) and corrupts one argument of the forward or
of the backprop: a tensor's rank, one of its dimensions, its dtype, its type, or an attribute's
value or type, or a length. The contract (shared/spec/cudnn_rnn.md): every bad input is a
ValueError or TypeError whose message names an argument, what was expected and what was given
(no IndexError or RuntimeError from deep inside, no silent reinterpretation). A corrupted
argument the contract ignores (a non-LSTM mode's cell state) or that stays valid (another
layout of the same values) must give the uncorrupted call's results. Draws run on the
reference backend and, fewer, on the Triton backend (float32 configurations on its kernels).
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop, params_size

TENSORS = ["input", "input_h", "input_c", "params", "sequence_lengths"]
BACKPROP_TENSORS = TENSORS + ["output", "output_h", "output_c", "output_backprop",
                              "output_h_backprop", "output_c_backprop", "reserve_space",
                              "host_reserved"]
# Every name a message may blame (an inconsistency between two arguments may name either).
NAMES = BACKPROP_TENSORS + ["rnn_mode", "input_mode", "direction", "dropout", "seed", "seed2",
                            "num_proj", "is_training", "time_major", "backend"]
BAD_ATTRIBUTES = {
    "rnn_mode": ["LSTM", "lstm2", 1, None],
    "input_mode": ["skip", "", 0],
    "direction": ["bi", "forward", True],
    "dropout": [-0.1, 1.0, 1.5, "0.1", None, float("nan")],
    "seed": [1.5, "1", None, 2**64],
    "seed2": [0.5, [1]],
    "num_proj": [-1, 2.0, "2", None],
    "is_training": [1, "yes", None],
    "time_major": [0, "no", None],
    "backend": ["cuda", "", 3],
}


def _config(rng: random.Random) -> dict:
    mode = rng.choice(["lstm", "gru", "rnn_tanh", "rnn_relu"])
    H = rng.randint(2, 5)
    cfg = dict(mode=mode, L=rng.randint(1, 2), D=rng.choice([1, 2]), H=H,
               P=rng.choice([0, rng.randint(1, H)]) if mode == "lstm" else 0,
               I=rng.randint(1, 4), T=rng.randint(1, 4), B=rng.randint(1, 3),
               time_major=rng.random() < 0.5,
               dtype=rng.choice([torch.float32, torch.float64]),
               lengths=rng.random() < 0.5)
    return cfg


def _args(cfg: dict, rng: random.Random, backend: str) -> tuple[dict, dict]:
    """(tensors, attributes) of a valid forward call."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    T, B, I, H, P, L, D = (cfg[k] for k in ("T", "B", "I", "H", "P", "L", "D"))
    Hout = P or H
    dt = cfg["dtype"]

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dt) * 0.5

    x = t(T, B, I) if cfg["time_major"] else t(B, T, I)
    h = t(L * D, B, Hout) if cfg["time_major"] else t(B, L * D, Hout)
    c = (t(L * D, B, H) if cfg["time_major"] else t(B, L * D, H)) if cfg["mode"] == "lstm" \
        else None
    n = params_size(rnn_mode=cfg["mode"], num_layers=L, num_units=H, input_size=I,
                    direction="bidirectional" if D == 2 else "unidirectional", num_proj=P)
    lengths = (torch.tensor([rng.randint(0, T) for _ in range(B)], dtype=torch.int32)
               if cfg["lengths"] else None)
    tensors = dict(input=x, input_h=h, input_c=c, params=t(n), sequence_lengths=lengths)
    attrs = dict(rnn_mode=cfg["mode"], direction="bidirectional" if D == 2 else "unidirectional",
                 num_proj=P, time_major=cfg["time_major"], backend=backend)
    return tensors, attrs


def _corrupt_tensor(rng: random.Random, name: str, value, cfg: dict):
    """(kind, corrupted value) for one tensor argument, or None where nothing applies."""
    kinds = ["type"]
    if isinstance(value, torch.Tensor):
        kinds += ["rank+", "dtype"] + (["rank-", "dim"] if value.dim() else [])
    kind = rng.choice(kinds)
    if kind == "type":
        return kind, rng.choice([[1.0], 3, "x"] + ([] if value is None else [None]))
    if kind == "rank+":
        return kind, value.unsqueeze(rng.randint(0, value.dim()))
    if kind == "rank-":
        d = rng.randrange(value.dim())
        return kind, value.select(d, 0) if value.shape[d] else value.sum(d)
    if kind == "dtype":
        other = [d for d in (torch.float16, torch.float32, torch.float64, torch.int64,
                             torch.int32, torch.uint8) if d != value.dtype
                 and not (name == "sequence_lengths" and d in (torch.int32, torch.int64))]
        return kind, value.to(rng.choice(other))
    d = rng.randrange(value.dim())
    if name == "input" and d == (0 if cfg["time_major"] else 1):
        return None  # another max time is a valid call
    shape = list(value.shape)
    shape[d] = shape[d] + 1 if shape[d] <= 1 or rng.random() < 0.5 else shape[d] - 1
    return kind, torch.zeros(shape, dtype=value.dtype)


def _ignored(name: str, bad, cfg: dict) -> bool:
    """An argument the contract ignores in this configuration (a non-LSTM mode's cell state),
    or takes as its default (output_c_backprop None: zeros), or another form of the same
    bytes (host_reserved: opaque, optional, any 64 one-byte elements)."""
    if name == "output_c_backprop" and bad is None:
        return True  # zeros for LSTM (the base call's own)
    if name == "host_reserved":
        return bad is None or (isinstance(bad, torch.Tensor) and bad.numel() == 64
                               and bad.dtype.itemsize == 1)
    return cfg["mode"] != "lstm" and name in ("input_c", "output_c", "output_c_backprop") \
        and (bad is None or isinstance(bad, torch.Tensor))


def _check_error(err: Exception, what: str, name: str) -> None:
    """A ValueError / TypeError naming the corrupted argument `name` (not only some other
    argument), with the expected and the given value."""
    assert isinstance(err, (ValueError, TypeError)), f"{what}: raised {err!r}"
    msg = str(err)
    assert re.search(rf"\b{re.escape(name)}\b", msg), (
        f"{what}: the message does not name {name}: {msg!r}")
    assert "expected" in msg and "got" in msg, f"{what}: no expected / given: {msg!r}"


def _same(got, want, what: str) -> None:
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            assert torch.equal(g, w), f"{what}: a result differs"


# The Triton backend runs its kernels on a GPU or in the interpreter (tests/conftest.py sets
# TRITON_INTERPRET=1 without a GPU); its draws are seeds of their own.
@pytest.mark.parametrize("backend,seed", [("reference", s) for s in range(300)]
                         + [("triton", s) for s in range(300, 400)])
def test_a_corrupted_argument_is_named_or_ignored(backend, seed):
    rng = random.Random(seed)
    cfg = _config(rng)
    tensors, attrs = _args(cfg, rng, backend)
    fwd = cudnn_rnn(*tensors.values(), **attrs)
    backprop = rng.random() < 0.5
    if backprop:
        call_tensors = dict(tensors, output=fwd.output, output_h=fwd.output_h,
                            output_c=fwd.output_c,
                            output_backprop=torch.ones_like(fwd.output),
                            output_h_backprop=torch.ones_like(fwd.output_h),
                            output_c_backprop=torch.zeros_like(fwd.output_c),
                            reserve_space=fwd.reserve_space, host_reserved=fwd.host_reserved)
        op = cudnn_rnn_backprop
        call_attrs = dict(attrs)
        want = op(*call_tensors.values(), **call_attrs)
    else:
        call_tensors, op, call_attrs, want = dict(tensors), cudnn_rnn, dict(attrs), fwd
    names = list(call_tensors) + [a for a in BAD_ATTRIBUTES
                                  if not (backprop and a == "is_training")]
    name = rng.choice(names)
    if name in BAD_ATTRIBUTES:
        bad = rng.choice(BAD_ATTRIBUTES[name])
        call_attrs[name] = bad
        what = f"{backend} seed {seed} {cfg}: {op.__name__}({name}={bad!r})"
        ignored = False
    else:
        drawn = _corrupt_tensor(rng, name, call_tensors[name], cfg)
        if drawn is None:
            return
        kind, bad = drawn
        if name == "sequence_lengths" and kind == "type" and bad is None:
            bad = [1]
        call_tensors[name] = bad
        what = f"{backend} seed {seed} {cfg}: {op.__name__}, {name} {kind}"
        ignored = _ignored(name, bad, cfg)
    try:
        got = op(*call_tensors.values(), **call_attrs)
    except Exception as err:  # noqa: BLE001 (the type is the check)
        assert not ignored, f"{what}: an ignored argument raised {err!r}"
        _check_error(err, what, name)
        return
    assert ignored, f"{what}: accepted"
    _same(got, want, what)
