"""kernels/split_k.py, the split-K backward recurrence (the planner's rule runs it at three
shapes, `planner._SPLIT_K_RULE`; elsewhere where a constraint, tuning entry or switch names
it): against `rnn.reference.recurrence_backward` in the interpreter (two launches per
step, the carries through global memory) for every cell, variable lengths with zeros,
unsorted, both time directions, batch tiles that do not divide the batch, in float32 and
(LSTM, GRU) bf16 / fp16; its tiling rules and argument errors (shapes, dtypes, devices)."""

from __future__ import annotations

import re

import pytest
import torch

from tritonrnn.kernels import cells
from tritonrnn.kernels.split_k import (
    split,
    split_k1_tiles,
    split_k_backward,
    tiles,
    workspace,
)
from tritonrnn.rnn.packing import make_pack_info
from tritonrnn.rnn.reference import recurrence_backward

# (cell, H, lengths, units, kblock, btile): LSTM / GRU / tanh / relu, K blocks that give every
# program of a unit block a cell slice and ones that do not (GRU: 3 blocks, 8-unit slices:
# one program a block only meets the barriers), two batch tiles (the second partial; 32- and
# 64-row tiles over 3 rows too), four accumulators (`split`: [16, 16] and [32, 16] tiles),
# two (relu: [32, 64]) and one ([64, 128]).
CASES = [
    ("lstm", 32, [5, 0, 3, 5, 1, 4, 2, 5, 0, 3, 3, 1, 5, 2, 4, 5, 3, 2], 16, 64, 16),
    ("gru", 64, [4, 1, 0, 4, 2, 3], 16, 64, 16),
    ("rnn_tanh", 64, [3, 3, 1, 0, 2], 16, 64, 16),
    ("rnn_relu", 64, [2, 4, 4, 1], 64, 64, 32),
    ("lstm", 16, [3, 0, 2], 16, 64, 32),
    ("lstm", 128, [2, 1, 2], 128, 128, 64),
]


# The one-barrier form (`one_barrier=True`; kblock = G x the K block's units): unit blocks
# both wider and narrower than the K blocks (each program storing several units of a K
# block's dpre, or only some programs storing one), K blocks of 16 and 32 units, GRU's 3 x 16
# rows, two batch tiles (the second partial), a 32-row tile over 3 rows.
ONE_BARRIER_CASES = [
    ("lstm", 32, [5, 0, 3, 5, 1, 4, 2, 5, 0, 3, 3, 1, 5, 2, 4, 5, 3, 2], 16, 64, 16),
    ("lstm", 64, [4, 1, 0, 4, 2, 3], 64, 64, 16),
    ("gru", 64, [4, 1, 0, 4, 2, 3], 16, 48, 16),
    ("rnn_tanh", 64, [3, 3, 1, 0, 2], 32, 16, 16),
    ("rnn_relu", 64, [2, 4, 4, 1], 64, 32, 32),
    ("lstm", 16, [3, 0, 2], 16, 64, 32),
]


def _inputs(cell: str, H: int, lengths: list[int], seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    info = make_pack_info(lengths, max(lengths), torch.device("cpu"))
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    N, B = info.N, info.B

    def rnd(*shape, scale=1.0):
        return (torch.rand(*shape, generator=gen) * 2 - 1) * scale

    gated = cell in ("lstm", "gru")
    lstm = cell == "lstm"
    return dict(
        cell=cell, info=info,
        pre_x=rnd(N, G * H, scale=2.0) if gated else None,
        pre_h=rnd(N, G * H, scale=2.0) if gated else None,
        R=rnd(G * H, H, scale=H ** -0.5), y=rnd(N, H), h_prev=rnd(N, H),
        c_seq=rnd(N, H, scale=2.0) if lstm else None,
        c_prev=rnd(N, H, scale=2.0) if lstm else None,
        dy=rnd(N, H), dhT=rnd(B, H), dcT=rnd(B, H) if lstm else None,
    )


def _outputs(cell: str, H: int, info, dtype=torch.float32) -> dict:
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    nan = lambda *shape: torch.full(shape, float("nan"), dtype=dtype)  # noqa: E731
    # (poisoned: a row the kernel should write and does not fails)
    return dict(dpre_x=nan(info.N, G * H),
                dpre_h=nan(info.N, G * H) if cell == "gru" else None,
                dh0=nan(info.B, H),
                dc0=nan(info.B, H) if cell == "lstm" else None)


def _reference(x: dict, reverse: bool) -> dict:
    """The float64 reference backward (rnn/reference.py) on x's float32 values."""
    d = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
         for k, v in x.items()}
    want = _outputs(x["cell"], x["R"].shape[1], x["info"], torch.float64)
    recurrence_backward(d["cell"], d["pre_x"], d["pre_h"], d["R"], None, d["y"], d["h_prev"],
                        d["c_seq"], d["c_prev"], d["dy"], d["dhT"], d["dcT"], d["info"],
                        reverse, want["dpre_x"], want["dpre_h"], want["dh0"], want["dc0"],
                        None, None)
    return want


