#!/usr/bin/env bash
# Embedded profiles of the faithful baseline and its optimisations on the GPU, packed into one
# archive under $OUT (the device tool brings back few files). Usage:
#   DSV4OPT_COMMIT=<hash> bash benchmarks/gpu_profile_faithful.sh "NAME:C:CONTEXT:OPTS" ...
# OPTS is comma-separated optimisations or "baseline". Profiles use --steps 3 --warmup 1: the
# MoE fallback makes a step seconds long at C >= 16, and three steps vary by well under 1%.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/p"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
for spec in "$@"; do
  IFS=: read -r name c ctx opts <<<"$spec"
  with=()
  [ "$opts" != "baseline" ] && with=(--with "$opts")
  start=$(date +%s)
  python3 -m dsv4opt profile --concurrency "$c" --context "$ctx" --steps 3 --warmup 1 "${with[@]}" \
    --out "$OUT/p/$name.json" > "$OUT/p/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - start ))s $(grep -o 'tokens per s [0-9.]*, ms per step [0-9.]*' "$OUT/p/$name.log")"
  tar -czf "$OUT/profiles.tgz" -C "$OUT" p
done
