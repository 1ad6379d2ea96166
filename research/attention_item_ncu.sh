#!/usr/bin/env bash
# research/attention_item_ncu.py under Nsight Compute: one report (--set full, source counters), then its
# details page (every case) and the SASS source pages of our persistent kernel, v5's grid kernel and cuDNN's
# forward at B 8 S 2048 plain, and of the band kernel at window 1024, as CSV (gzipped). The report itself stays
# in /tmp (too large to bring back).
# Run on the GPU from the repository root: research/attention_item_ncu.sh OUTDIR [sass]
# (sass: only the SASS source pages, the full report's ~400 s left out)
set -uo pipefail
out=${1:?usage: $0 OUTDIR [sass]}
mode=${2:-all}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
rep=/tmp/attention-item-ncu
ncu --version > "$out/ncu-version.txt" 2>&1
if [ "$mode" != sass ]; then
timeout 400 ncu --clock-control none --profile-from-start off --kernel-name 'regex:attn_fwd|fprop|flash|sdpa' \
  --set full --import-source yes -f -o "$rep" python3 research/attention_item_ncu.py > "$out/profile.log" 2>&1
echo "profile rc=$?"
ncu -i "$rep.ncu-rep" --page details --print-details all > "$out/details.txt" 2>&1
echo "details rc=$?"
ncu -i "$rep.ncu-rep" --page raw --csv > "$out/raw.csv" 2>&1; gzip -f "$out/raw.csv"
fi
# the SASS source pages, one profiled run each (filtering an imported report by launch is not relied on)
i=0
for case in "B8 S2048 flash_attention" "B8 S2048 v5 grid" "B8 S2048 cudnn" "B1 S16384 window1024 flash_attention"; do
  i=$((i + 1))
  timeout 150 ncu --clock-control none --profile-from-start off --kernel-name 'regex:attn_fwd|fprop|flash|sdpa' \
    --section SourceCounters --page source --csv --print-source sass \
    python3 research/attention_item_ncu.py "$case" > "$out/sass-$i.csv" 2> "$out/sass-$i.err"
  echo "sass $i ($case) rc=$? lines=$(wc -l < "$out/sass-$i.csv")"
  gzip -f "$out/sass-$i.csv"
done
