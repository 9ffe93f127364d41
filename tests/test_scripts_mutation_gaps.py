"""The lent-GPU scripts' behaviour that the other script tests left unchecked (a mutation round
of scripts/step_ablation.py, scripts/split_k_probe.py, scripts/fuzz_configs.py and
scripts/gpu_session.sh): each test here fails on a plausible bug that every other test
passed. CPU only: the GPU runs, the variant processes and the sm_90 compiles are faked."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT, load_script, run_gpu_session

ABL = load_script("step_ablation")
PROBE = load_script("split_k_probe")
FZ = load_script("fuzz_configs")


# --- step_ablation.py --------------------------------------------------------------------


def test_constraint_parts_are_the_tiles_the_docstring_names():
    """Each constraint part asks for the tiles its name and the module docstring give (tile
    sizes read block_h x block_b): a wrong one times another plan than the one decided on."""
    want = {"bk0": {"block_k": 0}, "bk32": {"block_k": 32}, "bk64": {"block_k": 64},
            "bk128": {"block_k": 128}, "bb64": {"block_b": 64}, "bh16": {"block_h": 16},
            "bb16": {"block_h": 32, "block_b": 16}, "bb128": {"block_h": 64, "block_b": 128},
            "bh128": {"block_h": 128, "block_b": 64},
            "stepwise": {"family": "stepwise", "block_h": 32, "block_b": 64, "block_k": 64},
            "sw64": {"family": "stepwise", "block_h": 64, "block_b": 64, "block_k": 64},
            **{f"st{n}": {"num_stages": n} for n in (3, 4, 6, 8)}}
    for part, cons in want.items():
        assert ABL.constraints(f"{part},layer") == {"family": "persistent_grid", **cons}, part


@pytest.mark.parametrize("part, form", [("splitk", 2), ("splitk1", 1)])
def test_split_k_parts_switch_on_their_own_form(part, form, monkeypatch):
    """splitk turns on the two-barrier form, splitk1 the one-barrier form (at LSTM H=1024
    B=16 both have tiles on an H100: the one-barrier switch wins where it is on)."""
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import PRESETS

    monkeypatch.setattr(split_k, "_BWD_SPLIT_K", False)
    monkeypatch.setattr(split_k, "_BWD_SPLIT_K1", False)
    for module, name, value in ABL.swaps()[part]:
        monkeypatch.setattr(module, name, value)
    assert split_k.switched_form("lstm", 1024, 16, torch.bfloat16, PRESETS["h100"]) == form


@pytest.mark.parametrize("variant", ["nodots,full", "full,nodots,layer", "bk65,layer"])
def test_every_part_of_a_variant_is_checked(variant):
    bad = next(p for p in variant.split(",") if p in ("nodots", "bk65"))
    with pytest.raises(ValueError, match=f"unknown part '{bad}'"):
        ABL.check_variant(variant)


@pytest.mark.parametrize("text", ["lstm,768,16,4", "lstm,768,x", "lstm,768,16;gru,1024,6b"])
def test_parse_shapes_names_the_option_for_each_bad_item(text):
    with pytest.raises(ValueError, match="^--shapes: expected MODE,H,B"):
        ABL.parse_shapes(text)


def test_a_verdict_compares_the_whole_layer_fwd_plus_bwd():
    row = {"variant": "bw4,layer", "mode": "lstm", "H": 768, "B": 16, "programs": 48,
           "num_warps": 8, "step_us": 5.0, "fwd_ms": 1.0, "bwd_ms": 5.0}
    plan = {**row, "variant": "layer", "fwd_ms": 2.0, "bwd_ms": 2.0}
    assert ABL._time_line(row, plan).endswith("= 1.50x the plan's fwd+bwd")
    assert "the plan's" not in ABL._time_line(plan, plan)  # the plan's own row: no verdict


def test_run_variant_gives_the_last_stderr_line_of_a_failing_process(tmp_path):
    """A failing variant's reason is its traceback's last line (the exception), not the
    first ('Traceback (most recent call last):')."""
    broken = tmp_path / "broken.py"
    broken.write_text("def f():\n    raise RuntimeError('no tiles')\nf()\n")
    rc, killed, why = ABL.run_variant([sys.executable, str(broken)], 30, lambda row: None)
    assert (rc, killed, why) == (1, False, ["RuntimeError: no tiles"])


def _fake_timed_run(seen: list, out: Path | None = None):
    """A run_variant that prints one row per shape, recording (variant, limit, the rows saved
    in `out` when each row is passed on)."""

    def fake_run(cmd, limit, on_row):
        v = cmd[cmd.index("--variant") + 1]
        saved = []
        for m, h, b in (sh.split(",") for sh in cmd[cmd.index("--shapes") + 1].split(";")):
            on_row({"variant": v, "mode": m, "H": int(h), "B": int(b), "programs": 48,
                    "num_warps": 4, "step_us": 5.0, "fwd_ms": 1.0, "bwd_ms": 1.0})
            if out is not None:
                path = out / "step_ablation.json"
                saved.append(len(json.loads(path.read_text())["rows"]) if path.exists()
                             else 0)
        seen.append((v, limit, saved))
        return 0, False, []

    return fake_run


def test_a_timed_variant_process_has_one_limit_and_saves_each_row_as_it_comes(
        monkeypatch, capsys, tmp_path):
    """A timed variant process is cut at 240 s however many shapes it runs (at 240 s a shape,
    a hung variant of a 3-shape job would outlast every stage's box, 560 s at most, and
    take the rest of the set with it), and the JSON is rewritten after every row, before
    the process ends (a set cut by its box keeps the rows of the variant it was in)."""
    seen = []
    monkeypatch.setattr(ABL, "run_variant", _fake_timed_run(seen, tmp_path))
    monkeypatch.setattr(sys, "argv", ["step_ablation.py", "--shapes",
                                      "lstm,768,16;gru,1024,64;lstm,512,1", "--variants",
                                      "layer;bw4,layer", "--out", str(tmp_path)])
    assert ABL.main() == 0
    capsys.readouterr()
    assert seen == [("layer", 240, [1, 2, 3]), ("bw4,layer", 240, [4, 5, 6])]


def test_aot_exits_1_when_a_variant_process_fails(monkeypatch, capsys):
    """--aot's exit status says a variant process failed (the pre-session check would pass
    a variant that cannot even start)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(ABL, "run_variant", lambda cmd, limit, on_row: (1, False, ["boom"]))
    monkeypatch.setattr(sys, "argv", ["step_ablation.py", "--aot", "--shapes", "lstm,256,16",
                                      "--variants", "full"])
    assert ABL.main() == 1
    assert "1 variant processes failed" in capsys.readouterr().out


