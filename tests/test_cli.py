"""The `tritonrnn` command in-process: check, bench, tune, plan and the one-line errors.

Shapes are tiny: the Triton kernels run in the interpreter when there is no GPU. Every test
points the tuning cache at a temporary directory so nothing touches the user's cache.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tritonrnn.bench import cli
from tritonrnn.bench.cli import main
from tritonrnn.rnn import engine, reference


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path / "cache"))
    # `--device cpu` sets TRITON_INTERPRET for the process; restore it after each test.
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "0"))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tritonrnn: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ----------------------------------------------------------------------------- check


def test_check_reference_every_combination_passes(capsys):
    rc = main(["check", "--backend", "reference", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "20/20 combinations pass" in out
    for mode in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        for d in ("uni", "bi"):
            for lens in ("full", "varlen"):
                assert any(line.split()[:2] == [mode, d] and lens in line
                           for line in out.splitlines()), (mode, d, lens)


def test_check_fails_with_nonzero_exit_on_a_wrong_backend(capsys, monkeypatch):
    """A recurrence whose output is off by 1e-3 (far above fp32 rounding) must fail check."""

    def broken(self, *args):
        reference.recurrence_forward(*args)
        args[9].add_(1e-3)  # y, the layer output

    monkeypatch.setattr(engine.ReferenceRecurrence, "forward", broken)
    rc = main(["check", "--backend", "reference", "--mode", "gru", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL" in out and "FAILED" in out


def test_check_triton_backend_small(capsys):
    """The Triton kernels (interpreter without a GPU) on every direction x varlen case."""
    rc = main(["check", "--backend", "triton", "--mode", "rnn_tanh", "--time", "3",
               "--batch", "3", "--hidden", "16", "--input-size", "16", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "4/4 combinations pass" in out


def test_commands_choose_the_interpreter_before_triton_is_imported(tmp_path):
    """From a shell without TRITON_INTERPRET, `--device cpu` runs the Triton kernels in the
    interpreter: the CLI sets the variable before anything imports triton (set after it,
    every Triton case of check, bench and tune failed inside its launch). Fresh processes:
    this one imported triton under the interpreter already."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITONRNN_CACHE_DIR"] = str(tmp_path)
    shape = ["--mode", "gru", "--hidden", "8", "--input-size", "8", "--batch", "2", "--time",
             "3", "--device", "cpu", "--no-progress"]
    runs = {
        "check": ["check", "--backend", "triton", *shape],
        "tune": ["tune", *shape, "--allow-cpu", "--max-candidates", "1", "--cpu-rep", "1"],
    }
    for name, argv in runs.items():
        res = subprocess.run([sys.executable, "-m", "tritonrnn.bench", *argv], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
        assert res.returncode == 0, (name, res.stdout, res.stderr)
        if name == "check":
            assert "5/5 combinations pass" in res.stdout, res.stdout
        else:
            assert "gru H8 B2 T3 bf16: best {" in res.stdout, res.stdout


def test_version_names_tritonrnn_torch_and_triton(capsys):
    """From the packages' metadata, which for a CUDA wheel of torch omits the local label
    that torch.__version__ has (2.8.0 and 2.8.0+cu128)."""
    from importlib.metadata import version

    import triton

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == (f"tritonrnn {version('tritonrnn')} (torch "
                                       f"{version('torch')}, Triton {version('triton')})\n")
    assert version("tritonrnn") == "0.1.0"
    assert torch.__version__.split("+")[0] == version("torch").split("+")[0]
    assert triton.__version__ == version("triton")


@pytest.mark.parametrize("argv, cpu, want", [
    (["bench", "--warmup", "5", "--rep", "20", "--no-tune", "--tune-candidates", "2"], True,
     "--warmup --rep --no-tune --tune-candidates ignored: GPU only (this run is on the CPU)"),
    (["bench", "--cpu-rep", "1", "--allow-slow", "--warmup", "5"], False,
     "--cpu-rep --allow-slow ignored: CPU only (this run is on a GPU)"),
    (["bench", "--warmup", "25", "--cpu-rep", "3"], True, None),  # the defaults, given
    (["bench", "--warmup", "5", "--cpu-rep", "1"], True, "--warmup ignored"),
    (["bench"], False, None),
    (["tune", "--allow-cpu", "--rep", "20", "--cpu-rep", "1"], True, "--rep ignored"),
    (["barrier", "--cpu-rep", "2"], False, "--cpu-rep ignored"),
])
def test_options_for_the_other_kind_of_device_are_noted(capsys, argv, cpu, want):
    cli._note_ignored(cli.build_parser().parse_args(argv), cpu)
    err = capsys.readouterr().err
    if want is None:
        assert err == ""
    else:
        assert err.startswith(f"tritonrnn: note: {want}"), err


# ----------------------------------------------------------------------------- bench


def _load_report(out_dir):
    files = sorted(out_dir.glob("*.json"))
    assert len(files) == 1, files
    report = json.loads(files[0].read_text())
    png = files[0].with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return report


def test_bench_smoke_writes_json_and_plot(tmp_path, capsys, monkeypatch):
    from tritonrnn.bench import harness

    written = []
    real_write = harness.write_report

    def record(report, out_dir):
        written.append((len(report["results"]), report.get("partial", False)))
        return real_write(report, out_dir)

    monkeypatch.setattr(harness, "write_report", record)
    out_dir = tmp_path / "results"
    rc = main(["bench", "--preset", "smoke", "--backend", "reference", "--out", str(out_dir),
               "--no-progress", "--no-tune", "--cpu-rep", "1", "--rep", "20", "--warmup", "5"])
    out, err = capsys.readouterr()
    assert rc == 0, out
    # The options of the other kind of device are ignored, and the run says which.
    assert ("tritonrnn: note: --cpu-rep ignored: CPU only (this run is on a GPU)"
            if torch.cuda.is_available() else "tritonrnn: note: --warmup --rep --no-tune "
            "ignored: GPU only (this run is on the CPU)") in err, err
    report = _load_report(out_dir)
    assert report["schema"] == "tritonrnn.bench/1"
    assert report["preset"] == "smoke"
    env = report["environment"]
    for key in ("device", "device_type", "commit", "torch", "triton", "cuda", "python"):
        assert key in env
    assert env["torch"] == torch.__version__
    assert report["roofline"]["memory_bytes_per_s"] > 0
    assert report["roofline"]["matrix_flops_per_s"]["float32"] > 0
    assert report["timing"]["quantiles"] == [0.5, 0.2, 0.8]
    assert len(report["results"]) == 2
    assert report["failures"] == []
    # A checkpoint after the first shape, then the whole report over it in the same file.
    assert written == [(1, True), (2, False)]
    assert "partial" not in report
    for r in report["results"]:
        impls = r["implementations"]
        assert impls["tritonrnn"]["correctness"]["ok"]
        assert impls["tritonrnn"]["reserve_bytes"] > 0
        assert impls["flashrnn"]["status"] == "skip"
        if env["device_type"] == "cpu":
            assert impls["torch-graph"] == {"status": "skip",
                                            "reason": "CUDA graphs need a GPU"}
        varlen = r["shape"]["varlen"] != "none"
        expect = ({"tritonrnn", "torch"} | ({"torch-packed"} if varlen else set())
                  | ({"torch-graph"} if env["device_type"] == "cuda" else set()))
        timed = {run["impl"] for run in r["runs"]}
        assert timed == expect
        for run in r["runs"]:
            assert run["status"] == "ok"
            assert run["ms_p20"] <= run["ms"] <= run["ms_p80"]
            for key in ("tflops", "pct_roofline", "bound", "flops", "bytes",
                        "speedup_vs_torch", "peak_bytes"):
                assert key in run
            assert run["tflops"] > 0
        if varlen:
            assert impls["torch-packed"]["correctness"]["ok"]
            assert impls["torch"]["correctness"] is None  # padded run, other semantics
        else:
            assert impls["torch"]["correctness"]["ok"]
    if env["device_type"] == "cpu":
        assert "no CUDA GPU found" in out or "--device cpu" in out
        assert "say nothing about GPU speed" in out


def test_bench_and_check_run_without_the_bench_extra(tmp_path, capsys, monkeypatch):
    """tqdm and matplotlib are the `bench` extra: without them bench and check still run
    (no bars, no PNG, which bench says), with progress asked for too, on a terminal (bars
    are drawn only there: `progress.progress_bar`)."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(sys, "stderr", Terminal())
    rc = main(["bench", "--preset", "smoke", "--backend", "reference", "--impl", "tritonrnn",
               "--pass", "fwd", "--out", str(tmp_path), "--no-tune", "--cpu-rep", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    [report] = tmp_path.glob("*.json")
    assert "no plot: " in out and "matplotlib" in out and not list(tmp_path.glob("*.png"))
    assert json.loads(report.read_text())["results"][0]["implementations"]["tritonrnn"][
        "correctness"]["ok"]
    assert main(["check", "--backend", "reference", "--mode", "gru"]) == 0
    assert "combinations pass" in capsys.readouterr().out


@pytest.mark.parametrize(("offset", "why"), [
    (8e-6, "more than 4x the baseline's error"),
    (1e-3, "outside the dtype tolerance"),
], ids=["4x-worse-than-torch", "beyond-dtype-tolerance"])
def test_bench_fails_when_tritonrnn_is_inaccurate(tmp_path, capsys, monkeypatch, offset, why):
    """fp32 smoke: torch's own error is ~1e-7, one step's rounding bound ~4e-6 and the dtype
    bound ~1.2e-5; an 8e-6 offset passes the dtype bound but not the baseline comparison."""

    def off(self, *args):
        reference.recurrence_forward(*args)
        args[9].add_(offset)

    monkeypatch.setattr(engine.ReferenceRecurrence, "forward", off)
    rc = main(["bench", "--preset", "smoke", "--backend", "reference", "--impl", "tritonrnn",
               "--impl", "torch", "--impl", "torch-packed", "--pass", "fwd", "--out",
               str(tmp_path), "--no-progress", "--no-tune", "--cpu-rep", "1", "--rep", "20",
               "--warmup", "5"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAILED" in out and why in out
    report = _load_report(tmp_path)
    assert report["failures"]
    assert not report["results"][0]["implementations"]["tritonrnn"]["correctness"]["ok"]


def test_bench_default_backend_small_varlen(tmp_path, capsys):
    """The default backend (Triton: interpreter without a GPU) on one tiny varlen shape."""
    out_dir = tmp_path / "r"
    rc = main(["bench", "--mode", "gru", "--hidden", "16", "--input-size", "16", "--batch",
               "3", "--time", "4", "--dtype", "fp32", "--varlen", "uniform", "--pass",
               "fwdbwd", "--impl", "tritonrnn", "--impl", "torch-packed", "--out",
               str(out_dir), "--no-progress", "--no-tune", "--cpu-rep", "1", "--rep", "20",
               "--warmup", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    report = _load_report(out_dir)
    assert report["preset"] == "custom"
    assert report["tritonrnn_backend"].startswith("triton")
    (r,) = report["results"]
    assert r["implementations"]["tritonrnn"]["correctness"]["ok"]
    assert {(run["impl"], run["pass"]) for run in r["runs"]} == {
        ("tritonrnn", "fwdbwd"), ("torch-packed", "fwdbwd")}


# ----------------------------------------------------------------------------- plan, tune


def test_plan_prints_explain(capsys):
    rc = main(["plan", "--preset", "anchor", "--device-preset", "h100"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("Plan ")
    assert "H=768" in out and "B=16" in out and "T=1024" in out
    assert "reserve:" in out and "NVIDIA H100" in out
    # The weights in registers on 8 warps in both passes (planner._persistent_grid_warps,
    # _persistent_grid_bwd_warps).
    assert "weights=resident (in registers: fwd, bwd) warps=8 " in out


def test_plan_on_the_a100_preset(capsys):
    """The A100 (108 SMs, 163 KiB per program) runs the anchor on the same co-resident grid
    as the H100 (48 programs); LSTM H=1024 B=64's 128 programs of 16 x 32 tiles would not be
    co-resident there, so it plans 64 programs of 16 x 64 tiles, their weights streamed."""
    assert main(["plan", "--preset", "anchor", "--device-preset", "a100"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA A100" in out and "persistent_grid" in out and "programs=48" in out
    assert main(["plan", "--hidden", "1024", "--batch", "64", "--device-preset", "a100"]) == 0
    out = capsys.readouterr().out
    assert "programs=64" in out and "block_b=64" in out and "weights=streamed/64" in out, out


@pytest.mark.parametrize("hoist", ["auto", "off"])
def test_plan_names_register_weights(capsys, monkeypatch, hoist):
    # LSTM H=256 B=16: HOIST by the planner's rule, none where the switch turns it off.
    monkeypatch.setenv("TRITONRNN_HOIST_WEIGHTS", hoist)
    assert main(["plan", "--mode", "lstm", "--hidden", "256", "--batch", "16",
                 "--device-preset", "h100"]) == 0
    label = "resident (in registers: fwd, bwd)" if hoist == "auto" else "resident"
    assert f"weights={label} " in capsys.readouterr().out


@pytest.mark.parametrize("mode, batch, label", [
    # 32 x 64 tiles, on the streamed loops' stages (`_stream_stages`)
    ("lstm", 256, "weights=streamed/64 (joint gates, transposed, 5 stages, backward 8) "),
    ("rnn_tanh", 16, "weights=streamed/64 (8 stages) warps"),  # one gate, 16-row batch tile
    ("gru", 16, "weights=streamed/64 (joint gates, 7 stages, backward 8) "),
    # 64 x 64 tiles: the gated backward keeps Triton's default (`_STAGED_TILE`)
    ("lstm", 1024, "weights=streamed/64 (joint gates, transposed, 4 stages, backward 3) "),
])
def test_plan_names_the_streamed_loops(capsys, mode, batch, label):
    hidden = {"lstm": "768" if batch == 256 else "384", "gru": "4096",
              "rnn_tanh": "8192"}[mode]
    assert main(["plan", "--mode", mode, "--hidden", hidden, "--batch", str(batch),
                 "--device-preset", "h100"]) == 0
    assert label in capsys.readouterr().out


def test_plan_shows_the_layer_pipeline(capsys, monkeypatch):
    """The layer-pipeline line: off with the reason (and what the opt-in would give), the
    automatic choice with TRITONRNN_PIPELINE=1, forced by --pipeline-chunks; the pipelined
    plans list the extra workspaces (pipeline.*)."""
    shape = ["plan", "--preset", "anchor", "--layers", "2", "--device-preset", "h100"]
    monkeypatch.delenv("TRITONRNN_PIPELINE", raising=False)
    assert main(shape) == 0
    out = capsys.readouterr().out
    assert ("\n  layer pipeline: off (the automatic choice is opt-in and TRITONRNN_PIPELINE=1 "
            "is not set; with it: 16 chunks, 2 layers concurrent)\n") in out
    assert "pipeline.dpre_x" not in out
    monkeypatch.setenv("TRITONRNN_PIPELINE", "1")
    assert main(shape) == 0
    out = capsys.readouterr().out
    assert "\n  layer pipeline: 16 chunks, 2 layers concurrent (automatic" in out
    assert "backward  pipeline.dpre_x" in out and "extra workspaces (pipeline.* below)" in out
    monkeypatch.delenv("TRITONRNN_PIPELINE")
    tiny = ["plan", "--mode", "gru", "--hidden", "7", "--batch", "4", "--time", "7",
            "--layers", "2", "--dtype", "fp32", "--device-preset", "interpreter"]
    assert main([*tiny, "--pipeline-chunks", "3"]) == 0
    out = capsys.readouterr().out
    assert ("\n  layer pipeline: 3 chunks, 2 layers concurrent (forced by "
            "plan_constraints(pipeline_chunks=3))\n") in out
    assert "backward  pipeline.dpre_h" in out
    assert main(tiny) == 0
    assert "\n  layer pipeline: off (the automatic choice is opt-in" in capsys.readouterr().out


def test_plan_shows_a_forced_split_k_backward(capsys):
    """--split-k-bwd: the plan's backward on the split-K kernel (its tiles and form, its
    programs counted, its workspace listed); a form without tiles for the shape is a one-line
    error naming it."""
    shape = ["plan", "--hidden", "1024", "--batch", "16", "--device-preset", "h100"]
    assert main([*shape, "--split-k-bwd", "1"]) == 0
    out = capsys.readouterr().out
    assert "backward split-K 256 x 128 x 16, one barrier programs=128 " in out
    assert "backward  split_k.partials" in out
    assert main([*shape, "--split-k-bwd", "0"]) == 0
    assert "split" not in capsys.readouterr().out
    assert main(["plan", "--hidden", "1024", "--batch", "64", "--device-preset", "h100",
                 "--split-k-bwd", "1"]) == 2
    assert _one_line_error(capsys).startswith(
        "tritonrnn: error: plan_constraints: split_k_bwd = 1 has no tiles for lstm H=1024")


def test_tune_then_plan_reads_the_cache(capsys, monkeypatch):
    """End to end: tune (two forced candidates, interpreter/GPU) stores the best in the cache
    and `plan` then reports the tuned choice."""
    from tritonrnn.rnn import planner

    picks = [{"family": "persistent_cta", "block_b": 16, "num_warps": 4},
             {"family": "stepwise", "block_b": 16, "num_warps": 4, "block_h": 16}]
    monkeypatch.setattr(planner, "candidates", lambda plan: list(picks))
    shape = ["--mode", "rnn_relu", "--hidden", "16", "--input-size", "16", "--batch", "2",
             "--time", "3", "--dtype", "fp32"]
    rc = main(["tune", *shape, "--allow-cpu", "--no-progress", "--cpu-rep", "1",
               "--rep", "20", "--warmup", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "best" in out
    entries = json.loads(planner.tuning_cache_path().read_text())["entries"]
    assert len(entries) == 1
    (entry,) = entries.values()
    assert entry["family"] in {"persistent_cta", "stepwise"} and entry["ms"] > 0
    rc = main(["plan", *shape])
    assert rc == 0
    assert "(choice: tuned)" in capsys.readouterr().out
    rc = main(["tune", *shape, "--allow-cpu", "--no-progress"])
    assert rc == 0
    assert "cached" in capsys.readouterr().out


def test_tune_on_the_cpu_of_a_gpu_host_files_its_timings_under_the_interpreters_key(
        capsys, monkeypatch):
    """`tune --device cpu` where torch sees a GPU (faked: the current device's properties
    are an H100's): the timings are the interpreter's, so the key and the candidates are
    planned for it, not for the current device (whose key they were filed under)."""
    from tritonrnn.rnn import planner

    monkeypatch.setattr(planner, "_current_device_properties", lambda: planner.PRESETS["h100"])
    picks = [{"family": "persistent_cta", "block_b": 16, "num_warps": 4}]
    monkeypatch.setattr(planner, "candidates", lambda plan: list(picks))
    shape = ["--mode", "rnn_relu", "--hidden", "16", "--input-size", "16", "--batch", "2",
             "--time", "3", "--dtype", "fp32"]
    rc = main(["tune", *shape, "--device", "cpu", "--allow-cpu", "--no-progress",
               "--cpu-rep", "1", "--rep", "20", "--warmup", "5"])
    assert rc == 0, capsys.readouterr().out
    entries = json.loads(planner.tuning_cache_path().read_text())["entries"]
    interpreter = planner.PRESETS["interpreter"].name
    assert [k.split("|")[0] for k in entries] == [interpreter], entries
    assert all(e["device"] == interpreter for e in entries.values())


def test_tune_max_candidates_caches_a_partial_best_then_carries_on(capsys, monkeypatch):
    """--max-candidates 1: the plan's own choice is timed and cached as partial (plan reads
    it); the next run without the limit times only the other candidate."""
    from tritonrnn.rnn import planner

    picks = [{"family": "stepwise", "block_b": 16, "num_warps": 4, "block_h": 16},
             {"family": "persistent_cta", "block_b": 16, "num_warps": 4}]
    monkeypatch.setattr(planner, "candidates", lambda plan: list(picks))
    shape = ["--mode", "rnn_tanh", "--hidden", "16", "--input-size", "16", "--batch", "2",
             "--time", "3", "--dtype", "fp32"]
    timing = ["--allow-cpu", "--no-progress", "--cpu-rep", "1", "--rep", "20", "--warmup", "5"]
    assert main(["tune", *shape, *timing, "--max-candidates", "1"]) == 0
    assert "of the first 1 of 2 candidates (partial" in capsys.readouterr().out
    (entry,) = json.loads(planner.tuning_cache_path().read_text())["entries"].values()
    assert (entry["measured"], entry["candidates"]) == (1, 2)
    assert main(["plan", *shape]) == 0
    assert "(choice: tuned, partial: best of 1 of 2 candidates)" in capsys.readouterr().out
    assert main(["tune", *shape, *timing]) == 0
    out = capsys.readouterr().out
    assert "of 2 candidates" in out and "partial" not in out and "cached" not in out
    (entry,) = json.loads(planner.tuning_cache_path().read_text())["entries"].values()
    assert "measured" not in entry
    assert main(["plan", *shape]) == 0
    assert "(choice: tuned)" in capsys.readouterr().out


@pytest.mark.gpu
def test_tune_on_gpu_times_the_planners_candidates(capsys):
    """On a GPU, with the planner's own candidates: the first three of the key are timed with
    do_bench, the best is cached as partial, and `plan` reports it."""
    from tritonrnn.rnn import planner

    shape = ["--mode", "lstm", "--hidden", "64", "--batch", "4", "--time", "16", "--dtype",
             "bf16"]
    rc = main(["tune", *shape, "--no-progress", "--max-candidates", "3", "--rep", "20",
               "--warmup", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    (entry,) = json.loads(planner.tuning_cache_path().read_text())["entries"].values()
    assert entry["ms"] > 0 and entry["measured"] == 3 < entry["candidates"], entry
    assert main(["plan", *shape]) == 0
    assert f"(choice: tuned, partial: best of 3 of {entry['candidates']} candidates)" in (
        capsys.readouterr().out)


# ----------------------------------------------------------------------------- errors


# (argv, what its one-line error says)
_BAD_OPTIONS = [
    ([], "expected a command: bench, check, tune, plan, aot or barrier"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["bench", "--mode", "foo"], "bench: argument --mode: invalid choice: 'foo'"),
    (["bench", "--hidden", "0"], "--hidden: expected an int >= 1, got 0"),
    (["bench", "--hidden", "abc"], "bench: argument --hidden: invalid int value: 'abc'"),
    (["bench", "--preset", "nope"], "bench: argument --preset: invalid choice: 'nope'"),
    (["bench", "--dtype", "int8"], "--dtype: expected one of bf16, fp16, fp32, fp64, got "
                                   "'int8'"),
    (["bench", "--varlen", "zipf"], "--varlen: expected one of none, uniform, uniform:F, "
                                    "got 'zipf'"),
    (["bench", "--varlen", "uniform:2"], "--varlen: expected 'uniform:F' with F in [0, 1], "
                                         "got 'uniform:2'"),
    (["bench", "--mode", "gru", "--proj", "4"], "--proj: expected 0 for --mode gru"),
    (["bench", "--hidden", "10", "--proj", "11"], "--proj: expected a value in [0, "
                                                  "--hidden=10], got 11"),
    (["bench", "--pass", "sideways"], "bench: argument --pass: invalid choice: 'sideways'"),
    (["bench", "--rep", "0"], "--rep: expected an int >= 1, got 0"),
    (["check", "--dtype", "fp8"], "--dtype: expected one of bf16, fp16, fp32, fp64, got "
                                  "'fp8'"),
    (["check", "--time", "0"], "--time: expected an int >= 1, got 0"),
    (["plan", "--device-preset", "tpu"], "--device-preset: expected one of ['current', "
                                         "'a100', 'h100', 'h200', 'interpreter'], got 'tpu'"),
    (["plan", "--layers", "-1"], "--layers: expected an int >= 1, got -1"),
    (["plan", "--pipeline-chunks", "0"], "--pipeline-chunks: expected an int >= 1, got 0"),
    (["plan", "--bidirectional", "--pipeline-chunks", "2", "--device-preset", "h100"],
     "pipeline_chunks: expected 1 for a bidirectional stack"),
    (["tune", "--batch", "0", "--allow-cpu"], "--batch: expected an int >= 1, got 0"),
    (["tune", "--max-candidates", "0"], "--max-candidates: expected an int >= 1, got 0"),
]


@pytest.mark.parametrize("argv, says", _BAD_OPTIONS,
                         ids=[" ".join(a) or "no-command" for a, _ in _BAD_OPTIONS])
def test_bad_options_are_one_line_exit_2(argv, says, capsys):
    assert main(argv) == 2
    line = _one_line_error(capsys)
    assert line.startswith("tritonrnn: error: ") and says in line, line


def test_cpu_refuses_gpu_presets_and_tuning(capsys):
    assert main(["bench", "--device", "cpu", "--preset", "anchor"]) == 2
    assert "needs a CUDA GPU" in _one_line_error(capsys)
    assert main(["bench", "--device", "cpu", "--hidden", "1024", "--time", "1024"]) == 2
    assert "too large for the CPU interpreter" in _one_line_error(capsys)
    assert main(["tune", "--device", "cpu"]) == 2
    assert "no CUDA GPU found" in _one_line_error(capsys)


def test_library_errors_are_one_line_exit_2(capsys, monkeypatch):
    from tritonrnn.rnn import planner

    def bad(**_kw):
        raise ValueError("num_units: expected an int >= 1, got 0")

    monkeypatch.setattr(planner, "plan_for", bad)
    assert main(["plan"]) == 2
    assert _one_line_error(capsys) == "tritonrnn: error: num_units: expected an int >= 1, got 0"


def test_help_exits_zero(capsys):
    assert main(["--help"]) == 0
    assert "bench" in capsys.readouterr().out
    assert main(["bench", "--help"]) == 0
    assert "--preset" in capsys.readouterr().out


def test_console_script_entry_point():
    """pyproject's `tritonrnn = tritonrnn.bench.cli:main` resolves to this function."""
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "tritonrnn"]
    assert ep.value == "tritonrnn.bench.cli:main"
    assert ep.load() is cli.main


