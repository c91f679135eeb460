"""Write each optimisation's measured.json (kernel speed-up per batch) from committed H200 benchmark output.

    python scripts/record_measured.py

`dsv4opt recommend` reads measured.json for its Amdahl bound. The figures are taken from the JSON
the benchmark runs wrote, never typed in:
- mma-attn: docs/kernels/mma_attn_h200_bench.json (`dsv4opt bench mma-attn --json`): baseline / mma-attn time.
- bf16-gemm: docs/optimizations/bf16_gemm_h200.json (`scripts/gpu_bf16_gemm.py`): float32 / bf16 time of
  the indexer score and the pre-mix, weighted by how often one decode step of dsv4-flash calls each
  (the indexer once per CSA layer, the pre-mix before each of a layer's two sublayers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsv4opt.fileio import write_json_atomic  # noqa: E402
from dsv4opt.workload.config import CSA, ModelConfig  # noqa: E402


def mma_attn() -> dict:
    src = ROOT / "docs/kernels/mma_attn_h200_bench.json"
    bench = json.loads(src.read_text())
    return {
        "device": bench["device"],
        "source": f"{src.relative_to(ROOT)} (dsv4opt bench mma-attn)",
        "kernel_speedup": {str(r["batch"]): r["baseline_us"] / r["mma_us"] for r in bench["rows"]},
    }


def bf16_gemm() -> dict:
    src = ROOT / "docs/optimizations/bf16_gemm_h200.json"
    data = json.loads(src.read_text())
    cfg = ModelConfig.from_name("dsv4-flash")
    n_idx = sum(cfg.layer_kind(i) == CSA for i in range(cfg.layers))
    n_pre = 2 * cfg.layers
    speedup = {}
    for row in data["timings"]:
        before = n_idx * row["indexer_fp32_us"] + n_pre * row["premix_fp32_us"]
        after = n_idx * row["indexer_bf16_us"] + n_pre * row["premix_bf16_us"]
        speedup[str(row["C"])] = before / after
    log = (ROOT / "docs/optimizations/bf16_gemm_h200_log.txt").read_text().splitlines()
    device = next(line.split(":", 1)[1].split(",")[0].strip() for line in log if line.startswith("device:"))
    return {
        "device": device,
        "source": f"{src.relative_to(ROOT)} (scripts/gpu_bf16_gemm.py), {n_idx} indexer + {n_pre} pre-mix calls per step",
        "kernel_speedup": speedup,
    }


if __name__ == "__main__":
    for package, record in (("mma_attn", mma_attn()), ("bf16_gemm", bf16_gemm())):
        path = write_json_atomic(ROOT / "dsv4opt/optimizations" / package / "measured.json", record)
        print(path.relative_to(ROOT), {k: round(v, 2) for k, v in record["kernel_speedup"].items()})
