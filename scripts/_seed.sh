# Sourced first in a device call, from the repository root: every step of the call (the tier, benches,
# research scripts) shares one Triton and one tilewise kernel cache, filled from the carried seed
# (.cache/device-seed/seed-*.tgz, git-ignored) when there is one; `seed_export` (the call's last
# step) writes them back as $OUT/seed/seed-N.tgz for the next session. scripts/device_cache.py says
# what is kept and why. A machine still warm from this session's last call keeps its caches. Run the tier
# without --cold under a seed (it empties the caches).
#
#   source scripts/_seed.sh; scripts/device-step o1 250 tier scripts/gpu-check --tests ...; ...; seed_export
TILEWISE_SEED_ROOT=${TILEWISE_SEED_ROOT:-/tmp/tilewise-seeded}
export TRITON_CACHE_DIR=$TILEWISE_SEED_ROOT/triton TILEWISE_CACHE_DIR=$TILEWISE_SEED_ROOT/kernels
if [ -f "$TILEWISE_SEED_ROOT/origin" ]; then  # a machine kept warm since this session's last call: its caches
  TILEWISE_CACHE_SEED="$(cat "$TILEWISE_SEED_ROOT/origin"), then kept from the machine's last call"
else
  rm -rf "${TILEWISE_SEED_ROOT:?}"
  mkdir -p "$TRITON_CACHE_DIR" "$TILEWISE_CACHE_DIR"
  chmod 700 "$TILEWISE_CACHE_DIR"
  if compgen -G ".cache/device-seed/seed-*.tgz" >/dev/null; then
    TILEWISE_CACHE_SEED="seeded ($(python3 scripts/device_cache.py restore --seed .cache/device-seed \
      --triton "$TRITON_CACHE_DIR" --tilewise "$TILEWISE_CACHE_DIR" | tail -1))"
  else
    TILEWISE_CACHE_SEED="emptied first (no seed carried)"
  fi
  echo "$TILEWISE_CACHE_SEED" > "$TILEWISE_SEED_ROOT/origin"
fi
export TILEWISE_CACHE_SEED
echo "caches: $TILEWISE_CACHE_SEED"

seed_export() {
  python3 scripts/device_cache.py export --triton "$TRITON_CACHE_DIR" --tilewise "$TILEWISE_CACHE_DIR" \
    --out "${OUT:-.out}/seed"
}