# bf16 / fp16: the grid family's half-precision tolerances (tests/test_kernels_grid.py, TOL
# and _close). Inputs and weights are the same rounded values on both sides; the kernel
# rounds the gate gradients (the next step's product operand) and the stored outputs to the
# dtype: a few units of its epsilon (bf16 7.8e-3, fp16 9.8e-4), the absolute part relative
# to max(1, max |want|).
HALF_TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


def _close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """The kernel against the float64 reference. float32: sums of <= 4 H products over <= 8
    steps of O(1) values, each rounded to float32 (u = 6e-8), well inside 2e-5; bf16 / fp16:
    HALF_TOL."""
    tol = HALF_TOL.get(got.dtype)
    if tol is None:
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5, msg=what or None)
    else:
        torch.testing.assert_close(got.double(), want, rtol=tol,
                                   atol=tol * max(1.0, want.abs().max().item()),
                                   msg=what or None)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd-time", "reversed"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-H{c[1]}-B{len(c[2])}-U{c[3]}"
                                                     f"-KB{c[4]}-BB{c[5]}")
def test_split_k_backward_matches_the_reference(case, reverse):
    _check_against_the_reference(case, reverse, one_barrier=False)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd-time", "reversed"])
@pytest.mark.parametrize("case", ONE_BARRIER_CASES,
                         ids=lambda c: f"{c[0]}-H{c[1]}-B{len(c[2])}-U{c[3]}-KB{c[4]}-BB{c[5]}")
def test_one_barrier_split_k_backward_matches_the_reference(case, reverse):
    _check_against_the_reference(case, reverse, one_barrier=True)


# (one_barrier, case) in bf16 / fp16: LSTM and GRU in each form.
HALF_CASES = [(False, CASES[0]), (False, CASES[1]), (True, ONE_BARRIER_CASES[0]),
              (True, ONE_BARRIER_CASES[2])]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("one_barrier, case", HALF_CASES, ids=[
    f"{'one-barrier' if one else 'two-barriers'}-{c[0]}" for one, c in HALF_CASES])
def test_split_k_backward_in_half_precision_matches_the_reference(one_barrier, case, dtype):
    """bf16 / fp16 tensors against the float64 reference on the same rounded values (LSTM
    forward in time, GRU reversed). The interpreter's tl.dot is wrong on bf16 operands (dh0
    off by 1e11 here when the products took them): the launcher runs its products in fp32
    there (DOT_DT), in the tensors' dtype on a GPU."""
    _check_against_the_reference(case, case[0] != "lstm", one_barrier, dtype)


