"""The lent-GPU scripts (scripts/gpu_session.sh, scripts/step_ablation.py) checked on the CPU,
so that a device session does not spend its minutes on a command that cannot start.

Every stage of gpu_session.sh runs with `python`, `nvidia-smi` and `ncu` replaced by stubs
that only record their arguments; each recorded `python -m tritonrnn.bench ...` must parse
with the command's own parser, each `scripts/step_ablation.py ...` with the script's (its
variants and shapes included) and each pytest call must name existing paths. The ablation's
no-op replacements must keep the signatures of what they replace, and every variant part must
run its swapped kernels (in the interpreter: the outputs are garbage, only the run counts).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, load_script, run_gpu_session

from tritonrnn.bench.cli import build_parser

STAGES = ["all", "tests", "bench", "bench2", "grid", "tune", "ablation", "wide", "large",
          "warps", "hoist", "vector", "spills", "spills2", "huge", "late",
          "decide", "confirm", "barrier", "phases", "splitk", "profile"]


ABL = load_script("step_ablation")
PROBE = load_script("split_k_probe")

# A stub records its name and arguments as one JSON line and runs nothing, but for the report
# file an ncu profile run writes (`-o STEM`: gpu_profile.sh fails a profile without one).
RECORDER = """import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "ncu" and "-o" in sys.argv:
    open(sys.argv[sys.argv.index("-o") + 1] + ".ncu-rep", "w").close()
"""


def _record(stage: str, tmp_path: Path) -> list[list[str]]:
    return run_gpu_session(stage, tmp_path, RECORDER)


def _python_calls(calls: list[list[str]]) -> list[list[str]]:
    """The python command lines, also those ncu runs (`ncu ... python ARGS`)."""
    out = []
    for call in calls:
        if call[0] == "python":
            out.append(call[1:])
        elif call[0] == "ncu" and "python" in call:
            out.append(call[call.index("python") + 1:])
    return out


@pytest.mark.parametrize("stage", STAGES)
def test_every_command_of_a_gpu_session_stage_parses(stage, tmp_path):
    calls = _python_calls(_record(stage, tmp_path))
    checked = 0
    for argv in calls:
        if argv[:2] == ["-m", "tritonrnn.bench"]:
            build_parser().parse_args(argv[2:])  # the CLI's errors exit: a failure here
            checked += 1
        elif argv and argv[0] == "scripts/step_ablation.py":
            for shapes, variants in ABL.jobs(ABL.build_parser().parse_args(argv[1:])):
                _check_plans(shapes, variants)
            checked += 1
        elif argv and argv[0] == "scripts/split_k_probe.py":
            PROBE.build_parser().parse_args(argv[1:])  # (its --config checks the tiles)
            checked += 1
        elif argv[:2] == ["-m", "pytest"]:
            paths = [a for a in argv[2:] if not a.startswith("-") and "/" in a or a == "tests"]
            assert paths and all((ROOT / p).exists() for p in paths), argv
            checked += 1
    assert checked, f"stage {stage}: no command recorded ({calls})"


@pytest.mark.parametrize("stage", ["all", "tests", "decide", "confirm", "barrier", "splitk",
                                   "profile"])
def test_a_stage_brings_its_files_back_in_one_archive(stage, tmp_path):
    """The device tool brings back at most 8 files from $OUT: a stage leaves one archive
    there, $OUT/<stage>.tgz, holding its logs (and whatever its programs wrote)."""
    import tarfile

    _record(stage, tmp_path)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [f"{stage}.tgz"]
    with tarfile.open(out / f"{stage}.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    want = {"all": {"gpu.txt", "warm-grid.log", "warm-targets.log", "bench-grid.log",
                    "barrier.log", "bench-targets.log", "check.log"},
            "tests": {"gpu.txt", "gpu-tests.log"},
            "decide": {"gpu.txt", "ablation-decide.log"},
            "confirm": {"gpu.txt", "warm-grid.log", "bench-grid.log", "ablation-confirm.log",
                        "check.log"},
            "barrier": {"gpu.txt", "warm-grid.log", "barrier.log"},
            "splitk": {"gpu.txt", "warm-lstm-1024-256-2.log", "warm-gru-1024-16-1.log",
                       "ablation-splitk.log", "bench-split-k.log", "splitk.log",
                       "splitk1.log"},
            "profile": {"gpu.txt", *(f"lstm-{shape}-{kind}.log" for shape in ("768-16", "1024-64")
                                     for kind in ("fwd", "bwd"))}}[stage]
    assert want <= names, names


# A recorder whose runs of pytest (`python -m pytest`), of one bench step (`--preset grid`)
# and of the ablation script fail.
FAILING = RECORDER + """args = sys.argv[1:]
if args[:3] == ["python", "-m", "pytest"] or "grid" in args or (
        len(args) > 1 and args[1].endswith("step_ablation.py")):
    sys.exit(3)
