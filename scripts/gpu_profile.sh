#!/usr/bin/env bash
# Nsight Compute profile of the persistent-grid kernels on a lent GPU (development tool):
# stall reasons per SASS instruction of one forward launch and of one layer's backward, per
# shape, each ncu run cut at NCU_SECONDS (default 110; a cut run leaves the earlier reports).
#   bash scripts/gpu_profile.sh [MODE,H,B ...]    (default lstm,768,16; writes to $OUT)
# What to look for: the sm_90 compile of the anchor's forward (Triton 3.6, `tritonrnn aot
# --dump`) had 27 BAR.SYNC in each step-loop iteration with per-gate sums: 7 inside the
# product's branch (h staged in shared memory for the dots, the split-K partial sums added
# across warps), 12 from there to the grid barrier's arrival (8 of them the four gate
# tiles' conversions from the MMA layout to the cell's: TTGIR convert_layout #linear ->
# #blocked), 8 while the arrival is out (the next step's prefetched inputs) and at the
# wait. The joined gate sums (grid_tiles._FWD_JOINED_SUMS, the default) convert the
# four tiles at once: 21; the active-row mask formed in the loop (_mask_in_loop, the
# default) drops the carried mask's conversion: 19; both chunks of h loaded and staged
# together (_paired_chunks): 17; the split-K slices added by halves (_ksum, split 4
# ways): 14. The backward had 33, 30 with halves; its gates' operands loaded ahead
# (_paired_gates, the default since 2026-11-26: TRITONRNN_BWD_PAIRED_GATES=off keeps them
# apart) 18. Which of them a step
# waits on, and the shared-memory bank conflicts, are the profile's to say.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/ncu}
mkdir -p "$out"
[ $# -gt 0 ] || set -- lstm,768,16
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "gpu_profile.sh: ncu not found" >&2; exit 1; }
sections=(--section SpeedOfLight --section WarpStateStats --section SourceCounters
          --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis)
report() {  # $1: report stem; each conversion cut at NCU_CONVERT_SECONDS (default 30)
  if [ ! -f "$1.ncu-rep" ]; then  # no kernel matched, or the run was cut before one
    echo "$(basename "$1"): no report (see $(basename "$1").log)" >&2
    missing=$((missing + 1))
    return 0
  fi
  local cut=${NCU_CONVERT_SECONDS:-30}
  # The raw report (large) is dropped only once both pages are out of it.
  timeout "$cut" "$ncu" -i "$1.ncu-rep" --page details > "$1-details.txt" 2>&1 \
    && { timeout "$cut" "$ncu" -i "$1.ncu-rep" --page source --csv --print-source sass \
           > "$1-sass.csv" 2>&1 \
         || timeout "$cut" "$ncu" -i "$1.ncu-rep" --page source --csv > "$1-sass.csv" 2>&1; } \
    && rm -f "$1.ncu-rep"
}
missing=0
profile() {  # $1: kernel regex, $2: report stem, the rest: step_ablation.py arguments
  local kernel=$1 stem=$2 t0=$SECONDS
  shift 2
  timeout "${NCU_SECONDS:-110}" "$ncu" --clock-control none -k "regex:$kernel" --launch-skip 1 \
    --launch-count 1 "${sections[@]}" -f -o "$stem" python scripts/step_ablation.py "$@" \
    > "$stem.log" 2>&1
  echo "$(basename "$stem"): rc $? in $((SECONDS - t0)) s"
  report "$stem"
}
for shape in "$@"; do
  name=${shape//,/-}
  profile _grid_fwd "$out/$name-fwd" --once "$shape"
  # The layer's backward: the grid kernel, or the split-K kernel where the planner's rule
  # (rnn/planner._SPLIT_K_RULE: LSTM H=1024 B=16 / 64, GRU H=1536 B=16) runs it.
  profile "_grid_bwd|_split_k1?_bwd" "$out/$name-bwd" --once "$shape" --layer
  grep -E "Duration|Warp Cycles Per Issued|Excessive|excessive" "$out/$name-fwd-details.txt" \
    2>/dev/null | head -8 || true  # no match: the details are in the report files anyway
done
[ "$missing" -eq 0 ]  # exit 1 when a profile wrote no report
