"""pytest-benchmark of TensorArray per-op overhead: write, read, stack, grad, backward.

Run:  python -m pytest -q tests/test_tensorarray_bench.py --benchmark-only \
          --benchmark-columns=mean,median,min,rounds --benchmark-sort=name

Each benchmark's call does ``OPS`` ops (the loop an RNN runs), so the per-op cost is the
reported time divided by ``OPS``; it is also stored as ``extra_info["us_per_op"]`` (median) in
``--benchmark-json`` output. Element [B, H] = [16, 64] float32 on the CPU, one intra-op thread
(these are Python-overhead measurements; OpenMP scheduling on a shared machine would only add
noise). No timing assertions (target: a write or a read under 20 us on the CPU); each
benchmark checks the result of one more, untimed call (`run`'s check).
"""

from __future__ import annotations

import pytest
import torch

from tritonrnn.tensorarray import TensorArray

OPS = 100
B, H = 16, 64
ROUNDS = 30


def array(storage: str, size: int = OPS, **kw) -> TensorArray:
    shape = (B, H) if storage == "slab" else None
    return TensorArray(torch.float32, size, element_shape=shape, **kw)


def filled(storage: str, value: torch.Tensor, **kw) -> TensorArray:
    ta = array(storage, **kw)
    for i in range(OPS):
        ta = ta.write(i, value)
    return ta


def run(benchmark, fn, setup, check, ops: int = OPS):
    """Benchmark ``fn(*setup())`` and record the median per-op microseconds; then one more
    call, untimed, whose result ``check(result)`` must accept (a broken path fails here
    rather than being timed)."""
    benchmark.pedantic(fn, setup=lambda: (setup(), {}), rounds=ROUNDS, warmup_rounds=3)
    benchmark.extra_info["ops_per_call"] = ops
    if benchmark.stats is not None:  # None under --benchmark-disable (one plain run)
        benchmark.extra_info["us_per_op"] = benchmark.stats.stats.median / ops * 1e6
    check(fn(*setup()))


def _all(value: torch.Tensor):
    """A check: the result is OPS rows equal to `value`."""
    def check(got: torch.Tensor) -> None:
        assert torch.equal(got.detach(), value.detach().expand(OPS, *value.shape))
    return check


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


AUTOGRAD = [False, True]
AUTOGRAD_IDS = ["nograd", "autograd"]


@pytest.mark.parametrize("storage", ["slab", "list"])
@pytest.mark.parametrize("autograd", AUTOGRAD, ids=AUTOGRAD_IDS)
def test_bench_write(benchmark, storage, autograd):
    value = torch.randn(B, H, requires_grad=autograd)

    def writes(ta):
        for i in range(OPS):
            ta = ta.write(i, value)
        return ta

    run(benchmark, writes, lambda: (array(storage),), lambda ta: _all(value)(ta.stack()))


@pytest.mark.parametrize("storage", ["slab", "list"])
@pytest.mark.parametrize("autograd", AUTOGRAD, ids=AUTOGRAD_IDS)
def test_bench_read(benchmark, storage, autograd):
    value = torch.randn(B, H, requires_grad=autograd)

    def reads(ta):
        for i in range(OPS):
            last = ta.read(i)
        return last

    run(benchmark, reads, lambda: (filled(storage, value),),
        lambda got: _all(value)(got.expand(OPS, B, H)))


@pytest.mark.parametrize("storage", ["slab", "list"])
@pytest.mark.parametrize("autograd", AUTOGRAD, ids=AUTOGRAD_IDS)
def test_bench_stack(benchmark, storage, autograd):
    """One stack of OPS elements per call (slab: a view; list: one torch.stack copy)."""
    value = torch.randn(B, H, requires_grad=autograd)
    run(benchmark, lambda ta: ta.stack(), lambda: (filled(storage, value),), _all(value),
        ops=1)


@pytest.mark.parametrize("storage", ["slab", "list"])
def test_bench_grad(benchmark, storage):
    """TensorArrayGrad: create the gradient array of a filled array (soft copy of OPS shapes)."""
    value = torch.randn(B, H)
    def soft_copied(g) -> None:  # OPS indices, each the forward's shape, read as zeros
        assert g.size() == OPS
        _all(torch.zeros(B, H))(g.stack())

    run(benchmark, lambda ta: ta.grad("gradients"), lambda: (filled(storage, value),),
        soft_copied, ops=1)


def _ones(xs: list[torch.Tensor]):
    """A check of a sum's backward: each leaf's gradient is ones (the setups clear them, so
    only the last call's are there)."""
    def check(_none) -> None:
        assert all(torch.equal(x.grad, torch.ones(B, H)) for x in xs)
    return check


@pytest.mark.parametrize("storage", ["slab", "list"])
def test_bench_backward_per_step(benchmark, storage):
    """Backward of an RNN-style loop (OPS writes, then stack): per step = time / OPS.

    One leaf per step, so the time is the TensorArray's and not PyTorch's select-backward.
    """
    xs = [torch.randn(B, H, requires_grad=True) for _ in range(OPS)]

    def setup():
        for x in xs:
            x.grad = None  # (untimed)
        ta = array(storage)
        for t in range(OPS):
            ta = ta.write(t, xs[t])
        return (ta.stack().sum(),)

    run(benchmark, lambda loss: loss.backward(), setup, _ones(xs))


def test_bench_reference_plain_torch_loop(benchmark):
    """Reference for the backward: the same loop with a Python list and torch.stack."""
    xs = [torch.randn(B, H, requires_grad=True) for _ in range(OPS)]

    def setup():
        for x in xs:
            x.grad = None  # (untimed)
        outs = []
        for t in range(OPS):
            outs.append(xs[t])
        return (torch.stack(outs).sum(),)

    run(benchmark, lambda loss: loss.backward(), setup, _ones(xs))
