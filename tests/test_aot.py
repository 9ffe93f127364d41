"""`tritonrnn aot` machinery: launch capture, the compile signature, the GPU values of the
interpreter-dependent constexprs, SASS/PTX/cuobjdump parsing, and real sm_90 compiles.

The capture and signature tests run the real engine and launchers on tiny CPU tensors (nothing
is launched). The compile tests need ptxas and cuobjdump (shipped in Triton's wheel) but no
GPU; in this interpreted test process they run in one fresh Python process (`aot_reports`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from tritonrnn.bench import aot
from tritonrnn.bench.harness import environment
from tritonrnn.kernels import grid_tiles as gt
from tritonrnn.kernels import persistent_cta as pc
from tritonrnn.kernels import persistent_grid as pg
from tritonrnn.kernels.grid_tiles import SMEM_SLACK as _SMEM_SLACK
from tritonrnn.rnn.packing import make_pack_info
from tritonrnn.rnn.planner import PRESETS

H100 = PRESETS["h100"]


# ----------------------------------------------------------------------------- signature


def _fake_kernel(X, Y, n, one, big, flag, scale, none_arg, BLOCK: tl.constexpr,
                 MODE: "tl.constexpr", K, DEF: tl.constexpr = 3):  # noqa: UP037 (as a string)
    pass


def _fake_launch(**over) -> aot.Launch:
    buf = torch.zeros(9, dtype=torch.int32)
    args = (torch.zeros(8, dtype=torch.bfloat16), buf[1:], 32, 1, 2**40, True, 0.5, None, 64)
    fields = dict(module="m", name="_fake_kernel", fn=_fake_kernel, grid=(3, 2), args=args,
                  kwargs=dict(MODE=tl.bfloat16, K=1, num_warps=8),
                  do_not_specialize=("K",))
    fields.update(over)
    return aot.Launch(**fields)


def test_signature_types_specialisation_and_options():
    sig = aot.build_signature(_fake_launch())
    assert sig.signature == {
        "X": "*bf16", "Y": "*i32", "n": "i32", "one": "constexpr", "big": "i64", "flag": "u1",
        "scale": "fp32", "none_arg": "constexpr", "BLOCK": "constexpr", "MODE": "constexpr",
        "K": "i32", "DEF": "constexpr",
    }
    # Indices as Triton's JIT keys them; the int 1 is specialised, K (do_not_specialize) not.
    assert sig.constexprs == {(3,): 1, (7,): None, (8,): 64, (9,): tl.bfloat16, (11,): 3}
    # X is 16-byte aligned, Y starts 4 bytes into its buffer; n and big are multiples of 16.
    assert sig.attrs == {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]],
                         (4,): [["tt.divisibility", 16]]}
    assert sig.options == {"num_warps": 8}
    assert sig.constexpr("MODE") == tl.bfloat16


@pytest.mark.parametrize("over, err, match", [
    (dict(args=(0,) * 13), TypeError, "13 positional arguments"),
    (dict(kwargs=dict(K=1)), TypeError, "missing argument MODE"),
    (dict(kwargs=dict(MODE=1, K=1, BLOCK=2)), TypeError, "BLOCK given by position"),
    (dict(args=(torch.zeros(2, dtype=torch.complex64),) + (0,) * 8), ValueError, "complex64"),
], ids=["too-many-args", "missing-arg", "twice", "untyped-dtype"])
def test_signature_errors(over, err, match):
    with pytest.raises(err, match=match):
        aot.build_signature(_fake_launch(**over))


# ----------------------------------------------------------------------------- capture


def _capture(shape, **constraints):
    lp, _ = aot.plan_layer(shape, "h100", constraints or None)
    return lp, aot.capture(shape, lp)


BF16_LSTM = aot.AotShape("lstm", hidden=32, batch=5, dtype=torch.bfloat16)


def test_capture_records_one_launch_per_pass_and_restores_everything():
    before = dict(vars(pg)), dict(vars(pc)), os.environ.get("TRITON_INTERPRET")
    lp, launches = _capture(BF16_LSTM, family="persistent_grid", block_h=16)
    assert set(launches) == {"forward", "backward"}
    fwd, bwd = launches["forward"], launches["backward"]
    assert (fwd.name, bwd.name) == ("_grid_fwd_kernel", "_grid_bwd_kernel")
    assert fwd.fn is pg._grid_fwd_kernel.fn
    # Two hidden slices of 16, one batch tile, one direction: the plan's programs.
    assert fwd.grid == (2, 1) and fwd.grid[0] * fwd.grid[1] == lp.num_programs
    assert fwd.kwargs["num_warps"] == lp.num_warps
    assert fwd.kwargs["BLOCK_H"] == 16 and fwd.kwargs["BLOCK_B"] == lp.block_b
    # Kernel objects and the environment are back as they were.
    assert dict(vars(pg)) == before[0] and dict(vars(pc)) == before[1]
    assert os.environ.get("TRITON_INTERPRET") == before[2]


@pytest.mark.parametrize("constraints", [
    dict(family="persistent_cta"), dict(family="persistent_grid", block_k=0),
    dict(family="stepwise"),
], ids=["cta", "grid", "stepwise"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bidir"])
def test_a_whole_one_layer_backward_launches_one_recurrent_kernel(constraints, bidirectional):
    """The premise of `capture` stopping the backward at its first launch: run to the end
    (weight gradients included), a one-layer backward launches one kernel (`_only_new`
    raises otherwise), the one the stopped capture records."""
    shape = aot.AotShape("lstm", hidden=32, batch=5, proj=16, bidirectional=bidirectional)
    lp, launches = _capture(shape, **constraints)
    whole = aot.capture(shape, lp, whole_backward=True)
    assert [whole[p].name for p in whole] == [launches[p].name for p in launches]


def test_capture_skips_the_backward_after_its_launch(monkeypatch):
    """The weight-gradient GEMMs (torch.mm, after the recurrence) do not run in a capture."""
    def refuse(*args, **kwargs):
        raise AssertionError("a weight-gradient GEMM ran during a capture")

    monkeypatch.setattr(torch, "mm", refuse)
    lp, launches = _capture(BF16_LSTM, family="persistent_grid", block_h=16)
    assert launches["backward"].name == "_grid_bwd_kernel"


def test_compile_error_names_the_innermost_cause(monkeypatch):
    # Nested @triton.jit helpers chain one CompilationError per call level, each ending in a
    # caret line; the report keeps the outermost location and the innermost message.
    def failing_compile(*_a, **_k):
        try:
            try:
                raise AssertionError("input and other must have equal batch shapes")
            except AssertionError as e:
                raise RuntimeError("at 7:15:\n    return tl.dot(a, b)\n           ^") from e
        except RuntimeError as e:
            raise RuntimeError("at 142:24:\n    carry = _bwd_carry(...)\n            ^") from e

    monkeypatch.setattr(aot, "compile_launch", failing_compile)
    launch = aot.Launch("m", "_k", None, (4,), (), {"num_warps": 4})
    rep = aot.report_kernel("forward", launch, aot.GpuContext(torch.float32, False), H100)
    assert rep.error == ("RuntimeError: at 142:24: ... ^ <- AssertionError: input and other "
                         "must have equal batch shapes")


def test_capture_runs_nothing_in_the_interpreter(monkeypatch):
    # Triton <= 3.5's interpreter leaves triton.language patched after a launch, which breaks
    # every later compile in the process: the capture must not run the launchers' interpreter
    # probe (`_interpreter_loops_to_tensors`), nor any other kernel.
    from triton.runtime import interpreter

    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran in the interpreter during a capture")

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", refuse)
    probe = pc._interpreter_loops_to_tensors
    probe.cache_clear()  # an earlier test's answer would hide a probe launch
    lp, launches = _capture(BF16_LSTM, family="persistent_cta")
    assert pc._interpreter_loops_to_tensors is probe
    for launch in launches.values():
        assert aot.build_signature(launch).constexpr("HOST_STEPS") == -1  # the GPU's value


def test_recording_restores_on_error():
    original = pg._grid_fwd_kernel
    with pytest.raises(RuntimeError, match="boom"), aot.recording():
        assert isinstance(pg._grid_fwd_kernel, aot._Recorder)
        raise RuntimeError("boom")
    assert pg._grid_fwd_kernel is original


def test_recorder_refuses_a_host_call_of_a_device_function():
    with aot.recording(), pytest.raises(RuntimeError, match="called from the host"):
        pg._mm(None, None, True)


@pytest.mark.parametrize("constraints", [
    dict(family="persistent_cta"), dict(family="persistent_grid", block_k=0),
    dict(family="persistent_grid", block_k=32), dict(family="stepwise"),
], ids=["cta", "grid-resident", "grid-streamed", "stepwise"])
def test_every_launch_pins_fp_fusion(constraints):
    """Triton 3.10 turns FMA contraction off by default (3.9 warns at the first compile);
    every launch asks for it (kernels/compile_options.py), so the kernels' numerics and speed
    do not change with the release. The recurrences of each family and the dropout kernel."""
    from tritonrnn.kernels import dropout

    shape = aot.AotShape("lstm", hidden=64, batch=16, proj=32, bidirectional=True)
    lp, launches = _capture(shape, **constraints)
    assert set(launches) == {"forward", "backward"}
    with aot.recording(("tritonrnn.kernels.dropout",)) as sink:
        x = torch.zeros(4, 8)
        dropout.dropout_apply(x, x, torch.arange(4), 0.5, 7)
    assert len(sink) == 1
    for launch in [*launches.values(), *sink.values()]:
        assert launch.kwargs.get("enable_fp_fusion") is True, launch.name
        assert aot.build_signature(launch).options["enable_fp_fusion"] is True


def test_capture_pair_launch_and_projection():
    shape = aot.AotShape("lstm", hidden=32, batch=5, proj=16, dtype=torch.float16,
                         bidirectional=True)
    lp, launches = _capture(shape, family="persistent_grid", block_h=16)
    assert lp.num_dirs == 2
    fwd = launches["forward"]
    assert fwd.grid == (2, 2) and fwd.kwargs["NUM_DIRS"] == 2 and fwd.kwargs["P"] == 16
    sig = aot.build_signature(fwd)
    assert sig.signature["XG"] == "*fp16" and sig.signature["LENS"] == "*i32"
    assert sig.signature["HST"] == "*fp32"  # fp32 state workspace


def test_capture_refuses_float64():
    shape = aot.AotShape("gru", hidden=32, batch=5, dtype=torch.float64)
    lp, _ = aot.plan_layer(shape)
    with pytest.raises(ValueError, match="reference family"):
        aot.capture(shape, lp)


def test_grid_signature_runtime_args_are_not_specialised():
    """u_begin/u_end are 0/1 in the interpreter's one-step launches: a GPU launch has other
    values, so they (and B, n_sub, ...) must stay runtime i32, never a constexpr 1."""
    _, launches = _capture(BF16_LSTM, family="stepwise")
    for launch in launches.values():
        sig = aot.build_signature(launch)
        for name in launch.do_not_specialize:
            assert sig.signature[name] in ("i32", "i64"), name
        assert sig.signature["u_end"] == "i32"


# ----------------------------------------------------------------------------- GPU values


@pytest.mark.parametrize("shape, constraints, expected", [
    (BF16_LSTM, dict(family="persistent_grid", block_h=16),
     {"DOT_DT": (tl.float32, tl.bfloat16), "FP32_DOT": (True, False),
      "BARRIER": (0, 1)}),
    (BF16_LSTM, dict(family="stepwise"),
     {"DOT_DT": (tl.float32, tl.bfloat16), "FP32_DOT": (True, False)}),
    # fp32 resident (the planner streams fp32, `_weight_layouts`; forced here): the
    # interpreter's dots are the GPU's, nothing changes.
    (aot.AotShape("gru", hidden=32, batch=5, dtype=torch.float32),
     dict(family="stepwise", block_k=0), {}),
    (BF16_LSTM, dict(family="persistent_cta"), {"UPCAST": (True, False), "IEEE": (True, False)}),
    (aot.AotShape("rnn_tanh", hidden=32, batch=5, dtype=torch.float32),
     dict(family="persistent_cta"), {"UPCAST": (True, False)}),
], ids=["grid-persistent-bf16", "stepwise-bf16", "stepwise-fp32", "cta-bf16", "cta-fp32"])
def test_interpreter_constexprs_get_their_gpu_values(shape, constraints, expected):
    lp, launches = _capture(shape, **constraints)
    ctx = aot.GpuContext(shape.dtype, persistent=lp.family == "persistent_grid")
    for launch in launches.values():
        sig, changed = aot.gpu_signature(aot.build_signature(launch), ctx)
        want = {k: v for k, v in expected.items() if k in sig.names}  # this kernel's
        assert changed == want
        if "BARRIER" in sig.names:
            assert sig.constexpr("BARRIER") == int(lp.family == "persistent_grid")
        for name, (_, gpu) in want.items():
            assert sig.constexpr(name) == gpu
    assert {k for launch in launches.values() for k in expected
            if k in aot.build_signature(launch).names} == set(expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_rules_match_the_launchers_logic_outside_the_interpreter(dtype, monkeypatch):
    """The rules restate the launchers' "on GPU" branches: check them against the launchers'
    own helpers with interpretation off (fails when the lead changes that logic)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    upcast, ieee = pc._dot_flags(dtype, False)
    ctx = aot.GpuContext(dtype, persistent=True)
    # Under the interpreter IEEE is recorded True (allow_tf32 False).
    assert aot._gpu_upcast(True, ctx, {}) is upcast
    assert aot._gpu_ieee(True, ctx, {}) is ieee
    assert aot._gpu_dot_dt(tl.float32, ctx, {}) == gt._DOT_DTYPES[dtype]
    assert aot._gpu_fp32_dot(True, ctx, {"DOT_DT": gt._DOT_DTYPES[dtype]}) is (
        dtype == torch.float32)
    info = make_pack_info([3, 2], 3, torch.device("cpu"))
    assert aot._gpu_host_steps(3, ctx, {}) == pc._host_steps(info) == -1