"""


# A recorder whose ncu writes no report (no kernel matched the profile's regex).
NO_REPORT = RECORDER.replace('"-o" in sys.argv', "False")


@pytest.mark.parametrize(("stage", "recorder", "steps"), [
    ("tests", FAILING, ["pytest-grid(rc 3)", "pytest-rest(rc 3)"]),
    ("confirm", FAILING, ["bench-grid(rc 3)", "ablation-confirm(rc 3)"]),
    ("profile", NO_REPORT, ["profile-lstm,768,16(rc 1)", "profile-lstm,1024,64(rc 1)"]),
], ids=["tests", "confirm", "profile"])
def test_a_stage_whose_step_fails_exits_1_naming_it(stage, recorder, steps, tmp_path):
    """The device tool's rc is the stage's: a failed pytest run, time-boxed step, ablation
    or profile without a report makes the stage exit 1, naming the steps on stderr (the
    `tests` stage exited 0 whatever pytest said), after running its other steps and packing
    its files."""
    assert recorder != RECORDER
    calls = run_gpu_session(stage, tmp_path, recorder, returncode=1,
                            stderr=[f"gpu_session.sh {stage}: steps that did not end with rc 0:",
                                    *steps])
    assert calls and (tmp_path / "out" / f"{stage}.tgz").is_file()


@pytest.mark.parametrize("preset", ["h100", "h200"])
def test_the_profiles_kernel_filters_match_the_kernels_the_plans_launch(preset):
    """gpu_profile.sh picks each pass's kernel by an ncu name regex: at the `profile`
    stage's shapes it must match the kernel the planner's plan runs (the backward of LSTM
    H=1024 B=64 is the split-K kernel's since the planner's rule: `_grid_bwd` alone matched
    nothing, and ncu wrote no report)."""
    from tritonrnn.kernels import persistent_grid as pg
    from tritonrnn.kernels import split_k
    from tritonrnn.rnn.planner import PRESETS, recurrence_choice

    profile = (ROOT / "scripts" / "gpu_profile.sh").read_text()
    fwd, bwd = re.findall(r'^\s*profile "?([^" ]+)"? "\$out/\$name-(?:fwd|bwd)"', profile,
                          re.MULTILINE)
    stage = (ROOT / "scripts" / "gpu_session.sh").read_text().split("\n  profile)")[1]
    shapes = re.search(r"for shape in ([\w, ]+); do", stage).group(1).split()
    assert shapes == ["lstm,768,16", "lstm,1024,64"]
    backward = {0: pg._grid_bwd_kernel, 1: split_k._split_k1_bwd_kernel,
                2: split_k._split_k_bwd_kernel}
    for mode, h, b in (shape.split(",") for shape in shapes):
        lp, _ = recurrence_choice(mode, int(h), int(h), 0, torch.bfloat16, int(b),
                                  PRESETS[preset])
        assert lp.family == "persistent_grid", (mode, h, b, lp)
        assert re.search(fwd, pg._grid_fwd_kernel.fn.__name__)
        assert re.search(bwd, backward[lp.split_k_bwd].fn.__name__), (mode, h, b, lp)
        assert not re.search(bwd, pg._grid_fwd_kernel.fn.__name__)


def _budgets(stage: str) -> list[int]:
    """The time boxes of a stage of gpu_session.sh (`box`, `timeout` and `ablate` SECONDS); a
    last box of `timeout $((N - elapsed))` caps the whole stage at N."""
    text = (ROOT / "scripts" / "gpu_session.sh").read_text()
    block = text[text.index(f"\n  {stage})"):]
    block = block[:block.index(";;")]
    cap = re.findall(r"timeout \$\(\((\d+) - ", block)
    if cap:
        return [int(cap[-1])]
    # gpu_profile.sh, one call a shape, cuts each of its ncu runs (a forward and a backward
    # per shape) and each of a run's report conversions (two, three where the first SASS
    # page fails).
    ncu = re.search(r"for shape in ((?:[\w,]+ ?)+); do\s+NCU_SECONDS=(\d+) "
                    r"NCU_CONVERT_SECONDS=(\d+) .*gpu_profile\.sh", block)
    if ncu:
        run, convert = int(ncu.group(2)), int(ncu.group(3))
        return [run + 3 * convert] * 2 * len(ncu.group(1).split())
    return _boxes(block)


# A box may be a variable with a default: ablate "${NAME:-N}".
_BOX = re.compile(r'(?:box|timeout|ablate) "?(?:\$\{\w+:-)?(\d+)\}?"? ')
_LOOP = re.compile(r"\bfor \w+ in (.+?); do\b", re.S)
_DO_DONE = re.compile(r"\b(do|done)\b")


def _boxes(text: str) -> list[int]:
    """The boxes a piece of the script runs one after another: a loop's boxes once per item
    (`for p in a b c; do box 110 ...; done`: three), or once where its body backgrounds them
    (`... &` then `wait`: they overlap)."""
    out, pos = [], 0
    while (loop := _LOOP.search(text, pos)):
        out += [int(n) for n in _BOX.findall(text[pos:loop.start()])]
        depth = 1
        for word in _DO_DONE.finditer(text, loop.end()):
            depth += 1 if word.group() == "do" else -1
            if depth == 0:
                break
        body = text[loop.end():word.start()]
        inner = _boxes(body)
        if re.search(r"&\s*$", body, re.M):
            out += [max(inner)] if inner else []
        else:
            out += inner * len(shlex.split(loop.group(1).replace("\\\n", " ")))
        pos = word.end()
    return out + [int(n) for n in _BOX.findall(text[pos:])]


def test_boxes_count_a_loops_boxes_per_item_unless_backgrounded():
    text = """box 30 a
    for p in x "y z" w; do
      box 100 "bench-$p" cmd
      for q in 1 2; do timeout 10 run; done
    done
    for p in a b; do
      timeout 50 warm "$p" &
    done
    wait
    ablate "${DECIDE_SECONDS:-40}" decide"""
    assert _boxes(text) == [30, 100, 10, 10, 100, 10, 10, 100, 10, 10, 50, 40]


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_fits_one_device_command(stage):
    """The device tool stops a command at 600 s: each stage's boxes add up to less (a stage
    without boxes runs one timed program of its own)."""
    assert sum(_budgets(stage)) < 600


@pytest.mark.parametrize(("stages", "spare"), [(("tests", "all"), 170),
                                               (("tests", "decide", "barrier"), 170),
                                               (("tests", "splitk"), 170),
                                               (("tests", "confirm"), 170),
                                               (("all", "phases"), 80),
                                               (("tests", "profile"), 170)])
def test_a_session_fits_the_device_budget(stages, spare):
    """The stages the script's header runs in a 15-minute session (tests, then all; tests,
    decide with the shorter box the header names, then barrier; tests, then splitk; tests,
    then confirm; all, then phases; tests, then profile) are
    each cut below the timeout_s the header gives them, and together leave the machine's
    start, the transfers and the idle wait between the calls `spare` seconds of the 900 s (a
    start took about 30 s on 2026-11-26, a dead machine's 86 s)."""
    text = (ROOT / "scripts" / "gpu_session.sh").read_text()
    head = " ".join(text[:text.index("set -uo pipefail")].replace("#", " ").split())
    total = 0
    for stage in stages:
        given = re.search(rf"`(?:(\w+)=(\d+) bash scripts/gpu_session.sh )?{stage}` "
                          rf"\(timeout_s (\d+)\)", head)
        limit = int(given.group(3))
        secs = [int(given.group(2))] if given.group(1) else _budgets(stage)
        if given.group(1):  # the box the header sets is the stage's variable
            assert f"${{{given.group(1)}:-" in text, given.group(1)
        assert secs and sum(secs) + 30 <= limit < 600, (stage, secs, limit)
        total += limit
    assert total <= 900 - spare, total


def _check_plans(shapes, variants):
    """Every variant's plan constraints give a plan for every shape on an H100 (the planner
    raises ValueError otherwise, e.g. a grid that cannot be co-resident)."""
    from tritonrnn.rnn.planner import PRESETS, plan_constraints, recurrence_choice

    for v in variants:
        cons = ABL.constraints(v)
        for mode, H, B in shapes:
            with plan_constraints(**cons):
                lp, _ = recurrence_choice(mode, H, H, 0, torch.bfloat16, B, PRESETS["h100"])
            own = lp.choice()  # (Triton's default stages named 3, stored as 0)
            for key, want in cons.items():
                assert own.get(key, getattr(lp, key)) == want, (v, mode, H, B, key)


def _variant_plan(variant: str, shape, props):
    """The planner's LayerPlan for `shape` with `variant`'s planner swaps and constraints
    applied (its kernel-module swaps change no plan), the heuristic's cache cleared around
    it (a plan cached before the swap would hide it)."""
    from tritonrnn.rnn import planner
    from tritonrnn.rnn.planner import plan_constraints, recurrence_choice

    table = ABL.swaps()
    saved = [(name, getattr(planner, name)) for part in variant.split(",")
             for module, name, _ in table.get(part, ()) if module is planner]
    planner._heuristic_cached.cache_clear()
    try:
        for part in variant.split(","):
            for module, name, value in table.get(part, ()):
                if module is planner:
                    setattr(planner, name, value)
        with plan_constraints(**ABL.constraints(variant)):
            return recurrence_choice(*shape[:2], shape[1], 0, torch.bfloat16, shape[2],
                                     props)[0]
    finally:
        for name, value in reversed(saved):
            setattr(planner, name, value)
        planner._heuristic_cached.cache_clear()


def test_no_planner_variant_of_a_set_is_the_plan_itself():
    """A variant made only of plan changes (constraints, the planner's warps and rules) must
    plan something else than `layer` at one of its set's shapes at least, on an H100 and an
    H200: one that equals the plan at every shape would spend device minutes timing the plan
    twice (the warps, spills and spills-k512 sets did, after the planner adopted their
    winners: fw8 / w8, bw8, bk64)."""
    from tritonrnn.rnn import planner
    from tritonrnn.rnn.planner import PRESETS

    table = ABL.swaps()
    groups = [(name, *spec) for name, spec in ABL.SETS.items()] + [
        (f"{name}[{i}]", *spec) for name, specs in ABL.DECISIONS.items()
        for i, spec in enumerate(specs)]
    checked = 0
    for name, shapes, variants in groups:
        shapes = ABL.parse_shapes(shapes)
        for variant in variants.split(";"):
            parts = variant.split(",")
            if set(parts) <= {"layer", "full"} or "bh32" in parts or variant.startswith("bare"):
                continue  # the plan itself; bh32 is applied after the planner
            if not all(p in ("layer", "full") or p in ABL._CONSTRAINTS or
                       (p in table and all(m is planner for m, _, _ in table[p]))
                       for p in parts):
                continue  # it swaps kernel code: the plan alone cannot tell
            for preset in ("h100", "h200"):
                props = PRESETS[preset]
                assert any(_variant_plan(variant, s, props) != _variant_plan("layer", s, props)
                           for s in shapes), (name, variant, preset)
            checked += 1
    assert checked >= 20  # (the sets' constraint and warps variants)


def test_ablation_constraint_parts():
    assert ABL.constraints("full,layer") == {}
    assert ABL.constraints("bk64,bb64,layer") == {"family": "persistent_grid", "block_k": 64,
                                                 "block_b": 64}
    ABL.check_variant("bk128,bb64,bh16,layer")
    assert ABL.constraints("stepwise,layer") == {"family": "stepwise", "block_h": 32,
                                                 "block_b": 64, "block_k": 64}
    assert ABL.constraints("bb128,noxjoin,layer") == {"family": "persistent_grid",
                                                      "block_h": 64, "block_b": 128}


def test_unknown_variant_and_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="unknown part 'nodots'"):
        ABL.check_variant("full,nodots")
    with pytest.raises(ValueError, match="MODE,H,B"):
        ABL.parse_shapes("lstm,768;gru,1024,16")
    assert ABL.parse_shapes("lstm,768,64;gru,1024,16") == [("lstm", 768, 64), ("gru", 1024, 16)]
    r = subprocess.run([sys.executable, "scripts/step_ablation.py", "--variants", "full;s3"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown part 's3'" in r.stderr.splitlines()[-1]


def test_every_named_set_is_run_by_a_stage_and_plans():
    """step_ablation.SETS are the stages' ablations: each is used by gpu_session.sh, and each
    of its variants plans every one of its shapes."""
    text = (ROOT / "scripts" / "gpu_session.sh").read_text()
    used = re.findall(r'^\s*ablate (?:\d+|"\$\{\w+:-\d+\}") ([\w-]+)', text, re.MULTILINE)
    assert sorted(used) == sorted([*ABL.SETS, *ABL.DECISIONS])
    for name, (shapes, variants) in ABL.SETS.items():
        args = ABL.build_parser().parse_args(["--set", name])
        [(got_shapes, got_variants)] = ABL.jobs(args)
        assert got_shapes == ABL.parse_shapes(shapes) and got_variants == variants.split(";")
        _check_plans(got_shapes, got_variants)
    for name, decisions in ABL.DECISIONS.items():
        got = ABL.jobs(ABL.build_parser().parse_args(["--set", name]))
        assert len(got) == len(decisions)
        for (shapes, variants), (got_shapes, got_variants) in zip(decisions, got, strict=True):
            assert got_shapes == ABL.parse_shapes(shapes) and got_variants == variants.split(";")
            # A decision is the planner's plan against the variants that undo its rules (or,
            # `_grid_backward`, the plan with the grid's own backward against them).
            base = got_variants[0]
            assert base in ("layer", "nosplitk,layer") and len(got_variants) >= 2, (name,
                                                                                     variants)
            assert all(v.endswith(",layer") and ABL.baseline(v) in (base, "layer")
                       for v in got_variants[1:]), (name, variants)
            _check_plans(got_shapes, got_variants)
    args = ABL.build_parser().parse_args(["--aot", "--set", "all"])
    assert len(ABL.jobs(args)) == len(ABL.SETS) + sum(map(len, ABL.DECISIONS.values()))


def test_a_decisions_rule_variants_keep_the_weights_where_the_plan_has_them(monkeypatch):
    """A decision's variants that name no plan constraints change a rule of the kernels or
    the planner (a chunk width, a split, warps): the plan they time keeps the baseline's
    family, tiles and resident or streamed weights, so the decision compares that rule alone
    (chunk1024 at GRU H=1024 B=64 would have streamed the weights: its 1024 x 32 operand
    fails resident_operands_fit)."""
    from tritonrnn.rnn import planner

    def plan(variant: str, mode: str, H: int, B: int):
        with monkeypatch.context() as m:
            for part in variant.split(","):
                for module, name, value in ABL.swaps().get(part, []):
                    m.setattr(module, name, value)
            planner.clear_plan_caches()
            lp, _ = planner.recurrence_choice(mode, H, H, 0, torch.bfloat16, B,
                                              planner.PRESETS["h100"])
        planner.clear_plan_caches()
        return lp.family, lp.block_h, lp.block_b, lp.block_k

    checked = 0
    for decisions in ABL.DECISIONS.values():
        for shapes, variants in decisions:
            for mode, H, B in ABL.parse_shapes(shapes):
                base = plan("layer", mode, H, B)
                for v in variants.split(";")[1:]:
                    if not ABL.constraints(v):
                        assert plan(v, mode, H, B) == base, (v, mode, H, B)
                        checked += 1
    assert checked
    # The check can fail: the swap that the gru,1024,64 decision no longer makes.
    assert plan("chunk1024,layer", "gru", 1024, 64)[3] != plan("layer", "gru", 1024, 64)[3]


def test_decisions_run_in_order_and_time_a_baseline_once():
    a, b = ("lstm", 768, 16), ("gru", 1024, 64)
    todo = [([a], ["layer", "fw8,layer"]), ([b], ["layer", "nosums,layer"]),
            ([a, b], ["layer", "hoist,layer"])]
    # Timed: job by job, so a run cut short keeps whole decisions; a (variant, shape) pair
    # already run is not run again.
    assert ABL.runs(todo, merge=False) == [
        ("layer", [a]), ("fw8,layer", [a]), ("layer", [b]), ("nosums,layer", [b]),
        ("hoist,layer", [a, b])]
    # --aot: one process per variant over all its shapes.
    assert ABL.runs(todo, merge=True) == [
        ("layer", [a, b]), ("fw8,layer", [a]), ("nosums,layer", [b]), ("hoist,layer", [a, b])]


@pytest.mark.parametrize("argv, message", [
    (["--set", "wide", "--shapes", "lstm,768,16"], "--set: takes its shapes and variants"),
    (["--set", "all"], "--set all: expected --aot with it"),
    (["--aot", "--once", "lstm,768,16"], "--aot: compiles the variants' kernels; expected no "
                                         "--once"),
])
def test_set_and_aot_option_errors(argv, message):
    r = subprocess.run([sys.executable, "scripts/step_ablation.py", *argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr.splitlines()[-1], r.stderr


def test_aot_refuses_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "scripts/step_ablation.py", "--aot", "--set", "warps"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert "--aot: compiles for a GPU; run without TRITON_INTERPRET=1" in r.stderr


def test_aot_compiles_each_variant_with_its_swaps(tmp_path):
    """`--aot` compiles each variant in a process of its own with the variant applied: the
    planner's swaps (w8: 8 warps) and the kernels' (nohoist: the resident weights read from
    shared memory every step instead of held in registers, so more ldmatrix in the step loop
    than the planner's hoisted LSTM H=256 B=16) both reach the compiled kernels. noload takes
    the exchange operand's global loads out of the step loops and nothing else of the
    product: its operand stays loop-variant (`_slot_one`; a loop-invariant one let the
    compiler hoist the whole hoisted-weight forward product out of the loop)."""
    from tritonrnn.bench import aot

    try:
        aot._tool("ptxas")
        aot._tool("cuobjdump")
    except aot.ToolMissing as e:
        pytest.skip(f"no ptxas/cuobjdump to compile for sm_90: {e}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "scripts/step_ablation.py", "--aot", "--shapes",
                        "lstm,256,16", "--variants", "full;nohoist;w8;noload", "--out",
                        str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 kernels compiled for sm_90" in r.stdout.splitlines()[-1]
    report = json.loads((tmp_path / "step_ablation_aot.json").read_text())
    assert report["environment"]["commit"] and report["command"][0] == "step_ablation.py"
    rows = report["rows"]
    by = {(row["variant"], row["phase"]): row for row in rows}
    assert sorted(by) == [(v, p) for v in ("full", "nohoist", "noload", "w8")
                          for p in ("backward", "forward")]
    assert all(row["error"] is None and row["mode"] == "lstm" and row["H"] == 256
               for row in rows)
    assert by["full", "forward"]["num_warps"] == 4 and by["w8", "forward"]["num_warps"] == 8
    assert by["w8", "backward"]["num_warps"] == 8
    for phase in ("forward", "backward"):
        assert by["nohoist", phase]["LDSM"] > by["full", phase]["LDSM"], phase
        full, noload = by["full", phase], by["noload", phase]
        assert noload["MMA"] == full["MMA"] > 0 and noload["LDSM"] == full["LDSM"], phase
        assert noload["LDG"] < full["LDG"], phase


def _positional(fn) -> list[inspect.Parameter]:
    fn = getattr(fn, "fn", fn)  # a @triton.jit object's Python function
    return list(inspect.signature(fn).parameters.values())


def _constexpr_positions(fn) -> list[int]:
    return [i for i, p in enumerate(_positional(fn)) if "constexpr" in str(p.annotation)]


@pytest.mark.parametrize("part", sorted(ABL.swaps()))
def test_ablation_swaps_keep_the_replaced_signatures(part):
    for module, name, value in ABL.swaps()[part]:
        original = getattr(module, name)
        if isinstance(original, (bool, int, dict)):  # a switch or a rule's table
            assert type(value) is type(original), (part, name)
        elif hasattr(original, "fn"):  # a jit helper: called positionally from the kernels
            assert hasattr(value, "fn"), (part, name)
            got, want = _positional(value), _positional(original)
            assert len(got) == len(want), (part, name, len(got), len(want))
            assert _constexpr_positions(value) == _constexpr_positions(original), (part, name)
        else:  # a planner / kernel-module rule, called with the original's arguments
            inspect.signature(value).bind(*[None] * len(_positional(original)))


# The variants that stand for an environment switch decide every launch as the switch does.
@pytest.mark.parametrize("part, env, value, fn", [
    ("hoist", "TRITONRNN_HOIST_WEIGHTS", "fwd,bwd", "_hoist_weights"),
    ("hoistf", "TRITONRNN_HOIST_WEIGHTS", "fwd", "_hoist_weights"),
    ("nohoist", "TRITONRNN_HOIST_WEIGHTS", "off", "_hoist_weights"),
])
def test_switch_variants_decide_as_their_environment(monkeypatch, part, env, value, fn):
    from tritonrnn.kernels import grid_tiles as gt

    ((module, name, swapped),) = ABL.swaps()[part]
    assert (module, name) == (gt, fn)
    monkeypatch.setenv(env, value)
    real = getattr(gt, fn)
    cases = [(p, bk, bb, persistent, proj) for p in ("fwd", "bwd") for bk in (0, 64)
             for bb in (1, 2, 4, 16, 32, 64) for persistent in (True, False) for proj in (0, 48)]
    for case in cases:
        assert swapped(*case) == real(*case), (part, case)
    assert any(swapped(*case) for case in cases) is (value != "off")
    assert swapped("fwd", 0, 1, True, 0) is gt.Hoist.NONE  # B = 1: vector tiles, not hoisted


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="swapped helpers run in the interpreter (a GPU process would reuse "
                           "kernels compiled before the swap)")
@pytest.mark.parametrize("part", sorted(ABL.swaps()))
def test_ablation_variant_kernels_run(part, monkeypatch):
    """Each part's swapped code runs without an error at shapes that reach it: resident
    16-row tiles (most parts), streamed ones with a 64-column batch tile (noswap, nojoin),
    32-column batch tiles (pairg32, hoist) and vector tiles (vec1, the s<n> splits). Parts
    that reach none of these (the wide-tile thresholds, mma1 and samebwd: GPU presets only)
    are compiled for sm_90 by `step_ablation.py --aot` instead."""
    from tritonrnn.rnn import cudnn_rnn, params_size, planner
    from tritonrnn.rnn.planner import plan_constraints

    for module, name, value in ABL.swaps()[part]:
        monkeypatch.setattr(module, name, value)
    # A plan cached before the swap would hide a planner part (and one made with it must
    # not outlive this test).
    planner.clear_plan_caches()
    g = torch.Generator().manual_seed(0)
    T, H = 2, 32  # two steps: the second reads the exchanged h of the first
    n = params_size(rnn_mode="lstm", num_layers=1, num_units=H, input_size=H)
    params = (torch.randn(n, generator=g) * 0.1).requires_grad_()
    try:
        for B, tiles in ((3, {}), (3, {"block_k": 16, "block_b": 64}),
                         (20, {"block_b": 32}), (1, {"block_b": 1, "block_h": 8})):
            x = torch.randn(T, B, H, generator=g)
            h0 = torch.zeros(1, B, H)
            with plan_constraints(family="persistent_grid", **{"block_h": 16, **tiles}):
                out = cudnn_rnn(x, h0, torch.zeros(1, B, H), params, rnn_mode="lstm",
                                backend="triton")
                out.output.sum().backward()
            assert out.output.shape == (T, B, H) and params.grad.shape == (n,)
            params.grad = None
    finally:
        planner.clear_plan_caches()


def test_names_the_ablation_imports_exist():
    """step_ablation imports inside its GPU-only functions; a rename would only show there."""
    import ast
    import importlib

    tree = ast.parse((ROOT / "scripts" / "step_ablation.py").read_text())
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("tritonrnn"):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"), f"{node.module}.{alias.name}"
                found += 1
    assert found >= 10


def test_a_timed_set_gives_each_decision_its_verdict_and_survives_a_hung_variant(
        monkeypatch, capsys, tmp_path):
    """Each variant's line ends with its layer fwd + bwd against the same shape's plan
    (`layer`), or under `nosplitk` against `nosplitk,layer`; a variant process that outlives
    its limit is reported, the set goes on and exits 1 (the subprocesses are faked: nothing
    is timed)."""
    started = []

    def fake_run(cmd, limit, on_row):
        v = cmd[cmd.index("--variant") + 1]
        started.append(v)
        assert limit == 240
        if v == "hoist,layer":
            return -9, True, []
        ms = {"layer": 2.0, "fw8,layer": 3.0, "nosplitk,layer": 4.0}.get(v, 1.0)
        for m, h, b in (sh.split(",") for sh in cmd[cmd.index("--shapes") + 1].split(";")):
            on_row({"variant": v, "mode": m, "H": int(h), "B": int(b), "programs": 48,
                    "num_warps": 4, "step_us": 5.0, "fwd_ms": ms, "bwd_ms": ms})
        return 0, False, []

    monkeypatch.setitem(ABL.DECISIONS, "decide", [
        ("lstm,768,16", "layer;fw8,layer;hoist,layer"), ("gru,1024,64", "layer;nosums,layer"),
        ("gru,1024,64", "nosplitk,layer;nosplitk,w4,layer")])
    monkeypatch.setattr(ABL, "run_variant", fake_run)
    monkeypatch.setattr(sys, "argv", ["step_ablation.py", "--set", "decide",
                                      "--out", str(tmp_path)])
    assert ABL.main() == 1
    out = capsys.readouterr().out
    assert started == ["layer", "fw8,layer", "hoist,layer", "layer", "nosums,layer",
                       "nosplitk,layer", "nosplitk,w4,layer"]
    assert "fw8,layer" in out and "= 1.50x the plan's fwd+bwd" in out
    assert "= 0.50x the plan's fwd+bwd" in out  # nosums against gru's plan
    assert "= 0.25x nosplitk,layer's fwd+bwd" in out  # nosplitk,w4 against its baseline
    assert "= 2.00x the plan's fwd+bwd" in out  # nosplitk,layer against gru's plan
    assert "hoist,layer: killed after 240 s (its rows until then are kept)" in out
    assert out.splitlines()[-1] == "1 variant processes failed: hoist,layer"
    report = json.loads((tmp_path / "step_ablation.json").read_text())
    assert {"device", "commit", "torch", "triton"} <= set(report["environment"])
    assert report["command"] == ["step_ablation.py", "--set", "decide", "--out", str(tmp_path)]
    rows = report["rows"]
    assert [r["variant"] for r in rows] == ["layer", "fw8,layer", "layer", "nosums,layer",
                                            "nosplitk,layer", "nosplitk,w4,layer"]


def test_a_variant_process_cut_at_its_limit_keeps_the_rows_it_printed(tmp_path):
    """run_variant passes each row on as the process prints it (a set cut by its box keeps
    them: the rows of a process used to come at its end), and kills the process at its
    limit; a failing one gives its exit code and last stderr line."""
    import time

    slow = tmp_path / "slow.py"
    slow.write_text("import json, time\n"
                    "for i in range(3):\n"
                    "    print(json.dumps({'i': i}), flush=True)\n"
                    "    time.sleep(0.3 if i < 2 else 60)\n")
    got = []
    t0 = time.monotonic()
    rc, killed, _ = ABL.run_variant([sys.executable, str(slow)], 2.0, got.append)
    assert killed and rc != 0 and got == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert time.monotonic() - t0 < 30
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nprint('{\"i\": 7}')\nsys.exit('broken')\n")
    rc, killed, why = ABL.run_variant([sys.executable, str(broken)], 30, got.append)
    assert (rc, killed, why, got[-1]) == (1, False, ["broken"], {"i": 7})


def test_a_stopped_set_stops_its_variant_process(tmp_path):
    """gpu_session.sh's time box stops step_ablation with SIGTERM: its variant process must
    not outlive it (it would hold the GPU through the next step)."""
    import signal
    import time

    marker = tmp_path / "child.pid"
    child = tmp_path / "child.py"
    child.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                     "time.sleep(60)\n")
    parent = tmp_path / "parent.py"
    parent.write_text(f"import signal, sys\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
                      "import step_ablation\n"
                      "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
                      f"step_ablation.run_variant([sys.executable, {str(child)!r}], 60, print)\n")
    proc = subprocess.Popen([sys.executable, str(parent)], cwd=ROOT)
    for _ in range(600):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.1)
    pid = int(marker.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