def test_barrier_needs_a_gpu(capsys):
    assert main(["barrier"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tritonrnn: error: barrier: needs a CUDA GPU (a grid barrier deadlocks in "
                   "the interpreter); none found"]
    assert main(["barrier", "--dtype", "fp64"]) == 2
    assert "--dtype: expected one of ['bf16', 'fp16', 'fp32'], got 'fp64'" in (
        capsys.readouterr().err
    )
    assert main(["barrier", "--hidden", "512", "0"]) == 2
    assert "--hidden: expected ints >= 1, got 0" in capsys.readouterr().err


@pytest.mark.gpu
def test_barrier_measures_on_gpu(tmp_path, capsys):
    assert main(["barrier", "--time", "64", "--mode", "gru", "--hidden", "512", "--batch", "1",
                 "16", "--out", str(tmp_path)]) == 0
    assert "ratio" in capsys.readouterr().out
    (path,) = tmp_path.glob("barrier-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert [(r["mode"], r["H"], r["B"]) for r in rows] == [("gru", 512, 1), ("gru", 512, 16)]
    assert all(r["step_us"] > 0 and r["bwd_step_us"] > 0 and r["barrier_us"] > 0 for r in rows)


# ----------------------------------------------------------------------------- aot


@pytest.mark.parametrize(
    "argv, message",
    [
        (["aot", "--block-h", "20"], "--block-h: expected a power of two >= 16, got 20"),
        (["aot", "--block-b", "8"], "--block-b: expected a power of two >= 16, got 8"),
        (["aot", "--block-k", "8"],
         "--block-k: expected 0 (resident weights) or a power of two >= 16, got 8"),
        (["aot", "--num-warps", "3"], "--num-warps: expected a power of two in [1, 32], got 3"),
        (["aot", "--num-stages", "0"], "--num-stages: expected an int >= 1, got 0"),
        (["aot", "--hidden", "768", "--num-stages-bwd", "4"],
         "tritonrnn: error: --num-stages-bwd 4 needs streamed weights"),  # the anchor's plan
        (["aot", "--arch", "61"], "--arch: expected a CUDA compute capability that Triton's "
         "ptxas compiles for, one of 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 107, 110, 120, "
         "121, got 61"),
        (["aot", "--arch", "999"], "one of 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 107, "
         "110, 120, 121, got 999"),
        (["aot", "--device-preset", "interpreter"],
         "--device-preset: expected current or one of ['a100', 'h100', 'h200'], got "
         "'interpreter'"),
        (["aot", "--jobs", "0"], "--jobs: expected an int >= 1, got 0"),
        (["aot", "--family", "reference"], "invalid choice: 'reference'"),
        (["aot", "--maxnreg", "300"], "--maxnreg: expected an int in [16, 255], got 300"),
        (["aot", "--dtype", "fp64"], "the planner runs float64 on the reference family"),
        (["aot", "--mode", "gru", "--proj", "8"], "--proj: expected 0 for --mode gru"),
        # The planner refuses a forced choice that cannot apply on the preset.
        (["aot", "--hidden", "1024", "--family", "persistent_cta"],
         "family 'persistent_cta' needs"),
        (["aot", "--hidden", "1536", "--batch", "256", "--family", "persistent_grid",
          "--block-h", "16"], "co-resident programs for H=1536"),
        (["aot", "--split-k-bwd", "3"], "--split-k-bwd: invalid choice: 3"),
        (["aot", "--hidden", "1024", "--batch", "64", "--split-k-bwd", "1"],
         "tritonrnn: error: --split-k-bwd 1 has no tiles for lstm H=1024 torch.bfloat16 batch "
         "bucket 64"),
    ],
    ids=["block-h", "block-b", "block-k", "num-warps", "num-stages", "stages-resident", "arch",
         "arch-unknown",
         "device-preset", "jobs",
         "family",
         "maxnreg", "fp64", "gru-proj", "cta-too-big", "grid-not-coresident", "split-k-form",
         "split-k-no-tiles"],
)
def test_aot_bad_options_are_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in _one_line_error(capsys)


def test_aot_current_device_needs_a_gpu(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["aot", "--device-preset", "current"]) == 2
    assert ("--device-preset: 'current' needs a CUDA device and this machine has none; name a "
            "preset: h100, h200 or a100") in _one_line_error(capsys)


@pytest.mark.parametrize("preset, arch", [("h100", 90), ("h200", 90), ("a100", 80)])
def test_aot_compiles_for_the_presets_architecture(preset, arch, capsys, monkeypatch):
    """Without --arch, aot targets the preset's GPU (sm_80 for the A100); --arch overrides it.
    The ptxas lookup, the first thing a compile does, records the target and stops it."""
    from tritonrnn.bench import aot

    asked = []

    def missing(name, arch=90):
        asked.append(arch)
        raise aot.ToolMissing(f"{name} not found (test)")

    monkeypatch.setattr(aot, "_tool", missing)
    assert main(["aot", "--hidden", "64", "--device-preset", preset]) == 1
    assert main(["aot", "--hidden", "64", "--device-preset", preset, "--arch", "100"]) == 1
    capsys.readouterr()
    assert asked == [arch, 100]


def test_aot_without_ptxas_is_one_line_exit_1(capsys, monkeypatch):
    from tritonrnn.bench import aot

    def missing(name, arch=90):
        raise aot.ToolMissing(f"{name} not found (test)")

    monkeypatch.setattr(aot, "_tool", missing)
    assert main(["aot", "--hidden", "64"]) == 1
    assert _one_line_error(capsys) == "tritonrnn: error: ptxas not found (test)"


# ----------------------------------------------------------------------------- audit fixes


@pytest.mark.parametrize("command", ["bench", "aot-json", "aot-json-is-a-dir", "aot-dump",
                                     "tune"])
def test_unwritable_outputs_are_one_line_exit_2_before_anything_runs(command, tmp_path,
                                                                     capsys, monkeypatch):
    # An output path that cannot be written (here: under a regular file) is a bad option,
    # found before a shape is timed, a kernel compiled or a candidate tuned.
    from tritonrnn.bench import aot, harness, tune

    for module, name in ((harness, "run_benchmark"), (aot, "aot_report"),
                         (tune, "tune_shapes")):
        monkeypatch.setattr(module, name,
                            lambda *_a, name=name, **_k: pytest.fail(f"{name} ran first"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = blocker / "out"
    aot_argv = ["aot", "--hidden", "32", "--batch", "4"]
    argv, option, path, what = {
        "bench": (["bench", "--preset", "smoke", "--backend", "reference", "--no-progress",
                   "--out", str(bad)], "--out", bad, "a writable directory"),
        "aot-json": ([*aot_argv, "--json", str(bad / "x.json")], "--json", bad / "x.json",
                     "a writable file path"),
        "aot-json-is-a-dir": ([*aot_argv, "--json", str(tmp_path)], "--json", tmp_path,
                              "a writable file path"),
        "aot-dump": ([*aot_argv, "--dump", str(bad)], "--dump", bad, "a writable directory"),
        "tune": (["tune", "--allow-cpu", "--max-candidates", "1", "--no-progress"],
                 "TRITONRNN_CACHE_DIR (the tuning cache)", bad, "a writable directory"),
    }[command]
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(bad if command == "tune" else tmp_path))
    assert main(argv) == 2
    assert _one_line_error(capsys).startswith(
        f"tritonrnn: error: {option}: expected {what}, got '{path}' (")


def test_a_late_os_error_is_one_line_exit_2(capsys, monkeypatch):
    import errno

    def disk_full(_args):
        raise OSError(errno.ENOSPC, "No space left on device", "/results/report.json")

    monkeypatch.setattr(cli, "cmd_plan", disk_full)
    assert main(["plan"]) == 2
    assert _one_line_error(capsys) == ("tritonrnn: error: [Errno 28] No space left on device: "
                                       "'/results/report.json'")


def test_bench_without_tritonrnn_fails_nothing(tmp_path, capsys):
    # --impl torch alone: no tritonrnn entry, so no "tritonrnn None: None" failure.
    rc = main(["bench", "--mode", "lstm", "--hidden", "8", "--batch", "2", "--time", "3",
               "--dtype", "fp32", "--impl", "torch", "--pass", "fwd", "--no-progress",
               "--cpu-rep", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "FAILED" not in out
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["failures"] == []
    assert set(report["results"][0]["implementations"]) == {"torch"}


def test_overrides_that_make_a_presets_shapes_equal_run_each_once(capsys):
    assert main(["plan", "--preset", "grid", "--hidden", "64", "--batch", "1", "--mode", "lstm",
                 "--device-preset", "h100"]) == 0
    assert capsys.readouterr().out.count("Plan ") == 1
    # The preset's order is kept (bench times, tune tunes and aot compiles these).
    args = cli.build_parser().parse_args(["bench", "--preset", "grid", "--hidden", "64"])
    preset, shapes = cli.resolve_shapes(args, "anchor")
    assert preset == "grid" and [(s.mode, s.batch) for s in shapes] == [
        ("lstm", 1), ("lstm", 16), ("lstm", 64), ("gru", 1), ("gru", 16), ("gru", 64)]


@pytest.mark.parametrize("flag, want", [([], [True, False]),
                                         (["--no-bidirectional"], [False, False]),
                                         (["--bidirectional"], [True, True])],
                         ids=["preset", "off", "on"])
def test_bidirectional_switches_a_presets_shapes_both_ways(flag, want):
    """--preset stack has bidirectional and unidirectional shapes: --no-bidirectional makes
    them all one-directional, --bidirectional all two, neither keeps each shape's own."""
    args = cli.build_parser().parse_args(["plan", "--preset", "stack", *flag])
    assert [s.bidirectional for s in cli.resolve_shapes(args, "anchor")[1]] == want


@pytest.mark.parametrize("argv", [["plan", "--input-size", "0"],
                                  ["bench", "--input-size", "0"],
                                  ["check", "--backend", "reference", "--input-size", "0"]],
                         ids=["plan", "bench", "check"])
def test_input_size_zero_is_refused(argv, capsys):
    # --input-size defaults to --hidden when not given; 0 is no size (as -1 is not).
    assert main(argv) == 2
    assert _one_line_error(capsys) == "tritonrnn: error: --input-size: expected an int >= 1, got 0"


# ----------------------------------------------------------------------------- review fixes


def _fake_shapes(monkeypatch, interrupt_at: int | None = None, runs: bool = True) -> None:
    """bench without timing anything: the roofline and each shape's record faked (with one
    run, or none: every implementation skipped); the `interrupt_at`-th shape of a run
    (1-based) raises KeyboardInterrupt (Ctrl-C)."""
    from tritonrnn.bench import harness, roofline

    monkeypatch.setattr(harness, "measure_ceilings",
                        lambda *a: roofline.Ceilings("cpu", 1e9, {"float32": 1e9}))
    calls: list[str] = []

    def run_shape(shape, opts, ceilings, tick):
        calls.append(shape.label)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        run = {"impl": "torch", "pass": "fwd", "status": "ok", "ms": 1.0, "ms_p20": 1.0,
               "ms_p80": 1.0, "peak_bytes": None, "flops": 1.0, "bytes": 1, "tflops": 1e-9,
               "roofline_ms": 1.0, "bound": "compute", "pct_roofline": 100.0,
               "speedup_vs_torch": None, "speedup_vs_torch_graph": None,
               "speedup_vs_torch_packed": None}
        return {"label": shape.label, "shape": shape.as_dict(), "tokens": 1,
                "plan": {"error": "faked"}, "implementations": {},
                "runs": [run] if runs else []}

    monkeypatch.setattr(harness, "run_shape", run_shape)


def test_an_interrupted_rerun_keeps_the_finished_report_and_names_its_partial_file(
        tmp_path, capsys, monkeypatch):
    """Ctrl-C in a rerun of a sweep: its checkpoints go to <stem>.partial.json, not over the
    finished report of the same name, and the message names that file; a run that completes
    replaces the report and removes the checkpoint file."""
    argv = ["bench", "--preset", "smoke", "--backend", "reference", "--no-progress",
            "--out", str(tmp_path), "--cpu-rep", "1"]
    _fake_shapes(monkeypatch)
    assert main(argv) == 0
    (final,) = tmp_path.glob("*.json")
    before = final.read_bytes()
    assert len(json.loads(before)["results"]) == 2
    capsys.readouterr()

    _fake_shapes(monkeypatch, interrupt_at=2)
    assert main(argv) == 130
    partial = final.with_name(final.stem + ".partial.json")
    err = capsys.readouterr().err
    assert err.strip() == ("tritonrnn: interrupted; the shapes finished before it are in "
                           f"{partial}"), err
    assert final.read_bytes() == before
    saved = json.loads(partial.read_text())
    assert saved["partial"] is True and len(saved["results"]) == 1

    _fake_shapes(monkeypatch, interrupt_at=1)
    assert main(argv) == 130
    assert "interrupted; no shape had finished, nothing written" in capsys.readouterr().err

    _fake_shapes(monkeypatch)
    assert main(argv) == 0
    assert sorted(tmp_path.glob("*.json")) == [final]
    assert "partial" not in json.loads(final.read_text())


@pytest.mark.parametrize("kind", ["text", "json-list", "bench-report", "fifo"])
def test_aot_json_refuses_to_replace_a_file_that_is_not_an_aot_report(kind, tmp_path, capsys,
                                                                      monkeypatch):
    """--json over an existing file that is not an earlier aot report (a mistyped path): one
    line, exit 2, before anything is compiled, the file as it was."""
    from tritonrnn.bench import aot

    monkeypatch.setattr(aot, "aot_report", lambda *_a, **_k: pytest.fail("compiled first"))
    path = tmp_path / "target"
    content = {"text": "root:x:0:0:root:/root:/bin/bash\n", "json-list": "[1, 2]",
               "bench-report": json.dumps({"schema": "tritonrnn.bench/1", "results": []})}
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(content[kind])
    assert main(["aot", "--hidden", "32", "--batch", "4", "--json", str(path)]) == 2
    why = {"text": "is not JSON", "json-list": "it has a JSON list",
           "bench-report": "it has ['results', 'schema']",
           "fifo": "is not a regular file"}[kind]
    line = _one_line_error(capsys)
    assert line.startswith("tritonrnn: error: --json: expected a new file or an earlier aot "
                           f"report to replace, got '{path}' (it exists and "), line
    assert why in line, line
    if kind != "fifo":
        assert path.read_text() == content[kind]


def test_aot_json_replaces_an_earlier_aot_report_or_writes_a_new_file(tmp_path, capsys,
                                                                      monkeypatch):
    from tritonrnn.bench import aot

    monkeypatch.setattr(aot, "aot_report", lambda s, *_a: {"shape": s.label, "kernels": []})
    monkeypatch.setattr(aot, "format_report", lambda r: r["shape"])
    monkeypatch.setattr(aot, "report_ok", lambda r: True)
    new = tmp_path / "new.json"
    assert main(["aot", "--hidden", "32", "--batch", "4", "--json", str(new)]) == 0
    assert main(["aot", "--hidden", "64", "--batch", "4", "--json", str(new)]) == 0
    capsys.readouterr()
    data = json.loads(new.read_text())
    assert set(data) == {"host", "reports"} and data["reports"][0]["shape"].startswith(
        "lstm H64")


@pytest.mark.parametrize("interpret, argv", [
    ("1", ["--dtype", "fp64"]),  # the planner runs float64 on its reference family
    ("1", ["--dtype", "fp64", "--backend", "triton"]),
    ("0", []),  # auto without the interpreter: the library picks the reference backend
], ids=["fp64", "fp64-triton", "interpret-0"])
def test_bench_names_the_backend_that_runs(interpret, argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    _fake_shapes(monkeypatch)
    assert main(["bench", "--preset", "smoke", "--device", "cpu", "--no-progress", "--out",
                 str(tmp_path), "--cpu-rep", "1", *argv]) == 0
    out = capsys.readouterr().out
    assert "on the CPU: tritonrnn's pure-PyTorch reference engine against torch.nn" in out, out
    (path,) = tmp_path.glob("*.json")
    assert json.loads(path.read_text())["tritonrnn_backend"] == "reference"


@pytest.mark.parametrize("command", ["bench", "check"])
@pytest.mark.parametrize("interpret", ["0", ""])
def test_backend_triton_on_the_cpu_needs_the_interpreter(command, interpret, tmp_path, capsys,
                                                        monkeypatch):
    """TRITON_INTERPRET set to anything but 1: --backend triton cannot run on the CPU; refused
    before the oracle and the baselines run (it failed at the end of the run)."""
    from tritonrnn.bench import check, harness

    monkeypatch.setattr(harness, "run_benchmark", lambda *_a, **_k: pytest.fail("ran"))
    monkeypatch.setattr(check, "run_check", lambda *_a, **_k: pytest.fail("ran"))
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    argv = [command, "--backend", "triton", "--device", "cpu", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path)] if command == "bench" else argv) == 2
    assert _one_line_error(capsys) == (
        "tritonrnn: error: --backend triton: on the CPU the Triton kernels run only in "
        f"Triton's interpreter: expected TRITON_INTERPRET unset or 1, got "
        f"TRITON_INTERPRET={interpret!r}")


@pytest.mark.parametrize("interpret", ["0", ""])
def test_tune_on_the_cpu_needs_the_interpreter(interpret, capsys, monkeypatch):
    """`tune --allow-cpu` times the Triton kernels, which run on the CPU only in Triton's
    interpreter: TRITON_INTERPRET set to anything but 1 is refused before anything runs."""
    from tritonrnn.bench import tune

    monkeypatch.setattr(tune, "tune_shapes", lambda *_a, **_k: pytest.fail("ran"))
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    assert main(["tune", "--allow-cpu", "--device", "cpu", "--no-progress"]) == 2
    assert _one_line_error(capsys) == (
        "tritonrnn: error: --allow-cpu: on the CPU the Triton kernels run only in "
        f"Triton's interpreter: expected TRITON_INTERPRET unset or 1, got "
        f"TRITON_INTERPRET={interpret!r}")


@pytest.mark.parametrize("lines", [3, 2000], ids=["flushed-at-exit", "flushed-while-printing"])
def test_a_closed_stdout_pipe_ends_quietly(lines, tmp_path):
    """`tritonrnn plan | head -1`: the reader gone, the command stops without a message and
    exits as a process killed by SIGPIPE would (141), whether the pipe fails while it prints
    (a long plan: the buffer fills) or at the final flush (a short one)."""
    import signal
    import subprocess
    import sys

    script = ("import sys\nfrom tritonrnn.bench import cli\n"
              f"cli.cmd_plan = lambda args: print(('plan line ' * 10 + '\\n') * {lines}) or 0\n"
              "sys.exit(cli.main(['plan']))\n")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        done = subprocess.run([sys.executable, "-c", script], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (128 + signal.SIGPIPE, ""), done.stderr


@pytest.mark.parametrize("content, got", [
    ('{"version": 1, "entries": \n', "got unreadable JSON"),
    ('{"version": 2, "entries": {}}', "got version 2"),
    ("[]", "got a JSON list"),
], ids=["truncated", "version", "list"])
def test_tune_refuses_a_damaged_cache_before_timing_anything(content, got, tmp_path, capsys,
                                                            monkeypatch):
    """A tuning cache that a store would refuse: one line naming it, exit 2, before any
    candidate is timed (it failed at the first store, after a key's candidates ran); the file
    is left as it is."""
    from tritonrnn.bench import tune

    monkeypatch.setattr(tune, "shape_measurer", lambda *_a: pytest.fail("timed first"))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tuning.json").write_text(content)
    rc = main(["tune", "--allow-cpu", "--hidden", "8", "--input-size", "4", "--batch", "2",
               "--time", "2", "--dtype", "fp32", "--max-candidates", "1", "--no-progress"])
    assert rc == 2
    line = _one_line_error(capsys)
    assert line.startswith(f"tritonrnn: error: tuning cache {cache / 'tuning.json'}: expected "
                           f"a JSON object with version 1 and its entries, {got}"), line
    assert (cache / "tuning.json").read_text() == content


def test_bench_tunes_a_missing_key_over_its_first_candidates_only(monkeypatch, capsys):
    """bench's tuning before timing (a GPU's) stops each missing key after --tune-candidates
    choices (default TUNE_CANDIDATES): the anchor alone has about 150 on an H200, each
    compiled and timed, before the main job's first timing."""
    import argparse

    from tritonrnn.bench import cli, tune

    seen = []
    monkeypatch.setattr(tune, "tune_shapes",
                        lambda *a, limit=None, **k: seen.append(limit) or [])
    for given, want in ((None, cli.TUNE_CANDIDATES), (40, 40)):
        argv = ["bench"] + ([] if given is None else ["--tune-candidates", str(given)])
        args = cli.build_parser().parse_args(argv)
        assert isinstance(args, argparse.Namespace)
        cli._tune_before_bench([], torch.device("cpu"), None, args)
        assert seen[-1] == want
    assert main(["bench", "--tune-candidates", "0"]) == 2
    assert _one_line_error(capsys) == ("tritonrnn: error: --tune-candidates: expected an int "
                                       ">= 1, got 0")
    # A key tuned whose entry the cache kept (another run's covers more candidates) is
    # reported as not stored.
    done = [{"status": "tuned", "label": "s1", "best": {"num_warps": 4}},
            {"status": "tuned", "label": "s2", "best": {"num_warps": 8}, "kept": True}]
    monkeypatch.setattr(tune, "tune_shapes", lambda *a, **k: done)
    capsys.readouterr()
    cli._tune_before_bench([], torch.device("cpu"), None, cli.build_parser().parse_args(
        ["bench"]))
    assert capsys.readouterr().out.splitlines() == [
        "  tuned s1: {'num_warps': 4}",
        "  tuned s2: {'num_warps': 8} (not stored: the cache's entry covers more candidates)"]


@pytest.mark.parametrize("extra, tunes", [
    ([], True), (["--no-tune"], False), (["--backend", "reference"], False),
    (["--impl", "torch"], False), (["--backend", "triton", "--impl", "tritonrnn"], True)],
    ids=["default", "no-tune", "reference", "without-tritonrnn", "triton"])
def test_bench_on_a_gpu_tunes_first_only_when_tritonrnn_kernels_are_timed(
        monkeypatch, tmp_path, capsys, extra, tunes):
    """On a GPU, bench tunes the missing plan keys before timing unless --no-tune, the
    reference backend or an --impl without tritonrnn (nothing of the kernels timed). The
    GPU branch run here with the device faked and the benchmark stopped at its start."""
    from tritonrnn.bench import harness

    tuned = []
    monkeypatch.setattr(cli, "_device", lambda choice: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU X")
    monkeypatch.setattr(cli, "_tune_before_bench",
                        lambda shapes, device, timing, args: tuned.append(
                            ([s.label for s in shapes], device.type)))

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "run_benchmark", stop)
    assert main(["bench", "--preset", "anchor", "--out", str(tmp_path), *extra]) == 130
    assert tuned == ([(["lstm H768 B16 T1024 bf16"], "cuda")] if tunes else [])
    assert "tritonrnn bench 'anchor' on GPU X" in capsys.readouterr().out


def test_bench_where_no_implementation_runs_exits_1(tmp_path, capsys, monkeypatch):
    """--impl flashrnn on the CPU (every selected implementation skipped for every shape):
    exit 1 and a line that says so (it exited 0 with a report of no runs)."""
    _fake_shapes(monkeypatch, runs=False)
    assert main(["bench", "--preset", "smoke", "--impl", "flashrnn", "--no-progress",
                 "--out", str(tmp_path)]) == 1
    assert ("NOTHING RAN: none of --impl flashrnn runs here"
            in capsys.readouterr().out)


def test_a_presets_value_at_odds_with_an_option_is_named_as_the_presets(capsys):
    """--preset stack --hidden 256: the projection of 512 is the preset's, not an option
    given; the message says whose shape it is (it read as if --proj 512 had been given)."""
    assert main(["plan", "--preset", "stack", "--hidden", "256"]) == 2
    line = _one_line_error(capsys)
    assert line.startswith("tritonrnn: error: --preset stack's shape lstm H1024 "), line
    assert line.endswith("with the options given: --proj: expected a value in [0, "
                         "--hidden=256], got 512"), line
