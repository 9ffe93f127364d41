"""tritonrnn.bench: the `tritonrnn` command (bench, check, tune, plan, aot, barrier) and its
harness.

Modules: cli (argument parsing and the six commands), presets (shapes, named sweeps and
length distributions), oracle (torch.nn <-> flat params, the float64 oracle, tolerances),
runners (tritonrnn, torch.nn/cuDNN and FlashRNN behind one interface), harness (timing,
correctness and the JSON report), roofline (FLOP/byte formulas and measured ceilings), timing
(do_bench / CPU loop), plot (PNG), table (report tables), progress (bars), check, tune, aot
(ahead-of-time compiles), barrier (per-step latency against a bare grid barrier).
"""
