"""The Triton pointwise cell helpers against the pure-PyTorch reference cells."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tritonrnn.kernels import cells
from tritonrnn.rnn import reference

N, H = 8, 16  # powers of two so the tiles need no masks
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter runs CPU tensors


@triton.jit
def _cells_kernel(X, Hs, HP, C, CP, DM, DC, OUT, CELL: tl.constexpr, N: tl.constexpr,
                  H: tl.constexpr):
    rows = tl.arange(0, N)[:, None]
    cols = tl.arange(0, H)[None, :]
    at = rows * H + cols
    g = N * H
    x0 = tl.load(X + at)
    x1 = tl.load(X + g + at)
    x2 = tl.load(X + 2 * g + at)
    x3 = tl.load(X + 3 * g + at)
    h0 = tl.load(Hs + at)
    h1 = tl.load(Hs + g + at)
    h2 = tl.load(Hs + 2 * g + at)
    h3 = tl.load(Hs + 3 * g + at)
    hp = tl.load(HP + at)
    cp = tl.load(CP + at)
    m, c_new = cells.cell_forward(CELL, x0, x1, x2, x3, h0, h1, h2, h3, hp, cp)
    c = tl.load(C + at)
    dm = tl.load(DM + at)
    dc = tl.load(DC + at)
    dx0, dx1, dx2, dx3, dh2, direct, dcp, mm = cells.cell_backward(
        CELL, x0, x1, x2, x3, h0, h1, h2, h3, dm, m, hp, c, cp, dc
    )
    tl.store(OUT + at, m)
    tl.store(OUT + g + at, c_new)
    tl.store(OUT + 2 * g + at, dx0)
    tl.store(OUT + 3 * g + at, dx1)
    tl.store(OUT + 4 * g + at, dx2)
    tl.store(OUT + 5 * g + at, dx3)
    tl.store(OUT + 6 * g + at, dh2)
    tl.store(OUT + 7 * g + at, direct)
    tl.store(OUT + 8 * g + at, dcp)
    tl.store(OUT + 9 * g + at, mm)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("scale", [1.0, 60.0], ids=["normal", "extreme"])
def test_cell_helpers_match_reference(cell, scale):
    g = torch.Generator().manual_seed(1)
    rnd = lambda *s: torch.randn(*s, generator=g) * scale  # noqa: E731
    X, Hs = rnd(4, N, H), rnd(4, N, H)
    hp, cp, c = rnd(N, H), rnd(N, H), rnd(N, H)
    dm, dc = torch.randn(N, H, generator=g), torch.randn(N, H, generator=g)
    out = torch.full((10, N, H), float("nan"), device=DEVICE)
    dev = [t.to(DEVICE) for t in (X, Hs, hp, c, cp, dm, dc)]
    _cells_kernel[(1,)](*dev, out, CELL=cells.CELL_IDS[cell], N=N, H=H)
    out = out.cpu()
    G = cells.NUM_GATES[cells.CELL_IDS[cell]]
    px = torch.cat(list(X[:G]), 1).double()
    ph = torch.cat(list(Hs[:G]), 1).double()
    lstm = cell == "lstm"
    # fp32 kernels against a float64 oracle on the same fp32 inputs: the rounding error of an
    # fp32 intermediate grows with the inputs' magnitude, so atol scales with it.
    tol = dict(rtol=1e-5, atol=1e-6 * scale)
    m, c_new = reference.cell_forward(cell, px, ph, hp.double(), cp.double() if lstm else None)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0].double(), m, **tol)
    if lstm:
        torch.testing.assert_close(out[1].double(), c_new, **tol)
    dpx, dph, direct, dcp, mm = reference.cell_backward(
        cell, px, ph, dm.double(), m, hp.double(), c.double() if lstm else None,
        cp.double() if lstm else None, dc.double() if lstm else None,
    )
    got_dx = torch.cat(list(out[2 : 2 + G]), 1).double()
    torch.testing.assert_close(got_dx, dpx, **tol)
    if G >= 3:
        torch.testing.assert_close(out[6].double(), dph[:, 2 * H : 3 * H], **tol)
    if direct is not None:
        torch.testing.assert_close(out[7].double(), direct, **tol)
    if lstm:
        torch.testing.assert_close(out[8].double(), dcp, **tol)
        torch.testing.assert_close(out[9].double(), mm, **tol)


@pytest.mark.parametrize("x", [-1000.0, -88.5, -44.5, -10.0, 0.0, 10.0, 44.5, 1000.0])
def test_activations_saturate_without_nan(x):
    @triton.jit
    def k(X, OUT):
        v = tl.load(X)
        tl.store(OUT, cells.sigmoid(v))
        tl.store(OUT + 1, cells.tanh(v))

    out = torch.empty(2, device=DEVICE)
    k[(1,)](torch.tensor([x], device=DEVICE), out)
    out = out.cpu()
    ref = torch.tensor([x], dtype=torch.float64)
    torch.testing.assert_close(out.double(), torch.cat([ref.sigmoid(), ref.tanh()]))
