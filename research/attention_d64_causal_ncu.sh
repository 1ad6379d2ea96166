#!/usr/bin/env bash
# Issue 30's profile where the D 64 causal forward stays under target (S 1024: 0.93-0.95x cuDNN, S 2048: 0.97-0.99x
# on an H100): our route and cuDNN's forward at B 16 S 1024 and B 8 S 2048 (H 16, bf16), one launch each under
# Nsight Compute (research/attention_item_ncu.py's "causal D64" cases), clocks left alone.
#   details.txt   the sections below for every launch: speed of light, compute (pipe utilization: tensor, FMA,
#                 XU = MUFU), instruction statistics, warp states (stall reasons), scheduler (issue slots),
#                 launch and occupancy
#   sass-N.csv.gz the SASS source pages of our S 1024 route and cuDNN's S 1024 kernel; read them with
#                 PYTHONPATH=src python3 research/ncu_sass_summary.py FILE --regions
# What to read (a forward item's fixed cost, c ~ 2.3 key tiles against cuDNN's 0.7-0.9, docs/tuning/attention.md, "A
# work item's cost with chained items"): issue-slot use and the XU / tensor pipes of both, and where our stall
# samples sit outside the key-tile loop (the item's start: Q's wait, S_0 and its softmax; its end: the last P V,
# normalization, O's TMA store).
# Run on the GPU from the repository root (~150 s): research/attention_d64_causal_ncu.sh OUTDIR
set -uo pipefail
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
filter='regex:attn_fwd|fprop|flash|sdpa'
timeout 240 ncu --clock-control none --profile-from-start off --kernel-name "$filter" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --section Occupancy \
  python3 research/attention_item_ncu.py "causal D64" > "$out/details.txt" 2> "$out/details.err"
echo "details rc=$? lines=$(wc -l < "$out/details.txt")"
i=0
for case in "B16 S1024 causal D64 flash_attention" "B16 S1024 causal D64 cudnn"; do
  i=$((i + 1))
  timeout 150 ncu --clock-control none --profile-from-start off --kernel-name "$filter" \
    --section SourceCounters --page source --csv --print-source sass \
    python3 research/attention_item_ncu.py "$case" > "$out/sass-$i.csv" 2> "$out/sass-$i.err"
  echo "sass $i ($case) rc=$? lines=$(wc -l < "$out/sass-$i.csv")"
  gzip -f "$out/sass-$i.csv"
done
