"""Non-finite data (NaN, inf) goes where torch.nn puts it, in every output and gradient, in
every family: a kernel must not hide a NaN (a relu whose max returned the other operand gave 0
in place of torch's NaN, and the gradients downstream were made up). Padding stays exactly 0.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import make_case, params_from_module, torch_oracle

from tritonrnn.rnn import cudnn_rnn
from tritonrnn.rnn.planner import plan_constraints

MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
LENS = [4, 3, 1]
T, I, H = 4, 3, 5
NAN, INF = float("nan"), float("inf")


def _check(mode, backend, family, *, x_at=None, h0_at=None, r_at=None, value=NAN, seed=0,
           device="cpu"):
    module, x, h0, c0, lens = make_case(mode, I, H, 1, False, 0, T, LENS, True, seed)
    if x_at is not None:
        x[x_at] = value
    if h0_at is not None:
        h0[h0_at] = value
    if r_at is not None:
        with torch.no_grad():
            module.weight_hh_l0[r_at] = value
    g = torch.Generator().manual_seed(seed + 1)
    grads = (torch.randn(T, len(LENS), H, generator=g, dtype=torch.float64),
             torch.randn(h0.shape, generator=g, dtype=torch.float64),
             torch.randn(c0.shape, generator=g, dtype=torch.float64) if c0 is not None else None)
    want = torch_oracle(module, x, h0, c0, lens, True, grads)
    dtype = torch.float64 if backend == "reference" else torch.float32
    tol = dict(rtol=1e-10, atol=1e-10) if backend == "reference" else dict(rtol=2e-5,
                                                                            atol=2e-5)
    leaves = [t.to(device=device, dtype=dtype).requires_grad_(True) if t is not None else None
              for t in (x, h0, c0, params_from_module(module))]
    ctx = plan_constraints(family=family) if family else contextlib.nullcontext()
    with ctx:
        res = cudnn_rnn(*leaves, lens, rnn_mode=mode, backend=backend)
        loss = sum((o * d.to(device=device, dtype=dtype)).sum() for o, d in
                   zip((res.output, res.output_h, res.output_c), grads, strict=True)
                   if d is not None)
        got = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    pairs = {"output": (res.output, want["output"]), "output_h": (res.output_h,
                                                                  want["output_h"]),
             "dx": (got[0], want["dx"]), "dh0": (got[1], want["dh0"]),
             "dparams": (got[-1], params_from_module(module, tensors=want["dparams"]))}
    if c0 is not None:
        pairs.update(output_c=(res.output_c, want["output_c"]), dc0=(got[2], want["dc0"]))
    # The case reaches the results (a saturated gate can keep an inf out of the outputs,
    # not out of the gradients: 0 * inf).
    assert not all(b.isfinite().all() for _, b in pairs.values())
    for name, (a, b) in pairs.items():
        torch.testing.assert_close(a.detach().cpu().double(), b, equal_nan=True, **tol,
                                   msg=lambda m, n=name: f"{n}: {m}")
    for b, n in enumerate(LENS):  # padding: exactly 0, whatever the valid steps hold
        assert (res.output[n:, b] == 0).all() and (got[0][n:, b] == 0).all()


FAMILIES = [("reference", None), ("triton", "persistent_cta"), ("triton", "persistent_grid"),
            ("triton", "stepwise")]


@pytest.mark.parametrize("backend, family", FAMILIES, ids=["reference", "cta", "grid", "step"])
@pytest.mark.parametrize("mode", MODES)
def test_a_nan_input_step_gives_torchs_nans(mode, backend, family):
    _check(mode, backend, family, x_at=(1, 0, 0))


@pytest.mark.parametrize("case", [dict(h0_at=(0, 1, 2)), dict(r_at=(0, 0)),
                                  dict(x_at=(1, 0, 0), value=INF),
                                  dict(x_at=(2, 1, 1), value=-INF)],
                         ids=["nan-h0", "nan-R", "inf-x", "minus-inf-x"])
@pytest.mark.parametrize("mode", MODES)
def test_nonfinite_states_weights_and_inputs_give_torchs(mode, case):
    _check(mode, "triton", None, **case)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["persistent_cta", "persistent_grid", "stepwise"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_a_nan_input_step_gives_torchs_nans(mode, family):
    # The compiled max / where (max.NaN on sm_80 and newer), not the interpreter's NumPy.
    _check(mode, "triton", family, x_at=(1, 0, 0), device="cuda")
