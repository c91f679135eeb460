#!/usr/bin/env bash
# The H200 evidence runs, by stage: bash benchmarks/gpu_evidence.sh STAGE [STAGE ...]
#   smoke        workload smoke test (4 layers)
#   fixtures     small real traces of our own workload for tests/data (3 layers, graph + eager)
#   walkthrough  the loop of issue 6 at C=32: profile, apply mma-attn, recommend, apply bf16-gemm, report
#   sweep        baseline and variants at C = 1, 16, 32, 64
# Everything lands under $OUT (the device tool brings it back) as logs and .tgz bundles.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=150
OUT=${OUT:-/tmp/dsv4opt-out}
mkdir -p "$OUT"
dsv4opt() { python3 -m dsv4opt "$@"; }
say() { printf '\n$ dsv4opt %s\n' "$*"; }

stage_smoke() {
  timeout 240 python3 benchmarks/gpu_smoke_workload.py --skip-full 2>&1 | tee "$OUT/smoke.txt" | tail -25
}

stage_fixtures() {
  local d=/tmp/fixtures
  rm -rf "$d" && mkdir -p "$d"
  dsv4opt profile --layers 3 -c 4 --context 1024 --steps 2 --warmup 1 --trace-dir "$d" --out "$d/profile.json" \
    > "$OUT/fixtures.txt" 2>&1
  echo "fixtures exit $?"
  gzip -9 "$d"/*.trace.json
  tar czf "$OUT/fixtures.tgz" -C "$d" .
}

stage_walkthrough() {
  export DSV4OPT_STATE=$PWD/.dsv4opt/state.json
  rm -rf .dsv4opt profiles-walk && mkdir -p docs/walkthrough
  {
    say profile --concurrency 32; dsv4opt profile --concurrency 32
    say apply mma-attn; dsv4opt apply mma-attn
    say recommend; dsv4opt recommend
    say apply bf16-gemm; dsv4opt apply bf16-gemm
    say status; dsv4opt status
  } 2>&1 | tee "$OUT/walkthrough.txt"
  mapfile -t walked < <(python3 -c "
import json; s=json.load(open('.dsv4opt/state.json'))
seen=[]
[seen.append(h['profile']) for h in s['history'] if h.get('profile') and h['profile'] not in seen]
print('\n'.join(seen))")
  dsv4opt report "${walked[@]}" --out docs/walkthrough/report.html --title "dsv4opt walkthrough on the H200, C=32"
  dsv4opt report "${walked[@]}" --out docs/walkthrough/report.md --format md --title "dsv4opt walkthrough on the H200, C=32"
  tar czf "$OUT/walkthrough.tgz" "${walked[@]}" docs/walkthrough .dsv4opt/state.json
}

stage_sweep() {
  dsv4opt sweep --concurrency "${SWEEP_C:-1,16,32,64}" --with mma-attn --with bf16-gemm --with mma-attn,bf16-gemm \
    --out-dir profiles/sweep 2>&1 | tee "$OUT/sweep.txt"
  tar czf "$OUT/sweep.tgz" profiles/sweep
}

for stage in "$@"; do
  start=$(date +%s)
  echo "=== stage $stage"
  "stage_$stage"
  echo "=== stage $stage took $(( $(date +%s) - start )) s"
done
