"""The benchmark package's measurement and reporting (tritonrnn.bench): the report
files of custom runs, the barrier JSON's tags, and grid-barrier timeouts during timed runs
(barrier rows, tuner candidates). GPU-only paths are driven on the CPU with their launches
replaced by stubs; only the harness logic around them runs."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tritonrnn.bench import barrier, runners, tune
from tritonrnn.bench.cli import main
from tritonrnn.bench.presets import BenchShape
from tritonrnn.bench.timing import Timing, TimingConfig


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path / "cache"))
    # `--device cpu` sets TRITON_INTERPRET for the process; restore it after each test.
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "0"))


# ----------------------------------------------------------------------------- report files


def test_two_custom_runs_into_one_directory_keep_both_reports(tmp_path, capsys):
    """gpu_session.sh's `vector` stage runs `bench --mode lstm --hidden 768 ...` and then
    `--mode gru --hidden 1024 ...` with the same --out: both are preset 'custom', and the
    second report (JSON and PNG) used to replace the first."""
    common = ["bench", "--device", "cpu", "--hidden", "4", "--input-size", "3", "--batch", "1",
              "--time", "2", "--dtype", "fp32", "--impl", "torch", "--pass", "fwd",
              "--cpu-rep", "1", "--no-progress", "--out", str(tmp_path)]
    assert main([*common, "--mode", "lstm"]) == 0
    assert main([*common, "--mode", "gru"]) == 0
    capsys.readouterr()
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert sorted(r["results"][0]["shape"]["mode"] for r in reports) == ["gru", "lstm"]
    assert len(list(tmp_path.glob("*.png"))) == 2


def test_a_preset_with_overridden_options_does_not_replace_the_presets_report(tmp_path,
                                                                              capsys):
    """`--preset smoke --time 2` is not the smoke sweep: its report names the overrides and
    its file is not smoke's (it used to overwrite the preset's own report)."""
    common = ["bench", "--device", "cpu", "--preset", "smoke", "--impl", "torch", "--pass",
              "fwd", "--cpu-rep", "1", "--no-progress", "--out", str(tmp_path)]
    assert main(common) == 0
    assert main([*common, "--time", "2"]) == 0
    capsys.readouterr()
    reports = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert len(reports) == 2 and len(list(tmp_path.glob("*.png"))) == 2
    (plain,) = [r for r in reports.values() if "overrides" not in r]
    (name, over), = [(n, r) for n, r in reports.items() if "overrides" in r]
    assert over["overrides"] == {"time": 2}
    assert name.endswith("-smoke-time-2-pass-fwd-impl-torch.json")
    assert {r["shape"]["time"] for r in over["results"]} == {2}
    assert plain["preset"] == over["preset"] == "smoke"


@pytest.mark.parametrize("second", [["--pass", "bwd", "--impl", "torch"],
                                    ["--pass", "fwd", "--impl", "torch-packed"],
                                    ["--pass", "fwd", "--impl", "torch", "--backend",
                                     "reference"]],
                         ids=["pass", "impl", "backend"])
def test_runs_of_other_passes_or_implementations_keep_both_reports(tmp_path, capsys, second):
    """A `--pass fwd` run and a `--pass bwd` run of one preset (or runs of other --impl, or
    --backend) are different reports: each file is named after its run options, so the second
    no longer replaces the first."""
    common = ["bench", "--device", "cpu", "--preset", "smoke", "--time", "2", "--batch", "1",
              "--cpu-rep", "1", "--no-progress", "--out", str(tmp_path)]
    assert main([*common, "--pass", "fwd", "--impl", "torch"]) == 0
    assert main([*common, *second]) == 0
    capsys.readouterr()
    reports = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert len(reports) == 2 and len(list(tmp_path.glob("*.png"))) == 2
    selections = sorted(tuple(sorted(r["selection"].items())) for r in reports.values())
    assert len(set(selections)) == 2
    for name, r in reports.items():
        want = "-".join(f"{k}-{v}" for k, v in r["selection"].items())
        assert name.endswith(f"-smoke-batch-1-time-2-{want}.json"), name


def test_report_path_without_selection_keeps_the_preset_name(tmp_path):
    from tritonrnn.bench.harness import report_path

    report = {"created": "2026-11-30T00:00:00", "environment": {"device": "NVIDIA H200"},
              "preset": "grid", "results": []}
    assert report_path(report, tmp_path).name == "nvidia-h200-2026-11-30-grid.json"
    report["selection"] = {"pass": "fwdbwd"}
    assert report_path(report, tmp_path).name == "nvidia-h200-2026-11-30-grid-pass-fwdbwd.json"


# ----------------------------------------------------------------------------- barrier


def _stub_barrier_launches(monkeypatch, *, timed_out: bool, bare_timed_out: bool = False):
    """measure_shape on the CPU: a persistent-grid plan, launches that do nothing, a fixed
    1 ms per timed call, the deferred barrier check raising when `timed_out`, and the bare
    barrier's sync tensor [counter, error flag] with its flag set when `bare_timed_out`."""
    from tritonrnn.kernels import grid_barrier, persistent_grid
    from tritonrnn.rnn import planner

    lp = planner.LayerPlan("persistent_grid", block_b=16, block_h=32, num_warps=4,
                           num_programs=8)
    monkeypatch.setattr(planner, "device_properties", lambda device: None)
    monkeypatch.setattr(planner, "recurrence_choice", lambda *a, **k: (lp, "heuristic"))
    monkeypatch.setattr(persistent_grid, "grid_forward", lambda *a, **k: None)
    monkeypatch.setattr(persistent_grid, "grid_backward", lambda *a, **k: None)
    monkeypatch.setattr(grid_barrier, "run_bare_barriers",
                        lambda *a, **k: torch.tensor([0, int(bare_timed_out)], dtype=torch.int32))

    def check():
        if timed_out:
            raise grid_barrier.BarrierTimeoutError("a launch of _grid_fwd: timed out")

    monkeypatch.setattr(grid_barrier, "check_barriers", check)

    def timed(fn, device_type, cfg):
        fn()
        return Timing(1.0, 1.0, 1.0)

    monkeypatch.setattr(barrier, "time_callable", timed)