def _check_against_the_reference(case, reverse: bool, one_barrier: bool,
                                 dtype: torch.dtype = torch.float32) -> None:
    cell, H, lengths, U, KB, BB = case
    x = _inputs(cell, H, lengths, seed=len(lengths) + H)
    x = {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
    want, got = _reference(x, reverse), _outputs(cell, H, x["info"], dtype)
    split_k_backward(x["cell"], x["pre_x"], x["pre_h"], x["R"], x["y"], x["h_prev"],
                     x["c_seq"], x["c_prev"], x["dy"], x["dhT"], x["dcT"], x["info"], reverse,
                     got["dpre_x"], got["dpre_h"], got["dh0"], got["dc0"], units=U, kblock=KB,
                     btile=BB, one_barrier=one_barrier)
    for name, w in want.items():
        if w is None:
            assert got[name] is None
            continue
        assert not w.isnan().any(), name  # the reference wrote every element
        _close(got[name], w, name)
    assert want["dh0"].abs().max() > 0.1


@pytest.mark.parametrize("one_barrier", [False, True], ids=["two-barriers", "one-barrier"])
def test_split_k_backward_takes_strided_tensors_and_empty_batches(one_barrier):
    """A column view for dy and a strided dh0 (the layer's time-major views), and a batch
    whose sequences are all empty (dh0 = dhT, dc0 = dcT)."""
    x = _inputs("lstm", 16, [3, 1, 2], seed=4)
    want, got = _reference(x, True), _outputs("lstm", 16, x["info"])
    wide = torch.zeros(x["dy"].shape[0], 40)
    wide[:, 8:24] = x["dy"]
    dy = wide[:, 8:24]
    got["dh0"] = torch.full((3, 32), float("nan"))[:, ::2]
    args = [x[k] for k in ("pre_x", "pre_h", "R", "y", "h_prev", "c_seq", "c_prev")]
    split_k_backward("lstm", *args, dy, x["dhT"], x["dcT"], x["info"], True, got["dpre_x"],
                     None, got["dh0"], got["dc0"], units=16, kblock=64, btile=16,
                     one_barrier=one_barrier)
    for k in ("dpre_x", "dh0", "dc0"):
        _close(got[k], want[k], k)
    empty = _inputs("lstm", 16, [0, 0], seed=5)
    out = _outputs("lstm", 16, empty["info"])
    split_k_backward("lstm", *(empty[k] for k in ("pre_x", "pre_h", "R", "y", "h_prev", "c_seq",
                                                   "c_prev", "dy", "dhT", "dcT", "info")),
                     False, out["dpre_x"], None, out["dh0"], out["dc0"], units=16, kblock=64,
                     btile=16, one_barrier=one_barrier)
    torch.testing.assert_close(out["dh0"], empty["dhT"], rtol=0, atol=0)
    torch.testing.assert_close(out["dc0"], empty["dcT"], rtol=0, atol=0)


@pytest.mark.parametrize("one_barrier", [False, True], ids=["two-barriers", "one-barrier"])
def test_split_k_backward_in_float64_matches_torch_autograd_through_an_lstm(one_barrier):
    """A second oracle: the gradients of an LSTM unrolled in torch in float64 (lengths 4, 2,
    3: each sequence's state frozen past its end; a loss on every output and on the final h
    and c) at every step's pre-activations and at h0 / c0, against the kernel on the same
    values in float32, its outputs NaN-filled."""
    torch.manual_seed(1)
    H, T, B = 16, 4, 3
    lengths = [4, 2, 3]
    info = make_pack_info(lengths, T, torch.device("cpu"))
    R = (torch.randn(4 * H, H, dtype=torch.float64) / H ** 0.5)
    xs = torch.randn(T, B, 4 * H, dtype=torch.float64)
    h0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(T, B, H, dtype=torch.float64)
    dhT = torch.randn(B, H, dtype=torch.float64)
    dcT = torch.randn(B, H, dtype=torch.float64)
    # Sorted by length (the packed layout's order): rows 0, 2, 1 of the batch.
    order = info.perm.tolist()
    h, c, pres = h0, c0, {}
    loss = 0.0
    keep = {"y": {}, "hp": {}, "cs": {}, "cp": {}}
    for t in range(T):
        pre = xs[t] + h @ R.t()
        pre.retain_grad()
        i, f, g, o = pre.split(H, dim=1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        c_new = f * c + i * g
        h_new = o * c_new.tanh()
        active = torch.tensor([t < n for n in lengths]).unsqueeze(1)
        for b in range(B):
            if t < lengths[b]:
                pres[(t, b)] = pre
                keep["y"][(t, b)] = h_new[b].detach()
                keep["hp"][(t, b)] = h[b].detach()
                keep["cs"][(t, b)] = c_new[b].detach()
                keep["cp"][(t, b)] = c[b].detach()
        loss = loss + (torch.where(active, h_new, 0.0) * dy[t]).sum()
        h = torch.where(active, h_new, h)
        c = torch.where(active, c_new, c)
    loss = loss + (h * dhT).sum() + (c * dcT).sum()  # each sequence's last h and c
    loss.backward()
    # The packed rows: step t, sorted row j -> original batch order[j].
    N = info.N
    px = torch.zeros(N, 4 * H, dtype=torch.float64)
    ph = torch.zeros(N, 4 * H, dtype=torch.float64)
    packed = {k: torch.zeros(N, H, dtype=torch.float64) for k in ("y", "hp", "cs", "cp", "dy")}
    grads = torch.zeros(N, 4 * H, dtype=torch.float64)
    for t in range(T):
        for j in range(info.batch_sizes[t]):
            r, b = int(info.offsets[t]) + j, order[j]
            pre = pres[(t, b)]
            px[r] = xs[t, b]
            ph[r] = pre[b].detach() - xs[t, b]
            grads[r] = pre.grad[b]
            for k, src in (("y", "y"), ("hp", "hp"), ("cs", "cs"), ("cp", "cp")):
                packed[k][r] = keep[src][(t, b)]
            packed["dy"][r] = dy[t, b]
    nan = float("nan")
    out = dict(dpre_x=torch.full((N, 4 * H), nan), dh0=torch.full((B, H), nan),
               dc0=torch.full((B, H), nan))
    f32 = {k: v.float() for k, v in packed.items()}
    split_k_backward("lstm", px.float(), ph.float(), R.float(), f32["y"], f32["hp"], f32["cs"],
                     f32["cp"], f32["dy"], dhT[info.perm].float(), dcT[info.perm].float(),
                     info, False, out["dpre_x"], None,
                     out["dh0"], out["dc0"], units=16, kblock=64, btile=16,
                     one_barrier=one_barrier)
    tol = dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(out["dpre_x"].double(), grads, **tol)
    torch.testing.assert_close(out["dh0"].double(), h0.grad[info.perm], **tol)
    torch.testing.assert_close(out["dc0"].double(), c0.grad[info.perm], **tol)


def test_split_k_tiles_and_accumulators():
    """The timed configurations (scripts/split_k_probe.py): co-resident on an H100's 132 SMs;
    at H=768 each unit block has 6 K blocks and 4 cell slices of 32 units; GRU's 3H rows."""
    assert tiles("lstm", 1024, 256, 128, 512, 128) == (128, 8, 16)
    assert tiles("lstm", 768, 256, 128, 512, 128) == (72, 6, 32)
    assert tiles("lstm", 1024, 64, 64, 512, 64) == (128, 8, 8)
    assert tiles("lstm", 1024, 16, 64, 1024, 16) == (64, 4, 16)
    assert tiles("gru", 1024, 64, 64, 512, 64) == (96, 6, 16)
    assert tiles("lstm", 1024, 200, 128, 512, 128) == (128, 8, 16)  # a partial batch tile
    assert [split(U, BB) for U, BB in ((64, 16), (64, 64), (128, 128))] == [4, 2, 1]


def test_one_barrier_tiles():
    """The one-barrier form's tiling: NK = H / K-block units, every program runs its K
    block's cells (US = K-block units); the rule's tiles on an H100 (the most programs, then
    the smallest cell tile, then the fewest partial bytes stored) and None where no R block
    fits."""
    from tritonrnn.rnn.planner import PRESETS

    assert tiles("lstm", 1024, 16, 128, 256, 16, one_barrier=True) == (128, 16, 64)
    assert tiles("gru", 1024, 16, 128, 192, 16, one_barrier=True) == (128, 16, 64)
    assert tiles("lstm", 64, 40, 16, 64, 32, one_barrier=True) == (4 * 4 * 2, 4, 16)
    h100 = PRESETS["h100"]
    assert tiles("lstm", 1024, 16, 256, 128, 16, one_barrier=True) == (128, 32, 32)
    assert split_k1_tiles("lstm", 1024, 16, torch.bfloat16, h100) == (256, 128, 16)
    assert split_k1_tiles("lstm", 1024, 32, torch.bfloat16, h100) == (256, 128, 32)
    assert split_k1_tiles("lstm", 768, 16, torch.bfloat16, h100) == (256, 128, 16)  # 72
    assert split_k1_tiles("lstm", 1024, 64, torch.bfloat16, h100) is None  # past B = 32
    assert split_k1_tiles("gru", 1024, 16, torch.bfloat16, h100) == (256, 96, 16)
    assert split_k1_tiles("gru", 1536, 16, torch.bfloat16, h100) is None


# Each rule of `tiles` broken alone: (cell, H, B, units, kblock, btile) refused, and the same
# with the one value that breaks it mended (index, value) accepted, so each case shows its
# own rule refusing (a case breaking two rules, or a message any refusal matches, would not).
_TWO_BARRIER_RULES = {
    "units-power-of-two": (("lstm", 1536, 256, 96, 512, 128), (3, 128)),
    "kblock-power-of-two": (("gru", 1024, 256, 128, 192, 128), (4, 256)),
    "btile-power-of-two": (("lstm", 1024, 256, 128, 512, 48), (5, 64)),
    "units-divide-H": (("lstm", 96, 256, 64, 128, 128), (3, 32)),
    "kblock-divides-G*H": (("gru", 1024, 256, 128, 2048, 128), (4, 1024)),
    "kblock-at-least-64": (("lstm", 1024, 256, 128, 32, 128), (4, 64)),
    "btile-at-least-16": (("lstm", 1024, 256, 128, 512, 8), (5, 16)),
}
_ONE_BARRIER_RULES = {
    "units-power-of-two": (("lstm", 1536, 16, 96, 256, 16), (3, 128)),
    "kblock-units-power-of-two": (("lstm", 1536, 16, 128, 192, 16), (4, 256)),
    "btile-power-of-two": (("lstm", 1024, 16, 128, 256, 48), (5, 32)),
    "kblock-multiple-of-G": (("gru", 1024, 16, 128, 49, 16), (4, 48)),
    "units-divide-H": (("lstm", 96, 16, 64, 128, 16), (3, 32)),
    "kblock-units-divide-H": (("lstm", 96, 16, 32, 256, 16), (4, 128)),
    "kblock-units-at-least-16": (("lstm", 1024, 16, 128, 32, 16), (4, 64)),
    "units-at-least-16": (("lstm", 1024, 16, 8, 256, 16), (3, 16)),
    "btile-at-least-16": (("lstm", 1024, 16, 128, 256, 8), (5, 16)),
}


@pytest.mark.parametrize("one_barrier, case", [
    *((False, c) for c in _TWO_BARRIER_RULES.values()),
    *((True, c) for c in _ONE_BARRIER_RULES.values())],
    ids=[*(f"two-{k}" for k in _TWO_BARRIER_RULES), *(f"one-{k}" for k in _ONE_BARRIER_RULES)])
def test_split_k_tiles_refuse_each_rule_alone(one_barrier, case):
    args, (index, mended) = case
    cell, H, _, U, KB, BB = args
    with pytest.raises(ValueError, match=re.escape(
            f"got cell {cell!r}, H={H}, units={U}, kblock={KB}, btile={BB}")) as err:
        tiles(*args, one_barrier=one_barrier)
    assert str(err.value).startswith("split_k: expected powers of two units | H")
    fixed = list(args)
    fixed[index] = mended
    tiles(*fixed, one_barrier=one_barrier)  # that one value mended: accepted


def test_split_k_backward_names_a_wrong_argument():
    x = _inputs("lstm", 16, [2, 1], seed=0)
    out = _outputs("lstm", 16, x["info"])
    with pytest.raises(ValueError, match=r"c_seq: expected shape \[3, 16\], got None"):
        split_k_backward("lstm", x["pre_x"], x["pre_h"], x["R"], x["y"], x["h_prev"], None,
                         x["c_prev"], x["dy"], x["dhT"], x["dcT"], x["info"], False,
                         out["dpre_x"], None, out["dh0"], out["dc0"], units=16, kblock=64,
                         btile=16)
    with pytest.raises(ValueError, match="cell: expected one of"):
        split_k_backward("lstmx", None, None, x["R"], x["y"], x["h_prev"], None, None, x["dy"],
                         x["dhT"], None, x["info"], False, out["dpre_x"], None, out["dh0"],
                         None, units=16, kblock=64, btile=16)


def _run_with(x: dict, out: dict, **changed) -> None:
    """split_k_backward on x's inputs and out's outputs (LSTM H=16), the arguments named in
    `changed` replaced."""
    args = {**{k: v for k, v in x.items() if k != "cell"}, **out, **changed}
    split_k_backward("lstm", **args, reverse=False, units=16, kblock=64, btile=16)


def test_split_k_backward_names_a_tensor_of_another_dtype():
    """Every tensor in dy's dtype, one the grid kernels take (float64 runs on the reference
    backend): the kernel reads each pointer in its own dtype, so a tensor of another would be
    read as what it is not, or fail inside Triton naming no argument."""
    x = _inputs("lstm", 16, [2, 1], seed=0)
    out = _outputs("lstm", 16, x["info"])
    wide = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in x.items()}
    with pytest.raises(ValueError, match=re.escape(
            "dy: expected dtype float32, float16 or bfloat16 (the grid kernels'), got "
            "torch.float64 (float64 runs on the reference backend)")):
        _run_with(wide, {k: v.double() if v is not None else None for k, v in out.items()})
    for name, bad in (("R", x["R"].bfloat16()), ("dh0", out["dh0"].half()),
                      ("pre_x", x["pre_x"].double())):
        with pytest.raises(ValueError, match=re.escape(
                f"{name}: expected dtype torch.float32 (dy's), got {bad.dtype}")):
            _run_with(x, out, **{name: bad})
    with pytest.raises(ValueError, match="R: expected a tensor, got ndarray"):
        _run_with(x, out, R=x["R"].numpy())


def test_split_k_backward_names_a_tensor_on_another_device(monkeypatch):
    """Every tensor on dy's device, info's index tensors too, and that a GPU unless the
    interpreter runs the kernels: without the check a tensor elsewhere reached Triton's
    launch, whose errors name no argument. (meta stands in for another device here.)"""
    x = _inputs("lstm", 16, [2, 1], seed=0)
    out = _outputs("lstm", 16, x["info"])
    for name, t in (("R", x["R"]), ("c_prev", x["c_prev"]), ("dc0", out["dc0"])):
        with pytest.raises(ValueError, match=re.escape(
                f"{name}: expected a tensor on cpu (dy's), got meta")):
            _run_with(x, out, **{name: t.to("meta")})
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v
            for k, v in (*x.items(), *out.items())}
    with pytest.raises(ValueError, match=re.escape(
            "info: expected its index tensors on meta (dy's), got cpu")):
        _run_with(meta, {})
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # (read at the call: nothing is launched)
    with pytest.raises(ValueError, match=re.escape(
            "dy: expected a CUDA tensor (or TRITON_INTERPRET=1 for the interpreter), got "
            "device cpu")):
        _run_with(x, out)


