"""scripts/split_k_probe.py, the timing harness of the split-K backward (kernels/split_k.py,
whose own tests are tests/test_split_k.py): its correctness check runs end to end in the
interpreter (inputs -> kernel -> reference engine), its configs parse and are checked, and its
sm_90 report path records the kernel's persistent launch."""

from __future__ import annotations

import argparse

import pytest
import torch
from helpers import ROOT, load_script

PROBE = load_script("split_k_probe")


@pytest.mark.parametrize(("cell", "H", "U", "KB"), [("lstm", 32, 16, 64), ("gru", 64, 32, 64),
                                                    ("rnn_tanh", 64, 64, 64)])
def test_probe_check_runs_the_kernel_against_the_reference(cell, H, U, KB):
    err = PROBE.check(cell, H, 20, 4, U, KB, 16, torch.float32, "cpu")
    want = {"dpre_x", "dh0"} | ({"dc0"} if cell == "lstm" else set()) | (
        {"dpre_h"} if cell == "gru" else set())
    assert set(err) == want
    assert max(err.values()) < 1e-5, err


@pytest.mark.parametrize(("cell", "H", "U", "KB"), [("lstm", 32, 16, 64), ("gru", 64, 32, 48)])
def test_probe_check_runs_the_one_barrier_form_against_the_reference(cell, H, U, KB):
    err = PROBE.check(cell, H, 20, 4, U, KB, 16, torch.float32, "cpu", one_barrier=True)
    want = {"dpre_x", "dh0"} | ({"dc0"} if cell == "lstm" else set()) | (
        {"dpre_h"} if cell == "gru" else set())
    assert set(err) == want  # every output compared
    assert max(err.values()) < 1e-5, err


def test_probe_inputs_are_a_full_length_batch():
    x = PROBE.inputs("lstm", 16, 3, 5, torch.float32, "cpu")
    assert x["info"].lengths == (5, 5, 5) and x["info"].N == 15
    assert x["pre_x"].shape == (15, 64) and x["dc0"].shape == (3, 16)
    assert PROBE.inputs("rnn_relu", 16, 3, 5, torch.float32, "cpu")["pre_x"] is None


def test_probe_configs_parse_and_are_checked():
    ap = PROBE.build_parser()
    args = ap.parse_args(["--config", "1024,64,64,512,64", "--cell", "gru"])
    assert args.config == [(1024, 64, 64, 512, 64)] and args.cell == "gru"
    assert ap.parse_args([]).config is None  # the defaults: CONFIGS
    with pytest.raises(argparse.ArgumentTypeError):
        PROBE._config("1024,64,64")
    # Checked against the cell and the form: GRU's one-barrier K blocks of 3 x 64 rows have
    # no two-barrier tiling; 96 units none at all.
    assert PROBE.config_problem("gru", (1024, 16, 128, 192, 16), True) is None
    assert "kblock | G*H" in PROBE.config_problem("gru", (1024, 16, 128, 192, 16), False)
    assert "powers of two" in PROBE.config_problem("lstm", (1024, 64, 96, 512, 64), False)
    with pytest.raises(SystemExit):
        PROBE.main(["--aot", "--config", "1024,64,96,512,64"])
    from tritonrnn.rnn.planner import PRESETS

    configs = PROBE.default_configs("lstm", torch.bfloat16, PRESETS["h100"])
    assert configs == [(1024, 256, 128, 512, 128), (768, 256, 128, 512, 128),
                       (1024, 64, 64, 512, 64), (768, 64, 64, 512, 64), (1024, 16, 64, 512, 16),
                       (1024, 16, 64, 1024, 16)]
    for H, B, U, KB, BB in configs:
        assert PROBE.tiles("lstm", H, B, U, KB, BB)[0] <= 132  # co-resident on an H100
    one = PROBE.default_configs("lstm", torch.bfloat16, PRESETS["h100"], one_barrier=True)
    assert one == [(1024, 16, 256, 128, 16), (768, 16, 256, 128, 16), (1024, 32, 256, 128, 32),
                   (1024, 16, 128, 256, 16)]
    for H, B, U, KB, BB in one:
        assert PROBE.tiles("lstm", H, B, U, KB, BB, one_barrier=True)[0] <= 132
    # GRU: its K blocks are 3 gates' rows, so LSTM's extra one-barrier tile (kblock 256) is
    # left out; every config it keeps has a tiling.
    for one_barrier in (False, True):
        gru = PROBE.default_configs("gru", torch.bfloat16, PRESETS["h100"], one_barrier)
        assert gru and all(PROBE.config_problem("gru", c, one_barrier) is None for c in gru)
    assert (1024, 16, 128, 256, 16) not in PROBE.default_configs(
        "gru", torch.bfloat16, PRESETS["h100"], one_barrier=True)


def test_probe_aot_records_the_persistent_launch(monkeypatch):
    """`--aot` compiles the launch split_k_backward makes on a GPU: the recorded interpreter
    launch with the barrier on, every step and both phases (the compile itself is stubbed)."""
    seen = {}

    def fake_report(phase, call, ctx, props):
        seen.update(call=call, ctx=ctx)
        from tritonrnn.bench.aot import KernelReport

        return KernelReport(phase, call.name, list(call.grid), call.grid[0], 8, 0)

    import tritonrnn.bench.aot as aot

    monkeypatch.setattr(aot, "report_kernel", fake_report)
    rep = PROBE._aot("lstm", 32, 20, 16, 64, 16, torch.bfloat16)
    call = seen["call"]
    assert call.name == "_split_k_bwd_kernel" and call.kwargs["BARRIER"] == 1
    q_begin, q_end, do_a, do_b = call.args[-5:-1]
    assert (q_begin, q_end, do_a, do_b) == (0, 9, 1, 1)  # T = 8 steps and the dh0 step
    assert seen["ctx"].persistent and rep["programs"] == call.grid[0]
    PROBE._aot("lstm", 32, 20, 16, 64, 16, torch.bfloat16, one_barrier=True)
    call = seen["call"]
    assert call.name == "_split_k1_bwd_kernel" and call.kwargs["BARRIER"] == 1
    assert call.args[-3:-1] == (0, 9) and call.kwargs["KU"] == 16
    assert call.grid == (2 * 2 * 2,)  # 2 unit blocks x 2 K blocks x 2 batch tiles


def test_one_barrier_form_compiles_for_sm90_without_spills(tmp_path):
    """The one-barrier kernel's persistent launch at LSTM H=1024 B=16 on the rule's tiles
    (256 x 128 x 16), compiled for sm_90 by Triton's ptxas in a fresh process (no
    TRITON_INTERPRET: an interpreted process cannot compile): it fits, on mma.sync, with no
    local memory in its step loop (kernels/NOTES.md, "A split-K backward")."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "split_k_probe.py"), "--aot",
                          "--one-barrier", "--config", "1024,16,256,128,16", "--json",
                          str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["error"] is None and row["fits"] and row["mma"] == "mma", row
    assert row["profile"]["LDL"] == 0 and row["profile"]["STL"] == 0, row["profile"]
