"""Test helpers: torch.nn oracles, conversion of their state dicts into flat params, the Triton
release the compile-cost tests assert for, and the loading of scripts run by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch

from tritonrnn.rnn import canonical_to_params

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
ROOT = Path(__file__).resolve().parents[1]


# The Triton release the `compiler_specific` tests assert for: what a kernel compiles to
# (spills, instruction and MMA counts, shared memory against the planner's estimates) is the
# business of the GPU machines' release, on whose compiles the planner's rules are calibrated
# (scripts/test_triton36.sh runs them there). Another release compiles differently, and the
# newest one changes with each PyPI release, not with this code.
CALIBRATION_TRITON = "3.6"


# A stand-in for `python`, `nvidia-smi` and `ncu` on a GPU session stage's PATH: it runs the
# recorder script given with its own name and arguments.
_STUB = """#!/bin/sh
exec "{py}" "{recorder}" "$(basename "$0")" "$@"
"""


def run_gpu_session(stage: str, tmp_path: Path, recorder: str, returncode: int = 0,
                    stderr: list[str] | None = None) -> list:
    """Runs `scripts/gpu_session.sh <stage>` with python, nvidia-smi and ncu replaced by
    `recorder` (Python source that appends one JSON line a call to $STUB_LOG; $OUT, $WORK
    and $STAGE are set for it) and returns those lines, parsed. The stage must exit with
    `returncode`, its stderr's last line holding each of `stderr`."""
    import json
    import os
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = tmp_path / "recorder.py"
    script.write_text(recorder)
    for name in ("python", "nvidia-smi", "ncu"):
        stub = bin_dir / name
        stub.write_text(_STUB.format(py=sys.executable, recorder=script))
        stub.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log),
           "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "STAGE": stage}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), stage], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == returncode, r.stderr
    last = (r.stderr.splitlines() or [""])[-1]
    assert all(s in last for s in stderr or []), r.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def compile_costs_apply(triton_version: str) -> bool:
    """Whether the `compiler_specific` tests run under this Triton release."""
    return triton_version.split("+")[0].split(".")[:2] == CALIBRATION_TRITON.split(".")


def load_script(name: str, folder: str = "scripts") -> ModuleType:
    """The module of `<root>/<folder>/<name>.py`, a script rather than a package module (the
    scripts and examples are run by path, not installed), loaded under the name `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stepwise_runs(hoistable: bool) -> bool:
    """Whether a stepwise-family case of the grid kernels runs here. In the interpreter a grid
    of several programs runs one sub-step per launch, persistent or not, and the launches
    differ only where the persistent one hoists its weights (HOIST: resident MMA tiles
    without a projection; test_kernels_grid.py::test_interpreted_launches_differ_only_in_hoist
    checks it): a stepwise case whose persistent twin cannot hoist (streamed weights, a
    projection) would repeat it, and runs on a GPU only, where the families launch
    differently."""
    return torch.cuda.is_available() or hoistable


def make_torch_rnn(mode: str, I: int, H: int, L: int, bidirectional: bool, proj: int = 0,
                   dtype=torch.float64) -> torch.nn.RNNBase:
    """The torch.nn module with the same equations as (mode, ...)."""
    if mode == "lstm":
        m = torch.nn.LSTM(I, H, L, bidirectional=bidirectional, proj_size=proj)
    elif mode == "gru":
        m = torch.nn.GRU(I, H, L, bidirectional=bidirectional)
    else:
        m = torch.nn.RNN(I, H, L, nonlinearity=mode[4:], bidirectional=bidirectional)
    return m.to(dtype)


def _suffixes(module: torch.nn.RNNBase) -> list[str]:
    dirs = ["", "_reverse"] if module.bidirectional else [""]
    return [f"l{layer}{d}" for layer in range(module.num_layers) for d in dirs]


def canonical_from_module(module: torch.nn.RNNBase, *, skip_input: bool = False,
                          tensors: dict | None = None):
    """(weights, biases) canonical lists from a torch.nn module's parameters (or from
    `tensors`, a dict with the same names, e.g. its gradients)."""
    G = GATES[_mode(module)]
    src = tensors if tensors is not None else dict(module.named_parameters())
    weights, biases = [], []
    for i, sfx in enumerate(_suffixes(module)):
        if not (skip_input and i < (2 if module.bidirectional else 1)):
            weights += list(src[f"weight_ih_{sfx}"].chunk(G))
        weights += list(src[f"weight_hh_{sfx}"].chunk(G))
        if f"weight_hr_{sfx}" in src:
            weights.append(src[f"weight_hr_{sfx}"])
        biases += list(src[f"bias_ih_{sfx}"].chunk(G)) + list(src[f"bias_hh_{sfx}"].chunk(G))
    return weights, biases


def _mode(module) -> str:
    if isinstance(module, torch.nn.LSTM):
        return "lstm"
    if isinstance(module, torch.nn.GRU):
        return "gru"
    return "rnn_" + module.nonlinearity


def params_from_module(module: torch.nn.RNNBase, *, skip_input: bool = False,
                       tensors: dict | None = None) -> torch.Tensor:
    """tritonrnn's flat params holding a torch.nn module's weights (detached copy)."""
    weights, biases = canonical_from_module(module, skip_input=skip_input, tensors=tensors)
    return canonical_to_params(
        [w.detach() for w in weights], [b.detach() for b in biases],
        rnn_mode=_mode(module), num_layers=module.num_layers, num_units=module.hidden_size,
        input_size=module.input_size, input_mode="skip_input" if skip_input else "linear_input",
        direction="bidirectional" if module.bidirectional else "unidirectional",
        num_proj=getattr(module, "proj_size", 0),
    )


def run_torch(module, x, h0, c0, lengths, time_major: bool):
    """torch.nn forward on padded input with lengths (via pack_padded_sequence).
    Returns (output padded to x's time length, h_n, c_n or None); zeros at padding."""
    T = x.shape[0] if time_major else x.shape[1]
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        x, lengths.cpu(), batch_first=not time_major, enforce_sorted=False
    )
    hx = (h0, c0) if isinstance(module, torch.nn.LSTM) else h0
    out, hn = module(packed, hx)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(
        out, batch_first=not time_major, total_length=T
    )
    if isinstance(module, torch.nn.LSTM):
        return out, hn[0], hn[1]
    return out, hn, None