@pytest.mark.parametrize("bad", ["1-D", "3-D", "None"])
def test_split_k_backward_names_a_weight_matrix_of_another_rank(bad):
    """R is [G * H, H]: one of another rank, or none, is named before its shape is unpacked
    (which failed with "not enough values to unpack", naming nothing)."""
    x = _inputs("lstm", 16, [2, 1], seed=0)
    out = _outputs("lstm", 16, x["info"])
    R, got = {"1-D": (x["R"].flatten(), "shape [1024]"), "3-D": (x["R"][None], "shape [1, 64, 16]"),
              "None": (None, "None")}[bad]
    with pytest.raises(ValueError, match=re.escape(
            f"R: expected a 2-D tensor [4 * H, H] for cell 'lstm', got {got}")):
        _run_with(x, out, R=R)


@pytest.mark.parametrize("one_barrier", [False, True], ids=["two-barriers", "one-barrier"])
def test_launches_without_barriers_take_any_length(monkeypatch, one_barrier):
    """The grid barrier's int32 counter bounds one persistent launch's steps (barriers x
    programs < 2**31); launches of one step each meet no barrier, so no length is refused for
    it. Many programs stand in for a long sequence (the launches are recorded, not run)."""
    from tritonrnn.kernels import split_k

    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, kw["BARRIER"]))

    real_tiles = split_k.tiles
    monkeypatch.setattr(split_k, "tiles", lambda *a: (2**30, *real_tiles(*a)[1:]))
    monkeypatch.setattr(split_k, "_split_k1_bwd_kernel" if one_barrier
                        else "_split_k_bwd_kernel", Recorder())
    x = _inputs("lstm", 16, [2, 1], seed=0)
    out = _outputs("lstm", 16, x["info"])
    args = {k: v for k, v in x.items() if k != "cell"}
    split_k_backward("lstm", **args, reverse=False, **out, units=16, kblock=64, btile=16,
                     persistent=False, one_barrier=one_barrier)
    steps = x["info"].max_len + 1
    assert launches == [((2**30,), 0)] * (steps * (1 if one_barrier else 2))