def test_a_sigterm_to_a_set_stops_its_variant_process(tmp_path):
    """gpu_session.sh's box stops step_ablation.py's main with SIGTERM: main's own handler
    exits through run_variant's cleanup (status 143), so the variant process does not hold
    the GPU through the next step."""
    marker = tmp_path / "child.pid"
    child = tmp_path / "child.py"
    child.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                     "time.sleep(60)\n")
    parent = tmp_path / "parent.py"
    parent.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "import step_ablation\n"
        "real = step_ablation.run_variant\n"
        f"step_ablation.run_variant = lambda cmd, limit, on_row: real("
        f"[sys.executable, {str(child)!r}], limit, on_row)\n"
        "sys.argv = ['step_ablation.py', '--shapes', 'lstm,16,1', '--variants', 'full']\n"
        "sys.exit(step_ablation.main())\n")
    proc = subprocess.Popen([sys.executable, str(parent)], cwd=ROOT)
    pid = None
    try:
        for _ in range(600):
            if marker.exists() and marker.read_text():
                pid = int(marker.read_text())
                break
            time.sleep(0.1)
        assert pid is not None, "the variant process did not start"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        time.sleep(0.5)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- gpu_session.sh ----------------------------------------------------------------------

# A stub that records its arguments, the names in the stage's archive at that moment, and
# prints a pytest call's arguments (so that the log the tests stage tees holds each run).
RECORDER = """import json, os, sys, tarfile
arch = os.path.join(os.environ["OUT"], os.environ["STAGE"] + ".tgz")
names = []
if os.path.exists(arch):
    with tarfile.open(arch) as t:
        names = sorted(os.path.basename(n) for n in t.getnames())
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "archive": names}) + "\\n")
if "pytest" in sys.argv:
    print("STUB", " ".join(sys.argv[1:]))
"""


