"""Plan.explain() and the plan's buffers for the layer pipeline (rnn/pipeline.py): whether the
stack is pipelined, with how many chunks and why (off / forced / automatic), and the extra
workspaces a pipelined run allocates, checked against the tensors the engine really allocates
(as are the unpipelined buffers of the Triton backend).

The automatic choice is opt-in (TRITONRNN_PIPELINE=1); every test sets or clears the variable
itself. The plan cache is cleared around each test (one test patches the time model).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from tritonrnn.rnn import engine, planner
from tritonrnn.rnn import pipeline as pipeline_mod
from tritonrnn.rnn.config import make_config
from tritonrnn.rnn.packing import make_pack_info
from tritonrnn.rnn.params import config_params_size
from tritonrnn.rnn.planner import PRESETS, plan_constraints, plan_for


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITONRNN_PIPELINE", raising=False)
    planner._plan_cached.cache_clear()
    yield
    planner._plan_cached.cache_clear()


def _anchor(**kw):
    """The design's anchor (LSTM H=768 B=16 T=1024 bf16) as a 2-layer stack on an H100: a
    48-program persistent grid, two layers co-resident (2 x 48 <= 132 SMs)."""
    args = dict(rnn_mode="lstm", input_size=768, num_units=768, num_layers=2, batch=16,
                max_time=1024, dtype=torch.bfloat16, device_properties="h100")
    return plan_for(**{**args, **kw})


def _tiny(**kw):
    args = dict(rnn_mode="gru", input_size=5, num_units=7, num_layers=3, batch=4, max_time=7,
                dtype=torch.float32, device_properties="interpreter")
    return plan_for(**{**args, **kw})


def _line(plan) -> str:
    (line,) = [x for x in plan.explain().splitlines() if x.startswith("  layer pipeline: ")]
    return line


def _phase_bytes(plan, phase: str) -> int:
    return sum(b.nbytes for b in plan.buffers if b.phase == phase)


def _extras(plan) -> list:
    return [b for b in plan.buffers if b.name.startswith("pipeline.")]


# ----------------------------------------------------------------------------- explain


def test_off_without_opt_in_says_what_the_rule_would_do():
    p = _anchor()
    assert _line(p) == ("  layer pipeline: off (the automatic choice is opt-in and "
                        "TRITONRNN_PIPELINE=1 is not set; with it: 16 chunks, 2 layers "
                        "concurrent)")
    assert p.pipeline.chunks == 1 and p.pipeline.source == "off"
    assert not _extras(p) and p.pipeline_extra_bytes == 0


OFF_CASES = {
    # name: (plan keywords, constraints, the reason's pattern)
    "interpreter": (dict(device_properties="interpreter"), {}, r"not a CUDA device"),
    "bidirectional": (dict(direction="bidirectional"), {}, r"bidirectional: the reverse"),
    "one_layer": (dict(num_layers=1), {}, r"a single layer"),
    "short": (dict(max_time=63), {}, r"T = 63 < 64 steps: no two chunks of >= 32 steps"),
    "stepwise": (dict(), {"family": "stepwise"}, r"stepwise recurrences: only persistent"),
    "float64": (dict(dtype=torch.float64), {}, r"reference recurrences: only persistent"),
    # 60 SMs hold one 48-program layer, not two.
    "co_residency": (dict(device_properties=dataclasses.replace(PRESETS["h100"], sm_count=60)),
                     {}, r"co-residency: two layers' programs \(2 x 48\) exceed the 60 SMs"),
}


@pytest.mark.parametrize("case", list(OFF_CASES))
def test_off_reasons_with_opt_in(case, monkeypatch):
    kw, constraints, reason = OFF_CASES[case]
    monkeypatch.setenv("TRITONRNN_PIPELINE", "1")
    with plan_constraints(**constraints):
        p = _anchor(**kw)
    assert re.fullmatch(rf"  layer pipeline: off \(.*{reason}.*\)", _line(p)), _line(p)
    assert p.pipeline.chunks == 1 and not _extras(p)
    # Off, the buffers are the unpipelined ones: what the plan lists without the opt-in.
    monkeypatch.delenv("TRITONRNN_PIPELINE")
    with plan_constraints(**constraints):
        assert _anchor(**kw).buffers == p.buffers


def test_off_when_the_model_gains_too_little(monkeypatch):
    """With 1 ms per (layer, chunk) the best split (C = 2: 11.68 ms) saves under 10% of the
    unpipelined 12.24 ms."""
    monkeypatch.setenv("TRITONRNN_PIPELINE", "1")
    monkeypatch.setattr(pipeline_mod, "T_LAUNCH_US", 1000.0)
    assert _line(_anchor()) == ("  layer pipeline: off (the model gains under 10% (best 2 "
                                "chunks: 11.68 ms vs 12.24 ms unpipelined))")


def test_automatic_lists_the_extra_buffers_and_counts_them_in_peak(monkeypatch):
    serial = _anchor()
    monkeypatch.setenv("TRITONRNN_PIPELINE", "1")
    p = _anchor()
    text = p.explain()
    assert _line(p) == ("  layer pipeline: 16 chunks, 2 layers concurrent (automatic "
                        "(TRITONRNN_PIPELINE=1), model: 5.76 ms vs 10.26 ms unpipelined)")
    assert "decided at T=1024 (max_time; the engine decides per batch on its longest" in text
    assert (p.pipeline.chunks, p.pipeline.width, p.pipeline.source) == (16, 2, "automatic")
    # The same decision as the rule the engine applies on a CUDA device.
    assert pipeline_mod.pipeline_chunks(make_config(
        rnn_mode="lstm", num_layers=2, num_units=768, input_size=768), 16, 1024, "cuda",
        dtype=torch.bfloat16, props=PRESETS["h100"]) == 16
    # Byte formulas written out (bf16: 2 bytes; N = 16 * 1024, G*H = 3072, H = Hout = 768).
    N, GH, H, item = 16 * 1024, 3072, 768, 2
    extras = {b.name: (b.shape, b.phase, b.nbytes) for b in _extras(p)}
    assert extras == {
        "pipeline.h_mid": ((2, 2, 16, H), "forward", 2 * 2 * 16 * H * item),
        "pipeline.c_mid": ((2, 2, 16, H), "forward", 2 * 2 * 16 * H * item),
        "pipeline.h_prev": ((1, N, H), "backward", N * H * item),
        "pipeline.dpre_x": ((1, N, GH), "backward", N * GH * item),
        "pipeline.dh_mid": ((2, 2, 16, H), "backward", 2 * 2 * 16 * H * item),
        "pipeline.dc_mid": ((2, 2, 16, H), "backward", 2 * 2 * 16 * H * item),
    }
    extra = (N * (H + GH) + 4 * 2 * 2 * 16 * H) * item
    assert p.pipeline_extra_bytes == extra
    for name, (shape, phase, nbytes) in extras.items():
        row = rf"\n    {phase} +{re.escape(name)} +{re.escape(str(list(shape)))} +bfloat16 +"
        assert re.search(rf"{row}{nbytes:,} B\n", text), name
    assert f"extra workspaces (pipeline.* below): {extra:,} B" in text
    # Unpipelined backward (no dropout: no dropped workspace): pre_x (dpre_x written over it,
    # planner.backward_writes_over_preacts), pre_h, h_prev, c_prev, dx/dy ping-pong [2, N,
    # 768]. Pipelined: pre_x, pre_h, c_prev, dy, dx, h_prev, dpre_x (first slot) and the
    # extras above; the backward is the larger phase in both.
    bwd_serial = N * (2 * GH + 2 * H + 2 * H) * item
    bwd_pipe = N * (3 * GH + 4 * H) * item + extra - 2 * 2 * 2 * 16 * H * item
    assert _phase_bytes(serial, "backward") == bwd_serial
    assert _phase_bytes(p, "backward") == bwd_pipe
    assert serial.peak_bytes == serial.reserve_bytes + bwd_serial
    assert p.peak_bytes == p.reserve_bytes + bwd_pipe > serial.peak_bytes
    assert f"peak: {p.peak_bytes:,} B" in text


@pytest.mark.parametrize("k, line", [
    (4, "4 chunks, 3 layers concurrent (forced by plan_constraints(pipeline_chunks=4))"),
    (9, "7 chunks, 3 layers concurrent (forced by plan_constraints(pipeline_chunks=9), "
        "clamped to T = 7 steps)"),
    (1, "off (forced by plan_constraints(pipeline_chunks=1))"),
], ids=["C4", "clamped", "C1"])
def test_forced(k, line, monkeypatch):
    """Forced on any device (the interpreter too), whatever TRITONRNN_PIPELINE says."""
    for env in ("0", "1"):
        monkeypatch.setenv("TRITONRNN_PIPELINE", env)
        with plan_constraints(pipeline_chunks=k):
            p = _tiny()
        assert _line(p) == f"  layer pipeline: {line}"
        assert bool(_extras(p)) == (k > 1)


def test_forced_on_a_bidirectional_stack_raises_when_planned():
    with plan_constraints(pipeline_chunks=2), pytest.raises(
            ValueError, match=r"pipeline_chunks: expected 1 for a bidirectional .*got 2"):
        _tiny(direction="bidirectional")
    with plan_constraints(pipeline_chunks=1):
        assert "layer pipeline: off (forced" in _tiny(direction="bidirectional").explain()


# ----------------------------------------------------------------------------- engine bytes

B, T, H, I = 3, 5, 6, 4
ENGINE_CASES = {
    # name: (mode, num_proj, dropout, chunks)
    "lstm-C2": ("lstm", 0, 0.0, 2),
    "lstm-proj-C3": ("lstm", 3, 0.0, 3),
    "gru-C2": ("gru", 0, 0.0, 2),
    "rnn_tanh-dropout-C3": ("rnn_tanh", 0, 0.3, 3),
}


def _engine_run(cfg, chunks: int, rec=None, device: str = "cpu"):
    """engine.forward (training) + engine.backward on the stack with every sequence T long
    (so N = B * T, the plan's N), the given backend (default: the reference one) on
    `device`, pipeline_chunks = chunks. Returns ({phase: [every tensor engine.new_buffer
    allocated]}, pipelines run, dx, dparams)."""
    LD, Hout = cfg.num_layers * cfg.num_dirs, cfg.out_size
    info = make_pack_info([T] * B, T, torch.device(device))
    g = torch.Generator().manual_seed(11)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    x, h0 = randn(info.N, I), randn(LD, B, Hout)
    c0 = randn(LD, B, H) if cfg.is_lstm else None
    params = 0.3 * randn(config_params_size(cfg))
    seen: dict[str, list[torch.Tensor]] = {"forward": [], "backward": []}
    phase = ["forward"]
    new_buffer, run = engine.new_buffer, pipeline_mod.run

    def spy(*shape, dtype, device):
        t = new_buffer(*shape, dtype=dtype, device=device)
        seen[phase[0]].append(t)
        return t

    pipes = []
    rec = rec or engine.ReferenceRecurrence()
    with pytest.MonkeyPatch.context() as mp, plan_constraints(pipeline_chunks=chunks):
        mp.setattr(engine, "new_buffer", spy)
        mp.setattr(pipeline_mod, "run",
                   lambda pipe, *a, **k: (pipes.append(pipe), run(pipe, *a, **k))[1])
        fwd = engine.forward(cfg, rec, x, h0, c0, params, info, True)
        phase[0] = "backward"
        bwd = engine.backward(cfg, rec, x, h0, c0, params, info, fwd.y, randn(*fwd.y.shape),
                              randn(LD, B, Hout), randn(LD, B, H) if c0 is not None else None,
                              fwd.reserve)
    return seen, pipes, bwd.dx, bwd.dparams


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("case", list(ENGINE_CASES))
def test_plan_bytes_match_what_the_engine_allocates(case):
    mode, proj, dropout, chunks = ENGINE_CASES[case]
    L = 2  # the reference backend's W = min(L, 2) is then the Triton plan's W = L
    cfg = make_config(rnn_mode=mode, num_layers=L, num_units=H, input_size=I, num_proj=proj,
                      dropout=dropout, seed=5, seed2=6)
    kw = dict(rnn_mode=mode, input_size=I, num_units=H, num_layers=L, num_proj=proj, batch=B,
              max_time=T, dtype=torch.float32, device_properties="interpreter",
              dropout=dropout)
    with plan_constraints(pipeline_chunks=chunks):
        plan = plan_for(**kw)
    with plan_constraints(pipeline_chunks=1):
        flat = plan_for(**kw)
    got, pipes, dx, dparams = _engine_run(cfg, chunks)
    want, no_pipes, dx_flat, dparams_flat = _engine_run(cfg, 1)
    W, N, Hout = plan.pipeline.width, B * T, cfg.out_size

    # The engine ran the plan's decision, forward and backward.
    assert no_pipes == [] and pipes == [plan.pipeline.pipeline] * 2
    assert W == 2 and flat.pipeline.chunks == 1
    # What the pipelined run allocates beyond the unpipelined one, phase by phase, equals
    # the difference of the two plans' buffer lists (with dropout: the pipelined run's
    # dropped [N, Hout] forward and [W, N, Hout] backward; the unpipelined engine allocates
    # its dropped either way).
    for phase in ("forward", "backward"):
        measured = _nbytes(got[phase]) - _nbytes(want[phase])
        planned = _phase_bytes(plan, phase) - _phase_bytes(flat, phase)
        assert measured == planned, phase
    if dropout:
        assert sorted((b.phase, b.name, b.shape) for b in plan.buffers if "dropped" in b.name
                      ) == [("backward", "dropped", (N, Hout)),
                            ("backward", "pipeline.dropped", (W - 1, N, Hout)),
                            ("forward", "dropped", (N, Hout))]
    else:
        # The extras themselves, from the real tensors: W - 1 of the W slots of each
        # [W, N, C] backward buffer, and every [L, 2, B, C] state between chunks.
        slots = [t for t in got["backward"] if t.dim() == 3 and t.shape[:2] == (W, N)]
        states = [t for p in got.values() for t in p if t.dim() == 4 and t.shape[:2] == (L, 2)]
        real = _nbytes(slots) * (W - 1) // W + _nbytes(states)
        assert len(slots) + len(states) == len(_extras(plan))
        assert plan.pipeline_extra_bytes == real > 0
        assert sorted((b.shape[0] + 1, *b.shape[1:]) if len(b.shape) == 3 else b.shape
                      for b in _extras(plan)) == sorted(tuple(t.shape) for t in slots + states)
    # Same gradients (fp32, tolerance argued in tests/test_layer_pipeline.py: 2e-5 of the
    # largest entry): routing the allocations through rnn/pipeline.py changed nothing.
    for a, b in ((dx, dx_flat), (dparams, dparams_flat)):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5 * max(1.0, b.abs().max().item()))


@pytest.mark.parametrize("mode,direction,proj,layers,dropout", [
    ("lstm", "bidirectional", 0, 2, 0.0), ("gru", "bidirectional", 0, 2, 0.0),
    ("lstm", "unidirectional", 3, 2, 0.0), ("lstm", "bidirectional", 3, 2, 0.0),
    ("rnn_tanh", "unidirectional", 0, 2, 0.0), ("lstm", "unidirectional", 0, 2, 0.25),
    ("gru", "bidirectional", 0, 3, 0.25), ("lstm", "unidirectional", 0, 1, 0.25),
    ("lstm", "bidirectional", 3, 1, 0.0),
])
def test_plan_buffers_are_what_the_triton_engine_allocates(mode, direction, proj, layers,
                                                           dropout):
    # Every workspace the engine allocates for a training step with the Triton backend,
    # forward and backward, is in the plan with its shape: bidirectional layers'
    # per-recurrence workspaces hold a half per direction. Not counted: the [L*D, B, C] final
    # states and their gradients (outputs), and x_packed (the ops pack x before the engine
    # runs); the dx/dy ping-pong is flat [N * C] buffers, two (one for a single layer); the
    # inter-layer dropout's workspace only where there is dropout between layers.
    from tritonrnn.rnn.triton_backend import triton_recurrence

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = make_config(rnn_mode=mode, num_layers=layers, num_units=H, input_size=I,
                      direction=direction, num_proj=proj, dropout=dropout)
    seen, _, _, _ = _engine_run(cfg, 1, triton_recurrence(), device)
    plan = plan_for(rnn_mode=mode, input_size=I, num_units=H, num_layers=layers,
                    direction=direction, num_proj=proj, batch=B, max_time=T,
                    dropout=dropout, dtype=torch.float32,
                    device_properties=None if device == "cuda" else "interpreter")
    assert sum(b.name == "dropped" for b in plan.buffers) == (2 if layers > 1 and dropout
                                                             else 0)
    LD = layers * cfg.num_dirs
    for phase in ("forward", "backward"):
        got = sorted(s[1:] if len(s) == 3 and s[0] == 1 else s  # [1, N, C]: one direction
                     for s in (tuple(t.shape) for t in seen[phase])
                     if not (len(s) == 3 and s[:2] == (LD, B)))
        want = []
        for b in plan.buffers:
            if b.phase != phase or b.name == "x_packed":
                continue
            if b.name.startswith("dx_dy"):
                assert b.shape[0] == min(layers, 2)
                want += [(b.shape[1] * b.shape[2],)] * b.shape[0]
            else:
                want.append(b.shape)
        assert got == sorted(want), phase


@pytest.mark.parametrize("layers", [2, 3, 4])
@pytest.mark.parametrize("mode,direction", [("lstm", "bidirectional"), ("gru", "unidirectional")])
def test_inference_forward_keeps_two_inner_outputs(mode, direction, layers):
    # Inference keeps no layer outputs for a backward: layer l reads only layer l-1's, so the
    # inner outputs alternate between two [N, D*Hout] buffers (one for two layers) beside the
    # stack's output, and no dropout workspace is allocated (dropout is off in inference).
    # The results equal a training forward's, whose inner outputs live in the reserve.
    cfg = make_config(rnn_mode=mode, num_layers=layers, num_units=H, input_size=I,
                      direction=direction, dropout=0.5)
    LD, Hout = layers * cfg.num_dirs, cfg.out_size
    info = make_pack_info([T, T - 2, 0, T - 1][:B] + [T] * (B - 4), T, torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    x, h0 = torch.randn(info.N, I, generator=g), torch.randn(LD, B, Hout, generator=g)
    c0 = torch.randn(LD, B, H, generator=g) if cfg.is_lstm else None
    params = 0.3 * torch.randn(config_params_size(cfg), generator=g)
    seen = []
    new_buffer = engine.new_buffer

    def spy(*shape, dtype, device):
        t = new_buffer(*shape, dtype=dtype, device=device)
        seen.append(t)
        return t

    rec = engine.ReferenceRecurrence()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "new_buffer", spy)
        out = engine.forward(cfg, rec, x, h0, c0, params, info, False)
    outputs = [t for t in seen if tuple(t.shape) == (info.N, cfg.num_dirs * Hout)]
    assert len(outputs) == min(layers - 1, 2) + 1
    no_dropout = dataclasses.replace(cfg, dropout=0.0)
    ref = engine.forward(no_dropout, rec, x, h0, c0, params, info, True)
    torch.testing.assert_close(out.y, ref.y, rtol=0, atol=0)
    torch.testing.assert_close(out.hT, ref.hT, rtol=0, atol=0)
    if cfg.is_lstm:
        torch.testing.assert_close(out.cT, ref.cT, rtol=0, atol=0)


@pytest.mark.parametrize("mode,direction", [("lstm", "bidirectional"), ("gru", "unidirectional"),
                                            ("gru", "bidirectional")])
def test_gradients_written_over_preactivations_change_nothing(monkeypatch, mode, direction):
    # planner.backward_writes_over_preacts: by default the backward writes dpre_x (and GRU's
    # dpre_h) over the recomputed pre-activations; with TRITONRNN_BARRIER_CHECK=sync it keeps
    # them apart (a timed-out launch is rerun from its inputs). Same buffers as the plan in
    # both modes, one [N, G*H] workspace fewer per recurrence (two for GRU), and bit-identical
    # gradients from the Triton backend (the interpreter).
    from tritonrnn.rnn.triton_backend import triton_recurrence

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = make_config(rnn_mode=mode, num_layers=2, num_units=H, input_size=I,
                      direction=direction)
    got = {}
    for check in ("sync", "deferred"):
        monkeypatch.setenv("TRITONRNN_BARRIER_CHECK", check)
        test_plan_buffers_are_what_the_triton_engine_allocates(mode, direction, 0, 2, 0.0)
        seen, _, dx, dparams = _engine_run(cfg, 1, triton_recurrence(), device)
        got[check] = (_nbytes(seen["backward"]), dx, dparams)
    G, W = cfg.num_gates, cfg.num_dirs
    fewer = (2 if mode == "gru" else 1) * W * B * T * G * H * 4  # fp32
    assert got["sync"][0] - got["deferred"][0] == fewer
    for a, b in zip(got["sync"][1:], got["deferred"][1:], strict=True):
        assert torch.equal(a, b)