@pytest.mark.parametrize("one_barrier", [False, True], ids=["two-barriers", "one-barrier"])
def test_a_single_programs_launch_meets_its_barriers(monkeypatch, one_barrier):
    """One program runs every step in one launch, its barriers compiled in, in the interpreter
    too (it never waits for another program): the same results as a launch per step, bit for
    bit; with the counter one arrival short of every target (`_barrier_extra`), the first
    wait times out and the launch raises. In the two-barrier form that wait precedes the
    first cell phase, so no gradient was written (a wait that passed a sub-step early would
    have run it)."""
    from tritonrnn.kernels import split_k
    from tritonrnn.kernels.grid_barrier import BarrierTimeoutError

    monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", "sync")  # the launch itself raises
    cell, H, lengths = "lstm", 16, [3, 0, 2]
    tile = dict(units=16, kblock=64, btile=32, one_barrier=one_barrier)
    assert tiles(cell, H, len(lengths), 16, 64, 32, one_barrier)[0] == 1
    x = _inputs(cell, H, lengths, seed=3)
    args = {k: v for k, v in x.items() if k != "cell"}
    got = {}
    for persistent in (True, False):
        got[persistent] = _outputs(cell, H, x["info"])
        split_k_backward(cell, **args, reverse=True, **got[persistent], **tile,
                         persistent=persistent)
    for name, v in got[True].items():
        if v is not None:
            assert torch.equal(v, got[False][name]), name
    out = _outputs(cell, H, x["info"])
    with pytest.raises(BarrierTimeoutError, match="split_k_backward: .*grid barrier timed out"):
        split_k_backward(cell, **args, reverse=True, **out, **tile, _max_spin=64,
                         _barrier_extra=1)
    if not one_barrier:
        assert out["dpre_x"].isnan().all() and out["dh0"].isnan().all()
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **kw: launches.append(kw["BARRIER"])

    monkeypatch.setattr(split_k, "_split_k1_bwd_kernel" if one_barrier
                        else "_split_k_bwd_kernel", Recorder())
    split_k_backward(cell, **args, reverse=True, **_outputs(cell, H, x["info"]), **tile)
    assert launches == [1]


