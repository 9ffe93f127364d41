"""The packed layout (rnn/packing.py): its fields against a plain construction, and what
building one costs the device."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tritonrnn.rnn import packing
from tritonrnn.rnn.packing import make_pack_info, prev_rows, window

LENGTHS = [[3, 0, 5, 5, 1], [4], [0, 0], [2, 7, 7, 1, 6, 3]]


def _plain(lengths: list[int], T: int) -> dict[str, list[int]]:
    """The layout's index fields, written out step by step from the packing rule."""
    order = sorted(range(len(lengths)), key=lambda b: -lengths[b])  # stable: ties keep order
    rows = [(t, j) for t in range(T) for j in range(len(order)) if lengths[order[j]] > t]
    max_len = max(lengths, default=0)
    offsets = [sum(1 for t2, _ in rows if t2 < t) for t in range(max(max_len, 1) + 1)]
    at = {tj: i for i, tj in enumerate(rows)}
    B = len(order)
    return dict(perm=order, inv_perm=[order.index(b) for b in range(B)],
                lengths_sorted=[lengths[b] for b in order], offsets=offsets,
                row_time=[t for t, _ in rows], row_batch=[order[j] for _, j in rows],
                padded_index=[t * B + order[j] for t, j in rows],
                # into cat([state0 (B rows), packed rows]): the state at a direction's start
                prev_fwd=[j if t == 0 else B + at[(t - 1, j)] for t, j in rows],
                prev_rev=[j if t == lengths[order[j]] - 1 else B + at[(t + 1, j)]
                          for t, j in rows])


@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
def test_layout_fields(lengths):
    T = max(lengths + [1]) + 1
    info = make_pack_info(lengths, T, torch.device("cpu"))
    want = _plain(lengths, T)
    for reverse in (False, True):
        got = prev_rows(info, reverse)
        assert got.tolist() == want.pop("prev_rev" if reverse else "prev_fwd"), reverse
    for name, values in want.items():
        got = getattr(info, name)
        assert got.tolist() == values, name
        assert got.dtype == (torch.int32 if name in ("lengths_sorted", "offsets")
                             else torch.int64), name
    assert (info.N, info.max_len) == (len(want["row_time"]), max(lengths))
    assert info.in_order == (lengths == sorted(lengths, reverse=True))
    assert not info.dense  # T is longer than every sequence


@pytest.mark.parametrize("lengths, T, dense", [
    ([4, 4, 4], 4, True), ([4], 4, True), ([4, 4, 3], 4, False), ([3, 3], 4, False),
    ([0, 0], 0, False), ([], 3, False),
])
def test_a_dense_layout_packs_by_reshaping(lengths, T, dense):
    """All sequences T long (and at least one row): the packed rows are the padded rows in
    order, so pack is a reshape (a view of a contiguous input) and unpack one copy."""
    info = make_pack_info(lengths, T, torch.device("cpu"))
    assert info.dense == dense
    if not dense:
        return
    assert info.in_order and info.padded_index.tolist() == list(range(info.N))
    x = torch.randn(T, len(lengths), 5, dtype=torch.float64)
    rows = packing.pack(x, info)
    assert rows.data_ptr() == x.data_ptr() and rows.shape == (info.N, 5)
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # a batch-major caller's view
    assert torch.equal(packing.pack(strided, info), rows) and packing.pack(
        strided, info).is_contiguous()
    for time_major in (True, False):
        out = packing.unpack(rows, info, time_major)
        assert torch.equal(out if time_major else out.transpose(0, 1), x)
        assert out.data_ptr() != x.data_ptr()


