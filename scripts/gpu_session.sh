#!/usr/bin/env bash
# Batched runs on a lent GPU machine (torch and Triton preinstalled, no package registry):
# install the project, then one stage per call of the device tool.
# A session has 15 device minutes, the machine's start (1 to 2 minutes) included; a start
# took about 30 s, transfers included, all four times on 2026-11-26 (one call, once, found
# its machine dead: 86 s lost, then a fresh start).
# 2026-11-29 (H200): tests, splitk, all and decide (its box cut after 19 rows) ran on commit
# afb44c0 (bench/results/README.md). The split-K forms won in the layer at LSTM H=1024 B=16
# (one barrier, 0.93x), LSTM H=1024 B=64 / 256 (0.98x) and GRU H=1536 B=16 (0.95x): the
# planner runs them there since 2026-11-30 (`_SPLIT_K_RULE`; not at B=256, whose sm_90
# compile spills; the layer pipeline counts each pass's programs apart since, so the
# forward keeps its layers in flight).
# Next session, in this order (give the machine back after the last call):
#   1. `tests` (timeout_s 230): the GPU-marked tests, with the split-K rule's plans in a
#      pipelined stack (test_gpu_split_k_rule_pipelines_the_forward_alone) and the
#      pair-barrier fix of 2026-11-29; since the ninth session of 2026-11-30 a
#      StepwiseFallbackWarning fails a test (pyproject.toml: a persistent launch that fell
#      back stepwise passed before), and the deferred barrier check's bookkeeping is tagged
#      (test_check_flags_tags_a_failure_of_its_queuing_as_after_the_launch);
#   2. `confirm` (timeout_s 470): the grid sweep against cuDNN with the rule, the rule
#      against the grid's own backward as one plan (`nosplitk`), the buckets between
#      (LSTM H=1024 B=32 / 128, GRU H=1536 B=32), LSTM H=1024 B=256's split-K a second
#      time, then the older confirm rows; `check`.
#   Then `all` (timeout_s 490: its `barrier` step times the rule's split-K backwards against
#   bare barriers of their own programs) and `decide`'s rows after its cut, in a later
#   session; and
#   the layer pipeline, never timed on a GPU (TRITONRNN_PIPELINE stays opt-in until it is):
#   `grid`'s last two steps (the 2-layer stack without and with it).
# The order below is the one the 2026-11-29 runs followed:
#   1. `tests` (timeout_s 230): the GPU-marked tests; never run on a GPU yet among them:
#      the split-K backward's (test_gpu_split_k_backward, ..._in_the_layer), the
#      first-chunk hoist's (test_gpu_first_chunk_hoisted), NaN propagation, the layout's
#      copy without a sync, the module's single read of CUDA lengths.
#   2. `splitk` (timeout_s 500): the split-K backward (kernels/split_k.py, off by default:
#      a third of the streamed grid's L2 bytes per step at LSTM H=1024 B=256, a quarter of
#      the resident grid's at B=64 and B=16, for a second grid barrier; or one barrier with
#      each K block's cells run by all its programs, B <= 32) against the plan's backward in
#      the layer, then cuDNN's backward, then the kernel alone in both forms. It aims at the
#      largest gaps of issue 5 (LSTM B=256 backward 0.73x cuDNN-graph, B=64 H >= 768). If a
#      form wins, a planner rule for it needs `tests` and `all` in a later session.
#   Those two take 730 s of the 900 with the start: nothing else fits after them. A session
#   whose `tests` fails early (a broken install) runs `DECIDE_SECONDS=240 bash
#   scripts/gpu_session.sh decide` (timeout_s 270) instead of `splitk`: the untimed planner
#   rules (the backward's own tiles against the forward's, `samebwd`; the first resident
#   chunk hoisted against `nohoist`; the streamed stages against Triton's 3, `st3`, and 8,
#   `st8`; `bw4`, `fw4`, `bk0`), then `barrier` (timeout_s 230).
# Since the last timed sweep (`all`: the grid and targets presets against cuDNN, the bare
# barrier, check; 2026-11-27) the planner's rules changed the plans at B >= 32 (the 16 x 32
# forward on 8 warps, `_split_k_on_8`; resident tiles past 1024 elements streamed,
# `_RESIDENT_TILE`; the backward's own 32 x 16 tiles at B = 64, `_taller_backward`; the
# streamed stages, `_stream_stages`, 904 of the 3960 H100 / H200 plans): `all` (timeout_s
# 490) re-times issue 5's evidence with them, the session after, or this one where `splitk`
# fails early.
# A change that `decide` motivates needs `tests` and `all` (timeout_s 490)
# in the session after (on 2026-11-27 `tests` took 169 s, `all` 269, `decide` 243). Later
# `phases` (timeout_s 330): where a step's
# time goes (on 2026-11-27 the recurrent product was half a forward step; `noload` prices
# h's read alone since, its operand kept loop-variant) and
# `profile` (timeout_s 450): Nsight Compute on the anchor and on LSTM H=1024 B=64
# (scripts/gpu_profile.sh). The other stages are the sweeps and
# ablation sets for later sessions (the layer pipeline is in `grid`, tune in `tune`).
# What a stage writes goes to $WORK/<stage> (default /tmp/tritonrnn-gpu) and, after each step,
# into one archive, $OUT/<stage>.tgz (the device tool brings back at most 8 files; a stage cut
# at its limit still brings back what its finished steps wrote). Unpack it here with
#   tar xzf /work/.device/.../all.tgz -C bench/results
# Without $OUT (run by hand) everything goes to bench/results. A stage exits 1 when one of
# its steps (a time-boxed command, an ablation, a pytest run, a profile) did not end with
# rc 0, and names those steps on stderr; the finished steps' files are packed either way.
# The warm-up compiles that run in the background (`confirm`, `splitk`, `all`) are not
# counted: they only fill the Triton cache, and a kernel that does not compile fails the
# step that runs it.
# The ablation sets that change the grid's backward (and `splitk`'s rows at the rule's
# shapes) run it with `nosplitk` since 2026-11-30: at LSTM H=1024 B=16 / 64 and GRU H=1536
# B=16 the planner's plan runs the split-K backward, which those variants leave alone.
#   bash scripts/gpu_session.sh all       the evidence of issues 5 and 6 in one call, each step
#                                         time-boxed: the sweeps' kernels compiled ahead in
#                                         parallel (warm), the grid and targets sweeps against
#                                         cuDNN, the bare barrier, check (460 s in all)
#   bash scripts/gpu_session.sh tests     GPU-marked tests (kernels on CUDA tensors), cut at
#                                         200 s, the persistent-grid family's first; the log
#                                         names each test as it finishes
#   bash scripts/gpu_session.sh decide    the untimed planner rules, one decision after another
#                                         (step_ablation.DECISIONS), cut at 540 s
#   bash scripts/gpu_session.sh confirm   the grid sweep against cuDNN, then the rows that check
#                                         a new rule where `decide` did not time it
#                                         (step_ablation.DECISIONS["confirm"]: the split-K
#                                         rule first), then check
#   bash scripts/gpu_session.sh barrier   the grid sweep's kernels compiled ahead, then
#                                         `tritonrnn barrier` (its 18 shapes), cut at 195 s
#   bash scripts/gpu_session.sh phases    where a step's time goes with the current kernels,
#                                         forward step and whole layer (fwd, bwd): the
#                                         exchange operand's L2 trip (noload), the product
#                                         (nodot,nobdot), the barrier (nowait,noarrive);
#                                         anchor, LSTM H=1024 B=16, a vector tile (B = 1)
#   bash scripts/gpu_session.sh bench     presets anchor, small-batch, gru, fp16 vs cuDNN + barrier
#   bash scripts/gpu_session.sh bench2    presets large-batch, varlen vs cuDNN
#   bash scripts/gpu_session.sh grid      preset grid (issue 5's B x H sweep), pipeline, stack
#   bash scripts/gpu_session.sh tune      tritonrnn tune on the anchor shape, then anchor again
#   bash scripts/gpu_session.sh ablation  scripts/step_ablation.py (where a grid step's time goes)
#   bash scripts/gpu_session.sh wide      the B=64 tiles (16 x 32) with and without the 8-warp
#                                         backward (bw4) and the 512 + 512 reduction (chunk1024)
#   bash scripts/gpu_session.sh large     B=256 (streamed weights) with and without the
#                                         transposed wgmma loops (noswap) and joint gates
#                                         (nojoin); B=64 resident against streamed 16 x 64 tiles
#   bash scripts/gpu_session.sh warps     16 x 16 tiles (B = 16): the plan's 8 warps against
#                                         4 (w4 both passes, fw4 the forward): 8 warps halve
#                                         each warp's MMAs (anchor forward 96 -> 48 mma.sync,
#                                         696 -> 483 instructions, Triton 3.6)
#   bash scripts/gpu_session.sh hoist     resident weights held in registers
#                                         (HOIST; variants hoist / hoistf / nohoist) at the
#                                         planner's warps and at 8: anchor 8 warps ldmatrix
#                                         per warp and step 48 -> 24 in both passes; LSTM
#                                         H=256 (the planner's rule hoists it) 32 -> 16
#   bash scripts/gpu_session.sh vector    B = 1: vector tiles (FMA, weights in registers)
#                                         against the 16-wide MMA tiles (mma1), step and layer
#   bash scripts/gpu_session.sh spills    GRU H=1536 B=1, 16, whose 4-warp backward spilled
#                                         in the step loop (12 local loads per step): the
#                                         plan's 8 backward warps since against 4 (bw4) and
#                                         one MMA chain (chains1), LSTM H=768 B=16 as the
#                                         control;
#                                         LSTM / GRU H=512 B=256 (16 x 64 tiles) resident
#                                         in 256 + 256 chunks against one 512 chunk
#                                         (nowidecap: 17 local loads per LSTM backward step)
#                                         and streamed weights (bk64)
#   bash scripts/gpu_session.sh spills2   the shapes whose wide resident chunks the planner
#                                         streams since (spills-wide), against resident
#                                         (bk0); the 32 x 64 / 64 x 64 tiles streamed since
#                                         (spills-k512) against resident (bk0)
#   bash scripts/gpu_session.sh huge      B = 512 and 1024: the planner's persistent grid,
#                                         whose wider tiles spill in the step loop (LSTM
#                                         H=1024 B=1024, 64 x 128: 41 / 70 local loads per
#                                         forward / backward step), against the 128 x 64
#                                         tiles it ran before (bh128: 77 / 73), the
#                                         stepwise family on 32 x 64 and on its own 64 x
#                                         64 tiles (sw64) and the forward without _xjoin
#                                         (noxjoin)
#   bash scripts/gpu_session.sh late      the 64 x 128 and 128 x 64 (bh128) backwards,
#                                         whose sub-steps load their inputs after their
#                                         product (`_late_loads`), against the prefetch
#                                         (nolate: LSTM 494 / 476 local loads per step
#                                         instead of 70 / 73)
#   bash scripts/gpu_session.sh splitk    the split-K backward against the plan's (the layer,
#                                         step_ablation's decisions splitk), cuDNN's backward
#                                         (preset split-k), the kernel alone in both its forms
#                                         (scripts/split_k_probe.py)
#   bash scripts/gpu_session.sh profile   scripts/gpu_profile.sh (Nsight Compute, forward and
#                                         backward: the anchor, LSTM H=1024 B=64), each ncu
#                                         run cut at 60 s, its conversions at 15 s each
# On that machine `pip` and the console script may belong to another Python: use python -m.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-tests}
if [ -n "${OUT:-}" ]; then
  out=${WORK:-/tmp/tritonrnn-gpu}/$stage
