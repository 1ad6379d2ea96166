#!/usr/bin/env bash
# research/attention_item_ncu.py under Nsight Compute, clocks left alone.
#   all (default): one report (--set full, source counters), then its details page (every D 128 case and D 64 at
#     S 4096) and the SASS source pages of our persistent kernel, v5's grid kernel and cuDNN's forward at B 8
#     S 2048 plain, and of the band kernel at window 1024, as CSV (gzipped). The report stays in /tmp (too large
#     to bring back).
#   sass: only those SASS source pages (the full report's ~400 s left out).
#   d64: issue 30's profile where the D 64 causal forward stays under target (S 1024: 0.93-0.95x cuDNN, S 2048:
#     0.97-0.99x on an H100), ~150 s: details.txt with speed of light, compute (pipe use: tensor, FMA, XU = MUFU),
#     instruction statistics, warp states (stall reasons), scheduler (issue slots), launch and occupancy for our
#     route and cuDNN's at B 16 S 1024 and B 8 S 2048 (the "causal D64" cases), then the SASS pages of both at
#     S 1024. What to read: a forward item's fixed cost (c ~ 2.3 key tiles against cuDNN's 0.7-0.9,
#     docs/tuning/attention.md, "A work item's cost with chained items"): issue slots, the XU / tensor pipes, and
#     our stall samples outside the key-tile loop (research/ncu_sass_summary.py FILE --regions).
# Run on the GPU from the repository root: research/attention_item_ncu.sh OUTDIR [all | sass | d64]
set -uo pipefail
out=${1:?usage: $0 OUTDIR [all | sass | d64]}
mode=${2:-all}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
rep=/tmp/attention-item-ncu
filter='regex:attn_fwd|fprop|flash|sdpa'
ncu --version > "$out/ncu-version.txt" 2>&1

sass_pages() {  # the SASS source page of each case, one profiled run each (filtering a report by launch is not relied on)
  local i=0 case
  for case in "$@"; do
    i=$((i + 1))
    timeout 150 ncu --clock-control none --profile-from-start off --kernel-name "$filter" \
      --section SourceCounters --page source --csv --print-source sass \
      python3 research/attention_item_ncu.py "$case" > "$out/sass-$i.csv" 2> "$out/sass-$i.err"
    echo "sass $i ($case) rc=$? lines=$(wc -l < "$out/sass-$i.csv")"
    gzip -f "$out/sass-$i.csv"
  done
}

if [ "$mode" = d64 ]; then
  timeout 240 ncu --clock-control none --profile-from-start off --kernel-name "$filter" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \
    --section SchedulerStats --section LaunchStats --section Occupancy \
    python3 research/attention_item_ncu.py "causal D64" > "$out/details.txt" 2> "$out/details.err"
  echo "details rc=$? lines=$(wc -l < "$out/details.txt")"
  sass_pages "B16 S1024 causal D64 flash_attention" "B16 S1024 causal D64 cudnn"
  exit 0
fi
if [ "$mode" != sass ]; then
  timeout 400 ncu --clock-control none --profile-from-start off --kernel-name "$filter" \
    --set full --import-source yes -f -o "$rep" python3 research/attention_item_ncu.py > "$out/profile.log" 2>&1
  echo "profile rc=$?"
  ncu -i "$rep.ncu-rep" --page details --print-details all > "$out/details.txt" 2>&1
  echo "details rc=$?"
  ncu -i "$rep.ncu-rep" --page raw --csv > "$out/raw.csv" 2>&1; gzip -f "$out/raw.csv"
fi
sass_pages "B8 S2048 flash_attention" "B8 S2048 v5 grid" "B8 S2048 cudnn" "B1 S16384 window1024 flash_attention"
