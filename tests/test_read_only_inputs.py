"""The ops only read what they are handed: after a forward and its backprop, every tensor
passed in (input, states, params, lengths, output, the output gradients, the reserve) is
bit for bit what it was, and no tensor returned shares memory with one passed in (each is
overwritten with NaN before the inputs are compared). For every kernel family and engine
path, and for each batch layout: dense time-major and batch-major (the engine reads the
caller's tensors directly and writes the padded output's rows, `PackInfo.dense`), a
variable-length batch already in sorted order (the states read in place, `PackInfo.in_order`)
and an unsorted one (gathered copies).

Values are not compared here; the families' tests do that against float64 oracles."""

from __future__ import annotations

import pytest
import torch

from tritonrnn.rnn import cudnn_rnn, cudnn_rnn_backprop, params_size, plan_constraints

T, B, I = 3, 3, 4
H = 32
# (backend, constraints, layers, direction, dropout)
CASES = {
    "reference": ("reference", {}, 1, "unidirectional", 0.0),
    "cta": ("triton", dict(family="persistent_cta"), 1, "unidirectional", 0.0),
    "cta_bidir": ("triton", dict(family="persistent_cta"), 1, "bidirectional", 0.0),
    "grid": ("triton", dict(family="persistent_grid", block_h=16), 1, "unidirectional", 0.0),
    "grid_bidir": ("triton", dict(family="persistent_grid", block_h=16), 1, "bidirectional",
                   0.0),
    "split_k1": ("triton", dict(family="persistent_grid", block_h=16, split_k_bwd=1), 1,
                 "unidirectional", 0.0),
    "split_k2": ("triton", dict(family="persistent_grid", block_h=16, split_k_bwd=2), 1,
                 "unidirectional", 0.0),
    "pipeline": ("triton", dict(family="persistent_cta", pipeline_chunks=2), 2,
                 "unidirectional", 0.0),
    "dropout": ("triton", dict(family="persistent_cta"), 2, "unidirectional", 0.5),
}
LAYOUTS = {  # (lengths, time_major)
    "dense": ([T, T, T], True),
    "dense_batch_major": ([T, T, T], False),
    "in_order": ([3, 2, 2], True),
    "unsorted": ([1, 3, 2], False),
}


# Every family on the two layouts whose tensors the kernels get in place; the other two
# layouts differ only above the engine (ops.py): on the reference and one Triton family.
RUNS = ([(case, "lstm", layout) for case in CASES for layout in ("dense", "in_order")]
        + [(case, "gru", layout) for case in ("grid", "split_k1")
           for layout in ("dense", "in_order")]
        + [(case, "lstm", layout) for case in ("reference", "cta")
           for layout in ("dense_batch_major", "unsorted")])


@pytest.mark.parametrize("case, mode, layout", RUNS)
def test_inputs_are_only_read(case, mode, layout):
    backend, constraints, L, direction, p = CASES[case]
    lengths, time_major = LAYOUTS[layout]
    D = 2 if direction == "bidirectional" else 1
    lstm = mode == "lstm"
    g = torch.Generator().manual_seed(7)
    rnd = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    tb = (T, B) if time_major else (B, T)
    st = (L * D, B, H) if time_major else (B, L * D, H)
    n = params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=I,
                    direction=direction)
    x, h0, c0 = rnd(*tb, I), rnd(*st), rnd(*st) if lstm else None
    params = rnd(n) * 0.2
    lens = torch.tensor(lengths)
    kw = dict(rnn_mode=mode, direction=direction, dropout=p, seed=3, seed2=4,
              time_major=time_major, backend=backend)
    with plan_constraints(**constraints):
        out = cudnn_rnn(x, h0, c0, params, lens, is_training=True, **kw)
        dy, dh, dc = rnd(*out.output.shape), rnd(*st), rnd(*st) if lstm else None
        handed = [x, h0, c0, params, lens, out.output, out.output_h,
                  out.output_c if lstm else None, dy, dh, dc, out.reserve_space,
                  out.host_reserved]
        before = [t.clone() if t is not None else None for t in handed]
        grads = cudnn_rnn_backprop(x, h0, c0, params, lens, out.output, out.output_h,
                                   out.output_c if lstm else None, dy, dh, dc,
                                   out.reserve_space, out.host_reserved, **kw)
    for t in grads:
        if t.is_floating_point():
            t.fill_(float("nan"))
    for i, (now, then) in enumerate(zip(handed, before, strict=True)):
        if now is not None:
            assert torch.equal(now, then), f"tensor {i} handed to the ops was changed"
    # The forward's own outputs do not share memory with its inputs either.
    out.output.fill_(float("nan"))
    out.output_h.fill_(float("nan"))
    for i, (now, then) in enumerate(zip(handed[:5], before[:5], strict=True)):
        if now is not None:
            assert torch.equal(now, then), f"input {i} shares memory with an output"