@pytest.mark.parametrize("timed_out, bare", [(False, False), (True, False), (False, True)],
                         ids=["ok", "timed-out", "bare-timed-out"])
def test_barrier_row_is_no_timing_when_a_timed_launchs_barrier_timed_out(monkeypatch,
                                                                        timed_out, bare):
    _stub_barrier_launches(monkeypatch, timed_out=timed_out, bare_timed_out=bare)
    T = 8
    row = barrier.measure_shape("gru", 32, 2, T, torch.float32, torch.device("cpu"),
                                TimingConfig())
    if not (timed_out or bare):
        assert row["step_us"] == pytest.approx(1e3 / T)
        assert row["ratio"] == pytest.approx(1.0)
        return
    assert "step_us" not in row and "ratio" not in row
    assert "timed out" in row["note"]
    assert "timed out" in barrier.format_rows([row])


@pytest.mark.parametrize("form, bwd_warps", [(0, 8), (0, 4), (1, 8), (2, 8), (2, 4)])
def test_barrier_row_times_each_pass_as_the_plan_runs_it(monkeypatch, form, bwd_warps):
    """A plan whose backward is the split-K kernel's (the planner's rule at LSTM H=1024 B=16:
    128 programs under a 64-program forward): the row times that kernel, on the plan's
    launch, not the grid backward, and each pass against the bare barriers of its own
    launch: its programs (`split_k.footprint` of the launch, 96 here, not the plan's 128)
    and, for the two-barrier form, two a step; the grid's own backward (form 0) against the
    forward's barrier. Each pass's bare barriers run on that pass's warps (they ran on 4
    whatever the kernels'), so a backward on other warps than the forward's gets its own."""
    from tritonrnn.kernels import grid_barrier, persistent_grid, split_k
    from tritonrnn.rnn import planner

    lp = planner.LayerPlan("persistent_grid", block_b=16, block_h=16, num_warps=8,
                           num_programs=128 if form else 64,
                           forward_programs=64 if form else 0, split_k_bwd=form,
                           num_warps_bwd=0 if bwd_warps == 8 else bwd_warps)
    launch = split_k.SplitK(256, 128, 16, True) if form == 1 else split_k.SplitK(
        64, 512, 16, False)
    ran = []  # each launch: "fwd", "grid", ("split", its launch's keywords) or ("bare", n)
    monkeypatch.setattr(planner, "device_properties", lambda device: None)
    monkeypatch.setattr(planner, "recurrence_choice", lambda *a, **k: (lp, "heuristic"))
    monkeypatch.setattr(planner, "split_k_launch",
                        lambda p, *a: launch if p.split_k_bwd else None)
    monkeypatch.setattr(split_k, "footprint", lambda *a: (96, 81920))
    monkeypatch.setattr(persistent_grid, "grid_forward", lambda *a, **k: ran.append("fwd"))
    monkeypatch.setattr(persistent_grid, "grid_backward", lambda *a, **k: ran.append("grid"))
    monkeypatch.setattr(split_k, "split_k_backward", lambda *a, **k: ran.append(
        ("split", k["units"], k["kblock"], k["btile"], k["one_barrier"], k["num_warps"])))
    monkeypatch.setattr(grid_barrier, "run_bare_barriers", lambda count, n, device, *,
                        num_warps: (ran.append(("bare", n, count, num_warps)),
                                    torch.tensor([0, 0], dtype=torch.int32))[1])
    monkeypatch.setattr(grid_barrier, "check_barriers", lambda: None)

    def timed(fn, device_type, cfg):
        """1 ms a forward, 2 ms a backward, programs / 64 ms a run of T bare barriers."""
        fn()
        last = ran[-1]
        ms = (1.0 if last == "fwd" else last[1] / 64 * last[2] / T if last[0] == "bare"
              else 2.0)
        return Timing(ms, ms, ms)

    monkeypatch.setattr(barrier, "time_callable", timed)
    T = 8
    row = barrier.measure_shape("lstm", 1024, 16, T, torch.bfloat16, torch.device("cpu"),
                                TimingConfig())
    backward = ("split", *launch, bwd_warps) if form else "grid"
    barriers = 2 if form == 2 else 1  # a step
    own_bare = bool(form) or bwd_warps != 8
    assert ran == ["fwd", backward, ("bare", 64, T, 8)] + (
        [("bare", 96 if form else 64, barriers * T, bwd_warps)] if own_bare else [])
    assert (row["programs"], row["programs_bwd"], row["split_k_bwd"]) == (
        64, 96 if form else 64, form)
    assert row["barriers_bwd"] == barriers and row["bare_warps"] == [8, bwd_warps]
    assert row["ratio"] == pytest.approx(1.0)  # 1 ms against the 64 programs' 1 ms
    # 2 ms against 1.5 ms (96 programs) a barrier, two of them a step in the two-barrier
    # form; against the forward's 1 ms (64 programs) for the grid's backward
    assert row["bwd_ratio"] == pytest.approx({0: 2.0, 1: 2 / 1.5, 2: 2 / 3.0}[form])
    assert ("barrier_bwd_us" in row) == own_bare
    text = barrier.format_rows([row])
    assert ("backward split-K" in text) == bool(form)
    if form:
        assert f"{'one barrier' if form == 1 else 'two barriers'} a step, 96 programs" in text


