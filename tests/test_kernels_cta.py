"""Persistent-CTA recurrent kernels (kernels/persistent_cta.py) against the float64 reference.

Every case builds a random packed problem, runs the launcher into NaN-poisoned buffers and
compares every output with rnn.reference.recurrence_forward / recurrence_backward run in
float64 on the same (dtype-rounded) inputs. The backward's inputs come from a float64 reference
forward (so pre_h, y, h_prev, c_seq, c_prev are mutually consistent, as in the engine).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pytest
import torch
import triton

from tritonrnn.kernels import persistent_cta
from tritonrnn.kernels.persistent_cta import (
    cta_backward,
    cta_forward,
    cta_onchip_bytes,
    cta_onchip_parts,
)
from tritonrnn.rnn import reference
from tritonrnn.rnn.packing import PackInfo, make_pack_info, prev_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
NAN = float("nan")

VARLEN = [3, 0, 7, 5, 2]  # unsorted, with a length-0 row
# 19 rows: with block_b=16 two programs run, the second one partly padded.
MANY = [4, 0, 7, 1, 6, 2, 7, 0, 3, 5, 5, 1, 6, 2, 4, 3, 0, 7, 2]

# fp32 kernels against float64: fp32's unit roundoff is 2^-24 ~ 6e-8; an output goes through at
# most 7 steps, each a dot of <= 64 terms plus a few pointwise ops, so its rounding error is
# bounded by a few hundred roundoffs of the O(1) values (measured: <= 8e-7). 1e-5 is ~170u.
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
# Half inputs: the kernel rounds h (and the backward's dpre) to the half dtype before each dot
# (fp32 accumulation) and rounds every stored output; with the same rounded inputs in the
# reference, the error is a few roundoffs per step over <= 7 steps: 16 roundoffs of O(1) values.
HALF_TOL = {
    torch.float16: dict(rtol=16 * 2.0**-11, atol=16 * 2.0**-11),
    torch.bfloat16: dict(rtol=16 * 2.0**-8, atol=16 * 2.0**-8),
}


@dataclass
class Problem:
    cell: str
    info: PackInfo
    reverse: bool
    H: int
    Hout: int
    fwd_in: dict  # xg, R, bR, Pw, h0, c0
    bwd_in: dict  # pre_x, pre_h, R, Pw, y, h_prev, c_seq, c_prev, dy, dhT, dcT


def _f64(t):
    return t.double() if t is not None else None


def make_problem(cell, H, P, lengths, reverse, dtype=torch.float32, scale=1.0, seed=0,
                 T=None):
    """Random inputs rounded to `dtype`; the backward's from a float64 reference forward.
    T: the padded length (default the longest sequence's)."""
    g = torch.Generator().manual_seed(seed)
    G, Hout, lstm = GATES[cell], (P or H), cell == "lstm"
    info = make_pack_info(lengths, T or max(max(lengths), 1), torch.device(DEVICE))
    N, B = info.N, info.B
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    cast = lambda t: t.to(dtype).to(DEVICE) if t is not None else None  # noqa: E731
    fwd = dict(
        xg=cast(rnd(N, G * H) * scale),
        R=cast(rnd(G * H, Hout) / Hout**0.5),
        bR=cast(rnd(G * H) * 0.1 * scale),
        Pw=cast(rnd(P, H) / H**0.5) if P else None,
        h0=cast(rnd(B, Hout)),
        c0=cast(rnd(B, H)) if lstm else None,
    )
    # Consistent backward inputs: a float64 forward on the rounded weights.
    y = torch.empty(N, Hout, dtype=torch.float64, device=DEVICE)
    c_seq = torch.empty(N, H, dtype=torch.float64, device=DEVICE) if lstm else None
    hT = torch.empty(B, Hout, dtype=torch.float64, device=DEVICE)
    cT = torch.empty(B, H, dtype=torch.float64, device=DEVICE) if lstm else None
    args = [_f64(fwd[k]) for k in ("xg", "R", "bR", "Pw", "h0", "c0")]
    reference.recurrence_forward(cell, *args, info, reverse, y, c_seq, hT, cT)
    y, c_seq = cast(y), cast(c_seq)
    prev = prev_rows(info, reverse)
    h_prev = torch.cat([fwd["h0"], y]).index_select(0, prev)
    c_prev = torch.cat([fwd["c0"], c_seq]).index_select(0, prev) if lstm else None
    pre_h = torch.addmm(_f64(fwd["bR"]), _f64(h_prev), _f64(fwd["R"]).t()).to(dtype)
    d = int(reverse)
    # dy as the engine passes it: one direction's column slice of a [N, 2*Hout] gradient.
    dy_wide = cast(rnd(N, 2 * Hout))
    # The pre-activations each cell's backward reads (reference.backward_preacts).
    gated = cell in ("lstm", "gru")
    bwd = dict(
        pre_x=fwd["xg"] if gated else None, pre_h=pre_h if gated else None, R=fwd["R"],
        Pw=fwd["Pw"], y=y,
        h_prev=h_prev,
        c_seq=c_seq, c_prev=c_prev, dy=dy_wide[:, d * Hout : (d + 1) * Hout],
        dhT=cast(rnd(B, Hout)), dcT=cast(rnd(B, H)) if lstm else None,
    )
    return Problem(cell, info, reverse, H, Hout, fwd, bwd)


def run_forward(p: Problem, dtype, keep_c=True, **tiles):
    """Runs cta_forward (or the float64 reference when dtype is float64) into NaN buffers.
    y is a column slice of a [N, 2*Hout] tensor, as the engine's bidirectional output."""
    N, B, lstm = p.info.N, p.info.B, p.cell == "lstm"
    new = lambda *s: torch.full(s, NAN, dtype=dtype, device=DEVICE)  # noqa: E731
    y_wide = new(N, 2 * p.Hout)
    d = int(p.reverse)
    out = dict(
        y=y_wide[:, d * p.Hout : (d + 1) * p.Hout],
        c_seq=new(N, p.H) if lstm and keep_c else None,
        hT=new(B, p.Hout),
        cT=new(B, p.H) if lstm else None,
    )
    f = p.fwd_in
    args = [f[k] for k in ("xg", "R", "bR", "Pw", "h0", "c0")]
    if dtype == torch.float64:
        reference.recurrence_forward(p.cell, *map(_f64, args), p.info, p.reverse, **out)
    else:
        cta_forward(p.cell, *args, p.info, p.reverse, **out, **tiles)
    # The other direction's half of y must be untouched.
    assert torch.isnan(y_wide[:, (1 - d) * p.Hout : (2 - d) * p.Hout]).all()
    return out


def run_backward(p: Problem, dtype, **tiles):
    N, B, G, lstm = p.info.N, p.info.B, GATES[p.cell], p.cell == "lstm"
    proj = p.fwd_in["Pw"] is not None
    new = lambda *s: torch.full(s, NAN, dtype=dtype, device=DEVICE)  # noqa: E731
    out = dict(
        dpre_x=new(N, G * p.H),
        dpre_h=new(N, G * p.H) if p.cell == "gru" else None,
        dh0=new(B, p.Hout),
        dc0=new(B, p.H) if lstm else None,
        dh_total=new(N, p.Hout) if proj else None,
        m_seq=new(N, p.H) if proj else None,
    )
    b = p.bwd_in
    names = ("pre_x", "pre_h", "R", "Pw", "y", "h_prev", "c_seq", "c_prev", "dy", "dhT", "dcT")
    args = [b[k] for k in names]
    if dtype == torch.float64:
        reference.recurrence_backward(p.cell, *map(_f64, args), p.info, p.reverse, **out)
    else:
        cta_backward(p.cell, *args, p.info, p.reverse, **out, **tiles)
    return out


def assert_outputs_close(got: dict, want: dict, tol: dict):
    for name, w in want.items():
        g = got[name]
        if w is None:
            assert g is None, name
            continue
        assert torch.isfinite(g).all(), f"{name}: non-finite entries (missing write?)"
        torch.testing.assert_close(g.double(), w, **tol, msg=lambda m, n=name: f"{n}: {m}")


# A covering subset: every cell in both directions, the projection on and off, odd sizes,
# batch 1, varlen with length 0 and unsorted lengths, several programs, no sequence at all.
CASES = [
    pytest.param("lstm", 33, 0, VARLEN, False, 16, id="lstm-H33-varlen-fwd"),
    pytest.param("lstm", 33, 0, VARLEN, True, 16, id="lstm-H33-varlen-rev"),
    pytest.param("lstm", 33, 17, VARLEN, True, 16, id="lstm-H33-P17-varlen-rev"),
    pytest.param("lstm", 40, 35, [6], False, 16, id="lstm-H40-P35-batch1-fwd"),
    pytest.param("lstm", 17, 9, MANY, False, 16, id="lstm-H17-P9-B19-2progs-fwd"),
    pytest.param("lstm", 16, 0, [0, 0, 0], True, 16, id="lstm-H16-all-len0-rev"),
    pytest.param("gru", 33, 0, VARLEN, False, 16, id="gru-H33-varlen-fwd"),
    pytest.param("gru", 20, 0, MANY, True, 16, id="gru-H20-B19-2progs-rev"),
    pytest.param("gru", 7, 0, [5], True, 16, id="gru-H7-batch1-rev"),
    pytest.param("rnn_tanh", 33, 0, VARLEN, True, 32, id="rnn_tanh-H33-varlen-rev-bb32"),
    pytest.param("rnn_tanh", 40, 0, [7], False, 16, id="rnn_tanh-H40-batch1-fwd"),
    pytest.param("rnn_relu", 33, 0, VARLEN, False, 16, id="rnn_relu-H33-varlen-fwd"),
    pytest.param("rnn_relu", 24, 0, MANY, True, 16, id="rnn_relu-H24-B19-2progs-rev"),
]
ARGS = "cell,H,P,lengths,reverse,block_b"


@pytest.mark.parametrize(ARGS, CASES)
def test_forward_matches_reference(cell, H, P, lengths, reverse, block_b):
    p = make_problem(cell, H, P, lengths, reverse)
    got = run_forward(p, torch.float32, block_b=block_b)
    assert_outputs_close(got, run_forward(p, torch.float64), FP32_TOL)


@pytest.mark.parametrize(ARGS, CASES)
def test_backward_matches_reference(cell, H, P, lengths, reverse, block_b):
    p = make_problem(cell, H, P, lengths, reverse)
    got = run_backward(p, torch.float32, block_b=block_b)
    assert_outputs_close(got, run_backward(p, torch.float64), FP32_TOL)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_padded_time_past_the_longest_sequence(cell, reverse):
    """T longer than every sequence (padded steps no row runs, a length-0 row): the packed
    rows and final states as at T = the longest length, both passes."""
    p = make_problem(cell, 17, 0, [4, 0, 2], reverse, T=7)
    assert p.info.max_len == 4 and p.info.T == 7
    assert_outputs_close(run_forward(p, torch.float32), run_forward(p, torch.float64), FP32_TOL)
    assert_outputs_close(run_backward(p, torch.float32), run_backward(p, torch.float64),
                         FP32_TOL)


# Loops bounded by the host (HOST_STEPS, what an interpreter that cannot loop to a tensor
# runs, e.g. Triton 3.6's with NumPy >= 2.4): every tile runs the batch's longest length. MANY
# puts shorter rows in the second tile, which then runs idle steps before (backward) or after
# (forward) its own, and must leave its rows' states and outputs untouched.
HOST_BOUND_CASES = [
    pytest.param("lstm", 17, 9, MANY, False, 16, id="lstm-H17-P9-B19-fwd"),
    pytest.param("lstm", 17, 0, MANY, True, 16, id="lstm-H17-B19-rev"),
    pytest.param("gru", 20, 0, MANY, True, 16, id="gru-H20-B19-rev"),
    pytest.param("rnn_tanh", 24, 0, MANY, False, 16, id="rnn_tanh-H24-B19-fwd"),
    pytest.param("rnn_relu", 24, 0, VARLEN, True, 16, id="rnn_relu-H24-varlen-rev"),
]


@pytest.mark.parametrize(ARGS, HOST_BOUND_CASES)
def test_host_bounded_loops_match_reference(monkeypatch, cell, H, P, lengths, reverse,
                                            block_b):
    seen = []

    def host_steps(info):
        seen.append(info.max_len)
        return info.max_len

    monkeypatch.setattr(persistent_cta, "_host_steps", host_steps)
    p = make_problem(cell, H, P, lengths, reverse)
    got_f = run_forward(p, torch.float32, block_b=block_b)
    got_b = run_backward(p, torch.float32, block_b=block_b)
    assert seen == [max(lengths)] * 2
    assert_outputs_close(got_f, run_forward(p, torch.float64), FP32_TOL)
    assert_outputs_close(got_b, run_backward(p, torch.float64), FP32_TOL)


def test_host_steps_only_where_the_interpreter_needs_them(monkeypatch):
    info = make_pack_info([3, 9, 4], 9, torch.device(DEVICE))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(persistent_cta, "_interpreter_loops_to_tensors", lambda: False)
    assert persistent_cta._host_steps(info) == 9
    monkeypatch.setattr(persistent_cta, "_interpreter_loops_to_tensors", lambda: True)
    assert persistent_cta._host_steps(info) == -1
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(persistent_cta, "_interpreter_loops_to_tensors", lambda: False)
    assert persistent_cta._host_steps(info) == -1  # compiled kernels bound their own loops


def test_interpreter_probe_matches_this_triton():
    """The probe's answer is what this Triton's interpreter does with a tensor loop bound."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("probes the interpreter (TRITON_INTERPRET=1)")
    import numpy as np

    version = lambda mod: tuple(int(v) for v in mod.__version__.split(".")[:2])  # noqa: E731
    if version(triton) >= (3, 7):  # the interpreter squeezes the bound (3.7.0 and later)
        assert persistent_cta._interpreter_loops_to_tensors()
    elif version(np) >= (2, 4):  # int() of a one-element array is an error since NumPy 2.4
        assert not persistent_cta._interpreter_loops_to_tensors()
    else:
        pytest.skip("older NumPy: a DeprecationWarning, an error only under warning filters")


def test_forward_without_c_seq():
    """Inference LSTM: c_seq is None, y/hT/cT still right."""
    p = make_problem("lstm", 33, 0, VARLEN, True)
    got = run_forward(p, torch.float32, keep_c=False)
    assert_outputs_close(got, run_forward(p, torch.float64, keep_c=False), FP32_TOL)


def test_length_zero_rows_pass_states_through():
    """Exact pass-through, independent of the tolerance: hT = h0, cT = c0, dh0 = dhT, dc0 = dcT
    on length-0 rows (sorted last)."""
    p = make_problem("lstm", 33, 0, VARLEN, False)
    fwd, bwd = run_forward(p, torch.float32), run_backward(p, torch.float32)
    zero = p.info.lengths_sorted == 0
    assert zero.sum() == 1
    assert torch.equal(fwd["hT"][zero], p.fwd_in["h0"][zero])
    assert torch.equal(fwd["cT"][zero], p.fwd_in["c0"][zero])
    assert torch.equal(bwd["dh0"][zero], p.bwd_in["dhT"][zero])
    assert torch.equal(bwd["dc0"][zero], p.bwd_in["dcT"][zero])


@pytest.mark.parametrize("cell,P", [("lstm", 9), ("gru", 0)], ids=["lstm-P9", "gru"])
def test_deterministic(cell, P):
    """No atomics, fixed reduction order: two runs are bit-identical."""
    p = make_problem(cell, 17, P, MANY, True)
    f1, f2 = run_forward(p, torch.float32), run_forward(p, torch.float32)
    b1, b2 = run_backward(p, torch.float32), run_backward(p, torch.float32)
    for a, b in [(f1, f2), (b1, b2)]:
        for k in a:
            if a[k] is not None:
                assert torch.equal(a[k], b[k]), k


# The interpreter's NumPy warns when sigmoid's exp(-x) overflows to inf: the intended limit.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_extreme_preactivations_stay_finite(cell):
    """Pre-activations of |x| ~ 60 (saturated gates; exp overflow in naive activations)."""
    p = make_problem(cell, 33, 0, VARLEN, False, scale=60.0)
    # The fp32 tolerance of the other tests: saturated gates are where a naive activation
    # goes wrong (a scaled atol, 6e-4, would have passed an approximation that far off; the
    # largest atol needed here at rtol 1e-5 is about 3e-7).
    assert_outputs_close(run_forward(p, torch.float32), run_forward(p, torch.float64), FP32_TOL)
    assert_outputs_close(run_backward(p, torch.float32), run_backward(p, torch.float64),
                         FP32_TOL)


def test_bfloat16_lstm_projection():
    """bf16 loads, stores and dot-operand rounding; runs everywhere (the interpreter rounds the
    operands to bf16 and multiplies in fp32, the GPU's exact bf16 products). See HALF_TOL."""
    p = make_problem("lstm", 20, 17, VARLEN, True, dtype=torch.bfloat16)
    tol = HALF_TOL[torch.bfloat16]
    assert_outputs_close(run_forward(p, torch.bfloat16), run_forward(p, torch.float64), tol)
    assert_outputs_close(run_backward(p, torch.bfloat16), run_backward(p, torch.float64), tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(ARGS, CASES)
def test_half_matches_reference(cell, H, P, lengths, reverse, block_b, dtype):
    p = make_problem(cell, H, P, lengths, reverse, dtype=dtype)
    tol = HALF_TOL[dtype]
    got = run_forward(p, dtype, block_b=block_b)
    assert_outputs_close(got, run_forward(p, torch.float64), tol)
    got = run_backward(p, dtype, block_b=block_b)
    assert_outputs_close(got, run_backward(p, torch.float64), tol)


def test_rejects_bad_arguments():
    p = make_problem("gru", 16, 0, [3, 1], False)
    args = [_f64(p.fwd_in[k]) for k in ("xg", "R", "bR", "Pw", "h0", "c0")]
    out = {k: _f64(v) for k, v in run_forward(p, torch.float32).items()}
    with pytest.raises(ValueError, match="float64"):
        cta_forward("gru", *args, p.info, False, **out)
    with pytest.raises(ValueError, match="block_b"):
        run_forward(p, torch.float32, block_b=8)
    q = make_problem("rnn_tanh", 16, 0, [3, 1], False)  # R [16, 16]: not [3*H, Hout]
    with pytest.raises(ValueError, match="R: expected"):
        cta_forward("gru", *(q.fwd_in[k] for k in ("xg", "R", "bR", "Pw", "h0", "c0")),
                    q.info, False, **run_forward(q, torch.float32))
    with pytest.raises(ValueError, match="cell"):
        cta_onchip_bytes("lstmx", 16, 16, 0, torch.float32, 16)


@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_rejects_tensors_on_another_device(pass_, monkeypatch):
    """Every tensor on the first one's device (xg's in the forward, dy's in the backward),
    info's index tensors too, and that a GPU unless the interpreter runs the kernels: no
    device was checked, and CPU tensors without the interpreter reached Triton's launch
    ("RuntimeError: 0 active drivers"), a CPU R beside CUDA ones its "Pointer argument"
    error, naming no argument. meta stands in for another device."""
    p = make_problem("lstm", 16, 0, [3, 1], False)
    forward = pass_ == "forward"
    names = (("xg", "R", "bR", "Pw", "h0", "c0") if forward else
             ("pre_x", "pre_h", "R", "Pw", "y", "h_prev", "c_seq", "c_prev", "dy", "dhT", "dcT"))
    source = p.fwd_in if forward else p.bwd_in
    outs = run_forward(p, torch.float32) if forward else run_backward(p, torch.float32)
    tensors = {**{k: source[k] for k in names}, **outs}
    call, first = (cta_forward, "xg") if forward else (cta_backward, "dy")
    dev = tensors[first].device
    for name in ("R", "c0", "cT") if forward else ("R", "h_prev", "dc0"):
        with pytest.raises(ValueError, match=re.escape(
                f"{name}: expected a tensor on {dev} ({first}'s), got meta")):
            call("lstm", info=p.info, reverse=False,
                 **{**tensors, name: tensors[name].to("meta")})
    meta = {k: v.to("meta") if v is not None else None for k, v in tensors.items()}
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (read at the call: nothing is launched)
    with pytest.raises(ValueError, match=re.escape(
            f"info: expected its index tensors on meta ({first}'s), got {dev}")):
        call("lstm", info=p.info, reverse=False, **meta)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu = {k: v.cpu() if v is not None else None for k, v in tensors.items()}
    with pytest.raises(ValueError, match=re.escape(
            f"{first}: expected a CUDA tensor (or TRITON_INTERPRET=1 for the interpreter), "
            "got device cpu")):
        call("lstm", info=make_pack_info([3, 1], 3, torch.device("cpu")), reverse=False,
             **cpu)
    # A tensor argument of another type is named (it raised AttributeError on .dtype).
    name = "h0" if forward else "y"
    with pytest.raises(ValueError, match=rf"^{name}: expected a tensor, got list$"):
        call("lstm", info=p.info, reverse=False, **{**tensors, name: [1.0]})


@pytest.mark.parametrize("cell, P", [("lstm", 0), ("gru", 0), ("lstm", 8)],
                         ids=["lstm", "gru", "lstm-proj"])
def test_rejects_tensors_of_other_shapes(cell, P):
    """The kernel addresses every tensor by the layer's sizes: one row short (or a state
    missing) is refused by name before anything is written, never read or written past."""
    p = make_problem(cell, 16, P, [3, 1], False)
    f_names = ("xg", "R", "bR", "Pw", "h0", "c0")
    fwd_out = run_forward(p, torch.float32)
    bwd_out = run_backward(p, torch.float32)
    b_names = ("pre_x", "pre_h", "R", "Pw", "y", "h_prev", "c_seq", "c_prev", "dy", "dhT",
               "dcT")
    fwd = {**{k: p.fwd_in[k] for k in f_names}, **fwd_out}
    bwd = {**{k: p.bwd_in[k] for k in b_names}, **bwd_out}
    for tensors, call in ((fwd, cta_forward), (bwd, cta_backward)):
        for name, t in tensors.items():
            if t is None or name in ("R", "pre_x", "pre_h"):  # (checked by their own rules)
                continue
            for bad, got in ((t[:-1], list(t[:-1].shape)), (None, None)):
                if bad is None and name in ("c_seq", "Pw"):
                    continue  # optional (c_seq), or another layer (no projection)
                args = {**tensors, name: bad}
                want = (f"{name}: expected a tensor, got NoneType" if bad is None and name in
                        ("xg", "dy") else  # the tensor that sets the dtype
                        f"{name}: expected shape {list(t.shape)} for cell {cell!r}, got {got}")
                with pytest.raises(ValueError, match=re.escape(want)):
                    call(cell, info=p.info, reverse=False, **args)


def test_onchip_bytes_formula():
    # LSTM bf16, H = Hout = 128, block_b 16: R 4*128*128*2, bias 4*128*4, h and c 16*256*4,
    # gate tiles 2*4*16*128*4.
    want = 4 * 128 * 128 * 2 + 4 * 128 * 4 + 16 * 256 * 4 + 2 * 4 * 16 * 128 * 4
    assert cta_onchip_bytes("lstm", 128, 128, 0, torch.bfloat16, 16) == want
    # Odd sizes pad to the tile: H=33 costs what H=64 costs; a projection adds Pw.
    assert cta_onchip_bytes("gru", 33, 33, 0, torch.float32, 16) == cta_onchip_bytes(
        "gru", 64, 64, 0, torch.float32, 16
    )
    no_p = cta_onchip_bytes("lstm", 64, 32, 0, torch.float16, 16)
    assert cta_onchip_bytes("lstm", 64, 32, 32, torch.float16, 16) == no_p + 32 * 64 * 2
    parts = cta_onchip_parts("lstm", 128, 128, 0, torch.bfloat16, 16)
    assert parts.smem == 4 * 128 * 128 * 2 and parts.smem + parts.regs == want
