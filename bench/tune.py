"""`tritonrnn tune`: times the planner's candidate choices and keeps the best per plan key.

For each shape the planner gives a Plan (its key buckets T and B, so one entry serves every
nearby length); `candidates(plan)` lists the choices that can run on the device. Each choice
is forced with `plan_constraints`, checked once against the float64 oracle (a choice that
computes wrong numbers is never kept) and timed on a forward+backward step. The best one is
written with `store_tuning_entry` into the persistent cache that `plan_for` reads.

Screening: the planner's own choice is timed first; every later choice runs once more after
its checked run, and one whose single run already takes more than SCREEN_FACTOR times the
best median so far is recorded as screened out (its one-run time kept) instead of being
timed in full. At the anchor on an H100 the stepwise choices took 8 to 15x the resident
grid's 12.2 ms (and the streamed grid ones 1.3 to 2.8x): timing them in full took most of a
run that did not finish in 110 s.

Order: the planner's own choice first, then the others by how far they are from it
(`by_promise`: the choices that change one of its tiles or warps, then two, ...; another
family counts as three changes), so that a run cut short, or limited with
--max-candidates N, has timed the neighbourhood of the planner's choice first. A key has up
to a few hundred candidates (LSTM H=1024 B=64 on an H100: 300, 64 of them the split-K
backward beside a persistent-grid forward; 236 before those), each compiled before it runs.

Resumable: every measured choice is recorded at once in `tuning.partial.json` next to the
cache; an interrupted run picks up where it stopped. Keys already in the cache are skipped
unless --force. With --max-candidates N, a key's first N candidates (those of earlier runs
included) are measured and the best of them stored, marked as partial
(`planner.tuning_complete`): the planner uses it, and a later run with a larger N, or none,
carries on from the measurements kept in the partial file.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .presets import BenchShape
from .timing import TimingConfig, measure, one_run_ms


def partial_path() -> Path:
    from tritonrnn.rnn.planner import tuning_cache_path

    return tuning_cache_path().with_name("tuning.partial.json")


def _partial_key(key: str) -> str:
    """A plan key's record in the partial file: its unfinished measurements are resumed only
    by the Triton release, kernels and kernel switches that took them (as the cache's entries,
    `planner.tuning_entry`)."""
    import triton

    from tritonrnn.rnn.planner import kernel_variants, kernels_fingerprint

    variants = kernel_variants()
    switches = "".join(f"|{k}={v}" for k, v in sorted(variants.items()))
    return f"{key}|triton {triton.__version__}|kernels {kernels_fingerprint()}{switches}"


def _read_partial(path: Path) -> dict:
    """The partial file's records ({} without one). A file that is not a JSON object
    raises ValueError naming it: the records are written back whole, and rewriting a
    damaged file would drop every other key's resumable measurements."""
    from tritonrnn.rnn.planner import read_json_object

    data = read_json_object(path, f"tune's partial file {path}: expected a JSON object",
                            "move it aside (or delete it) to start afresh; it is left as it is")
    return {} if data is None else data


def _write_partial(path: Path, data: dict) -> None:
    from tritonrnn.rnn.planner import write_json_atomic

    write_json_atomic(path, data)


def _set_partial(path: Path, pkey: str, record: dict | None) -> None:
    """The partial file's record for `pkey` updated with `record`'s measurements (None:
    removed), the other keys' records kept: one read-modify-write under the tuning cache's
    lock. The key's record takes the union of the file's and `record`'s measurements
    (`record`'s where both have one), so two runs of one key (concurrent `tune` runs on two
    GPUs of a model) keep each other's."""
    from tritonrnn.rnn.planner import tuning_cache_lock

    with tuning_cache_lock():
        partial = _read_partial(path)
        if record is None:
            partial.pop(pkey, None)
        else:
            partial[pkey] = {**_measurements(partial.get(pkey)), **record}
        _write_partial(path, partial)


def _measurements(record: object) -> dict:
    """A partial-file record ({choice id: measurement}) with what it holds that tune_key can
    use: a measurement is {"ms": float | None} with an optional "screened_ms" (a number) or
    "error" (a string). Anything else (an edited or damaged file) is dropped, so that choice
    is measured again rather than ending the run."""
    if not isinstance(record, dict):
        return {}

    def number(v: object) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    return {cid: m for cid, m in record.items()
            if isinstance(cid, str) and isinstance(m, dict) and "ms" in m
            and (m["ms"] is None or number(m["ms"]))
            and ("screened_ms" not in m or number(m["screened_ms"]))
            and ("error" not in m or isinstance(m["error"], str))}


def choice_id(choice: dict) -> str:
    return json.dumps(choice, sort_keys=True)


# A choice whose one run takes more than this many times the best median so far is not timed
# in full (a run-to-run spread is far below 2x; a choice that slow cannot become the best).
SCREEN_FACTOR = 2.0


@dataclass(frozen=True)
class Screened:
    """What a measurer returns for a choice it stopped after one run: `ms` (that run)
    exceeded the bound it was given."""

    ms: float