# (units, kblock per gate, btile): the two-barrier form (each cell run by one program), the
# one-barrier form with 4 programs in each K block (the stepwise launches run them one after
# another, so a gradient stored before every program of its K block has read that step's
# pre-activations is read as one), and on one program (all steps in one launch: the
# gradients held in registers across the in-kernel loop's iterations).
OVER_FORMS = [(16, 16, False), (16, 16, True), (64, 64, True)]


@pytest.mark.parametrize("form", OVER_FORMS, ids=["two-barriers", "one-barrier",
                                                  "one-barrier-one-program"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_split_k_backward_writes_over_the_preacts(cell, form):
    """The Triton backend writes the gradients over the pre-activations
    (`planner.backward_writes_over_preacts`): dpre_x into pre_x, GRU's dpre_h into pre_h.
    Both forms give the reference's gradients so; the one-barrier form stores each step's
    gradients one iteration late, once every program of a K block has read them."""
    units, kb, one_barrier = form
    H = 64 if units < 64 else units
    lengths = [4, 1, 0, 4, 2, 3] if units < 64 else [4, 1, 0, 4, 2, 3, 4, 4]
    x = _inputs(cell, H, lengths, seed=3)
    want = _reference(x, False)
    pre_x, pre_h = x["pre_x"].clone(), x["pre_h"].clone()
    got = _outputs(cell, H, x["info"])
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    kblock = G * kb if one_barrier else 4 * kb
    split_k_backward(cell, pre_x, pre_h, x["R"], x["y"], x["h_prev"], x["c_seq"],
                     x["c_prev"], x["dy"], x["dhT"], x["dcT"], x["info"], False, pre_x,
                     pre_h if cell == "gru" else None, got["dh0"], got["dc0"], units=units,
                     kblock=kblock, btile=16, one_barrier=one_barrier)
    _close(pre_x, want["dpre_x"], "dpre_x")
    if cell == "gru":
        _close(pre_h, want["dpre_h"], "dpre_h")
    for name in ("dh0", "dc0"):
        if want[name] is not None:
            _close(got[name], want[name], name)


@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "over-preacts"])
def test_a_run_past_the_barrier_counter_launches_per_step_with_its_held_buffer(monkeypatch,
                                                                               in_place):
    """A persistent launch whose barriers would overflow the int32 counter (barriers x
    programs > _COUNTER_LIMIT, some 16 million steps) runs a launch per step instead, and
    the one-barrier form then needs its HELD buffer: without it each launch parked its
    gradients in dpre_x's first rows (other steps' gradients, or pre-activations not yet
    read). One program runs all steps in one launch in the interpreter too; a limit of 2
    stands in for the length."""
    from tritonrnn.kernels import split_k

    cell, H = "lstm", 64
    x = _inputs(cell, H, [4, 1, 0, 4, 2, 3, 4, 4], seed=3)
    want = _reference(x, False)
    launches, kernel = [], split_k._split_k1_bwd_kernel

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(split_k, "_split_k1_bwd_kernel", Counted())
    monkeypatch.setattr(split_k, "_COUNTER_LIMIT", 2)
    pre_x, got = x["pre_x"].clone(), _outputs(cell, H, x["info"])
    dpre_x = pre_x if in_place else got["dpre_x"]
    split_k_backward(cell, pre_x, x["pre_h"], x["R"], x["y"], x["h_prev"], x["c_seq"],
                     x["c_prev"], x["dy"], x["dhT"], x["dcT"], x["info"], False, dpre_x, None,
                     got["dh0"], got["dc0"], units=64, kblock=256, btile=16, one_barrier=True,
                     persistent=True)
    assert launches == [(1,)] * (x["info"].max_len + 1)  # one program, a launch per step
    _close(dpre_x, want["dpre_x"], "dpre_x")
    for name in ("dh0", "dc0"):
        _close(got[name], want[name], name)


def test_workspace_holds_gradients_only_between_launches():
    """The one-barrier form's HELD buffer (the gradients a launch leaves for the next) only
    where its steps take several launches: stepwise, or the interpreter's persistent launch
    of more than one program; one launch on a GPU, or of one program, leaves nothing. The
    two-barrier form has none."""
    many = ("lstm", 64, 16, 16, 64, 16)  # 16 programs
    assert "held" not in workspace(*many, True)  # a GPU's one launch
    assert workspace(*many, True, persistent=False)["held"] == (4, 16, 64)
    assert workspace(*many, True, on_gpu=False)["held"] == (4, 16, 64)
    one = ("lstm", 64, 16, 64, 256, 16)  # one program
    assert tiles(*one, one_barrier=True)[0] == 1
    assert "held" not in workspace(*one, True, on_gpu=False)
    assert "held" not in workspace(*many, False, persistent=False)
