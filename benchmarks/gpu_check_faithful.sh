#!/usr/bin/env bash
# One lease, in order: the test suite on the GPU, then the workload smoke test (tiny vs float64,
# 4-layer sync/graph checks, full-model ms/step). Logs go to $OUT (the device tool) or ./gpu-out.
# Usage: DSV4OPT_COMMIT=<hash> bash benchmarks/gpu_check_faithful.sh
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout 400 python3 -m pytest -q -p no:cacheprovider tests/workload tests/optimizations 2>&1 | tail -40 > "$OUT/pytest_gpu.log"
tail -5 "$OUT/pytest_gpu.log"
timeout 300 python3 benchmarks/gpu_smoke_workload.py --concurrency 32 --context 8192 2>&1 | tee "$OUT/smoke.log" | tail -30
if [ "${PROFILE:-0}" = "1" ]; then
  # One baseline profile at C = 32 (the loop's default settings), kept with its traces.
  timeout 240 python3 -m dsv4opt profile --concurrency 32 --out "$OUT/c32-baseline.json" --trace-dir "$OUT/traces" 2>&1 | tail -45 | tee "$OUT/profile_c32.log"
  rm -rf "$OUT/traces"
fi