def _batch_axis(time_major: bool) -> int:
    return 1 if time_major else 0


def _state_axis(time_major: bool) -> int:
    return 1 if time_major else 0


def make_case(mode, I, H, L, bidirectional, proj, T, lengths, time_major, seed=0,
              dtype=torch.float64):
    """A seeded torch.nn module plus random inputs in the op's layouts (float64 leaves)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    module = make_torch_rnn(mode, I, H, L, bidirectional, proj)
    B = len(lengths)
    D = 2 if bidirectional else 1
    Hout = proj or H
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = rnd(T, B, I) if time_major else rnd(B, T, I)
    h0 = rnd(L * D, B, Hout) if time_major else rnd(B, L * D, Hout)
    c0 = (rnd(L * D, B, H) if time_major else rnd(B, L * D, H)) if mode == "lstm" else None
    lens = torch.tensor(lengths, dtype=torch.int64)
    return module, x, h0, c0, lens


def torch_oracle(module, x, h0, c0, lens, time_major, grads):
    """Outputs and input/state/param gradients of torch.nn (float64) for the op's layouts.

    grads = (d_output, d_h, d_c): gradients of the op's outputs. Length-0 sequences (which
    pack_padded_sequence rejects) are handled by hand: zero output, state passed through."""
    bax = _batch_axis(time_major)
    keep = (lens > 0).nonzero().flatten()
    x_ = x.detach().clone().requires_grad_(True)
    h0_ = h0.detach().clone().requires_grad_(True)
    c0_ = c0.detach().clone().requires_grad_(True) if c0 is not None else None
    tm = lambda t: t if time_major else t.transpose(0, 1)  # noqa: E731 (state layout)
    out = torch.zeros(*x.shape[:2], grads[0].shape[2], dtype=x.dtype, device=x.device)
    hn = tm(h0_).clone()
    cn = tm(c0_).clone() if c0_ is not None else None
    if keep.numel():
        kd = keep.to(x.device)
        o, h, c = run_torch(
            module, x_.index_select(bax, kd), tm(h0_).index_select(1, kd),
            tm(c0_).index_select(1, kd) if c0_ is not None else None, lens[keep], time_major,
        )
        out = out.index_copy(bax, kd, o)
        hn = hn.index_copy(1, kd, h)
        if cn is not None:
            cn = cn.index_copy(1, kd, c)
    hn, cn = tm(hn), (tm(cn) if cn is not None else None)
    loss = (out * grads[0]).sum() + (hn * grads[1]).sum()
    if cn is not None:
        loss = loss + (cn * grads[2]).sum()
    names = [n for n, _ in module.named_parameters()]
    leaves = [x_, h0_] + ([c0_] if c0_ is not None else []) + list(module.parameters())
    gs = torch.autograd.grad(loss, leaves, allow_unused=True)
    gs = [torch.zeros_like(v) if gv is None else gv for v, gv in zip(leaves, gs, strict=True)]
    k = 3 if c0_ is not None else 2
    return {
        "output": out.detach(), "output_h": hn.detach(),
        "output_c": cn.detach() if cn is not None else None,
        "dx": gs[0], "dh0": gs[1], "dc0": gs[2] if c0_ is not None else None,
        "dparams": dict(zip(names, gs[k:], strict=True)),
    }


LENGTHS = {
    "full": lambda T: [T, T, T],
    "varlen": lambda T: [3, T, 1, T - 2],  # unsorted
    "zero": lambda T: [2, 0, T, 0, 1],  # length-0 sequences
    "batch1": lambda T: [T - 1],
    "batch70": lambda T: [(37 * j) % (T + 1) for j in range(70)],  # 0..T, unsorted
}


def compare_with_torch(mode, *, L=1, bidirectional=False, lengths="varlen", time_major=True,
                       proj=0, I=5, H=7, T=6, backend="reference", dtype=torch.float64,
                       rtol=1e-10, atol=1e-10, seed=0, device="cpu", check=True):
    """Runs cudnn_rnn forward + autograd backward and checks every output and gradient
    against torch.nn in float64. Returns the max abs errors by name."""
    from tritonrnn.rnn import cudnn_rnn

    lens_list = LENGTHS[lengths](T)
    module, x, h0, c0, lens = make_case(mode, I, H, L, bidirectional, proj, T, lens_list,
                                        time_major, seed)
    D = 2 if bidirectional else 1
    Hout = proj or H
    params = params_from_module(module)
    g = torch.Generator().manual_seed(seed + 1)
    out_shape = (T, len(lens_list), D * Hout) if time_major else (len(lens_list), T, D * Hout)
    grads = (torch.randn(out_shape, generator=g, dtype=torch.float64),
             torch.randn(h0.shape, generator=g, dtype=torch.float64),
             torch.randn(c0.shape, generator=g, dtype=torch.float64) if c0 is not None else None)
    want = torch_oracle(module, x, h0, c0, lens, time_major, grads)
    leaves = [t.to(device=device, dtype=dtype).requires_grad_(True) if t is not None else None
              for t in (x, h0, c0, params)]
    xs, hs, cs, ps = leaves
    res = cudnn_rnn(xs, hs, cs, ps, lens, rnn_mode=mode, time_major=time_major,
                    direction="bidirectional" if bidirectional else "unidirectional",
                    num_proj=proj, backend=backend)
    gd = [t.to(device=device, dtype=dtype) if t is not None else None for t in grads]
    loss = (res.output * gd[0]).sum() + (res.output_h * gd[1]).sum()
    if cs is not None:
        loss = loss + (res.output_c * gd[2]).sum()
    got_grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    dparams_want = params_from_module(module, tensors=want["dparams"])
    pairs = {
        "output": (res.output, want["output"]),
        "output_h": (res.output_h, want["output_h"]),
        "dx": (got_grads[0], want["dx"]),
        "dh0": (got_grads[1], want["dh0"]),
        "dparams": (got_grads[-1], dparams_want),
    }
    if cs is not None:
        pairs["output_c"] = (res.output_c, want["output_c"])
        pairs["dc0"] = (got_grads[2], want["dc0"])
    errors = {}
    for name, (got, exp) in pairs.items():
        assert got.shape == exp.shape, f"{name}: shape {got.shape} != {exp.shape}"
        assert torch.isfinite(got).all(), f"{name}: non-finite values"
        got = got.detach().cpu().double()
        errors[name] = (got - exp).abs().max().item() if got.numel() else 0.0
        if not check:
            errors[name] /= max(1.0, exp.abs().max().item() if exp.numel() else 0.0)
            continue
        torch.testing.assert_close(got, exp, rtol=rtol, atol=atol, msg=lambda m,
                                   n=name: f"{n}: {m}")
    # Padded outputs are exactly zero, padded input gradients exactly zero, in every dtype
    # (check=False only leaves the tolerance to the caller).
    out = (res.output if time_major else res.output.transpose(0, 1)).cpu()
    dx = (got_grads[0] if time_major else got_grads[0].transpose(0, 1)).cpu()
    for b, n in enumerate(lens_list):
        assert (out[n:, b] == 0).all(), f"output at padded steps of sequence {b} is not 0"
        assert (dx[n:, b] == 0).all(), f"input gradient at padded steps of sequence {b} is not 0"
    if not check:
        return errors, (module, x, h0, c0, lens, grads, want, params)
    return errors