else
  out=bench/results
fi
mkdir -p "$out"
# The stage's files so far as $OUT/<stage>.tgz (replaced whole, so a cut leaves the last one).
pack() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  tar czf "$OUT/.$stage.tgz" -C "$out" . && mv "$OUT/.$stage.tgz" "$OUT/$stage.tgz" \
    || echo "gpu_session.sh: could not write $OUT/$stage.tgz" >&2
}
trap pack EXIT
export PYTHONUNBUFFERED=1
# Compiled kernels kept in the tree (ignored): a warm machine reuses them between calls.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.tcache}
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
if [ "${PIPESTATUS[0]}" -ne 0 ]; then  # every step after would fail on the missing package
  echo "gpu_session.sh: pip install failed; nothing run" | tee "$out/install-failed.txt" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$out/gpu.txt"
tr() { python -m tritonrnn.bench "$@"; }
# One scripts/step_ablation.py sweep: ablate SECONDS NAME runs its named set NAME (shapes and
# variants: step_ablation.SETS; JSON in $out/NAME, log in $out/ablation-NAME.log; SECONDS 0:
# no time box, as for timeout). Before a device session, on the CPU, compile every set's
# kernels for sm_90 with the GPU machine's Triton (no device minute on a kernel that does not
# compile or fit): PYTHONPATH=.triton36 .venv/bin/python scripts/step_ablation.py --aot --set all
ablate() { local secs=$1 name=$2 t0=$SECONDS
  timeout "$secs" python scripts/step_ablation.py --out "$out/$name" --set "$name" 2>&1 \
    | tee "$out/ablation-$name.log" | tail -20
  local rc=${PIPESTATUS[0]}
  echo "ablation $name: rc $rc in $((SECONDS - t0)) s (124: cut at its box)"
  failed_step "ablation-$name" "$rc"
  pack; }