# ----------------------------------------------------------------------------- parsing


SASS = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   LDS R3, [R0] ;
        /*0030*/              @!P0 BRA 0x90 ;
        /*0040*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0050*/                   ATOMG.E.ADD.STRONG.GPU PT, R2, desc[UR4][R6.64], R9 ;
        /*0060*/               @P1 BRA 0x50 ;
        /*0070*/                   BRA.DIV 0xf0 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/                   STG.E desc[UR4][R4.64], R2 ;
        /*00a0*/                   NOP ;
        /*00b0*/               @P0 BRA 0x20 ;
        /*00c0*/                   LDSM.16.M88.4 R4, [R2] ;
        /*00d0*/                   EXIT ;
        /*00e0*/                   BRA 0xe0;
        /*00f0*/                   SHFL.IDX PT, R2, R2, RZ, 0x1f ;
        /*0100*/                   BRA 0x80 ;
        /*0110*/                   STS [R0], R2 ;
        /*0120*/                   BRA 0x110 ;
"""


def test_loop_profile_counts_the_outermost_natural_loop():
    prof = aot.loop_profile(SASS)
    # Loop headed at 0x20 (back edge 0xb0): 0x20..0xb0 less the NOP (9), plus the out-of-line
    # divergence path 0xf0..0x100 that jumps back in. Unreachable 0x110.. and the 0xe0
    # self-branch after EXIT are not part of it.
    assert prof["instructions"] == 9 + 2
    assert (prof["LDS"], prof["MMA"], prof["ATOM"], prof["BAR"], prof["STG"]) == (1, 1, 1, 1, 1)
    assert prof["LDG"] == 0 and prof["LDSM"] == 0 and prof["STS"] == 0  # outside the loop
    assert prof["inner_loops"] == 1  # 0x50..0x60


def test_a_branch_back_from_outside_is_no_loop():
    """An out-of-line block that jumps back to an earlier address (0x100 -> 0x40) closes no
    loop: its target does not dominate it. The address-range rule would have taken it."""
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   BRA.DIV 0x100 ;
        /*0020*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0030*/               @P0 BRA 0x20 ;
        /*0040*/                   STG.E desc[UR4][R4.64], R2 ;
        /*0050*/                   EXIT ;
        /*0100*/                   SHFL.IDX PT, R2, R2, RZ, 0x1f ;
        /*0110*/                   BRA 0x40 ;
"""
    prof = aot.loop_profile(sass)
    assert (prof["instructions"], prof["LDG"], prof["STG"]) == (2, 1, 0)


def test_mma_chain_follows_accumulators_in_the_step_loop():
    sass = """
        /*0000*/                   HMMA.16816.F32.BF16 R40, R2, R4, RZ ;
        /*0010*/                   HMMA.16816.F32.BF16 R40, R2, R4, R40 ;
        /*0020*/                   HMMA.16816.F32.BF16 R8, R12.reuse, R16, RZ ;
        /*0030*/                   HMMA.16816.F32.BF16 R20, R12, R16.reuse, RZ ;
        /*0040*/                   HMMA.16816.F32.BF16 R8, R14, R18, R8 ;
        /*0050*/               @P1 HMMA.16816.F32.BF16 R24, R14, R18, R8 ;
        /*0060*/                   HMMA.16816.F32.BF16 R20, R14, R18, R20 ;
        /*0070*/               @P0 BRA 0x20 ;
        /*0080*/                   EXIT ;
"""
    # In the loop (0x20..0x70): R8 -> R8 -> R24 (3), R20 -> R20 (2); the chain of 2 at
    # 0x00..0x10 is before the loop. Over the whole function the longest is still 3.
    assert aot.loop_profile(sass)["MMA_chain"] == 3
    assert aot.mma_chain(sass) == 3 and aot.mma_chain(sass, {0x0, 0x10}) == 2
    assert aot.loop_profile(SASS)["MMA_chain"] == 1  # one HMMA (R8 written by no HMMA before)


def test_loop_profile_labels_and_no_loop():
    labelled = """
        /*0000*/                   LDG.E R2, desc[UR4][R4.64] ;
.L_x_0:
        /*0010*/                   HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/               @P0 BRA `(.L_x_0) ;
        /*0030*/                   EXIT ;
"""
    prof = aot.loop_profile(labelled)
    assert (prof["instructions"], prof["MMA"], prof["LDG"]) == (2, 1, 0)
    no_loop = SASS.split("/*0060*/")[0]
    assert aot.loop_profile(no_loop)["instructions"] == 0


SPILL_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL.64 [R1], R4 ;
        /*0020*/                   STL [R1+0x8], R6 ;
        /*0030*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0040*/                   LDL.LU.64 R8, [R1] ;
        /*0050*/                   BRA.DIV 0xc0 ;
        /*0060*/                   STL.128 [R1+0x10], R8 ;
        /*0070*/               @P0 BRA 0x30 ;
        /*0080*/                   LDL R6, [R1+0x8] ;
        /*0090*/                   STG.E desc[UR4][R4.64], R6 ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA 0xb0;
        /*00c0*/                   LDL R3, [R1+0x20] ;
        /*00d0*/                   BRA 0x60 ;
"""


def test_loop_profile_splits_local_memory_traffic_at_the_step_loop():
    """Spill stores in the prologue (0x10, 0x20) and a reload in the epilogue (0x80) are
    outside; the reload at 0x40, the store at 0x60 (modifiers .LU.64 / .128 stripped) and the
    reload on the out-of-line divergence path 0xc0 (it jumps back in) are in the loop."""
    prof = aot.loop_profile(SPILL_SASS)
    assert prof["instructions"] == 5 + 2  # 0x30..0x70 and 0xc0..0xd0
    assert (prof["LDL"], prof["STL"]) == (2, 1)
    assert (prof["LDL_outside"], prof["STL_outside"]) == (1, 2)
    assert (prof["LDG"], prof["STG"]) == (1, 0)
    # Without the back edge there is no step loop: every local access is outside.
    flat = aot.loop_profile(SPILL_SASS.replace("@P0 BRA 0x30", "NOP"))
    assert (flat["instructions"], flat["LDL"], flat["STL"]) == (0, 0, 0)
    assert (flat["LDL_outside"], flat["STL_outside"]) == (3, 3)


def test_loop_profile_without_local_memory_reports_zero_outside():
    prof = aot.loop_profile(SASS)
    assert {k: prof[k] for k in ("LDL", "STL", "LDL_outside", "STL_outside")} == dict.fromkeys(
        ("LDL", "STL", "LDL_outside", "STL_outside"), 0)


# sm_100 SASS (Triton 3.9, `tritonrnn aot --arch 100 --dump`): branches on a uniform
# predicate given as the first operand, and the tcgen05 MMA (UTCHMMA). The step loop is
# 0x20..0x40, entered unless UP0; its back edge is taken while !UP1.
SASS_SM100 = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   BRA.U UP0, 0x60 ;
        /*0020*/       UTCHMMA gdesc[UR40], gdesc[UR38], tmem[UR43], tmem[UR4], idesc[UR5], !UPT ;
        /*0030*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0040*/                   BRA.U !UP1, 0x20 ;
        /*0050*/                   STG.E desc[UR4][R4.64], R2 ;
        /*0060*/                   EXIT ;
        /*0070*/                   BRA 0x70;
"""


