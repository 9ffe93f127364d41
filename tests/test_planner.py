"""The planner on faked device properties: family rule, caching, constraints, tuning cache."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tritonrnn.rnn import reserve as reserve_mod
from tritonrnn.rnn.planner import (
    PRESETS,
    candidates,
    load_tuning_cache,
    plan_constraints,
    plan_for,
    store_tuning_entry,
    tuning_cache_path,
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path))


def _plan(mode="lstm", H=64, B=16, T=1024, dtype=torch.bfloat16, device="h100", **kw):
    return plan_for(rnn_mode=mode, input_size=H, num_units=H, batch=B, max_time=T, dtype=dtype,
                    device_properties=device, **kw)


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_family_rule_on_hopper(device):
    assert _plan(H=64, device=device).layer(0).family == "persistent_cta"
    assert _plan(H=768, device=device).layer(0).family == "persistent_grid"
    assert _plan(mode="gru", H=1024, device=device).layer(0).family == "persistent_grid"
    assert _plan(H=8192, device=device).layer(0).family == "stepwise"
    assert _plan(H=64, dtype=torch.float64, device=device).layer(0).family == "reference"


def test_grid_plans_are_co_resident_and_fit():
    for H in (256, 512, 768, 1024):
        lp = _plan(H=H).layer(0)
        if lp.family == "persistent_grid":
            assert lp.num_programs <= PRESETS["h100"].sm_count
            assert lp.onchip_bytes <= PRESETS["h100"].smem_per_program


def test_small_shared_memory_device_falls_back():
    tiny = dataclasses.replace(PRESETS["h100"], name="tiny", smem_per_program=4096, sm_count=4)
    lp = _plan(H=256, device=tiny).layer(0)
    assert lp.family == "stepwise"


def test_plans_are_cached_and_bucketed():
    a = _plan(B=13, T=1000)
    assert _plan(B=13, T=1000) is a
    b = _plan(B=15, T=1020)
    assert a.key == b.key and a.layers == b.layers  # same bucket: same kernel choice
    assert _plan(B=100, T=1000).key != a.key


def test_reserve_and_buffers_in_plan():
    p = _plan(H=32, B=4, T=10, num_layers=3, direction="bidirectional")
    N, D, L, H = 40, 2, 3, 32
    assert p.reserve_bytes == reserve_mod.PAYLOAD_OFFSET + 2 * N * D * (L * H + (L - 1) * H)
    assert p.peak_bytes > p.reserve_bytes
    text = p.explain()
    for word in ("reserve.c_seq", "dpre_x", "persistent_cta", "layer 2 dir 1", "peak"):
        assert word in text


def test_constraints_force_each_family():
    for family in ("persistent_cta", "persistent_grid", "stepwise", "reference"):
        with plan_constraints(family=family):
            p = _plan(H=64)
        assert p.layer(0).family == family and p.source == "constrained"
    with plan_constraints(family="stepwise", block_h=32, num_warps=8):
        lp = _plan(H=64).layer(0)
    assert (lp.block_h, lp.num_warps) == (32, 8)
    assert _plan(H=64).layer(0).family == "persistent_cta"  # restored after the block


def test_constraints_that_cannot_apply_raise():
    with plan_constraints(family="persistent_cta"), pytest.raises(
        ValueError, match=r"persistent_cta' needs \d+ bytes of shared memory for H=4096"
    ):
        _plan(H=4096)
    with plan_constraints(family="persistent_grid", block_h=16), pytest.raises(
        ValueError, match=r"needs \d+ co-resident programs.*132 SMs"
    ):
        _plan(H=8192)
    with plan_constraints(family="stepwise"), pytest.raises(ValueError, match="float64"):
        _plan(dtype=torch.float64)
    with pytest.raises(ValueError, match=r"expected keys .*got 'tile'"), plan_constraints(tile=3):
        pass
    with pytest.raises(ValueError, match=r"family expected one of.*'fast'"), plan_constraints(
        family="fast"
    ):
        pass
    with pytest.raises(ValueError, match=r"block_b expected a power of two >= 16, got 24"), \
            plan_constraints(block_b=24):
        pass


def test_tuning_cache_overrides_heuristic():
    base = _plan(H=128)
    assert base.source == "heuristic"
    choice = {"family": "stepwise", "block_b": 16, "block_h": 32, "num_warps": 8}
    store_tuning_entry(base.key, choice, 1.25, "h100")
    assert tuning_cache_path().exists()
    assert load_tuning_cache()[base.key]["ms"] == 1.25
    tuned = _plan(H=128)
    assert tuned.source == "tuned"
    assert (tuned.layer(0).family, tuned.layer(0).block_h) == ("stepwise", 32)


def test_candidates_run_on_the_device():
    p = _plan(H=256, B=16)
    cands = candidates(p)
    families = {c["family"] for c in cands}
    assert {"persistent_grid", "stepwise"} <= families
    for c in cands:
        with plan_constraints(**c):
            _plan(H=256, B=16)  # every candidate plans without error


def test_plan_for_errors():
    with pytest.raises(ValueError, match=r"device_properties: expected one of.*'a100'"):
        _plan(device="a100")
    with pytest.raises(ValueError, match=r"batch: expected an int >= 1, got 0"):
        _plan(B=0)
    with pytest.raises(TypeError, match=r"dtype: expected float16.*torch.int32"):
        _plan(dtype=torch.int32)
