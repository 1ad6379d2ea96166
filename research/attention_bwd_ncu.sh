#!/usr/bin/env bash
# Issue 30's backward profile, side by side under Nsight Compute: v6 (the library's deterministic
# backward: attn_bwd_dkdv_ws + attn_bwd_dq_ws), v7's bound (research/attention_fused_bwd.py dQ mode 7:
# dQ live, never written) and v7 with its dQ adds (mode 4), each with LSE / Delta loaded by the consumers
# (STATS 1) and staged by the loader (STATS 2), and cuDNN's backward (bprop). B 4 H 16 S 4096, bf16,
# non-causal, D 128 and 64.
# Three passes: the sections (speed of light, pipes, stalls, instruction mix, with their bodies), the raw
# tensor-pipe and stall metrics by regex, and the per-opcode instruction counts.
# Run on the GPU from the repository root: research/attention_bwd_ncu.sh OUTDIR ["metrics opcodes"]
set -uo pipefail
out=${1:?usage: $0 OUTDIR [PASSES]}
passes=${2:-"sections metrics opcodes"}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
NCU="ncu --clock-control none"
ncu --version > "$out/ncu-version.txt" 2>&1
ncu --query-metrics --chip gh100 2>&1 | grep -E "pipe_tensor|gmma|warps_issue_stalled|inst_executed_pipe" \
  > "$out/metrics-available.txt"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section InstructionStats --section SchedulerStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis --print-details all"
METRICS="regex:sm__pipe_tensor.*pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_.*pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum"
OURS='regex:attn_bwd_dkdv_ws|attn_bwd_dq_ws|bprop'
FUSED='attn_bwd_fused_ws_kernel'
for pass in $passes; do
  case $pass in
    sections) args=$SECTIONS ;;
    metrics) args="--metrics $METRICS" ;;
    opcodes) args="--metrics sass__inst_executed_per_opcode --print-metric-instances details" ;;
  esac
  # shellcheck disable=SC2086
  timeout 200 $NCU --kernel-name "$OURS" $args python3 research/attention_kernel_profile.py --ncu \
    > "$out/v6-cudnn-$pass.log" 2>&1
  echo "v6/cuDNN $pass rc=$?"
  # shellcheck disable=SC2086
  timeout 200 $NCU --kernel-name "$FUSED" $args python3 research/attention_fused_bwd.py --ncu --modes 7,4 --stats 1,2 --ncu-dims 128,64 \
    > "$out/v7-$pass.log" 2>&1
  echo "v7 $pass rc=$?"
done