def _full_times(done: dict) -> dict[str, float]:
    """choice id -> ms of the choices timed in full (screened and failed ones have ms None)."""
    return {cid: r["ms"] for cid, r in done.items()
            if r.get("ms") is not None and math.isfinite(r["ms"])}


def tune_key(
    key: str,
    choices: list[dict],
    measure_choice: Callable[[dict, float | None], float | Screened],
    device_name: str,
    *,
    force: bool = False,
    tick: Callable[[str], None] | None = None,
    limit: int | None = None,
) -> dict:
    """Times `choices` for one plan key and stores the best (the machinery, device-agnostic).
    limit: measure at most the first `limit` choices (measurements resumed from earlier runs
    count); the best of them is stored as partial and the partial record kept.

    measure_choice(choice, bound) returns milliseconds, or Screened(ms) when one run already
    took more than `bound` ms (SCREEN_FACTOR x the best so far; None for the first choice),
    or raises: any Exception records the choice as failed with its reason (a compile error,
    out of resources, wrong numbers), while KeyboardInterrupt stops the run with every
    finished measurement kept. Returns a summary dict with status 'cached' | 'tuned' |
    'failed'."""
    from tritonrnn.rnn.planner import store_tuning_entry, tuning_complete, tuning_entry

    tick = tick or (lambda _msg: None)
    cached = tuning_entry(key)
    if cached and not force and tuning_complete(cached):
        for _ in choices:
            tick(f"{key}: cached")
        return {"key": key, "status": "cached", "best": cached}
    path = partial_path()
    partial = _read_partial(path)
    pkey = _partial_key(key)
    # A run carries on from the timed and screened measurements of earlier ones; a choice
    # that failed is measured again (its cause may be gone: another process holding the
    # GPU's memory, a barrier timeout on a shared GPU).
    done: dict = {cid: m for cid, m in _measurements(partial.get(pkey)).items()
                  if "error" not in m} if not force else {}
    for i, choice in enumerate(choices):
        cid = choice_id(choice)
        if cid in done:
            tick(f"{cid}: resumed")
            continue
        if limit is not None and i >= limit:
            tick(f"{cid}: past --max-candidates")
            continue
        tick(cid)
        best = min(_full_times(done).values(), default=None)
        try:
            got = measure_choice(choice, None if best is None else SCREEN_FACTOR * best)
        except Exception as e:  # a failing candidate is a data point, not the end
            done[cid] = {"ms": None, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
        else:
            done[cid] = ({"ms": None, "screened_ms": got.ms} if isinstance(got, Screened)
                         else {"ms": float(got)})
        _set_partial(path, pkey, done)
    ids = {choice_id(c) for c in choices}
    measured = sum(1 for cid in done if cid in ids)
    timed = {cid: ms for cid, ms in _full_times(done).items() if cid in ids}
    summary = {"key": key, "candidates": len(choices), "measured": done}
    if not timed:
        summary["status"] = "failed"
        return summary
    best_id = min(timed, key=timed.get)
    best = json.loads(best_id)
    if not store_tuning_entry(key, best, timed[best_id], device_name, measured, len(ids)):
        summary["kept"] = True  # the cache's entry for the key covers more candidates
    if measured >= len(ids):  # complete: the partial record has served
        _set_partial(path, pkey, None)
    else:
        summary["partial"] = measured
    summary.update(status="tuned", best={**best, "ms": timed[best_id]})
    return summary


def shape_measurer(shape: BenchShape, device: torch.device, timing: TimingConfig,
                   seed: int = 0) -> Callable[[dict], float]:
    """measure_choice for a shape: forced choice -> oracle check -> forward+backward time."""
    from tritonrnn.rnn.planner import plan_constraints
    from tritonrnn.rnn.triton_backend import StepwiseFallbackWarning

    from . import runners

    case = runners.build_case(shape, device, seed)
    runners.compute_oracle(case)

    def measure_choice(choice: dict, bound: float | None = None) -> float | Screened:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result = _measure(choice, bound)
        for w in seen:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        fallback = [str(w.message) for w in seen
                    if issubclass(w.category, StepwiseFallbackWarning)]
        if fallback:
            # The time is the stepwise kernels', not the choice's: no result for the choice.
            raise RuntimeError(f"its persistent launch failed and ran stepwise ({fallback[0]})")
        return result

    def _measure(choice: dict, bound: float | None) -> float | Screened:
        with plan_constraints(**choice):
            runner = runners.tritonrnn_runner(case, "triton")
        # Each choice answers for its own launches' barriers (deferred flags), here and
        # after its timed runs, so that none is left for the next choice to fail on.
        _check_barriers(device)
        if not runner.correctness["ok"]:
            raise ValueError(
                f"outside tolerance (max scaled error {runner.correctness['max_scaled_error']:.2e})"
            )
        step = runner.passes["fwdbwd"]

        def fn():
            with plan_constraints(**choice):
                return step()

        fn()  # compiled and warm (the checked run above used the same kernels)
        if bound is not None:
            one = one_run_ms(fn, device.type)
            if one > bound:
                _check_barriers(device)
                return Screened(one)
        ms = measure(fn, device.type, timing).ms
        # A timed launch whose grid barrier timed out skipped its waits: a fast time that is
        # no result, and must not become the cached best (BarrierTimeoutError: failed).
        _check_barriers(device)
        return ms

    return measure_choice


def _check_barriers(device: torch.device) -> None:
    if device.type == "cuda":
        from tritonrnn.kernels.grid_barrier import check_barriers

        check_barriers()


def own_choice(plan) -> dict:
    """The plan's choice for its first layer, as `candidates` spells a choice."""
    return plan.layer(0).choice()


def choice_distance(choice: dict, own: dict) -> int:
    """How far a choice is from the plan's own: the tiles and warps it changes, another
    family counting as three changes."""
    keys = (set(choice) | set(own)) - {"family"}
    return (3 * (choice.get("family") != own.get("family"))
            + sum(choice.get(k) != own.get(k) for k in keys))


def by_promise(plan, choices: list[dict]) -> list[dict]:
    """`choices` in the order tune times them: the plan's own choice first (it sets the
    screening bound early, and usually it is close to the best), then by `choice_distance`
    from it, ties in `choices`' order."""
    own = own_choice(plan)
    return sorted(choices, key=lambda c: choice_distance(c, own))


def tune_shapes(shapes: list[BenchShape], device: torch.device, timing: TimingConfig, *,
                force: bool = False, progress: bool = True, seed: int = 0,
                limit: int | None = None) -> list[dict]:
    """Tunes every shape's plan key on `device` (see the module docstring); limit: at most
    that many candidates per key (`tune_key`)."""
    from tritonrnn.rnn.planner import (
        candidates,
        device_properties,
        plan_for,
        stored_entries,
        tuning_cache_path,
    )

    from .progress import progress_bar

    # The cache and the partial file read as a store reads them, before anything is timed:
    # a damaged file fails here (ValueError naming it), not at the first store after a
    # key's candidates ran.
    stored_entries(tuning_cache_path())
    _read_partial(partial_path())
    # Planned for the device that times them: the plan key (and the candidates) of the
    # current device would file the interpreter's timings of `--device cpu` on a GPU host
    # under the GPU's key.
    props = device_properties(device)
    plans = []
    for s in shapes:
        plan = plan_for(rnn_mode=s.mode, input_size=s.input, num_units=s.hidden,
                        num_layers=s.layers, direction=s.direction, num_proj=s.proj,
                        batch=s.batch, max_time=s.time, dtype=s.torch_dtype,
                        device_properties=props)
        plans.append((s, plan, by_promise(plan, candidates(plan))))
    total = sum(len(c) for _, _, c in plans)
    name = props.name
    out = []
    with progress_bar(total, "tritonrnn tune", progress) as bar:

        def tick(msg: str) -> None:
            bar.set_postfix_str(msg[:60], refresh=False)
            bar.update(1)

        seen: set[str] = set()
        for s, plan, choices in plans:
            if plan.key in seen:  # two shapes in one bucket share a key: tune it once
                for _ in choices:
                    tick(f"{plan.key}: same key")
                continue
            seen.add(plan.key)
            cached = not force and plan.key in _cached_keys()
            measurer = (lambda _c, _b: math.nan) if cached else shape_measurer(s, device,
                                                                               timing, seed)
            summary = tune_key(plan.key, choices, measurer, name, force=force, tick=tick,
                               limit=limit)
            summary["label"] = s.label
            out.append(summary)
    return out


def _cached_keys() -> set[str]:
    """The keys whose tuning is complete (a partial entry's key is carried on)."""
    from tritonrnn.rnn.planner import load_tuning_cache, tuning_complete, tuning_entry

    return {key for key in load_tuning_cache()
            if (e := tuning_entry(key)) and tuning_complete(e)}


def format_tune(summaries: list[dict], cache: Path) -> str:
    lines = [f"tuning cache: {cache}"]
    for s in summaries:
        if s["status"] == "cached":
            lines.append(f"  {s['label']}: cached {s['best']} (use --force to retune)")
        elif s["status"] == "tuned":
            bad = sum(1 for r in s["measured"].values() if r.get("error"))
            out = sum(1 for r in s["measured"].values() if "screened_ms" in r)
            notes = []
            if bad:
                notes.append(f"{bad} failed")
            if out:
                notes.append(f"{out} screened out after one run (> {SCREEN_FACTOR:g}x the best)")
            if s.get("kept"):
                notes.append("not stored: the cache's entry, from another run, covers more "
                             "candidates")
            of = (f"the first {s['partial']} of {s['candidates']} candidates (partial: a run "
                  f"with a larger --max-candidates carries on)" if "partial" in s
                  else f"{s['candidates']} candidates")
            lines.append(f"  {s['label']}: best {s['best']} of {of}"
                         + (f" ({', '.join(notes)})" if notes else ""))
        else:
            reasons = "; ".join(sorted({str(r.get("error")) for r in s["measured"].values()}))
            lines.append(f"  {s['label']}: FAILED, no candidate ran ({reasons})")
        lines.append(f"    key {s['key']}")
    return "\n".join(lines)