def test_loop_profile_reads_sm100_uniform_branches_and_tcgen05():
    """A `BRA.U UP0, target` may fall through (its predicate is an operand, not an @ guard):
    read as unconditional, the loop above was unreachable and every sm_100 fp32 step loop
    counted 0 instructions."""
    insns = aot.parse_sass(SASS_SM100)
    assert [i.predicated for i in insns if i.base == "BRA"] == [True, True, False]
    prof = aot.loop_profile(SASS_SM100)
    assert (prof["instructions"], prof["MMA"], prof["LDG"], prof["STG"]) == (3, 1, 1, 0)
    assert aot.mma_kind("tcgen05.mma.cta_group::1.kind::f16 [%r1], %rd2, %rd3;") == "tcgen05"


def test_mma_kind_and_res_usage_parsing():
    assert aot.mma_kind("wgmma.mma_async.sync.aligned.m64n16k16") == "wgmma"
    assert aot.mma_kind("mma.sync.aligned.m16n8k16.row.col.f32.bf16") == "mma"
    assert aot.mma_kind("fma.rn.f32") == "fma"
    text = (" Function _grid_bwd_kernel:\n  REG:255 STACK:232 SHARED:1024 LOCAL:8 "
            "CONSTANT[0]:928 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
    assert aot.parse_res_usage(text) == {"regs": 255, "stack": 232, "local": 8,
                                         "static_shared": 1024}
    with pytest.raises(RuntimeError, match="unexpected cuobjdump"):
        aot.parse_res_usage("nothing")


# ----------------------------------------------------------------------------- compiles

# (id, shape, constraints): the planner's own choice for LSTM 64 (persistent_cta), a forced
# persistent grid, a forced stepwise fp32 GRU (the planner's tiles: weights streamed).
COMPILES = [
    ("lstm64-cta-bf16", aot.AotShape("lstm", hidden=64, batch=16, dtype=torch.bfloat16), None),
    ("lstm256-grid-bf16", aot.AotShape("lstm", hidden=256, batch=16, dtype=torch.bfloat16),
     {"family": "persistent_grid", "block_h": 16}),
    ("gru256-stepwise-fp32", aot.AotShape("gru", hidden=256, batch=16, dtype=torch.float32),
     {"family": "stepwise"}),
]


@pytest.fixture(scope="module")
def reports():
    try:
        out = aot.aot_reports([(s, c) for _, s, c in COMPILES], "h100")
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_90: {e}")
    return {name: r for (name, _, _), r in zip(COMPILES, out, strict=True)}


def _kernels(report):
    assert [k["phase"] for k in report["kernels"]] == ["forward", "backward"]
    for k in report["kernels"]:
        assert k["error"] is None, k["error"]
    return report["kernels"]


def test_compiled_cta_bf16(reports):
    r = reports["lstm64-cta-bf16"]
    assert r["plan"]["family"] == "persistent_cta" and r["source"] == "heuristic"
    for k in _kernels(r):
        assert k["kernel"].startswith("_cta_")
        assert 0 < k["shared"] <= H100.smem_per_program  # the planner says it fits
        assert 0 < k["regs"] <= 255 and not k["spills"] and k["fits"]
        assert k["mma"] in ("mma", "wgmma")
        prof = k["profile"]
        assert prof["MMA"] > 0 and prof["BAR"] > 0 and prof["ATOM"] == 0  # no grid barrier
        assert prof["instructions"] > prof["MMA"]
        assert k["constexprs"]["UPCAST"] == "False"


def test_compiled_persistent_grid_bf16(reports):
    r = reports["lstm256-grid-bf16"]
    lp = r["plan"]
    assert (lp["family"], lp["block_h"]) == ("persistent_grid", 16)
    for k in _kernels(r):
        assert k["grid"] == [16, 1] and k["programs"] == 16 and k["co_resident"]
        # The planner's shared-memory formula is what its fit decisions rest on.
        assert 0 < k["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program
        # The weights stay in registers (HOIST): no local memory in the step loop. Triton 3.6
        # (the GPU machines') spills nothing; 3.9 saves 8 / 16 B around the loop, which the
        # report's `fits` counts as a spill.
        assert k["constexprs"]["HOIST"] == "True"
        assert k["regs"] > 0 and _local_ops(k)[0] == 0, k["profile"]
        if triton.__version__.startswith("3.6."):
            assert k["fits"] and not k["spills"]
        assert k["mma"] in ("mma", "wgmma")
        # The barrier is compiled in (BARRIER overridden): its atomics sit in the loop.
        assert k["interpreter_overrides"]["BARRIER"] == ["0", "1"]
        assert k["profile"]["ATOM"] >= 2 and k["profile"]["inner_loops"] >= 1
        assert k["profile"]["MMA"] > 0 and k["profile"]["LDG"] > 0
    # Dependent MMA chains: the forward's per-gate dots split K = 256 in 4 slices (64 / 16
    # = 4 MMAs each, `_gate_split`); the backward's 4 gates share one accumulator (chains of
    # 16 or fewer, `_bwd_chains`), K split in 4: 4 gates * 4 = 16.
    fwd, bwd = _kernels(r)
    assert fwd["constexprs"]["RS"] == "4" and bwd["constexprs"]["CHAINS"] == "1"
    assert fwd["profile"]["MMA_chain"] == 4 and bwd["profile"]["MMA_chain"] == 16


@pytest.mark.compiler_specific
def test_anchor_mma_chains():
    """The anchor (LSTM H=768 B=16, 16 x 16 tiles; both passes on 8 warps with their weights
    in registers, `planner._persistent_grid_warps`, `_persistent_grid_bwd_warps`): the
    backward's gates in 4 accumulators (K = 768 split in 8 over the warps: chains of 6; on 4
    warps in 4, chains of 12, not 4 * 12 = 48); the forward's two
    chunks (512 + 256) in 8 K slices each, one per warp, with the per-gate split-K dots
    (chains of 4; `_gate_split`, the slices added by halves; on 4 warps 4 slices, chains of
    8), none spilling. 4 gates x 2 MMA tiles
    x 768 / 16 is 384 MMAs, 96 per warp on 4 warps and 48 on 8: no warp forms a copy. (With
    2 slices, as while tl.sum added them, Triton 3.6 laid the slices over the 4 warps and
    ran each per-gate MMA twice: 192.)"""
    r = _compile_named([("anchor", aot.AotShape("lstm", hidden=768, batch=16,
                                                     dtype=torch.bfloat16))])
    fwd, bwd = _kernels(r["anchor"])
    assert bwd["constexprs"]["CHAINS"] == "4"
    assert fwd["constexprs"]["GATES"] == "0" and fwd["constexprs"]["RS"] == "8"
    assert fwd["profile"]["MMA_chain"] == 4
    assert bwd["profile"]["MMA_chain"] == 6
    assert (fwd["num_warps"], bwd["num_warps"]) == (8, 8)
    assert fwd["constexprs"]["HOIST"] == bwd["constexprs"]["HOIST"] == "True"
    for k in (fwd, bwd):
        assert k["profile"]["MMA"] == 4 * 2 * 768 // 16 // k["num_warps"], k["phase"]
    for k in (fwd, bwd):
        assert not k["spills"] and _local_ops(k) == (0, 0), k["profile"]


def test_compiled_stepwise_fp32(reports):
    """fp32 plans stream their weights (`rnn.planner._weight_layouts`): the FMA dots of a
    resident chunk spilled here (this shape's backward, block_k=0: 456 B per thread in
    Triton 3.6, 141 local loads per step); 64-column chunks spill nothing."""
    r = reports["gru256-stepwise-fp32"]
    assert r["plan"]["family"] == "stepwise" and r["plan"]["block_k"] == 64
    for k in _kernels(r):
        assert k["shared"] > 0 and k["regs"] > 0
        assert k["mma"] == "fma"  # exact fp32 dots run on the FMA units
        assert k["constexprs"]["BARRIER"] == "0" and k["co_resident"] is None
        assert k["profile"]["FFMA"] > 0 and k["profile"]["ATOM"] == 0
        assert not k["spills"] and _local_ops(k) == (0, 0), k["profile"]
        assert k["fits"]


@pytest.mark.compiler_specific
def test_hoisted_weights_leave_the_step_loop(monkeypatch):
    """HOIST (`kernels.grid_tiles._hoist_weights`, the planner's LSTM H=256 B=16: 16 x 16
    tiles, 4 warps, 256 B of weights per thread): without the runtime branches around the
    dots the compiler keeps the resident weights in registers: the step loops' ldmatrix
    drop to h's / dph's operand (per warp, Triton 3.6: forward 40 -> 8, backward 32 -> 16;
    3.9: 36 -> 4, 32 -> 16), the same
    MMAs, no local memory in the loop (Triton 3.6 spills nothing, 3.9 saves 8 / 16 B around
    the loop). TRITONRNN_HOIST_WEIGHTS=off compiles the branches. Both compiles sum the
    forward's gates per gate (TRITONRNN_FWD_JOINED_SUMS=off), so that HOIST alone differs:
    with the joined sums Triton 3.6's hoisted forward loop is the longer one (736 against 696
    instructions, `grid_tiles._FWD_JOINED_SUMS`)."""
    monkeypatch.setenv("TRITONRNN_FWD_JOINED_SUMS", "off")
    job = [(COMPILES[1][1], COMPILES[1][2])]
    try:
        (hoisted,) = aot.aot_reports(job, "h100")
        monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", "off")
        (r,) = aot.aot_reports(job, "h100")
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_90: {e}")
    assert _kernels(hoisted)[0]["constexprs"]["SUMS"] == "False"
    for k, base in zip(_kernels(hoisted), _kernels(r), strict=True):
        assert k["constexprs"]["HOIST"] == "True" and base["constexprs"]["HOIST"] == "False"
        assert k["profile"]["MMA"] == base["profile"]["MMA"], k["kernel"]
        # The weights' ldmatrix leave the loop (at least half of them: the operand's stay).
        assert 2 * k["profile"]["LDSM"] <= base["profile"]["LDSM"], (k["profile"],
                                                                      base["profile"])
        assert _local_ops(k)[0] == 0, k["profile"]
        assert k["profile"]["instructions"] < base["profile"]["instructions"]


ANCHOR = aot.AotShape("lstm", hidden=768, batch=16, dtype=torch.bfloat16)


# The anchor's forward as planned before 2026-11-26's fourth H200 session: 4 warps, its
# weights in shared memory (the planner's runs on 8 since, hoisted; `test_anchor_mma_chains`).
ANCHOR_4 = {"num_warps": 4}


@pytest.fixture(scope="module")
def anchor_report():
    """The anchor's compile (LSTM H=768 B=16, 16 x 16 tiles, 4 warps) with the default
    rules."""
    try:
        (r,) = aot.aot_reports([(ANCHOR, ANCHOR_4)], "h100")
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_90: {e}")
    return r


# Forward step-loop rules that each take 2 BAR.SYNC off the 4-warp anchor's loop, against
# their switch off (on the planner's 8-warp forward with its weights in registers Triton 3.6
# compiles PAIR to the same 16 BAR.SYNC and shared memory as without): MASK_IN_LOOP
# (`grid_tiles._mask_in_loop`: the active-row mask formed in the loop, not the
# loop-carried 1-D tensor Triton 3.6 converts to the tiles' layout
# through shared memory every step; 3.9 has no such conversion) and PAIR
# (`_paired_chunks`: both chunks of h, 512 + 256, loaded before either product and staged
# together; the per-gate forward's shared memory grows by the second chunk, 2*16*256 B, as
# the planner counts it: the plans' footprints are the backward's, whose paired gates stage
# more, so the count is the forward's with the backward's gates apart).
@pytest.mark.compiler_specific
@pytest.mark.parametrize("env, constexpr", [("TRITONRNN_FWD_MASK_IN_LOOP", "MASK_IN_LOOP"),
                                            ("TRITONRNN_FWD_PAIRED_CHUNKS", "PAIR")])
def test_forward_loop_rules_drop_two_barriers(anchor_report, monkeypatch, env, constexpr):
    monkeypatch.setenv(env, "off")
    try:
        (off,) = aot.aot_reports([(ANCHOR, ANCHOR_4)], "h100")
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_90: {e}")
    fwd, base = _kernels(anchor_report)[0], _kernels(off)[0]
    assert fwd["kernel"] == base["kernel"] == "_grid_fwd_kernel"
    want = ("1", "0") if constexpr == "PAIR" else ("True", "False")  # PAIR: 0, 1 or 2
    assert (fwd["constexprs"][constexpr], base["constexprs"][constexpr]) == want
    assert fwd["profile"]["MMA"] == base["profile"]["MMA"]
    bars = (fwd["profile"]["BAR"], base["profile"]["BAR"])
    if triton.__version__.startswith("3.6.") or constexpr == "PAIR":
        assert bars[0] == bars[1] - 2, bars
    else:
        assert bars[0] <= bars[1], bars
    lp, lp_off = anchor_report["plan"], off["plan"]
    assert fwd["shared"] <= lp["onchip_bytes"] and base["shared"] <= lp_off["onchip_bytes"]
    if constexpr == "PAIR":
        monkeypatch.setattr(gt, "_BWD_PAIRED_GATES", False)
        counts = []
        for paired in (True, False):
            monkeypatch.setattr(gt, "_FWD_PAIRED_CHUNKS", paired)
            counts.append(gt.grid_onchip_bytes("lstm", 768, 768, 0, torch.bfloat16, 16, 16,
                                               num_warps=4))
        assert counts[0] - counts[1] == 2 * 16 * 256, counts
        if triton.__version__.startswith("3.6."):
            assert fwd["shared"] - base["shared"] == 2 * 16 * 256
    # No local memory in the loop (Triton 3.6: none at all; 3.9, `test_anchor_mma_chains`).
    for k in (fwd, base):
        assert _local_ops(k)[0] == 0, k["profile"]
        if triton.__version__.startswith("3.6."):
            assert not k["spills"] and _local_ops(k) == (0, 0), k["profile"]


# The backward's gate operands loaded ahead (PAIRG, the default) compile where the planner fits
# their footprint: at the anchor with two gates' operands staged at once, within what the plan
# counts (147456 B: the weight slice and the staging apart). Triton 3.6 compiled the 4-warp
# unhoisted backward to exactly that (21 BAR.SYNC per step instead of 33); on the planner's 8
# warps hoisted, the weights' shared memory is dead once they are in registers and the
# staging reuses it: 98304 B, the slice alone. At GRU H=1536 B=16, where paired
# the backward would need 245760 B, the plan keeps its resident weights and the launch its
# gates apart (before the fit rule, the plan streamed the weights instead; since the split-K
# rule, the heuristic's backward there is the split-K kernel's, so the grid's is forced).
def test_paired_gates_compile_where_they_fit():
    gru = aot.AotShape("gru", hidden=1536, batch=16, dtype=torch.bfloat16)
    try:
        anchor, wide = aot.aot_reports([(ANCHOR, None), (gru, {"split_k_bwd": 0})], "h100")
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_90: {e}")
    for r, paired in ((anchor, True), (wide, False)):
        lp = r["plan"]
        assert (lp["family"], lp["block_k"], lp["pair_gates"]) == ("persistent_grid", 0, paired)
        bwd = _kernels(r)[1]
        assert bwd["constexprs"]["PAIRG"] == str(paired)
        assert bwd["shared"] <= lp["onchip_bytes"] <= H100.smem_per_program
    assert anchor["plan"]["onchip_bytes"] == 147456
    if triton.__version__.startswith("3.6."):  # (3.4 spilled the paired 4-warp anchor: 5
        bwd = _kernels(anchor)[1]               # local loads per step)
        assert bwd["shared"] == 98304 and bwd["constexprs"]["HOIST"] == "True"
        assert _local_ops(bwd)[0] == 0, bwd["profile"]


def _local_ops(k) -> tuple[int, int]:
    """(LDL + STL in the step loop, LDL + STL outside it) of a compiled kernel's report."""
    p = k["profile"]
    return p["LDL"] + p["STL"], p["LDL_outside"] + p["STL_outside"]


def test_local_memory_counts_agree_with_the_spill_bytes(reports):
    """ptxas reports no stack/local bytes <=> the SASS has no LDL/STL anywhere."""
    for r in reports.values():
        for k in _kernels(r):
            in_loop, outside = _local_ops(k)
            assert (in_loop + outside > 0) == k["spills"], (k["kernel"], k["profile"])
            assert k["loop_spills"] == (in_loop > 0), (k["kernel"], k["profile"])


@pytest.mark.parametrize("stack, local, in_loop, outside, kinds, shown", [
    (0, 0, 0, 0, (False, False), "yes"),
    (8, 0, 0, 2, (True, False), "yes*"),  # saved before the loop, restored after it
    (40, 0, 10, 2, (True, True), "NO:spills"),  # reloaded every step
    (0, 16, 3, 0, (True, True), "NO:spills"),
])
def test_only_spills_in_the_step_loop_fail_the_fit(stack, local, in_loop, outside, kinds, shown):
    profile = {"LDL": in_loop, "STL": 0, "LDL_outside": outside, "STL_outside": 0}
    assert aot.spill_kinds(stack, local, profile) == kinds
    assert aot.spill_kinds(stack, local, {}) == (kinds[0], kinds[0])  # no counts: in the loop
    k = dataclasses.asdict(aot.KernelReport("backward", "k", [4], 4, 4, shared=1024, regs=128,
                                            stack=stack, local=local, profile=profile))
    k.update(spills=kinds[0], loop_spills=kinds[1], fits_smem=True, fits_regs=True,
             fits=not kinds[1])
    report = {"shape": "s", "preset": "h100", "device": "d", "arch": 90, "triton": "t",
              "source": "heuristic", "kernels": [k], "plan": {
                  "family": "persistent_grid", "block_b": 16, "block_h": 16, "block_k": 0,
                  "num_warps": 4, "num_programs": 4, "num_dirs": 1, "onchip_bytes": 1024}}
    (row,) = [ln for ln in aot.format_report(report).splitlines() if "backward" in ln]
    assert row.split("|")[0].split()[-1] == shown, row
    assert aot.report_ok(report) is (not kinds[1])


def test_report_names_the_forwards_programs_where_the_backward_takes_more():
    """A split-K plan's backward launch takes more programs than its forward (the planner's
    rule at LSTM H=1024 B=16: 128 against 64): the plan line names both."""
    plan = {"family": "persistent_grid", "block_b": 16, "block_h": 16, "block_k": 0,
            "num_warps": 8, "num_programs": 128, "num_dirs": 1, "onchip_bytes": 163840}
    report = {"shape": "s", "preset": "h100", "device": "d", "arch": 90, "triton": "t",
              "source": "heuristic", "kernels": [], "plan": plan}
    assert "programs=128 planner" in aot.format_report(report)
    plan["forward_programs"] = 64
    assert "programs=128 (forward 64) planner" in aot.format_report(report)


def test_compile_options_reach_ptxas(reports):
    """An extra compile option (maxnreg, an experiment knob) caps the registers: the capped
    kernels spill, and (the step loop being where the live values are) reload in the loop;
    the uncapped ones (no spills) have no local-memory traffic at all."""
    shape = COMPILES[0][1]
    (r,) = aot.aot_reports([(shape, None)], "h100", compile_options={"maxnreg": 64})
    assert r["compile_options"] == {"maxnreg": 64} and "maxnreg" in aot.format_report(r)
    for k, base in zip(_kernels(r), reports["lstm64-cta-bf16"]["kernels"], strict=True):
        assert base["regs"] > 64 >= k["regs"] > 0
        assert k["spills"], f"{k['kernel']} at 64 registers no longer spills: pick a lower cap"
        assert _local_ops(k)[0] > 0, k["profile"]
        assert _local_ops(base) == (0, 0) and not base["spills"]


# The planner's own choice for B = 64 at H = 1024: 16 x 32 tiles, whose 4-warp compiles
# spilled in every step before the backward got 8 warps and the 1024 reduction two 512 chunks
# (Triton 3.6, in-loop local loads + stores: LSTM backward 518, forward 118; GRU 436 / 97).
# The forward on 8 warps (`planner._split_k_on_8`, timed faster than 4 on an H200): per-gate
# dots, each gate's K split 8 ways, each MMA once. (The grid's own backward, forced: at LSTM
# H=1024 B=64 the heuristic's is the split-K kernel's, `test_split_k_rule_compiles_...`.)
WIDE = {
    "lstm1024-b64": aot.AotShape("lstm", hidden=1024, batch=64, dtype=torch.bfloat16),
    "gru1024-b64": aot.AotShape("gru", hidden=1024, batch=64, dtype=torch.bfloat16),
}


def _compile_named(named, constraints: dict | None = None) -> dict:
    """{name: report} of the planner's heuristic plans for [(name, AotShape)] on an H100
    (under plan `constraints` where given)."""
    try:
        out = aot.aot_reports([(s, constraints) for _, s in named], "h100")
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_90: {e}")
    return dict(zip((name for name, _ in named), out, strict=True))


@pytest.mark.compiler_specific
@pytest.mark.parametrize("name", list(WIDE))
def test_wide_tiles_keep_spills_out_of_the_step_loop(name):
    r = _compile_named([(name, WIDE[name])], {"split_k_bwd": 0})[name]
    lp = r["plan"]
    fwd_warps = 8
    assert (lp["block_h"], lp["block_b"], lp["num_warps"], lp["num_warps_bwd"]) == (
        16, 32, fwd_warps, 0)
    fwd, bwd = _kernels(r)
    assert (fwd["num_warps"], bwd["num_warps"]) == (fwd_warps, 8)
    assert fwd["constexprs"]["RKA"] == fwd["constexprs"]["RKB"] == "512"
    # No MMA computed twice: the gates' 16 x 8 MMA tiles (4 per gate), K / 16 steps each,
    # over the warps.
    gates = 4 if name.startswith("lstm") else 3
    assert fwd["constexprs"]["GATES"] == "0"
    assert fwd["constexprs"]["RS"] == "8"  # K slices: one per warp
    assert fwd["profile"]["MMA"] == gates * (32 // 8) * (1024 // 16) // fwd_warps
    # Neither step loop has local-memory traffic (Triton 3.6 and 3.9 compiles).
    assert _local_ops(bwd)[0] == 0, bwd["profile"]
    assert _local_ops(fwd)[0] == 0, fwd["profile"]
    for k in (fwd, bwd):
        assert k["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program


# The split-K rule's plans (`planner._SPLIT_K_RULE`): the heuristic's backward at LSTM H=1024
# B=16 is the one-barrier kernel, at B=64 and GRU H=1536 B=16 the two-barrier one, on 8
# warps, their forwards the grid's; no local memory in either step loop and within the
# plan's shared memory (Triton 3.6 on the H200 preset, 2026-11-30: 81920 / 86016 / 139264
# B, 226 / 206 / 100 registers).
@pytest.mark.compiler_specific
def test_split_k_rule_compiles_without_spills():
    got = _compile_named([
        ("lstm1024-b16", aot.AotShape("lstm", hidden=1024, batch=16, dtype=torch.bfloat16)),
        ("lstm1024-b64", WIDE["lstm1024-b64"]),
        ("gru1536-b16", aot.AotShape("gru", hidden=1536, batch=16, dtype=torch.bfloat16))])
    kernels = {"lstm1024-b16": "_split_k1_bwd_kernel", "lstm1024-b64": "_split_k_bwd_kernel",
               "gru1536-b16": "_split_k_bwd_kernel"}
    for name, r in got.items():
        lp = r["plan"]
        assert lp["split_k_bwd"] == (1 if name == "lstm1024-b16" else 2), name
        fwd, bwd = _kernels(r)
        assert (fwd["kernel"], bwd["kernel"], bwd["num_warps"]) == (
            "_grid_fwd_kernel", kernels[name], 8)
        for k in (fwd, bwd):
            assert _local_ops(k)[0] == 0, (name, k["profile"])
            assert k["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program


# The planner's B = 64 plans at H = 768 (GRU 1024 too): a 16 x 32 forward on 8 warps, the
# backward on its own 32 x 16 tiles (`planner._taller_backward`): half the hidden slices, the
# same programs,
# the backward's step loop shorter than on 16 x 32 (LSTM 1019 -> 840 instructions, GRU 809
# -> 679, GRU H=1024 867 -> 737; Triton 3.6) and free of local memory.
TALLER = {
    "lstm768-b64": aot.AotShape("lstm", hidden=768, batch=64, dtype=torch.bfloat16),
    "gru768-b64": aot.AotShape("gru", hidden=768, batch=64, dtype=torch.bfloat16),
    "gru1024-b64": aot.AotShape("gru", hidden=1024, batch=64, dtype=torch.bfloat16),
}


@pytest.mark.compiler_specific
@pytest.mark.parametrize("name", list(TALLER))
def test_backward_compiles_on_its_own_tiles(name):
    r = _compile_named([(name, TALLER[name])])[name]
    lp = r["plan"]
    assert (lp["block_h"], lp["block_b"], lp["block_h_bwd"], lp["block_b_bwd"]) == (
        16, 32, 32, 16)
    fwd, bwd = _kernels(r)
    tiles = [(k["constexprs"]["BLOCK_H"], k["constexprs"]["BLOCK_B"]) for k in (fwd, bwd)]
    assert tiles == [("16", "32"), ("32", "16")]
    assert fwd["programs"] == bwd["programs"] == lp["num_programs"]
    assert (fwd["num_warps"], bwd["num_warps"]) == (8, 8)
    for k in (fwd, bwd):
        assert _local_ops(k)[0] == 0, (k["phase"], k["profile"])
        assert k["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program


# The planner's resident plan for LSTM H=512 B=256: 16 x 64 tiles on 8 warps. Its backward
# held K = 512 in one chunk and spilled in every step (Triton 3.6: 72 B, 17 local loads per
# step); a 64-column tile halves its chunks (`grid_tiles._max_chunk`: 256 + 256).
B256 = [("lstm512-b256", aot.AotShape("lstm", hidden=512, batch=256, dtype=torch.bfloat16))]


@pytest.mark.compiler_specific
def test_64_column_tiles_halve_their_chunks_and_do_not_spill():
    r = _compile_named(B256)["lstm512-b256"]
    lp = r["plan"]
    assert (lp["block_h"], lp["block_b"], lp["block_k"], lp["num_warps"]) == (16, 64, 0, 8)
    fwd, bwd = _kernels(r)
    assert fwd["constexprs"]["RKA"] == fwd["constexprs"]["RKB"] == "256"
    assert bwd["constexprs"]["RKA"] == bwd["constexprs"]["RKB"] == "256"
    for k in (fwd, bwd):
        assert _local_ops(k)[0] == 0, k["profile"]
        assert k["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program


# 16 x 16 backwards whose resident weights fit registers on neither 4 nor 8 warps, their
# first chunk neither, run 8 warps unhoisted (`planner._too_large_to_hoist`): on 4 their
# step loops spilled (Triton 3.6: LSTM H=1280 17 local loads per step; 3.9: 7), on 8 none.
@pytest.mark.compiler_specific
def test_backwards_too_large_to_hoist_run_8_warps_without_spills():
    got = _compile_named([
        ("lstm1280", aot.AotShape("lstm", hidden=1280, batch=16, dtype=torch.bfloat16))])
    for r in got.values():
        lp = r["plan"]
        assert (lp["block_h"], lp["block_b"], lp["block_k"]) == (16, 16, 0)
        assert (lp["num_warps"], lp["num_warps_bwd"]) == (4, 8)
        bwd = _kernels(r)[1]
        assert bwd["num_warps"] == 8 and bwd["constexprs"]["HOIST"] == "False"
        assert _local_ops(bwd)[0] == 0, bwd["profile"]
        assert bwd["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program


# Only the first resident chunk in registers (`grid_tiles.Hoist.FIRST`: GRU H=1536
# B=16's 1024 of 1536 columns in both passes, 8 warps; the 32 x 16 backward of GRU H=1024
# B=64, 512 of 1024): no local memory in the step loops, and fewer ldmatrix per step than
# the same passes unhoisted (Triton 3.6, per warp: GRU H=1536 forward 48 on 8 warps -> 24,
# backward 72 -> 48; GRU H=1024 B=64 backward 72 -> 48).
@pytest.mark.compiler_specific
def test_first_chunk_hoisted_without_spills(monkeypatch):
    # (the grid's own backward forced: GRU H=1536 B=16's heuristic runs the split-K one)
    named = [("gru1536", aot.AotShape("gru", hidden=1536, batch=16, dtype=torch.bfloat16)),
             ("gru1024-b64", WIDE["gru1024-b64"])]
    got = _compile_named(named, {"split_k_bwd": 0})
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", "off")
    off = _compile_named(named, {"split_k_bwd": 0})
    for name, r in got.items():
        lp = r["plan"]
        kernels = _kernels(r) if name == "gru1536" else _kernels(r)[1:]
        assert lp["num_warps"] == 8 and all(k["num_warps"] == 8 for k in kernels)
        for k, k_off in zip(kernels, _kernels(off[name])[-len(kernels):], strict=True):
            assert k["constexprs"]["HOIST"] == k["constexprs"]["HOIST_FIRST"] == "True"
            assert k_off["constexprs"]["HOIST"] == "False", k["phase"]
            assert _local_ops(k)[0] == 0, k["profile"]
            assert k["profile"]["LDSM"] < k_off["profile"]["LDSM"], (name, k["phase"])
            assert k["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program


@pytest.mark.compiler_specific
def test_split_k_backward_compiles_where_switched_on(monkeypatch):
    """TRITONRNN_BWD_SPLIT_K=on: the captured backward is the split-K kernel's (with the
    barrier: one persistent launch), and its sm_90 compile at LSTM H=1024 B=64 (64 x 512 x 64
    tiles, a 64 KiB R block) uses wgmma and keeps its step loop free of spills."""
    monkeypatch.setenv("TRITONRNN_BWD_SPLIT_K", "on")
    got = _compile_named([("lstm1024-b64", WIDE["lstm1024-b64"])])["lstm1024-b64"]
    fwd, bwd = _kernels(got)
    assert fwd["kernel"] == "_grid_fwd_kernel" and bwd["kernel"] == "_split_k_bwd_kernel"
    assert bwd["constexprs"]["BARRIER"] == "1" and "wgmma" in bwd["mma"]
    assert bwd["constexprs"]["U"] == "64" and bwd["constexprs"]["KC"] == "128"
    assert _local_ops(bwd)[0] == 0 and bwd["fits"], bwd["profile"]


@pytest.mark.compiler_specific
def test_one_barrier_split_k_backward_compiles_where_switched_on(monkeypatch):
    """TRITONRNN_BWD_SPLIT_K1=on (with the two-barrier form's switch on too): the captured
    backward at LSTM H=1024 B=16 is the one-barrier kernel's on `split_k1_tiles`' 256 x 128
    x 16 tiles (K blocks of 32 units), persistent, and its sm_90 compile keeps its step loop
    free of spills within the shared memory a grid program has."""
    monkeypatch.setenv("TRITONRNN_BWD_SPLIT_K", "on")
    monkeypatch.setenv("TRITONRNN_BWD_SPLIT_K1", "on")
    shape = aot.AotShape("lstm", hidden=1024, batch=16, dtype=torch.bfloat16)
    got = _compile_named([("lstm1024-b16", shape)])["lstm1024-b16"]
    fwd, bwd = _kernels(got)
    assert fwd["kernel"] == "_grid_fwd_kernel" and bwd["kernel"] == "_split_k1_bwd_kernel"
    c = bwd["constexprs"]
    assert (c["BARRIER"], c["U"], c["KU"], c["BB"], c["NK"]) == ("1", "256", "32", "16", "32")
    assert _local_ops(bwd)[0] == 0 and bwd["fits"], bwd["profile"]


@pytest.mark.parametrize("one, preset, tiles", [
    (False, "h100", (64, 512, 64)), (False, "a100", (256, 256, 64)),
    (True, "h100", (256, 128, 16)), (True, "a100", (256, 256, 16)),
], ids=["two-barriers-h100", "two-barriers-a100", "one-barrier-h100", "one-barrier-a100"])
def test_split_k_capture_takes_its_tiles_from_the_preset(monkeypatch, one, preset, tiles):
    """The split-K backward's tiles come from the device at launch, not from the plan: a
    capture for a preset derives them from the preset's properties (an A100 has 108 SMs and
    less shared memory than the interpreter preset's H100 figures), as a launch on that GPU
    would: `split_k_tiles` at LSTM H=1024 B=64 (TRITONRNN_BWD_SPLIT_K), `split_k1_tiles` at
    B=16 (TRITONRNN_BWD_SPLIT_K1; an A100 takes 64 programs of 64-unit K blocks, an H100 128
    of 32-unit ones)."""
    from tritonrnn.kernels import split_k

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1" if one else "_BWD_SPLIT_K", True)
    B = 16 if one else 64
    shape = aot.AotShape("lstm", hidden=1024, batch=B, dtype=torch.bfloat16)
    lp, _ = aot.plan_layer(shape, preset)
    rule = split_k.split_k1_tiles if one else split_k.split_k_tiles
    assert rule("lstm", 1024, B, torch.bfloat16, PRESETS[preset]) == tiles
    bwd = aot.capture(shape, lp, props=PRESETS[preset])["backward"]
    U, KB, BB = tiles
    assert bwd.name == ("_split_k1_bwd_kernel" if one else "_split_k_bwd_kernel")
    kb = 4 * bwd.kwargs["KU" if one else "KC"]
    assert (bwd.kwargs["U"], kb, bwd.kwargs["BB"]) == tiles
    assert bwd.grid == (split_k.tiles("lstm", 1024, B, U, KB, BB, one_barrier=one)[0],)


@pytest.mark.parametrize("form, kernel, tiles", [
    (1, "_split_k1_bwd_kernel", (256, 128, 16)), (2, "_split_k_bwd_kernel", (64, 512, 16)),
])
def test_split_k_capture_follows_a_forced_form(form, kernel, tiles):
    """plan_constraints(split_k_bwd=...) through `plan_layer` (`tritonrnn aot --split-k-bwd`),
    both switches off: the captured backward at LSTM H=1024 B=16 on the H100 preset is that
    form's kernel on its rule's tiles and the kernel's 8 warps; the forward is the plan's
    grid forward."""
    shape = aot.AotShape("lstm", hidden=1024, batch=16, dtype=torch.bfloat16)
    lp, source = aot.plan_layer(shape, "h100", {"split_k_bwd": form})
    assert (source, lp.split_k_bwd) == ("constrained", form)
    got = aot.capture(shape, lp, props=PRESETS["h100"])
    bwd = got["backward"]
    assert got["forward"].name == "_grid_fwd_kernel" and bwd.name == kernel
    kb = 4 * bwd.kwargs["KU" if form == 1 else "KC"]
    assert (bwd.kwargs["U"], kb, bwd.kwargs["BB"]) == tiles
    assert bwd.kwargs["num_warps"] == 8


def test_report_table_and_json_round_trip(reports, tmp_path):
    text = aot.format_report(reports["lstm256-grid-bf16"])
    assert "_grid_fwd_kernel" in text and "BARRIER=1" in text
    lines = text.splitlines()
    group, head = next((a, b) for a, b in zip(lines, lines[1:], strict=False)
                       if b.lstrip().startswith("pass"))
    # The in-loop LDL/STL columns sit in the step-loop group, the outside ones after it.
    assert group.index("step loop") < head.index("LDL") < group.index("outside loop")
    assert head.rstrip().endswith("LDL   STL") and head.count("LDL") == 2
    # Group line, header and kernel rows stay one screen wide.
    rows = [ln for ln in lines if "_grid_" in ln]
    assert len(rows) == 2 and max(len(ln) for ln in (group, head, *rows)) <= 190
    assert {len(ln) for ln in (head, *rows)} == {len(head)}  # columns line up
    path = tmp_path / "aot.json"
    aot.write_json(list(reports.values()), path)
    written = json.loads(path.read_text())
    here = environment(torch.device("cpu"))
    assert {k: written["host"][k] for k in ("commit", "source_sha256", "triton")} == {
        k: here[k] for k in ("commit", "source_sha256", "triton")}
    loaded = written["reports"]
    assert len(loaded) == len(COMPILES)
    for key in ("LDL", "STL", "LDL_outside", "STL_outside"):
        assert all(isinstance(k["profile"][key], int) for r in loaded for k in r["kernels"])


# A stand-in for the device driver of an H100: the three queries of a JIT compile.
_DRIVER = r"""
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

class Driver:
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
"""

# A fresh process (no TRITON_INTERPRET): compare build_signature + gpu_signature with what
# Triton's own JIT makes of the same GPU-valued call for a sm_90 target. The JIT runs as far
# as its compile call (a stand-in device driver answers its queries; `triton.compiler.compile`
# is replaced by one that keeps the ASTSource and stops), so nothing compiles and no
# version-specific JIT internals are called.
_JIT_CHECK = _DRIVER + r"""
import importlib, torch, triton.compiler
from tritonrnn.bench import aot

class Stop(Exception):
    pass

def keep(src, target=None, options=None):
    raise Stop(src)

driver.set_active(Driver())
triton.compiler.compile = keep
checked = 0
for shape, cons in [
        (aot.AotShape("lstm", 64, 16, dtype=torch.bfloat16), None),
        (aot.AotShape("lstm", 32, 5, proj=16, dtype=torch.float16, bidirectional=True),
         {"family": "persistent_grid", "block_h": 16}),
        (aot.AotShape("gru", 48, 17, dtype=torch.float32), {"family": "stepwise"})]:
    lp, _ = aot.plan_layer(shape, "h100", cons)
    ctx = aot.GpuContext(shape.dtype, lp.family == "persistent_grid")
    for launch in aot.capture(shape, lp).values():
        mine, _ = aot.gpu_signature(aot.build_signature(launch), ctx)
        kernel = getattr(importlib.import_module(launch.module), launch.name)
        gpu = mine.constexprs_by_name()
        kwargs = {k: gpu.get(k, v) for k, v in launch.kwargs.items()}
        kwargs.update(mine.options)
        try:
            kernel.warmup(*launch.args, grid=(1,), **kwargs)
            raise AssertionError(f"{launch.name}: the JIT did not reach its compile call")
        except Stop as stop:
            src = stop.args[0]
        assert src.signature == mine.signature, (launch.name, src.signature, mine.signature)
        assert src.constants == mine.constexprs, (launch.name, src.constants, mine.constexprs)
        attrs = {k: v for k, v in src.attrs.items() if v}  # the JIT lists "no hint" as []
        assert attrs == mine.attrs, (launch.name, attrs, mine.attrs)
        checked += 1
print("checked", checked)
"""


def test_signature_matches_tritons_jit_specialisation():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _JIT_CHECK], env=env, capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "checked 6" in res.stdout


def test_parallel_compiles_come_back_in_the_jobs_order(monkeypatch):
    """processes=N deals the jobs round-robin to N fresh processes at once and puts their
    reports back in the jobs' order."""
    shares = []

    def fresh(jobs, preset, arch, dump_dir, options):
        shares.append([s.hidden for s, _ in jobs])
        return [{"shape": s.label} for s, _ in jobs]

    monkeypatch.setattr(aot, "_reports_in_fresh_process", fresh)
    monkeypatch.setattr(aot, "_tool", lambda name, arch=90: name)
    jobs = [(aot.AotShape("lstm", 16 * (i + 1), 16), None) for i in range(7)]
    out = aot.aot_reports(jobs, "h100", processes=3)
    assert [r["shape"] for r in out] == [s.label for s, _ in jobs]
    assert sorted(shares) == [[16, 64, 112], [32, 80], [48, 96]]
    with pytest.raises(ValueError, match="processes: expected an int >= 1, got 0"):
        aot.aot_reports(jobs, "h100", processes=0)


# The whole way a GPU run compiles, short of a GPU: the real engine and launchers, outside the
# interpreter (so they make their GPU choices: DOT_DT, VW, BARRIER, launch options...), on CPU
# tensors that the launchers' checks are told are on a GPU, through the JIT with the stand-in
# driver; Triton's launch itself does nothing. After `aot_reports` compiled the same shapes,
# every kernel the launchers ask for must already be in the cache: what makes
# `tritonrnn aot --device-preset current` a warm-up of a GPU machine's runs. One shape per
# kind of kernel (small sizes: quick compiles).
_LAUNCH_CHECK = _DRIVER + r"""
import os, types, torch
from triton.compiler.compiler import CompiledKernel
from tritonrnn.bench import aot
from tritonrnn.kernels import persistent_cta as pc
from tritonrnn.kernels import persistent_grid as pg
from tritonrnn.kernels import grid_tiles as gt
from tritonrnn.rnn import engine
from tritonrnn.rnn.config import make_config
from tritonrnn.rnn.packing import make_pack_info
from tritonrnn.rnn.params import config_params_size
from tritonrnn.rnn.triton_backend import TritonRecurrence

jobs = [
    (aot.AotShape("lstm", 64, 16), None),  # persistent CTA
    (aot.AotShape("lstm", 128, 16), {"family": "persistent_grid", "block_h": 16}),
    (aot.AotShape("gru", 128, 1), {"family": "persistent_grid", "block_b": 1}),  # vector
    (aot.AotShape("lstm", 128, 64), {"family": "persistent_grid", "block_k": 64}),  # streamed
    (aot.AotShape("lstm", 32, 5, proj=16, dtype=torch.float32, bidirectional=True),
     {"family": "persistent_grid", "block_h": 16}),  # fp32 FMA dots, projection, pair launch
    (aot.AotShape("rnn_tanh", 64, 16, dtype=torch.float16), {"family": "persistent_grid"}),
    (aot.AotShape("gru", 48, 17, dtype=torch.float32), {"family": "stepwise"}),
]
cache = os.environ["TRITON_CACHE_DIR"]
aot.aot_reports(jobs, "h100", processes=2)
before = set(os.listdir(cache))
driver.set_active(Driver())
CompiledKernel._init_handles = lambda self: None  # loads the binary: no GPU here
CompiledKernel.launch_metadata = lambda self, *a: None
runs = [0]  # launches that reached a compiled kernel


def _counted(self):
    def run(*a, **k):
        runs[0] += 1
    return run


CompiledKernel.run = property(_counted)

def interpreted(check):
    def run(*args, **kwargs):
        os.environ["TRITON_INTERPRET"] = "1"  # only for its CUDA-tensor check
        try:
            return check(*args, **kwargs)
        finally:
            del os.environ["TRITON_INTERPRET"]
    return run

grid_check = interpreted(pg._check_common)

def on_gpu(*args, **kwargs):
    dtype, dev, _ = grid_check(*args, **kwargs)
    return dtype, dev, True

pg._check_common = on_gpu
pc._check_common = interpreted(pc._check_common)
torch.cuda.get_device_properties = lambda d=None: types.SimpleNamespace(
    multi_processor_count=132, shared_memory_per_block_optin=232448)
launched = 0
for shape, cons in jobs:
    lp, _ = aot.plan_layer(shape, "h100", cons)

    class Planned(TritonRecurrence):
        def plan_choice(self, s):
            return lp, "constrained"

    cfg = make_config(rnn_mode=shape.mode, num_layers=1, num_units=shape.hidden,
                      input_size=shape.hidden, num_proj=shape.proj,
                      direction="bidirectional" if shape.bidirectional else "unidirectional")
    B, D, T = shape.batch, cfg.num_dirs, 3
    info = make_pack_info([T] * B, T, torch.device("cpu"))
    z = dict(dtype=shape.dtype)
    x = torch.zeros(info.N, cfg.input_size, **z)
    params = torch.zeros(config_params_size(cfg), **z)
    h0 = torch.zeros(D, B, cfg.out_size, **z)
    c0 = torch.zeros(D, B, cfg.num_units, **z) if cfg.is_lstm else None
    first = runs[0]
    fwd = engine.forward(cfg, Planned(), x, h0, c0, params, info, training=True)
    engine.backward(cfg, Planned(), x, h0, c0, params, info, fwd.y, torch.zeros_like(fwd.y),
                    torch.zeros_like(h0), torch.zeros_like(c0) if c0 is not None else None,
                    fwd.reserve)
    # A forward and a backward launch at least reached compiled kernels (without them, no
    # new cache entry would prove nothing).
    assert runs[0] - first >= 2, f"{shape.label}: {runs[0] - first} compiled launches"
    new = sorted(set(os.listdir(cache)) - before)
    assert not new, f"{shape.label}: the launch path compiled {len(new)} kernels aot did not"
    launched += 1
print("launched", launched, "entries", len(before), "runs", runs[0])
"""


def test_the_launch_path_finds_every_kernel_aot_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    res = subprocess.run([sys.executable, "-c", _LAUNCH_CHECK], env=env, capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "launched 7 entries 14" in res.stdout, res.stdout


# Every kind of kernel the planner launches, as it plans them for an H100: they compile and
# fit on every supported Triton (scripts/test_floor.sh runs them with the oldest, 3.4).
# What the compiles cost, shared memory against the planner's estimates included, is the
# business of the GPU machines' Triton (3.6): the compiler_specific tests.
KINDS = [  # (id, shape, family, block_k, MMA kind: fma for one-row tiles and exact fp32 dots)
    ("cta", aot.AotShape("lstm", hidden=64, batch=16), "persistent_cta", 0, "mma"),
    ("grid-16x16", aot.AotShape("lstm", hidden=768, batch=16), "persistent_grid", 0, "mma"),
    ("grid-16x32", aot.AotShape("gru", hidden=1024, batch=64), "persistent_grid", 0, "mma"),
    ("grid-vector", aot.AotShape("lstm", hidden=768, batch=1), "persistent_grid", 0, "fma"),
    ("grid-streamed", aot.AotShape("lstm", hidden=768, batch=256), "persistent_grid", 64,
     "wgmma"),
    ("grid-fp32-proj-pair", aot.AotShape("lstm", hidden=512, batch=16, proj=256,
                                         dtype=torch.float32, bidirectional=True),
     "persistent_grid", 64, "fma"),
    ("grid-tanh-fp16", aot.AotShape("rnn_tanh", hidden=1024, batch=16, dtype=torch.float16),
     "persistent_grid", 0, "mma"),
]


@pytest.fixture(scope="module")
def kind_reports():
    return _compile_named([(name, shape) for name, shape, *_ in KINDS])


@pytest.mark.parametrize(("name", "family", "block_k", "mma"),
                         [(name, *rest) for name, _, *rest in KINDS],
                         ids=[name for name, *_ in KINDS])
def test_the_planners_kernels_compile_for_sm90(kind_reports, name, family, block_k, mma):
    r = kind_reports[name]
    lp = r["plan"]
    assert (lp["family"], lp["block_k"]) == (family, block_k)
    for k in _kernels(r):
        assert 0 < k["shared"] <= H100.smem_per_program
        assert 0 < k["regs"] <= 255 and k["fits_smem"] and k["fits_regs"]
        assert k["mma"] == mma
        if family == "persistent_grid":
            assert k["co_resident"] and k["programs"] == lp["num_programs"]
            assert k["interpreter_overrides"]["BARRIER"] == ["0", "1"]
            assert k["profile"]["ATOM"] >= 2  # the grid barrier is compiled in


@pytest.mark.compiler_specific
@pytest.mark.parametrize("name", [name for name, *_ in KINDS])
def test_the_planners_estimates_hold_for_its_kernels(kind_reports, name):
    """The planner's fit decisions rest on its on-chip estimate plus _SMEM_SLACK (Triton
    3.4's persistent-CTA backward exceeds it: 88192 B against 74752 + 7168 at LSTM H=64)."""
    lp = kind_reports[name]["plan"]
    for k in _kernels(kind_reports[name]):
        assert k["shared"] <= lp["onchip_bytes"] + _SMEM_SLACK <= H100.smem_per_program


# Large batch: the planner streams the weights (64 x 32 tiles, chunks of 64 columns). The
# streamed loops join the forward's gates into one [4 * 32, 64] tile and form the dots
# transposed, [batch 64, K] @ [K, rows], so both loops are Hopper wgmma where the per-gate
# [32, 64] products were mma.sync (Triton 3.6 before: forward 32 MMA, 37 LDSM; backward 384
# MMA, 389 LDSM, 153 BAR in the step loop, four inner loops).
LARGE = [
    ("lstm768-b256", aot.AotShape("lstm", hidden=768, batch=256, dtype=torch.bfloat16)),
    ("gru1024-b256", aot.AotShape("gru", hidden=1024, batch=256, dtype=torch.bfloat16)),
]


@pytest.fixture(scope="module")
def large_reports():
    return _compile_named(LARGE)


@pytest.mark.parametrize("name", [name for name, _ in LARGE])
def test_large_batch_streamed_loops_are_wgmma(large_reports, name):
    r = large_reports[name]
    lp = r["plan"]
    assert (lp["family"], lp["block_h"], lp["block_b"], lp["block_k"]) == (
        "persistent_grid", 32, 64, 64)
    fwd, bwd = _kernels(r)
    assert fwd["constexprs"]["GATES"] == "1" and fwd["constexprs"]["SWAP"] == "True"
    assert bwd["constexprs"]["SWAP"] == "True"
    for k in (fwd, bwd):
        assert k["mma"] == "wgmma", k["kernel"]
        assert not k["spills"] and _local_ops(k) == (0, 0), k["profile"]
        assert k["profile"]["LDSM"] <= 8, k["profile"]  # no mma.sync operand loads
        # The planner's formula is the compiled size (3 pipeline buffers of the widest loop).
        assert k["shared"] <= lp["onchip_bytes"] <= H100.smem_per_program - _SMEM_SLACK
    assert fwd["shared"] == lp["onchip_bytes"]
    # The backward's gates share one loop: a few MMAs per step, not 4 * 96.
    assert bwd["profile"]["MMA"] <= 32, bwd["profile"]


# Past the co-resident grid the planner runs stepwise tiles that read the fewest L2 bytes per
# step (`planner._stepwise_fit`): 64 x 64, streamed. They took the first resident tile that fit
# before, and spilled (bytes per thread, forward / backward): LSTM H=1024 B=4096 at 16 x 64
# tiles Triton 3.6 0 / 88 B, 3.9 352 / 560 B; rnn_tanh H=2048 B=1024 at 32 x 32 (3.6) 360 /
# 10032 B. Now Triton 3.6 spills neither; 3.9 spills the LSTM forward, 80 B (12 local loads).
HUGE = [
    ("lstm1024-b4096", aot.AotShape("lstm", hidden=1024, batch=4096, dtype=torch.bfloat16)),
    ("tanh2048-b1024", aot.AotShape("rnn_tanh", hidden=2048, batch=1024,
                                    dtype=torch.bfloat16)),
]


def _check_streamed_plans(named, family, block_h, spill_free):
    """Each shape's plan is `family` on block_h x 64 tiles (any block_h where None) streamed
    in 64-column chunks, both kernels wgmma within the planner's shared-memory estimate and,
    where spill_free, without local memory."""
    reports = _compile_named(named)
    for name, _ in named:
        r = reports[name]
        lp = r["plan"]
        assert (lp["family"], lp["block_b"], lp["block_k"]) == (family, 64, 64), name
        assert block_h in (None, lp["block_h"]), name
        for k in _kernels(r):
            assert k["mma"] == "wgmma", (name, k["kernel"])
            assert k["co_resident"] or family == "stepwise", name
            if spill_free:
                assert not k["spills"] and _local_ops(k) == (0, 0), (name, k["profile"])
            assert k["shared"] <= lp["onchip_bytes"] <= H100.smem_per_program - _SMEM_SLACK


@pytest.mark.compiler_specific
def test_huge_batch_stepwise_tiles_are_wgmma_without_spills():
    _check_streamed_plans(HUGE, "stepwise", 64, triton.__version__.startswith("3.6."))


# The persistent grid's first co-resident tiles at these shapes would hold resident chunks of
# 512 or 1024 columns against 64-column batch tiles, and spilled (Triton 3.6, local loads per
# step, forward + backward: 1097, 40, 335); the planner streams their weights instead
# (`grid_tiles.resident_operands_fit`). Neither Triton 3.6 nor 3.9 spills them so.
WIDE_CHUNKS = [
    ("tanh1536-b64", aot.AotShape("rnn_tanh", hidden=1536, batch=64, dtype=torch.bfloat16)),
    ("lstm768-b128", aot.AotShape("lstm", hidden=768, batch=128, dtype=torch.bfloat16)),
    ("gru768-b256", aot.AotShape("gru", hidden=768, batch=256, dtype=torch.bfloat16)),
]


@pytest.mark.compiler_specific
def test_wide_resident_chunks_stream_without_spills():
    _check_streamed_plans(WIDE_CHUNKS, "persistent_grid", None, True)


# The planner's tiles at B = 1024 were 128 x 64, whose step loops spilled (Triton 3.6, local
# loads + stores per step, forward / backward: LSTM H=1024 82 / 905, GRU 64 / 131). Now:
# 64 x 128 (`planner._grid_batch_tiles`: the same programs, less L2 traffic), whose
# forwards spill less (41 / 31), and backwards whose sub-steps load their own inputs after
# their product (`grid_tiles._late_loads`): prefetched 951 / 140, late 102 / 15.
# Triton 3.9 spills the forwards more, about as much at either tile (LSTM 132 at 128 x 64,
# 113 at 64 x 128; GRU 116 / 113), the late backwards 109 / 17 (prefetched at 128 x 64: 169
# / 21).
# The A100 preset's plans, compiled for sm_80 (no wgmma there): resident 16 x 16 tiles (the
# anchor, GRU H=1024), streamed 16 x 64 (LSTM H=1024 B=64: 128 programs of the H100's 16 x 32
# tiles would not be co-resident on 108 SMs), GRU H=1536 (streamed, where the H100 holds it
# resident), 64 x 64 at B=256, and the vector tiles of B=1.
A100_PLANS = [
    ("lstm768-b16", aot.AotShape("lstm", hidden=768, batch=16, dtype=torch.bfloat16)),
    ("gru1024-b16", aot.AotShape("gru", hidden=1024, batch=16, dtype=torch.bfloat16)),
    ("lstm1024-b64", aot.AotShape("lstm", hidden=1024, batch=64, dtype=torch.bfloat16)),
    ("gru1536-b16", aot.AotShape("gru", hidden=1536, batch=16, dtype=torch.bfloat16)),
    ("lstm1024-b256", aot.AotShape("lstm", hidden=1024, batch=256, dtype=torch.bfloat16)),
    ("lstm768-b1", aot.AotShape("lstm", hidden=768, batch=1, dtype=torch.bfloat16)),
]


@pytest.mark.compiler_specific
def test_a100_plans_compile_for_sm80_within_the_preset():
    """The planner's rules were calibrated on sm_90 compiles; on the A100 preset its plans
    compile for sm_80 within the shared memory it estimates and the A100 offers, co-resident,
    and on Triton 3.6 without spills (also every shape of the grid and targets presets,
    `tritonrnn aot --preset grid --device-preset a100`). Triton 3.9 spills one of them: LSTM
    H=1024 B=256's 64 x 64 tiles on mma.sync (41 forward, 110 backward local loads + stores
    per step; no 128-program grid is co-resident on 108 SMs)."""
    a100 = PRESETS["a100"]
    on_36 = triton.__version__.startswith("3.6.")
    try:
        reports = aot.aot_reports([(s, None) for _, s in A100_PLANS], "a100", a100.arch)
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_80: {e}")
    for (name, _), r in zip(A100_PLANS, reports, strict=True):
        lp = r["plan"]
        assert r["arch"] == 80 and lp["family"] == "persistent_grid", name
        assert lp["num_programs"] <= a100.sm_count, name
        for k in _kernels(r):
            assert k["mma"] == ("fma" if lp["block_b"] == 1 else "mma"), (name, k["kernel"])
            assert k["shared"] <= lp["onchip_bytes"] <= a100.smem_per_program, name
            assert k["fits_smem"] and k["co_resident"], (name, k["kernel"])
            if on_36 or name != "lstm1024-b256":
                assert k["fits"] and not k["spills"], (name, k["kernel"])
                assert _local_ops(k) == (0, 0), (name, k["profile"])


LATE_TILES = [
    ("lstm1024-b1024", aot.AotShape("lstm", hidden=1024, batch=1024, dtype=torch.bfloat16)),
    ("gru1024-b1024", aot.AotShape("gru", hidden=1024, batch=1024, dtype=torch.bfloat16)),
]


@pytest.mark.compiler_specific
def test_b1024_tiles_are_64x128_and_their_backwards_load_late():
    reports = _compile_named(LATE_TILES)
    on_36 = triton.__version__.startswith("3.6.")
    for name, fwd_bound, bwd_bound in (("lstm1024-b1024", 64 if on_36 else 128, 128),
                                       ("gru1024-b1024", 48 if on_36 else 128, 32)):
        r = reports[name]
        lp = r["plan"]
        assert (lp["family"], lp["block_h"], lp["block_b"]) == ("persistent_grid", 64, 128)
        fwd, bwd = _kernels(r)
        assert bwd["constexprs"]["LATE"] == "True", name
        assert _local_ops(fwd)[0] <= fwd_bound, (name, fwd["profile"])
        assert _local_ops(bwd)[0] <= bwd_bound, (name, bwd["profile"])
        for k in (fwd, bwd):
            assert k["mma"] == "wgmma" and k["co_resident"], (name, k["kernel"])
            assert k["shared"] <= lp["onchip_bytes"] <= H100.smem_per_program - _SMEM_SLACK


# The streamed loops' stages (`planner._stream_stages`): each pass's streamed loop pipelined
# for 96 KiB in flight (at most 8 stages; a gated cell's backward on 64 x 64 tiles keeps
# Triton's default 3). The launches carry num_stages to the compile, which buffers one chunk
# per stage (the joint / swapped loops: batch tiles of 64, and the gated forward) or one
# fewer (the other unswapped loops), within the planner's count. On Triton 3.6 (the GPU
# machines') no deepened pass has local memory in its step loop; 3.9 spills LSTM H=1024
# B=256's 5-stage forward a little (16 B, 2 local operations per step).
STAGED = {
    "lstm1024-b256": (aot.AotShape("lstm", hidden=1024, batch=256, dtype=torch.bfloat16),
                      (5, 8)),  # 32 x 64 tiles: 24 / 12 KiB per stage
    "lstm384-b1024": (aot.AotShape("lstm", hidden=384, batch=1024, dtype=torch.bfloat16),
                      (4, 3)),  # 64 x 64: 40 / 16 KiB
    "tanh3072-b1": (aot.AotShape("rnn_tanh", hidden=3072, batch=1, dtype=torch.bfloat16),
                    (8, 8)),  # 32 x 16: 6 KiB per stage, both loops unswapped
}


@pytest.mark.compiler_specific
@pytest.mark.parametrize("name", list(STAGED))
def test_streamed_loops_compile_on_their_stages(name):
    shape, want = STAGED[name]
    r = _compile_named([(name, shape)])[name]
    lp = r["plan"]
    assert lp["block_k"] == 64
    assert (lp["num_stages"], lp["num_stages_bwd"] or lp["num_stages"]) == want
    for k, stages, p in zip(_kernels(r), want, ("fwd", "bwd"), strict=True):
        assert k["num_stages"] == stages
        nbytes = gt.stream_stage_bytes(shape.mode, shape.hidden, 0, shape.dtype,
                                       lp["block_h"], lp["block_b"], 64, p)
        full = lp["block_b"] >= 64 or (p == "fwd" and shape.mode != "rnn_tanh")
        assert k["shared"] == (stages if full else stages - 1) * nbytes, (p, k["shared"])
        assert k["shared"] <= lp["onchip_bytes"] <= H100.smem_per_program
        if stages > 3 and triton.__version__.startswith("3.6."):
            assert _local_ops(k)[0] == 0, (p, k["profile"])