class _HostToDevice(TorchDispatchMode):
    """Counts the copies from the CPU to another device."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        src = {torch.ops.aten._to_copy.default: 0, torch.ops.aten.copy_.default: 1}.get(func)
        if src is not None and args[src].device.type == "cpu" and out.device.type != "cpu":
            self.copies += 1
        return out


def test_a_new_layout_is_one_copy_to_the_device():
    """The six index tensors built on the host go to the device in one copy: six blocking
    copies were six stream syncs on a GPU for every new set of lengths (a varlen training
    loop makes one at nearly every step). The meta device stands in for a GPU."""
    counter = _HostToDevice()
    with counter:
        info = make_pack_info([5, 2, 7, 0, 3, 1], 9, torch.device("meta"))
    assert counter.copies == 1
    assert info.perm.device.type == "meta" and info.padded_index.shape == (18,)


def test_an_unindexed_cuda_device_is_the_current_one(monkeypatch):
    """The layout cache keys on the indexed device: "cuda" is the current device at the
    call, so a later call under another current device does not get the first one's
    layout (tools and tests pass "cuda"; the ops pass their tensors' indexed device)."""
    import types

    seen = []

    def made(lengths, T, device):
        seen.append(device)
        return types.SimpleNamespace(device=device), None

    monkeypatch.setattr(packing, "_make_pack_info", made)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    make_pack_info([2, 1], 2, torch.device("cuda"))
    make_pack_info([2, 1], 2, "cuda")
    make_pack_info([2, 1], 2, torch.device("cuda", 0))
    make_pack_info([2, 1], 2, torch.device("cpu"))
    assert seen == [torch.device("cuda", 1)] * 2 + [torch.device("cuda", 0),
                                                    torch.device("cpu")]


@pytest.mark.gpu
def test_a_new_layout_does_not_sync_the_gpu():
    """A GPU builds a new layout without a stream sync (one copy from pinned memory), with
    the host's values."""
    lengths = [5, 2, 7, 0, 3, 1, 7, 11]  # lengths no other test uses: not cached
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        info = make_pack_info(lengths, 12, torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = make_pack_info(lengths, 12, torch.device("cpu"))
    for name in ("perm", "inv_perm", "lengths_sorted", "offsets", "row_time", "row_batch",
                 "padded_index"):
        assert torch.equal(getattr(info, name).cpu(), getattr(want, name)), name


def test_what_is_derived_from_a_layout_is_built_once_and_freed_with_it():
    """Windows, previous-row indices and reserve layouts are cached with their layout (14
    device ops a backward direction were repeated on every call), and go with it: the
    packing cache's eviction frees the layout and everything derived from it."""
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.reserve import reserve_layout

    info = make_pack_info([6, 1, 4, 6, 0], 6, torch.device("cpu"))
    cfg = make_config(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3)

    def derive(layout):
        return [prev_rows(layout, False), prev_rows(layout, True), window(layout, 2, 5),
                reserve_layout(cfg, layout, torch.float32)]

    derived = derive(info)
    assert all(a is b for a, b in zip(derived, derive(info), strict=True))
    assert reserve_layout(cfg, info, torch.float16) is not derived[3]
    refs = [weakref.ref(info), weakref.ref(derived[2])]
    del info, derived
    packing._make_pack_info.cache_clear()
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_seeds_do_not_multiply_the_cached_layouts():
    """The modules draw new dropout seeds every training step: the layouts kept per
    configuration ignore the dropout attributes (one entry per seed pair grew without end
    with a pack layout the packing cache keeps), while the reserve's fingerprint still
    counts the seeds where a mask applies."""
    from tritonrnn.rnn import params
    from tritonrnn.rnn.config import make_config
    from tritonrnn.rnn.reserve import reserve_layout

    info = make_pack_info([4, 2, 3], 4, torch.device("cpu"))
    cfgs = [make_config(rnn_mode="gru", num_layers=2, num_units=4, input_size=3, dropout=0.5,
                        seed=s, seed2=s + 1) for s in range(6)]
    layouts = [reserve_layout(cfg, info, torch.float32) for cfg in cfgs]
    assert len({layout.fingerprint for layout in layouts}) == 6
    assert {layout.y_offsets for layout in layouts} == {layouts[0].y_offsets}
    assert len(packing._DERIVED[info]) == 1
    params._layout_of.cache_clear()
    for cfg in cfgs:
        params._layout(cfg)
    assert params._layout_of.cache_info().currsize == 1


@pytest.mark.gpu
def test_a_layout_made_on_one_stream_is_ready_on_another():
    """A layout's copy (and what is derived from it) is queued on the stream current when it
    is made, the host not waiting: a caller on another stream waits for it on the GPU (an
    event) before its own work reads the index tensors. A side stream busy with a long
    kernel first delays the copy."""
    from tritonrnn.rnn.packing import prev_rows

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    lengths = [3, 9, 1, 4, 4, 8, 2, 6]  # lengths no other test uses: not cached
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # tens of milliseconds of GPU time ahead of the copy
        made = make_pack_info(lengths, 10, cuda)
        prev = prev_rows(made, True)
    info = make_pack_info(lengths, 10, cuda)
    assert info is made
    want = make_pack_info(lengths, 10, cpu)
    assert torch.equal(info.perm.cpu(), want.perm)
    assert torch.equal(info.padded_index.cpu(), want.padded_index)
    assert torch.equal(prev_rows(info, True).cpu(), prev_rows(want, True))
    assert prev_rows(info, True) is prev


@pytest.mark.gpu
def test_new_lengths_are_refused_by_name_during_a_capture():
    """Preparing a layout copies from the host: under a CUDA graph capture that copy would
    run at each replay from a buffer the capture does not keep. New lengths are refused
    with the argument named; lengths prepared before the capture are used."""
    cuda = torch.device("cuda")
    ready = make_pack_info([5, 7, 2], 8, cuda)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(ValueError, match=r"^sequence_lengths: a new set of lengths cannot "
                                             r"be prepared while a CUDA graph is captured"):
            make_pack_info([5, 7, 3, 1], 8, cuda)
        assert make_pack_info([5, 7, 2], 8, cuda) is ready
        out = ready.padded_index * 1
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), make_pack_info([5, 7, 2], 8, torch.device("cpu")).padded_index)