# box SECONDS NAME COMMAND...: one time-boxed step, its output in $out/NAME.log.
box() { local secs=$1 name=$2; shift 2; local t0=$SECONDS
  timeout "$secs" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc in $((SECONDS - t0)) s"
  failed_step "$name" "$rc"
  pack; }
# The stage's steps that did not end with rc 0 (124: cut at their box); the stage exits 1
# when there is one, so the device tool's rc says what the log does.
failed=""
failed_step() { [ "$2" -eq 0 ] || failed="$failed $1(rc $2)"; }
# Kernels in the Triton cache (one directory per compile, plus Triton's launcher modules).
cached() { echo "Triton cache: $(ls "$TRITON_CACHE_DIR" 2>/dev/null | wc -l) entries $1"; }
case "$stage" in
  tests)
    # pytest-xdist where the machine has it. The 281 GPU tests took 88 s (the two files
    # below, 156 tests) + 40 s with -n 12 on an H200 (2026-11-26, cold compile cache; 147 s
    # for the stage); the 282 of commit 392b4f0 86 + 84 s, close to the 180 s box then, so
    # the boxes are 130 s and 200 s since (12 GPU tests more with the paired backward), the
    # first 150 s since 2026-11-29 (327 GPU tests, most of the new ones new kernel compiles in
    # the first group; the stage's 200 s stay, for the session's spare). -v: a run cut at its
    # box still names each test it finished; -rf lists the failures at the end.
    # The persistent-grid family's (issue 5: bf16 / fp32 against the reference, barrier
    # stress, pair launches) first, so that a cut falls on the others.
    par=$(python -c "import xdist" 2>/dev/null && echo "-n 12")
    first="tests/test_kernels_grid.py tests/test_bidir_launch.py"
    t0=$SECONDS
    timeout 150 python -m pytest -v -rf -p no:cacheprovider -m gpu $first $par 2>&1 \
      | tee "$out/gpu-tests.log" | grep -v " PASSED \| SKIPPED " | tail -30
    failed_step "pytest-grid" "${PIPESTATUS[0]}"
    pack
    timeout $((200 - (SECONDS - t0))) python -m pytest -v -rf -p no:cacheprovider -m gpu tests \
      $(printf -- "--ignore=%s " $first) $par 2>&1 \
      | tee -a "$out/gpu-tests.log" | grep -v " PASSED \| SKIPPED " | tail -30
    failed_step "pytest-rest" "${PIPESTATUS[0]}"
    echo "$(grep -c " PASSED " "$out/gpu-tests.log") passed (gpu-tests.log)" ;;
  bench)
    # --no-tune: bench otherwise tunes each missing plan key's first 16 candidates
    # (--tune-candidates) first, unboxed; reports are checkpointed per shape.
    for p in anchor small-batch gru fp16; do
      box 110 "bench-$p" python -m tritonrnn.bench bench --preset "$p" --no-tune \
        --no-progress --out "$out"
      tail -30 "$out/bench-$p.log"
    done
    box 100 barrier python -m tritonrnn.bench barrier --out "$out"
    tail -25 "$out/barrier.log" ;;
  bench2)
    for p in large-batch varlen; do
      box 250 "bench-$p" python -m tritonrnn.bench bench --preset "$p" --no-tune \
        --no-progress --out "$out"
      tail -30 "$out/bench-$p.log"
    done ;;
  grid)
    for p in grid stack; do
      box 170 "bench-$p" python -m tritonrnn.bench bench --preset "$p" --pass fwdbwd \
        --no-tune --no-progress --out "$out"
      tail -40 "$out/bench-$p.log"
    done
    # The layer pipeline: the same 2-layer stack without and with the automatic overlap.
    box 110 bench-pipeline-serial python -m tritonrnn.bench bench --preset pipeline \
      --pass fwdbwd --no-tune --no-progress --out "$out/serial"
    TRITONRNN_PIPELINE=1 box 110 bench-pipeline python -m tritonrnn.bench bench \
      --preset pipeline --pass fwdbwd --no-tune --no-progress --out "$out"
    tail -n 20 "$out/bench-pipeline-serial.log" "$out/bench-pipeline.log" ;;
  tune)
    export TRITONRNN_CACHE_DIR="$out/cache"
    # The anchor has 150 candidates (`planner.candidates` on the h200 preset): the plan's own
    # and its 23 nearest (a partial entry that a later call carries on), then the anchor
    # timed on the tuned entry (--no-tune: not the rest of the key's candidates).
    box 330 tune python -m tritonrnn.bench tune --mode lstm --hidden 768 --batch 16 \
      --time 1024 --dtype bf16 --max-candidates 24 --no-progress
    box 120 bench-anchor-tuned python -m tritonrnn.bench bench --preset anchor --no-tune \
      --no-progress --out "$out"
    tail -n 30 "$out/tune.log" "$out/bench-anchor-tuned.log" ;;
  ablation)
    box 560 ablation python scripts/step_ablation.py --out "$out"
    tail -50 "$out/ablation.log" ;;
  wide)
    ablate 560 wide ;;
  large)
    # Time-boxed to fit one call (each ablation variant also has its own 240 s limit).
    ablate 200 large
    # B = 64: the resident 16 x 32 plan against streamed 16 x 64 tiles (wgmma loops).
    ablate 190 b64
    timeout 150 python -m tritonrnn.bench bench --preset large-batch --pass fwdbwd --no-tune \
      --no-progress --out "$out" 2>&1 | tee "$out/bench-large-batch.log" | tail -20
    failed_step bench-large-batch "${PIPESTATUS[0]}" ;;
  warps)
    ablate 560 warps ;;
  hoist)
    ablate 560 hoist ;;
  vector)
    ablate 380 vector
    for shape in "lstm 768" "gru 1024"; do set -- $shape
      timeout 80 python -m tritonrnn.bench bench --mode "$1" --hidden "$2" --batch 1 \
        --time 1024 --dtype bf16 --pass fwdbwd --no-tune --no-progress --out "$out" 2>&1 \
        | tee "$out/bench-$1-$2-b1.log" | tail -10
      failed_step "bench-$1-$2-b1" "${PIPESTATUS[0]}"
    done ;;
  spills)
    ablate 360 spills
    ablate 200 spills-b256 ;;
  spills2)
    ablate 280 spills-wide
    ablate 280 spills-k512 ;;
  huge)
    ablate 560 huge ;;
  late)
    ablate 560 late ;;
  decide)
    # DECIDE_SECONDS: a shorter box where less of the session is left (a call cut by the
    # device tool itself brings nothing back).
    ablate "${DECIDE_SECONDS:-540}" decide ;;
  confirm)
    # The split-K rule (planner `_SPLIT_K_RULE`, 2026-11-30) and the rules of 2026-11-27's
    # third session in one call of at most 430 s: the grid sweep's kernels compiled ahead
    # (the rule's among them), and the other plans `confirm`'s rows time, in parallel (the
    # grid's own backward at the rule's shapes and at LSTM H=1024 B=256, `--split-k-bwd 0`,
    # the plans at the buckets between them and the split-K forms there); the sweep against
    # cuDNN (with the rule at LSTM H=1024 B=16 / 64; its correctness check too), then
    # step_ablation's `confirm` rows, then `check`.
    box 45 warm-grid python -m tritonrnn.bench aot --preset grid --device-preset current \
      --jobs 14 --json "$out/aot-grid.json"
    t0=$SECONDS
    for job in lstm,1024,16,0 gru,1536,16,0 lstm,1024,64,0 lstm,1024,256,0 lstm,1024,256,2 \
        lstm,1024,32,0 lstm,1024,32,1 lstm,1024,32,2 lstm,1024,128,0 lstm,1024,128,2 \
        gru,1536,32,0 gru,1536,32,2; do
      IFS=, read -r m h b form <<< "$job"
      timeout 60 python -m tritonrnn.bench aot --mode "$m" --hidden "$h" --batch "$b" \
        --dtype bf16 --device-preset current --split-k-bwd "$form" \
        > "$out/warm-$m-$h-$b-$form.log" 2>&1 &
    done
    wait
    cached "after warm ($((SECONDS - t0)) s)"
    pack
    box 95 bench-grid python -m tritonrnn.bench bench --preset grid --pass fwdbwd --no-tune \
      --no-progress --out "$out"
    ablate 200 confirm
    box 30 check python -m tritonrnn.bench check --no-progress
    tail -24 "$out/bench-grid.log"; tail -8 "$out/check.log" ;;
  phases)
    ablate 300 phases ;;
  barrier)
    # Its shapes are the grid sweep's, and so are its kernels: compiled ahead (14
    # processes), a row takes about 7 s, else about 30 s (H200, 2026-11-26).
    box 45 warm-grid python -m tritonrnn.bench aot --preset grid --device-preset current \
      --jobs 14 --json "$out/aot-grid.json"
    box 150 barrier python -m tritonrnn.bench barrier --out "$out"
    tail -22 "$out/barrier.log" ;;
  splitk)
    # The split-K backward (kernels/split_k.py; R resident in blocks): first every kernel the
    # step after compiles, compiled ahead (each shape's plan, its two-barrier form and at
    # B <= 32 its one-barrier form, `aot --split-k-bwd`: the JIT's own compile for this GPU,
    # all at once); then the layer on the plan's backward against the two-barrier form
    # (TRITONRNN_BWD_SPLIT_K) and at B = 16 the one-barrier form (TRITONRNN_BWD_SPLIT_K1),
    # one shape a job, the largest gaps first (step_ablation's decisions `splitk`: a cut
    # keeps whole comparisons); then the library's backward and cuDNN's at the LSTM shapes
    # (preset split-k), then the kernel alone (scripts/split_k_probe.py: its step against the
    # bare barriers, the GEMMs outside the recurrence), and its one-barrier form
    # (--one-barrier: LSTM H = 1024 / 768 at B = 16, H = 1024 at B = 32; kernels/NOTES.md,
    # "A split-K backward").
    cached "at the start"
    t0=$SECONDS
    for sh in lstm,1024,256 lstm,1024,16 lstm,1024,64 gru,1024,64 lstm,768,64 gru,1024,16 \
        lstm,768,256 gru,1536,16; do
      IFS=, read -r m h b <<< "$sh"
      for form in 0 2 $([ "$b" -le 32 ] && echo 1); do
        timeout 60 python -m tritonrnn.bench aot --mode "$m" --hidden "$h" --batch "$b" \
          --dtype bf16 --device-preset current --split-k-bwd "$form" \
          > "$out/warm-$m-$h-$b-$form.log" 2>&1 &
      done
    done
    wait
    cached "after warm ($((SECONDS - t0)) s)"
    pack
    ablate 240 splitk
    box 80 bench-split-k python -m tritonrnn.bench bench --preset split-k --pass bwd \
      --no-tune --no-progress --out "$out"
    box 60 splitk python scripts/split_k_probe.py --json "$out/split-k-probe.json"
    box 30 splitk1 python scripts/split_k_probe.py --one-barrier \
      --json "$out/split-k-probe-one-barrier.json"
    tail -n 12 "$out/bench-split-k.log"; cat "$out/splitk.log" "$out/splitk1.log" ;;
  profile)
    # One shape a call of gpu_profile.sh, packed after each (a cut keeps the shapes done):
    # its two ncu runs cut at NCU_SECONDS, each report's conversions at NCU_CONVERT_SECONDS.
    for shape in lstm,768,16 lstm,1024,64; do
      NCU_SECONDS=60 NCU_CONVERT_SECONDS=15 OUT="$out" bash scripts/gpu_profile.sh "$shape"
      failed_step "profile-$shape" $?
      pack
    done ;;
  all)
    # Each step is cut at its budget; bench reports are checkpointed per shape (the barrier
    # JSON too), so a cut step keeps what it finished. Measured on an H200 (2026-11-26, with
    # the cuDNN-graph baseline): warm 31 s (46 cache entries; 5 more after the sweeps),
    # grid 72 s, targets 111 s, check 24 s, 279 s for the stage; the barrier, then boxed at
    # 30 s, measured 4 of its 18 rows (about 7 s a row with the grid's kernels cached, about
    # 30 s cold). First the sweeps' kernels are compiled ahead into the Triton cache, 14
    # processes at once (`aot --device-preset current`: the JIT's own compile for this GPU,
    # the entries the sweeps' runs look up; the cache counts before and after the sweeps
    # say whether they found them); the barrier runs after the grid sweep, whose shapes
    # and kernels it shares. The budgets add up to 460 s.
    cached "at the start"
    t0=$SECONDS
    for p in grid targets; do
      timeout 45 python -m tritonrnn.bench aot --preset "$p" --device-preset current --jobs 7 \
        --json "$out/aot-$p.json" > "$out/warm-$p.log" 2>&1 &
    done
    wait
    cached "after warm ($((SECONDS - t0)) s)"
    pack
    box 100 bench-grid python -m tritonrnn.bench bench --preset grid --pass fwdbwd --no-tune \
      --no-progress --out "$out"
    box 150 barrier python -m tritonrnn.bench barrier --out "$out"
    box 125 bench-targets python -m tritonrnn.bench bench --preset targets --pass all \
      --no-tune --no-progress --out "$out"
    cached "after the sweeps"
    box 40 check python -m tritonrnn.bench check --no-progress
    tail -20 "$out/barrier.log"; tail -15 "$out/check.log" ;;
  *) echo "usage: $0 all|tests|confirm|barrier|phases|bench|bench2|grid|tune|ablation|wide|large|warps|hoist|vector|spills|spills2|huge|late|decide|splitk|profile" >&2
     exit 2 ;;
esac
if [ -n "$failed" ]; then
  echo "gpu_session.sh $stage: steps that did not end with rc 0:$failed" >&2
  exit 1
fi
