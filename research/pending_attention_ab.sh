#!/usr/bin/env bash
# The attention A/Bs prepared without a GPU on 2026-12-05 (research/notes/attention.md, "Nineteenth session"),
# in one device call: the backward's register operands, the forward's variants, the fused backward's dQ modes.
# Needs research/patches/v5-overlap.patch and bwd-register-operands.patch applied (each script says what it
# imports). Each script under its own time limit; logs into DIR (default /tmp/attention-ab). Expected ~6 min.
#   scripts/device-step o5 560 ab research/pending_attention_ab.sh /tmp/o5/ab   (packs /tmp/o5 into $OUT)
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/attention-ab}
mkdir -p "$out"
export PYTHONPATH=src
sha=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
for script in attention_bwd_operands attention_fwd_operands attention_fused_bwd; do
    echo "== $script ($sha) $(date -u +%FT%TZ)"
    timeout 240 python3 "research/$script.py" > "$out/$script-$sha.log" 2>&1
    echo "exit $? after $SECONDS s"
    tail -n 40 "$out/$script-$sha.log"
done