class _Gathers(TorchDispatchMode):
    """Counts the gathers and scatters (index_select, index_copy) run."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.index_select, torch.ops.aten.index_copy_,
                                   torch.ops.aten.index_copy):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("lengths, time_major, want", [
    # Dense: no packing, no unpacking, no state permutations. The backward's two are the
    # recomputation's previous rows (h and c), which every layout gathers.
    ([4, 4, 4], True, (0, 2)),
    ([4, 4, 4], False, (0, 2)),
    # In order: pack x (forward); pack x, y, dy (backward) and unpack; no state permutation.
    ([4, 3, 1], True, (2, 6)),
    # Unsorted: also h0, c0 (both passes), hT, cT (forward), dhT, dcT, dh0, dc0 (backward).
    ([1, 4, 3], True, (6, 12)),
])
def test_gathers_a_call_runs(lengths, time_major, want):
    """The gathers and scatters around the kernels (the reference's and the kernels' own
    are not counted: the Triton CTA family in the interpreter runs none)."""
    from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop, params_size, plan_constraints

    T, B, I, H = 4, len(lengths), 3, 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn((T, B, I) if time_major else (B, T, I), generator=g)
    st = (1, B, H) if time_major else (B, 1, H)
    h0, c0 = torch.randn(st, generator=g), torch.randn(st, generator=g)
    params = torch.randn(params_size(rnn_mode="lstm", num_layers=1, num_units=H,
                                     input_size=I), generator=g) * 0.3
    lens = torch.tensor(lengths)
    kw = dict(time_major=time_major, backend="triton")
    make_pack_info(lengths, T, torch.device("cpu"))  # its construction (on the host) apart
    counts = []
    with plan_constraints(family="persistent_cta"):
        counter = _Gathers()
        with counter:
            out = cudnn_rnn(x, h0, c0, params, lens, **kw)
        counts.append(counter.count)
        counter = _Gathers()
        with counter:
            cudnn_rnn_backprop(x, h0, c0, params, lens, out.output, out.output_h, out.output_c,
                               torch.ones_like(out.output), torch.ones_like(h0),
                               torch.ones_like(c0), out.reserve_space, out.host_reserved, **kw)
        counts.append(counter.count)
    assert tuple(counts) == want


def test_the_capture_check_is_false_outside_a_capture():
    """kernels.grid_barrier.capturing, the library's one capture check (the layouts' caches,
    the layer pipeline and the barrier checks ask it): off a GPU, and outside a capture."""
    from tritonrnn.kernels.grid_barrier import capturing

    assert packing.capturing is capturing
    assert not capturing() and not capturing(torch.device("cpu"))
    assert not capturing(torch.device("meta"))
    if torch.cuda.is_available():
        assert not capturing(torch.device("cuda"))


@pytest.mark.parametrize("device", [None, "cuda"])
@pytest.mark.parametrize("answer", [False, True])
def test_the_capture_check_asks_torch_on_a_gpu(monkeypatch, device, answer):
    """The check's GPU branch, run without a GPU: torch.cuda made to look present, its capture
    query answering `answer` (a misspelt torch.cuda name there raised AttributeError at
    every call of the library on a GPU, which no CPU test reached)."""
    from tritonrnn.kernels.grid_barrier import capturing

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        lambda: asked.append(1) or answer)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    assert capturing(None if device is None else torch.device(device)) is answer
    assert asked == [1]
