"""The reference engine (rnn/reference.py and the engine's buffers around it) on what the
other suites leave out: inference of stacks deeper than two layers, where the engine's
inner layer-output buffers alternate (`engine._forward_inputs(reuse=True)`: with one buffer
a bidirectional layer run one direction at a time read its input after its first direction
had overwritten it), and half-precision inputs, whose internals run in float32 ("results
are cast when stored"): a bfloat16 run equals the float32 run on the same values rounded
once. The reference backend is what backend="reference" runs anywhere, and "auto" on a CPU
without the interpreter."""

from __future__ import annotations

import pytest
import torch

from tritonrnn.rnn import cudnn_rnn, params_size, reference
from tritonrnn.rnn.packing import make_pack_info


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("direction", ["unidirectional", "bidirectional"])
@pytest.mark.parametrize("L", [3, 4])
def test_deep_stack_inference_equals_training_forward(mode, direction, L):
    g = torch.Generator().manual_seed(0)
    T, B, I, H = 5, 3, 4, 6
    D = 2 if direction == "bidirectional" else 1
    n = params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=I,
                    direction=direction)
    x = torch.randn(T, B, I, generator=g, dtype=torch.float64)
    h = torch.randn(L * D, B, H, generator=g, dtype=torch.float64)
    c = torch.randn(L * D, B, H, generator=g, dtype=torch.float64) if mode == "lstm" else None
    p = torch.randn(n, generator=g, dtype=torch.float64) * 0.5
    lens = torch.tensor([5, 2, 4])
    kw = dict(rnn_mode=mode, direction=direction, backend="reference")
    infer = cudnn_rnn(x, h, c, p, lens, is_training=False, **kw)
    train = cudnn_rnn(x, h, c, p, lens, is_training=True, **kw)
    assert torch.equal(infer.output, train.output)
    assert torch.equal(infer.output_h, train.output_h)
    if c is not None:
        assert torch.equal(infer.output_c, train.output_c)


GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1}


def _problem(cell, H=8, lengths=(5, 2, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    info = make_pack_info(list(lengths), max(lengths), torch.device("cpu"))
    G, N, B = GATES[cell], info.N, info.B
    r = lambda *s, k=1.0: (torch.randn(*s, generator=g) * k).bfloat16()  # noqa: E731
    lstm = cell == "lstm"
    return info, dict(
        xg=r(N, G * H), R=r(G * H, H, k=H ** -0.5), bR=r(G * H), h0=r(B, H),
        c0=r(B, H) if lstm else None, dy=r(N, H), dhT=r(B, H), dcT=r(B, H) if lstm else None)


def _forward(cell, info, t, dtype, reverse):
    cv = {k: (v.to(dtype) if v is not None else None) for k, v in t.items()}
    N, B, H = info.N, info.B, t["R"].shape[1]
    lstm = cell == "lstm"
    y = torch.empty(N, H, dtype=dtype)
    c_seq = torch.empty(N, H, dtype=dtype) if lstm else None
    hT = torch.empty(B, H, dtype=dtype)
    cT = torch.empty(B, H, dtype=dtype) if lstm else None
    reference.recurrence_forward(cell, cv["xg"], cv["R"], cv["bR"], None, cv["h0"], cv["c0"],
                                 info, reverse, y, c_seq, hT, cT)
    return dict(y=y, c_seq=c_seq, hT=hT, cT=cT)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_bfloat16_reference_forward_is_the_float32_one_rounded_once(cell, reverse):
    info, t = _problem(cell)
    half = _forward(cell, info, t, torch.bfloat16, reverse)
    full = _forward(cell, info, t, torch.float32, reverse)
    for name, v in half.items():
        if v is not None:
            assert torch.equal(v, full[name].bfloat16()), name


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_bfloat16_reference_backward_is_the_float32_one_rounded_once(cell):
    info, t = _problem(cell)
    fwd = _forward(cell, info, t, torch.float32, False)
    N, B, H = info.N, info.B, t["R"].shape[1]
    G = GATES[cell]
    g = torch.Generator().manual_seed(1)
    pre_x = torch.randn(N, G * H, generator=g).bfloat16()
    pre_h = torch.randn(N, G * H, generator=g).bfloat16()
    h_prev = torch.randn(N, H, generator=g).bfloat16()
    c_prev = torch.randn(N, H, generator=g).bfloat16() if cell == "lstm" else None
    y = fwd["y"].bfloat16()
    c_seq = fwd["c_seq"].bfloat16() if fwd["c_seq"] is not None else None

    def run(dtype):
        cv = lambda v: v.to(dtype) if v is not None else None  # noqa: E731
        out = dict(dpre_x=torch.empty(N, G * H, dtype=dtype),
                   dpre_h=torch.empty(N, G * H, dtype=dtype) if cell == "gru" else None,
                   dh0=torch.empty(B, H, dtype=dtype),
                   dc0=torch.empty(B, H, dtype=dtype) if cell == "lstm" else None)
        reference.recurrence_backward(
            cell, cv(pre_x), cv(pre_h), cv(t["R"]), None, cv(y), cv(h_prev), cv(c_seq),
            cv(c_prev), cv(t["dy"]), cv(t["dhT"]), cv(t["dcT"]), info, False, out["dpre_x"],
            out["dpre_h"], out["dh0"], out["dc0"], None, None)
        return out

    half, full = run(torch.bfloat16), run(torch.float32)
    for name, v in half.items():
        if v is not None:
            assert torch.equal(v, full[name].bfloat16()), name


def test_the_suite_poisons_fresh_buffers_and_owns_its_tuning_cache():
    """The premises of every comparison here (tests/conftest.py): fresh engine buffers are
    NaN, so a missing write fails; and the tuning cache the planner reads is this test's own,
    empty, so no entry of ~/.cache/tritonrnn or a GPU session picks another family."""
    import os
    from pathlib import Path

    from tritonrnn.rnn.engine import new_buffer
    from tritonrnn.rnn.planner import load_tuning_cache, tuning_cache_path

    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        assert new_buffer(3, 2, dtype=dtype, device=torch.device("cpu")).isnan().all()
    assert os.environ["TRITONRNN_POISON"] == "1"
    home = Path.home() / ".cache" / "tritonrnn"
    assert home not in tuning_cache_path().parents and load_tuning_cache() == {}
