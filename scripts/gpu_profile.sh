#!/usr/bin/env bash
# Nsight Compute profile of the persistent-grid kernels on a lent GPU (development tool):
# stall reasons per SASS instruction of one forward launch and of one layer's fwd + bwd.
#   bash scripts/gpu_profile.sh [MODE,H,B]      (default lstm,768,16; writes to $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/ncu}
mkdir -p "$out"
shape=${1:-lstm,768,16}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
sections=(--section SpeedOfLight --section WarpStateStats --section SourceCounters
          --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis)
report() {  # $1: report stem
  "$ncu" -i "$1.ncu-rep" --page details > "$1-details.txt" 2>&1
  "$ncu" -i "$1.ncu-rep" --page source --csv --print-source sass > "$1-sass.csv" 2>&1 \
    || "$ncu" -i "$1.ncu-rep" --page source --csv > "$1-sass.csv" 2>&1
  rm -f "$1.ncu-rep"
}
"$ncu" --clock-control none -k regex:_grid_fwd --launch-skip 1 --launch-count 1 \
  "${sections[@]}" -f -o "$out/fwd" python scripts/step_ablation.py --once "$shape" \
  > "$out/ncu-fwd.log" 2>&1
report "$out/fwd"
"$ncu" --clock-control none -k regex:_grid_bwd --launch-skip 1 --launch-count 1 \
  "${sections[@]}" -f -o "$out/bwd" python scripts/step_ablation.py --once "$shape" --layer \
  > "$out/ncu-bwd.log" 2>&1
report "$out/bwd"
tail -n 3 "$out/ncu-fwd.log" "$out/ncu-bwd.log"
grep -E "Duration|Warp Cycles Per Issued|Issued Warp|Stall|One or More" "$out/fwd-details.txt" \
  | head -20 || true  # no match: the details are in the report files anyway
