"""The planner's co-residency rules at their boundary. A grid is co-resident when
its programs are <= the SMs (`rnn/planner.py` docstring: "programs <= SMs"), so a device with
exactly a plan's programs must keep that plan; one SM fewer must not."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tritonrnn.rnn.planner import PRESETS, plan_constraints, plan_for


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))


def _layer(mode, H, B, props, direction="unidirectional"):
    return plan_for(rnn_mode=mode, input_size=H, num_units=H, batch=B, max_time=1024,
                    dtype=torch.bfloat16, device_properties=props,
                    direction=direction).layer(0)


def _tiles(lp):
    return (lp.family, lp.block_h, lp.block_b, lp.block_k, lp.num_programs)


def _with_sms(n):
    return dataclasses.replace(PRESETS["h100"], name=f"{n}-SM h100", sm_count=n)


# (mode, H, B, direction): MMA-tile grids (the anchor, GRU H=1024, a 16 x 32 tile), the
# vector tiles (B = 1) and a bidirectional pair launch (both directions' programs counted).
CASES = [
    ("lstm", 768, 16, "unidirectional"),
    ("gru", 1024, 16, "unidirectional"),
    ("lstm", 1024, 64, "unidirectional"),
    ("lstm", 512, 1, "unidirectional"),
    ("lstm", 512, 16, "bidirectional"),
]


@pytest.mark.parametrize("mode,H,B,direction", CASES)
def test_a_device_with_exactly_the_plans_programs_keeps_the_plan(mode, H, B, direction):
    lp = _layer(mode, H, B, PRESETS["h100"], direction)
    assert lp.family == "persistent_grid"
    exact = _layer(mode, H, B, _with_sms(lp.num_programs), direction)
    assert _tiles(exact) == _tiles(lp)
    fewer = _layer(mode, H, B, _with_sms(lp.num_programs - 1), direction)
    assert fewer.num_programs <= lp.num_programs - 1 or fewer.family != "persistent_grid"


def test_forced_grid_tiles_run_on_exactly_their_programs():
    lp = _layer("lstm", 768, 16, PRESETS["h100"])
    with plan_constraints(family="persistent_grid", block_h=16, block_b=16):
        forced = _layer("lstm", 768, 16, _with_sms(lp.num_programs))
    assert (forced.block_h, forced.block_b, forced.num_programs) == (16, 16, lp.num_programs)
    with plan_constraints(family="persistent_grid", block_h=16, block_b=16), \
            pytest.raises(ValueError, match="co-resident programs"):
        _layer("lstm", 768, 16, _with_sms(lp.num_programs - 1))


@pytest.mark.parametrize("mode,H", [("lstm", 64), ("gru", 96), ("rnn_tanh", 128)])
def test_cta_whose_shared_memory_equals_the_device_budget_fits(mode, H):
    """`_cta_fits`: the persistent CTA's weights fit when they need exactly the device's
    shared memory per program (<=), and not with one byte less."""
    from tritonrnn.kernels.persistent_cta import cta_onchip_parts

    assert _layer(mode, H, 16, PRESETS["h100"]).family == "persistent_cta"
    need = cta_onchip_parts(mode, H, H, 0, torch.bfloat16, 16).smem
    exact = dataclasses.replace(PRESETS["h100"], name="exact smem", smem_per_program=need)
    assert _layer(mode, H, 16, exact).family == "persistent_cta"
    short = dataclasses.replace(PRESETS["h100"], name="short smem", smem_per_program=need - 1)
    assert _layer(mode, H, 16, short).family != "persistent_cta"
