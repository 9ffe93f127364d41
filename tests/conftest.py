"""Shared pytest fixtures: seeding, device selection, GPU marking and the skipping of the
compile-cost tests under another Triton than the one they assert for."""

from __future__ import annotations

import dataclasses
import inspect
import os
import threading

import pytest
import torch

# Tests run the Triton kernels on the CPU through the interpreter unless a GPU is present.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Fresh engine/reserve buffers start as NaN, so a missing kernel write cannot pass (set, not
# defaulted: an inherited TRITONRNN_POISON=0 would turn it off for the whole suite).
os.environ["TRITONRNN_POISON"] = "1"


class _NothingToRestore:
    def restore(self) -> None:
        pass


def _patch_triton_language_once_per_launch() -> None:
    """Triton's interpreter patches triton.language (every builtin, through inspect.getmembers)
    when a launch starts, and again on every call of a nested @triton.jit function, where the
    patches are already live and the new scope is never restored: a third of the interpreted
    kernels' time here (cProfile of a bidirectional end-to-end test: 63 of 190 s). Inside a
    launch, a nested call whose language modules are already patched skips the repeat: the
    launch's modules, and those a nested call patched (Triton's standard-library helpers,
    tl.sum or tl.sigmoid, bind triton.language.core where the kernels bind triton.language).
    The launch's own patching and restoring are Triton's. Tests only: the library leaves
    Triton alone. Triton versions without these internals run unchanged."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    patch_lang = getattr(interpreter, "_patch_lang", None)
    launcher = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or launcher is None or getattr(patch_lang, "_once", False):
        return
    launch = launcher.__call__
    state = threading.local()
    found: dict[int, frozenset] = {}  # id(module globals) -> the language modules they bind

    def langs(fn) -> frozenset:
        key = id(fn.__globals__)  # a module's globals live as long as the module
        if key not in found:
            found[key] = frozenset(id(v) for v in fn.__globals__.values()
                                   if inspect.ismodule(v) and v in (tl, tl.core))
        return found[key]

    def patch_once(fn):
        live = getattr(state, "live", None)
        mods = langs(fn)
        if live is not None and mods <= live:
            return _NothingToRestore()
        scope = patch_lang(fn)
        if getattr(state, "launching", False):
            # The launch's own patches last until it ends; a nested call's are never restored.
            state.live = mods if live is None else live | mods
        return scope

    def launch_once(self, *args, **kwargs):
        state.launching, state.live = True, None
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.launching, state.live = False, None

    patch_once._once = True
    interpreter._patch_lang = patch_once
    launcher.__call__ = launch_once


def _drop_discarded_overflow_checks() -> None:
    """Triton's interpreter builds an int32 overflow check around every integer add, sub and
    mul of an interpreted kernel (`sanitize_overflow`, on by default) and then drops it: its
    `device_assert` does nothing unless the options' `debug` is on (off by default, in 3.4 to
    3.9 alike), so the check costs seven interpreted operations and checks nothing: 37% of an
    end-to-end test's time here (cProfile of a bidirectional end-to-end test: 44 of 117 s).
    Without `debug`, the tests skip building it; tests/test_harness.py checks the premise (no
    overflow raises without `debug`, one does with it). Tests only: the library leaves
    Triton's options alone."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if (options is not None and getattr(options, "sanitize_overflow", False)
            and not getattr(options, "debug", True)):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_triton_language_once_per_launch()
    _drop_discarded_overflow_checks()


def pytest_collection_modifyitems(config, items):
    import triton
    from helpers import CALIBRATION_TRITON, compile_costs_apply

    if not compile_costs_apply(triton.__version__):
        skip_costs = pytest.mark.skip(
            reason=f"compile costs are asserted for Triton {CALIBRATION_TRITON} "
                   f"(scripts/test_triton36.sh), this is {triton.__version__}")
        for item in items:
            if "compiler_specific" in item.keywords:
                item.add_marker(skip_costs)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _own_tuning_cache(tmp_path_factory, monkeypatch):
    """Each test plans with an empty tuning cache of its own (tests that write one set their
    own directory over this): entries in ~/.cache/tritonrnn, or in a GPU session's cache
    (scripts/gpu_session.sh), would change which family an unconstrained test runs."""
    monkeypatch.setenv("TRITONRNN_CACHE_DIR", str(tmp_path_factory.mktemp("tuning")))


@pytest.fixture(autouse=True)
def _no_failed_barrier():
    """On a GPU, every test ends by checking that no persistent-grid barrier timed out (the
    launches report failures asynchronously, kernels/grid_barrier.py)."""
    yield
    if torch.cuda.is_available():
        from tritonrnn.kernels.grid_barrier import check_barriers

        check_barriers()


def _fresh_plans() -> None:
    """Empties the planner's caches (plans and heuristic choices), whose keys hold the
    kernel switches but not a swapped rule (a function replaced in-process)."""
    from tritonrnn.rnn import planner

    planner.clear_plan_caches()


def _switched(monkeypatch, attr: str, env: str, on: bool = True):
    """Turns a kernels.grid_tiles switch read at import (`attr`, env var `env`) on or
    off, with the planner's caches emptied before and after (their keys hold the switch
    since `planner._switch_state`; emptied all the same, so that no test's plans depend on
    what earlier tests cached)."""
    from tritonrnn.kernels import grid_tiles

    monkeypatch.setattr(grid_tiles, attr, on)
    # The processes that compile for sm_90 (bench.aot) import the kernels afresh.
    monkeypatch.setenv(env, "on" if on else "off")
    _fresh_plans()
    yield
    _fresh_plans()


@pytest.fixture
def no_split_k_rule(monkeypatch):
    """The heuristic's plans with the family's own backward everywhere (the planner's
    `_SPLIT_K_RULE` emptied, its caches emptied before and after): for tests of that
    backward at the shapes where the rule runs the split-K kernel instead."""
    from tritonrnn.rnn import planner

    monkeypatch.setattr(planner, "_SPLIT_K_RULE", {})
    _fresh_plans()
    yield
    _fresh_plans()


@pytest.fixture
def paired_gates_wide(monkeypatch):
    """The grid backward's gate operands loaded ahead on 16 x 32 tiles too
    (`kernels.grid_tiles._BWD_PAIRED_GATES_WIDE`, off by default)."""
    yield from _switched(monkeypatch, "_BWD_PAIRED_GATES_WIDE",
                         "TRITONRNN_BWD_PAIRED_GATES_WIDE")


@pytest.fixture
def gates_apart(monkeypatch):
    """The grid backward's gate operands each loaded where its products use them
    (`kernels.grid_tiles._BWD_PAIRED_GATES` off; PAIRG is the default)."""
    yield from _switched(monkeypatch, "_BWD_PAIRED_GATES", "TRITONRNN_BWD_PAIRED_GATES",
                         on=False)
