"""Every kernel launch runs under a device guard for its own tensors.

Triton launches on the current CUDA device, not on the tensors': a layer whose tensors sit
on cuda:1 while cuda:0 is current would run its kernels on the wrong GPU. Each launcher
therefore enters `torch.cuda.device_of(<one of its tensors>)` around the launch. A test
with two GPUs would need a machine CI does not have; here each kernel object is wrapped to
record, at every launch, the device of the innermost guard entered (a recording
`device_of`) and the devices of the launch's tensor arguments. On the CPU both are "cpu",
so what this checks is that no launch path runs outside a guard taken on its tensors.
"""

from __future__ import annotations

import contextlib
import traceback

import pytest
import torch
from helpers import compare_with_torch
from torch.utils._python_dispatch import TorchDispatchMode

from tritonrnn.kernels import dropout, persistent_cta, persistent_grid, split_k
from tritonrnn.rnn.planner import plan_constraints

KERNELS = [
    (persistent_cta, "_cta_forward_kernel"),
    (persistent_cta, "_cta_backward_kernel"),
    (persistent_grid, "_grid_fwd_kernel"),
    (persistent_grid, "_grid_bwd_kernel"),
    (split_k, "_split_k_bwd_kernel"),
    (split_k, "_split_k1_bwd_kernel"),
    (dropout, "_dropout_kernel"),
]


class _Recorded:
    """Stands in for a kernel: `k[grid](*args)` notes the guard's device, then launches."""

    def __init__(self, name, kernel, guards, launches):
        self.name, self.kernel, self.guards, self.launches = name, kernel, guards, launches

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            devices = {a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
            self.launches.append((self.name, self.guards[-1] if self.guards else None, devices))
            return launch(*args, **kwargs)

        return run


@pytest.fixture
def launches(monkeypatch):
    guards: list[torch.device] = []
    seen: list = []

    @contextlib.contextmanager
    def device_of(obj):
        guards.append(obj.device)
        try:
            yield
        finally:
            guards.pop()

    monkeypatch.setattr(torch.cuda, "device_of", device_of)
    for module, name in KERNELS:
        monkeypatch.setattr(module, name, _Recorded(name, getattr(module, name), guards, seen))
    return seen


# (constraints, layers, dropout, the kernels the run must launch)
CASES = {
    "cta": (dict(family="persistent_cta"), 1, 0.0,
            {"_cta_forward_kernel", "_cta_backward_kernel"}),
    "grid": (dict(family="persistent_grid", block_h=16), 1, 0.0,
             {"_grid_fwd_kernel", "_grid_bwd_kernel"}),
    "split_k": (dict(family="persistent_grid", block_h=16, split_k_bwd=2), 1, 0.0,
                {"_grid_fwd_kernel", "_split_k_bwd_kernel"}),
    "split_k1": (dict(family="persistent_grid", block_h=16, split_k_bwd=1), 1, 0.0,
                 {"_grid_fwd_kernel", "_split_k1_bwd_kernel"}),
    "dropout": (dict(family="persistent_cta"), 2, 0.5,
                {"_cta_forward_kernel", "_cta_backward_kernel", "_dropout_kernel"}),
}


@pytest.mark.parametrize("case", CASES)
def test_every_launch_is_guarded_on_its_tensors_device(case, launches):
    constraints, layers, p, want = CASES[case]
    with plan_constraints(**constraints):
        if p:
            _run_with_dropout(layers, p)
        else:
            compare_with_torch("lstm", L=layers, lengths="varlen", I=4, H=32, T=3,
                               backend="triton", dtype=torch.float32, rtol=2e-5, atol=2e-5)
    assert {name for name, _, _ in launches} == want
    for name, guard, devices in launches:
        assert guard is not None, f"{name} launched outside a device guard"
        assert devices == {guard}, f"{name}: guard on {guard}, tensors on {devices}"


def _run_with_dropout(layers, p):
    from tritonrnn.rnn import cudnn_rnn, params_size

    T, B, I, H = 3, 2, 4, 32
    g = torch.Generator().manual_seed(0)
    n = params_size(rnn_mode="lstm", num_layers=layers, num_units=H, input_size=I)
    x = torch.randn(T, B, I, generator=g).requires_grad_()
    h0, c0 = torch.zeros(layers, B, H), torch.zeros(layers, B, H)
    params = (torch.randn(n, generator=g) * 0.1).requires_grad_()
    res = cudnn_rnn(x, h0, c0, params, torch.tensor([3, 2]), rnn_mode="lstm", dropout=p,
                    seed=1, seed2=2, backend="triton")
    res.output.sum().backward()


class _HostValues(TorchDispatchMode):
    """Records where kernels/ turns a host value into a tensor (`aten.lift_fresh`: a Python
    scalar or list assigned into, or made into, a tensor). On a GPU that is a copy from
    pageable host memory, which waits for the stream: a host sync per launch, which the
    deferred barrier check and the layer pipeline exist to avoid, and which a CUDA-graph
    capture refuses."""

    def __init__(self):
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.lift_fresh.default:
            inner = [f for f in traceback.extract_stack() if "/kernels/" in f.filename]
            if inner:
                self.sites.append(f"kernels/{inner[-1].filename.rsplit('/', 1)[-1]}:"
                                  f"{inner[-1].lineno}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("case", ["cta", "grid", "split_k", "split_k1"])
def test_no_launcher_copies_host_values_to_the_device(case, bidirectional):
    """Every launcher of kernels/ (both directions, both split-K forms) writes its
    workspaces with device ops only; the caller's layout and params are on the device
    already. (`sync[0, 0] = x` in the split-K launcher did, once per backward.)"""
    constraints, layers, _, _ = CASES[case]
    # The interpreter's own probe (host tensors, once per process: never on a GPU) first.
    persistent_cta._interpreter_loops_to_tensors()
    mode = _HostValues()
    with plan_constraints(**constraints), mode:
        compare_with_torch("lstm", L=layers, bidirectional=bidirectional, lengths="varlen",
                           I=4, H=32, T=3, backend="triton", dtype=torch.float32, rtol=2e-5,
                           atol=2e-5)
    assert mode.sites == []