def _session(stage: str, tmp_path: Path) -> list[dict]:
    return run_gpu_session(stage, tmp_path, RECORDER)


def test_each_boxed_step_is_packed_before_the_next_starts(tmp_path):
    """A stage cut by the device tool brings back the last archive: `box` packs after its
    step, so the tuned bench starts with tune.log already in tune.tgz."""
    calls = _session("tune", tmp_path)
    bench = next(c for c in calls if c["argv"][1:4] == ["-m", "tritonrnn.bench", "bench"])
    assert "tune.log" in bench["archive"], bench


def test_the_archive_holds_each_log_as_the_stage_left_it(tmp_path):
    """The exit packs the stage's last output: the tests stage's log in the archive holds
    both pytest runs (the second runs after the stage's last explicit pack)."""
    _session("tests", tmp_path)
    with tarfile.open(tmp_path / "out" / "tests.tgz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("gpu-tests.log"))
        text = tar.extractfile(member).read().decode()
    runs = [line for line in text.splitlines() if line.startswith("STUB python -m pytest")]
    assert len(runs) == 2 and "--ignore=" in runs[1], text


def test_the_tests_stage_runs_only_gpu_marked_tests(tmp_path):
    calls = [c["argv"][1:] for c in _session("tests", tmp_path)
             if c["argv"][1:3] == ["-m", "pytest"]]
    assert len(calls) == 2
    for argv in calls:
        assert argv[argv.index("-m", 1) + 1] == "gpu", argv


def test_the_splitk_stage_probes_both_forms(tmp_path):
    """The splitk stage times the kernel alone in its two-barrier form, then its one-barrier
    form, each into its own JSON."""
    probes = [c["argv"][2:] for c in _session("splitk", tmp_path)
              if c["argv"][1:2] == ["scripts/split_k_probe.py"]]
    parsed = [PROBE.build_parser().parse_args(argv) for argv in probes]
    assert [a.one_barrier for a in parsed] == [False, True]
    assert len({a.json for a in parsed}) == 2


# --- split_k_probe.py --------------------------------------------------------------------


def test_probe_check_finds_a_wrong_kernel(monkeypatch):
    """check compares the kernel's outputs with the reference's: a dh0 off by 10% of its
    size shows in dh0's error, and only there."""
    real = PROBE.run

    def off(*a, **k):
        got = real(*a, **k)
        got["dh0"] += 0.1 * got["dh0"].abs().max()
        return got

    monkeypatch.setattr(PROBE, "run", off)
    err = PROBE.check("lstm", 32, 20, 4, 16, 64, 16, torch.float32, "cpu")
    assert err["dh0"] > 0.05 and max(err["dpre_x"], err["dc0"]) < 1e-5, err


@pytest.mark.parametrize("one_barrier, per_step", [(False, 2), (True, 1)])
def test_probe_times_the_bare_barriers_its_form_has(one_barrier, per_step, monkeypatch):
    """_timed's bare-barrier floor: two grid barriers a step for the two-barrier form, one
    for the one-barrier form (the GPU calls faked)."""
    from tritonrnn.kernels import grid_barrier

    counts = []
    real_inputs = PROBE.inputs
    monkeypatch.setattr(PROBE, "check", lambda *a, **k: {})
    monkeypatch.setattr(PROBE, "inputs", lambda *a, **k: real_inputs(*a[:5], "cpu"))
    monkeypatch.setattr(PROBE, "run", lambda *a, **k: None)
    monkeypatch.setattr(PROBE, "measure", lambda fn, dev, cfg: (fn(), SimpleNamespace(ms=1.0))[1])
    monkeypatch.setattr(PROBE, "bare_timed_out", lambda syncs: False)
    monkeypatch.setattr(grid_barrier, "check_barriers", lambda: None)
    monkeypatch.setattr(grid_barrier, "run_bare_barriers",
                        lambda n, programs, dev, num_warps=4: counts.append(n))
    T = 8
    row = PROBE._timed("lstm", 32, 20, 16, 64, 16, T, torch.float32, 8, one_barrier)
    assert counts == [per_step * T], counts
    assert row["programs"] == PROBE.tiles("lstm", 32, 20, 16, 64, 16, one_barrier)[0]


def test_probe_saves_each_config_as_it_ends_and_exits_1_on_a_failed_one(monkeypatch, tmp_path):
    """--json is rewritten after each config (a stage cut at its box keeps the configs
    done), a config that raises is a row with its error, and the exit status is 1."""
    out = tmp_path / "probe.json"
    seen = []

    def fake_aot(cell, H, B, U, KB, BB, dtype, warps, one_barrier):
        seen.append(len(json.loads(out.read_text())["results"]) if out.exists() else 0)
        if len(seen) == 2:
            raise RuntimeError("does not compile")
        return {"shared": 1, "regs": 2, "stack": 0, "local": 0, "mma": "mma", "fits": True,
                "error": None, "profile": {}}

    monkeypatch.setattr(PROBE, "_aot", fake_aot)
    rc = PROBE.main(["--aot", "--config", "32,20,16,64,16", "--config", "1024,64,64,512,64",
                     "--json", str(out)])
    assert rc == 1 and seen == [0, 1]
    rows = json.loads(out.read_text())["results"]
    assert rows[0]["error"] is None and "RuntimeError: does not compile" in rows[1]["error"]


def test_probe_checks_a_config_against_the_form_it_runs(monkeypatch, tmp_path):
    """A one-barrier config without a two-barrier tiling (GRU K blocks of 3 x 64 rows) is
    accepted with --one-barrier and run in that form."""
    seen = []
    monkeypatch.setattr(PROBE, "_aot", lambda *a: seen.append(a[-1]) or {})
    assert PROBE.main(["--aot", "--one-barrier", "--cell", "gru", "--config",
                       "1024,16,128,192,16"]) == 0
    assert seen == [True]


# --- fuzz_configs.py ---------------------------------------------------------------------


def test_an_extras_case_is_compared_with_the_reference_backend(monkeypatch):
    """torch.nn has neither dropout between layers nor skip_input: an --extras case goes to
    compare_with_reference, never to the torch.nn oracle (which would ignore both)."""
    import helpers

    def no_torch(*_a, **_k):
        raise AssertionError("compared with torch.nn")

    seen = []
    monkeypatch.setattr(helpers, "compare_with_torch", no_torch)
    monkeypatch.setattr(FZ, "compare_with_reference",
                        lambda s, device: seen.append(s) or {"output": 0.0})
    for i in range(4):
        case = FZ.focus_extras(FZ.draw(i), i)
        rec = FZ.run_case(case)
        assert rec["status"] == "ok", rec
        assert seen[-1] == case["shape"]


def test_a_case_records_its_largest_error(monkeypatch):
    import helpers

    monkeypatch.setattr(helpers, "compare_with_torch",
                        lambda *_a, **_k: {"output": 1e-7, "dx": 3e-6, "dh0": 0.0})
    rec = FZ.run_case(FZ.draw(1))
    assert rec["status"] == "ok" and rec["max_error"] == 3e-6, rec
