#!/usr/bin/env bash
# Reader speed and peak memory, whole process each, on one big trace:
#   dsv4opt analyze  vs  HTA get_gpu_kernel_breakdown  vs  a plain json.load loop.
# Usage: scripts/bench_reader.sh [SOURCE_TRACE] [MB]
#   builds /tmp/dsv4opt-bench/big.json (SOURCE repeated to MB megabytes) unless it exists.
# Needs /usr/bin/time and, for the HTA row, `pip install holistictraceanalysis psutil` (not a
# dependency of dsv4opt). Benchmarks never assert: this prints figures only.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-../shared/traces/tracelens_h100_qwen1.5_0.5b.json.gz}
MB=${2:-250}
DIR=/tmp/dsv4opt-bench
BIG=$DIR/big.json
mkdir -p "$DIR"
[ -f "$BIG" ] || python3 scripts/make_big_trace.py "$SRC" "$BIG" --mb "$MB"
ls -l "$BIG"
FMT="%e s wall, %U s user, %S s sys, %M KB peak RSS"

echo "== dsv4opt analyze"
/usr/bin/time -f "$FMT" python3 -m dsv4opt analyze "$BIG" --top 5 > "$DIR/dsv4opt.out" 2> "$DIR/dsv4opt.err" || true
tail -1 "$DIR/dsv4opt.err"; grep -m1 "GPU time" "$DIR/dsv4opt.out" || true

echo "== plain json.load loop"
/usr/bin/time -f "$FMT" python3 -c "
import json, math, sys
events = json.load(open(sys.argv[1]))['traceEvents']
print(math.fsum(e['dur'] for e in events if e.get('ph') == 'X' and e.get('cat') in ('kernel', 'gpu_memcpy', 'gpu_memset')), 'us')
" "$BIG" 2>&1 | tail -2

echo "== HTA get_gpu_kernel_breakdown"
if python3 -c "import hta, psutil" 2>/dev/null; then
  /usr/bin/time -f "$FMT" python3 -c "
import sys
from hta.trace_analysis import TraceAnalysis
kernel_type, kernels = TraceAnalysis(trace_dir=sys.argv[1]).get_gpu_kernel_breakdown(visualize=False)
print(kernel_type.to_string())
" "$DIR" > "$DIR/hta.out" 2>&1 || true
  tail -1 "$DIR/hta.out"
else
  echo "HTA not installed (pip install holistictraceanalysis psutil)"
fi