def test_barrier_json_is_tagged_with_commit_versions_and_timing(tmp_path, capsys,
                                                               monkeypatch):
    """The design: JSON tagged with GPU, commit and versions. The barrier file had only the
    device name and the rows."""
    row = {"mode": "gru", "H": 512, "B": 1, "T": 16, "dtype": "bfloat16",
           "family": "persistent_grid", "programs": 8, "block_h": 64, "block_b": 16,
           "block_k": 0, "num_warps": 4, "num_warps_bwd": 4, "step_us": 5.0,
           "bwd_step_us": 9.0, "barrier_us": 2.5, "ratio": 2.0, "bwd_ratio": 3.6}

    def fake_run(T, dtype, timing, shapes, on_row=None):
        assert isinstance(timing, TimingConfig)
        on_row(row)
        return [row]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(barrier, "run", fake_run)
    assert main(["barrier", "--time", "16", "--mode", "gru", "--hidden", "512", "--batch",
                 "1", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    (path,) = tmp_path.glob("barrier-*.json")
    data = json.loads(path.read_text())
    assert data["rows"] == [row] and data["device"] == "Fake GPU"
    env = data["environment"]
    assert env["device"] == "Fake GPU"
    for key in ("commit", "source_sha256", "torch", "triton", "python"):
        assert env[key], key
    assert data["time"] == 16 and data["dtype"] == "bf16"
    assert data["timing"]["method"] == "triton.testing.do_bench"
    assert data["command"][:2] == ["tritonrnn", "barrier"]


# ----------------------------------------------------------------------------- tune


def test_tune_fails_a_candidate_whose_timed_launch_had_a_barrier_time_out(monkeypatch):
    """The harness checks the deferred barrier flags after timing (a timed-out barrier skips
    its waits: a fast, wrong time); the tuner did not, so such a time could be cached as the
    key's best choice."""
    from tritonrnn.kernels import grid_barrier

    runner = runners.Runner("tritonrnn", passes={"fwdbwd": lambda: None},
                            correctness={"ok": True, "max_scaled_error": 0.0})
    monkeypatch.setattr(runners, "build_case", lambda *a, **k: object())
    monkeypatch.setattr(runners, "compute_oracle", lambda case: None)
    monkeypatch.setattr(runners, "tritonrnn_runner", lambda case, backend: runner)
    timed = []

    def fake_measure(fn, device_type, cfg):
        timed.append(fn())
        return Timing(0.5, 0.5, 0.5)

    monkeypatch.setattr(tune, "measure", fake_measure)

    def check():  # the checked run's launches were fine; a timed one's barrier timed out
        if timed:
            raise grid_barrier.BarrierTimeoutError("a launch of _grid_fwd: timed out")

    monkeypatch.setattr(grid_barrier, "check_barriers", check)
    shape = BenchShape(mode="lstm", hidden=32, batch=4, time=8, dtype="float32").validated()
    measure_choice = tune.shape_measurer(shape, torch.device("cuda"), TimingConfig())
    with pytest.raises(grid_barrier.BarrierTimeoutError):
        measure_choice({}, None)
    assert timed == [None]


def test_tune_fails_a_grid_candidate_that_ran_stepwise(monkeypatch):
    """A persistent-grid launch that raises RuntimeError (a cooperative launch the driver
    refuses) is rerun stepwise with a warning; tune timed that as the grid choice. Now the
    choice fails, naming the fallback (interpreter; the refusal stands in)."""
    from tritonrnn.kernels import persistent_grid as pg

    shape = BenchShape(mode="gru", hidden=16, batch=3, time=3, dtype="float32").validated()
    measure_choice = tune.shape_measurer(shape, torch.device("cpu"), TimingConfig(cpu_rep=1))
    choice = {"family": "persistent_grid", "block_h": 16, "block_b": 16}
    assert measure_choice(choice, None) > 0  # the grid itself: a time
    real = pg.grid_forward

    def refused(*args, persistent, **kw):
        if persistent:
            raise RuntimeError("cooperative launch refused")
        return real(*args, persistent=persistent, **kw)

    monkeypatch.setattr(pg, "grid_forward", refused)
    with pytest.warns(RuntimeWarning, match="rerunning stepwise"), pytest.raises(
            RuntimeError, match=r"its persistent launch failed and ran stepwise \(tritonrnn: "
                                r"persistent-grid launch failed \(cooperative launch refused"):
        measure_choice(choice, None)
    assert measure_choice({"family": "stepwise", "block_h": 16, "block_b": 16}, None) > 0


# ----------------------------------------------------------------------------- labels


def _gpu_report(packed_backend: str) -> dict:
    """A GPU report of one varlen shape: tritonrnn, cuDNN on padded input, and torch.nn on
    a PackedSequence that ran `packed_backend` (runners.torch_runner's rnn_backend)."""
    def run(impl, ms):
        return {"impl": impl, "pass": "fwd", "status": "ok", "ms": ms, "ms_p20": ms,
                "ms_p80": ms, "peak_bytes": 1024, "tflops": 1.0, "pct_roofline": 1.0,
                "speedup_vs_torch": 8.0 / ms, "speedup_vs_torch_packed": 20.0 / ms}

    def entry(backend):
        return {"status": "ok", "correctness": None, "correctness_note": "timed only",
                "reserve_bytes": None, "rnn_backend": backend}

    result = {"label": "lstm H256 B16 T1024 bf16 varlen=uniform", "tokens": 9000,
              "runs": [run("tritonrnn", 2.0), run("torch", 8.0), run("torch-packed", 20.0)],
              "implementations": {"tritonrnn": {**entry(None), "rnn_backend": None},
                                  "torch": entry("cuDNN 91900"),
                                  "torch-packed": entry(packed_backend)},
              "reserve_ratio": {}, "plan": {"error": "none here"}}
    return {"environment": {"device_type": "cuda", "device": "NVIDIA H200", "commit": "abc"},
            "preset": "varlen", "results": [result],
            "roofline": {"memory_bytes_per_s": 4e12, "matrix_flops_per_s": {"bfloat16": 7e14}}}


def test_a_packed_baseline_that_did_not_run_cudnn_is_not_called_cudnn():
    """torch runs a bfloat16 PackedSequence with its native CUDA kernels (the committed H200
    varlen results: rnn_backend 'torch native CUDA', no cuDNN reserve), yet the summary
    table and the plot named that baseline 'cuDNN-packed'."""
    from tritonrnn.bench.harness import display_name, format_table

    native = _gpu_report("torch native CUDA")
    text = format_table(native)
    assert "cuDNN-packed" not in text
    assert "torch-native-packed" in text
    assert display_name("torch", native) == "cuDNN"  # the padded run did take cuDNN
    assert display_name("torch-packed", _gpu_report("cuDNN 91900")) == "cuDNN-packed"


def test_the_gpu_timing_description_names_the_stretched_budget(monkeypatch):
    """measure() stretches do_bench's budget to at least 2 warm-up calls and MIN_SAMPLES
    timed calls of a slow pass; the report said only warmup_ms / rep_ms (25 / 100), which a
    12 ms pass would turn into 8 samples, not the 10 or more that ran."""
    import triton.testing

    from tritonrnn.bench import timing

    got = {}

    def do_bench(fn, warmup, rep, quantiles):
        got.update(warmup=warmup, rep=rep)
        return [1.0, 1.0, 1.0]

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    monkeypatch.setattr(timing, "one_run_ms", lambda fn, device_type: 37.0)
    cfg = TimingConfig()
    timing.measure(lambda: None, "cuda", cfg)
    desc = cfg.describe("cuda")
    assert got["rep"] >= desc["min_samples"] * 37.0
    assert got["warmup"] >= desc["min_warmup_calls"] * 37.0
    assert desc["min_samples"] == timing.MIN_SAMPLES
