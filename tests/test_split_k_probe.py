"""scripts/split_k_probe.py, the split-K backward step a GPU session times (not a library
path): its kernel against the float64 recurrence in the interpreter (one launch per step and
phase, as on a GPU in one launch), its tiling rules and their errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("split_k_probe",
                                               ROOT / "scripts" / "split_k_probe.py")
PROBE = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(PROBE)

# (H, B, T, U, KB, BB): every unit block's K blocks each with a cell slice (NK * US = U), and
# unit blocks with more K blocks than slices (NK = 3, US = 8: one program per block only
# meets the barriers), two batch tiles each, on phase A's four accumulators; then two and
# one (`split`: [BB, U] tiles of 2048 and 8192 elements).
SHAPES = [(32, 32, 5, 16, 64, 16), (48, 32, 4, 16, 64, 16), (64, 32, 3, 64, 64, 32),
          (128, 64, 2, 128, 128, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "H{}-B{}-T{}-U{}-KB{}-BB{}".format(*s))
def test_probe_matches_the_float64_recurrence(shape):
    H, B, T, U, KB, BB = shape
    assert PROBE.split(U, BB) == {16: 4, 32: 4, 64: 2, 128: 1}[U]
    x = PROBE.inputs(H, B, T, torch.float32, "cpu", seed=3)
    dph, dc = PROBE.launch(x["R"], x["ACT"], x["C"], x["DY"], U=U, KB=KB, BB=BB)
    ref_dph, ref_dc = PROBE.reference(x["R"], x["ACT"], x["C"], x["DY"])
    assert dph.shape == ref_dph.shape and dc.shape == ref_dc.shape
    torch.testing.assert_close(dph.double(), ref_dph, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(dc.double(), ref_dc, rtol=2e-5, atol=2e-5)
    assert ref_dph.abs().max() > 0.1  # the comparison sees real values


def test_probe_reference_is_the_lstm_backward():
    """The probe's recurrence is an LSTM's backward: autograd through the forward that made
    its gates and cell states, with loss sum_t <h_t, dy_t>, gives the same gate
    pre-activation gradients (dph), dc0, and dh0 = dph[0] @ R."""
    torch.manual_seed(0)
    H, B, T = 8, 3, 4
    R = torch.randn(4 * H, H, dtype=torch.float64) / H ** 0.5
    xs = torch.randn(T, B, 4 * H, dtype=torch.float64)
    dy = torch.randn(T, B, H, dtype=torch.float64)
    h0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    h, c, pres, acts, cs, loss = h0, c0, [], [], [c0.detach()], 0.0
    for t in range(T):
        pre = xs[t] + h @ R.t()
        pre.retain_grad()
        pres.append(pre)
        i, f, g, o = pre.split(H, dim=1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        acts.append(torch.cat([i, f, g, o], 1).detach())
        c = f * c + i * g
        h = o * c.tanh()
        cs.append(c.detach())
        loss = loss + (h * dy[t]).sum()
    loss.backward()
    dph, dc = PROBE.reference(R, torch.stack(acts), torch.stack(cs), dy)
    torch.testing.assert_close(dph, torch.stack([p.grad for p in pres]))
    torch.testing.assert_close(dc, c0.grad)
    torch.testing.assert_close(dph[0] @ R, h0.grad)


@pytest.mark.parametrize(("args", "message"), [
    ((1024, 256, 96, 512, 128), "powers of two"),
    ((1024, 256, 128, 32, 128), "64 <= KB"),
    ((1000, 256, 128, 512, 128), "U | H"),
    ((1024, 200, 128, 512, 128), "BB | B"),
])
def test_probe_tiles_refuse_what_does_not_divide(args, message):
    with pytest.raises(ValueError, match=message):
        PROBE.tiles(*args)


def test_probe_tiles_of_the_timed_shapes():
    """H=1024 and H=768 at B=256 (gpu_session.sh splitk): co-resident on an H100's 132 SMs;
    at H=768 each unit block has 6 K blocks and 4 cell slices of 32 units."""
    assert PROBE.tiles(1024, 256, 128, 512, 128) == (128, 8, 16)
    assert PROBE.tiles(768, 256, 128, 512, 128) == (72, 6, 32)
