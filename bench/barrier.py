"""Per-step latency of the persistent-grid recurrence against the bare grid barrier.

At small batch a persistent-grid step is bound by the exchange of h_t between programs, and
the floor of that exchange is one grid barrier. This measures, on the same GPU in one run:

- bare barrier: `n` barriers of the same number of co-resident programs, on the same warps,
  doing nothing else (kernels/grid_barrier.run_bare_barriers), in microseconds per barrier;
- kernel step: the persistent-grid forward recurrence of one layer (the planner's tiles), in
  microseconds per time step (input projection excluded: it is one GEMM outside the loop);
- backward step: the backward recurrence of the same layer as the plan runs it (the
  persistent grid's on the planner's backward tiles and warps, or the split-K kernel's where
  the plan names it, `LayerPlan.split_k_bwd`; the GEMMs that recompute the pre-activations
  and form the weight gradients excluded), per time step;

and reports each step's ratio to the barriers of its own launch (design target: within 2x):
the forward's one barrier a step of its programs and warps, the backward's of its programs,
warps and count
(the split-K kernel's two-barrier form meets twice a step, as `scripts/split_k_probe.py`
counts it).
"""

from __future__ import annotations

import torch

from tritonrnn.rnn.config import GATES

from .timing import TimingConfig
from .timing import measure as time_callable

MODES, HIDDEN, BATCH = ("lstm", "gru"), (512, 768, 1024), (1, 16, 64)


def shapes(modes=MODES, hidden=HIDDEN, batch=BATCH) -> list[tuple[str, int, int]]:
    """(mode, H, B) for every combination, in that nesting order."""
    return [(m, H, B) for m in modes for H in hidden for B in batch]


SHAPES = shapes()


def _recurrence_inputs(mode: str, H: int, B: int, T: int, dtype, device):
    from tritonrnn.rnn.packing import make_pack_info

    G = GATES[mode]
    info = make_pack_info([T] * B, T, device)
    N = info.N
    g = torch.Generator(device="cpu").manual_seed(0)
    rnd = lambda *s: (torch.randn(*s, generator=g) * 0.1).to(device=device, dtype=dtype)  # noqa: E731
    lstm = mode == "lstm"
    return dict(
        cell=mode, xg=rnd(N, G * H), R=rnd(G * H, H), bR=rnd(G * H), Pw=None, h0=rnd(B, H),
        c0=rnd(B, H) if lstm else None, info=info, reverse=False,
        y=torch.empty(N, H, dtype=dtype, device=device),
        c_seq=torch.empty(N, H, dtype=dtype, device=device) if lstm else None,
        hT=torch.empty(B, H, dtype=dtype, device=device),
        cT=torch.empty(B, H, dtype=dtype, device=device) if lstm else None,
    )


def _backward_inputs(mode: str, H: int, B: int, T: int, dtype, device):
    """grid_backward's arguments for one layer (`rnn.reference.recurrence_backward`'s
    contract): random pre-activations, states and output gradients (their values do not
    change the work), zeroed outputs."""
    from tritonrnn.rnn.packing import make_pack_info
    from tritonrnn.rnn.reference import backward_preacts

    G = GATES[mode]
    info = make_pack_info([T] * B, T, device)
    N = info.N
    g = torch.Generator(device="cpu").manual_seed(1)
    rnd = lambda *s: (torch.randn(*s, generator=g) * 0.1).to(device=device, dtype=dtype)  # noqa: E731
    zeros = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
    lstm = mode == "lstm"
    wants_x, wants_h = backward_preacts(mode)
    return dict(
        cell=mode, pre_x=rnd(N, G * H) if wants_x else None,
        pre_h=rnd(N, G * H) if wants_h else None, R=rnd(G * H, H),
        Pw=None, y=rnd(N, H), h_prev=rnd(N, H), c_seq=rnd(N, H) if lstm else None,
        c_prev=rnd(N, H) if lstm else None, dy=rnd(N, H), dhT=rnd(B, H),
        dcT=rnd(B, H) if lstm else None, info=info, reverse=False, dpre_x=zeros(N, G * H),
        dpre_h=zeros(N, G * H) if mode == "gru" else None, dh0=zeros(B, H),
        dc0=zeros(B, H) if lstm else None, dh_total=None, m_seq=None,
    )


def bare_timed_out(syncs: list[torch.Tensor]) -> bool:
    """Whether any of `run_bare_barriers`' returned sync tensors has its error flag set."""
    return bool(syncs) and bool(torch.stack([s[1] for s in syncs]).any())


