#!/usr/bin/env bash
# The attention A/Bs prepared without a GPU on 2026-12-05 (research/notes/attention.md, "Nineteenth session"),
# in one device call: the backward's register operands, the forward's variants, the fused backward's dQ modes.
# Needs research/patches/v5-overlap.patch and bwd-register-operands.patch applied (each script says what it
# imports). Logs into DIR (default /tmp/attention-ab), one a script; each script under its own limit, together
# 570 s at most (the device's 600 s a call), expected ~6 min. Give script names to run only those.
#   scripts/device-step o5 590 ab research/pending_attention_ab.sh /tmp/o5/ab   (packs /tmp/o5 into $OUT)
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/attention-ab}
shift || true
mkdir -p "$out"
export PYTHONPATH=src
sha=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
declare -A limit=([attention_bwd_operands]=150 [attention_fwd_operands]=240 [attention_fused_bwd]=180)
scripts=("$@")
[ ${#scripts[@]} -eq 0 ] && scripts=(attention_bwd_operands attention_fwd_operands attention_fused_bwd)
for script in "${scripts[@]}"; do
    echo "== $script ($sha) $(date -u +%FT%TZ)"
    timeout "${limit[$script]:-180}" python3 "research/$script.py" > "$out/$script-$sha.log" 2>&1
    echo "exit $? after $SECONDS s"
    tail -n 40 "$out/$script-$sha.log"
done