def measure_shape(mode: str, H: int, B: int, T: int, dtype, device, timing: TimingConfig) -> dict:
    """One row: the planner's choice, bare-barrier and per-step microseconds and their ratio.
    Each pass runs as the plan runs it: the backward on the split-K kernel where the plan
    names it (`planner.split_k_launch`: its own programs, `programs_bwd`, and one or two
    barriers a step, `split_k_bwd`), and each pass's ratio is against a bare barrier of its
    own programs and warps (`barrier_bwd_us` where they differ from the forward's)."""
    from tritonrnn.kernels import split_k
    from tritonrnn.kernels.grid_barrier import (
        BarrierTimeoutError,
        check_barriers,
        run_bare_barriers,
    )
    from tritonrnn.kernels.persistent_grid import grid_backward, grid_forward
    from tritonrnn.rnn import planner
    from tritonrnn.rnn.planner import device_properties, recurrence_choice

    props = device_properties(device)
    lp, _ = recurrence_choice(mode, H, H, 0, dtype, B, props)
    row = {"mode": mode, "H": H, "B": B, "T": T, "dtype": str(dtype).replace("torch.", ""),
           "family": lp.family, "programs": lp.pass_programs(False),
           "programs_bwd": lp.num_programs, "split_k_bwd": lp.split_k_bwd,
           "block_h": lp.block_h,
           "block_b": lp.block_b, "block_k": lp.block_k, "num_warps": lp.num_warps,
           "num_warps_bwd": lp.backward_warps, "block_h_bwd": lp.backward_block_h,
           "block_b_bwd": lp.backward_block_b, "num_stages": lp.num_stages,
           "num_stages_bwd": lp.backward_stages}
    if lp.family != "persistent_grid":
        row["note"] = f"planner picks {lp.family} for this shape: no barrier in the loop"
        return row
    tiles = dict(persistent=True, block_h=lp.block_h, block_b=lp.block_b, block_k=lp.block_k)
    fwd_kw = _recurrence_inputs(mode, H, B, T, dtype, device)
    step = time_callable(
        lambda: grid_forward(*fwd_kw.values(), **tiles, num_warps=lp.num_warps,
                             num_stages=lp.num_stages), "cuda", timing)
    bwd_kw = _backward_inputs(mode, H, B, T, dtype, device)
    split = planner.split_k_launch(lp, mode, H, B, dtype, props)
    if split is not None:
        row["programs_bwd"] = split_k.footprint(mode, H, B, dtype, split)[0]
        own = {k: v for k, v in bwd_kw.items() if k not in ("Pw", "dh_total", "m_seq")}

        def backward():
            split_k.split_k_backward(**own, units=split.units, kblock=split.kblock,
                                     btile=split.btile, one_barrier=split.one_barrier,
                                     num_warps=lp.backward_warps, persistent=True)
    else:
        bwd_tiles = {**tiles, "block_h": lp.backward_block_h, "block_b": lp.backward_block_b}

        def backward():
            grid_backward(**bwd_kw, **bwd_tiles, num_warps=lp.backward_warps,
                          num_stages=lp.backward_stages, pair_gates=lp.pair_gates)
    bwd = time_callable(backward, "cuda", timing)
    # The bare launches return their sync tensors ([counter, error flag]) instead of queueing
    # the flag: each one is kept and read once, after the timing.
    bare_syncs: list[torch.Tensor] = []

    def bare_barriers(programs: int, per_step: int, warps: int):
        return time_callable(
            lambda: bare_syncs.append(run_bare_barriers(per_step * T, programs, device,
                                                        num_warps=warps)),
            "cuda", timing)

    # Each pass's floor: barriers of its launch's programs on its warps (a barrier's bar.syncs
    # wait for every warp of the program; before 2026-11-30 the bare ones ran on 4 warps).
    row["bare_warps"] = [lp.num_warps, lp.backward_warps]
    bare = bare_barriers(row["programs"], 1, lp.num_warps)
    row["barriers_bwd"] = 1 if split is None or split.one_barrier else 2  # a step
    own_bwd = (row["programs_bwd"], row["barriers_bwd"], lp.backward_warps)
    bare_bwd = (bare_barriers(*own_bwd) if own_bwd != (row["programs"], 1, lp.num_warps)
                else bare)
    try:
        # The launches queue their barriers' error flags (deferred check): a launch whose
        # barrier timed out skipped its waits, and its time is no step's time.
        check_barriers()
    except BarrierTimeoutError as e:
        row["note"] = f"no timing: {e}".splitlines()[0]
        return row
    if bare_timed_out(bare_syncs):
        row["note"] = "no timing: a bare grid barrier timed out (programs not co-resident?)"
        return row
    row["step_us"] = step.ms * 1e3 / T
    row["bwd_step_us"] = bwd.ms * 1e3 / T
    row["barrier_us"] = bare.ms * 1e3 / T
    row["ratio"] = row["step_us"] / row["barrier_us"]
    if bare_bwd is not bare:
        row["barrier_bwd_us"] = bare_bwd.ms * 1e3 / T
    row["bwd_ratio"] = row["bwd_step_us"] / (bare_bwd.ms * 1e3 / T)
    return row


def run(T: int, dtype, timing: TimingConfig, shapes=SHAPES, on_row=None) -> list[dict]:
    """Measures every shape; `on_row(row)` is called as each one is done."""
    if not torch.cuda.is_available():
        raise ValueError("barrier: expected a CUDA GPU (a grid barrier deadlocks in the "
                         "interpreter), got none")
    device = torch.device("cuda")
    rows = []
    for mode, H, B in shapes:
        rows.append(measure_shape(mode, H, B, T, dtype, device, timing))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'mode':<5} {'H':>5} {'B':>3} {'family':<16} {'progs':>5} "
             f"{'step us':>9} {'barrier us':>10} {'ratio':>6} {'bwd us':>9} {'ratio':>6}"]
    for r in rows:
        if "step_us" in r:
            tail = f"{r['step_us']:>9.2f} {r['barrier_us']:>10.2f} {r['ratio']:>6.2f}"
            if "bwd_step_us" in r:  # rows from before 2026-11-25 have the forward only
                tail += f" {r['bwd_step_us']:>9.2f} {r['bwd_ratio']:>6.2f}"
            if r.get("split_k_bwd"):  # (its ratio against its own launch's barriers)
                from tritonrnn.kernels.split_k import FORM_NAMES

                tail += (f"  (backward split-K, {FORM_NAMES[r['split_k_bwd']]} a step, "
                         f"{r['programs_bwd']} programs: bare "
                         f"{r.get('barrier_bwd_us', r['barrier_us']):.2f} us a step)")
        else:
            tail = f"  ({r['note']})"
        lines.append(f"{r['mode']:<5} {r['H']:>5} {r['B']:>3} {r['family']:<16} "
                     f"{r['programs']:>5} {tail}")
    return "\n".join(lines)
