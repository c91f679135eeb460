"""Write measured.json (kernel speed-up per batch / concurrency) of mma-attn, grouped-moe and
fuse-glue from committed H200 benchmark output.

    python scripts/record_measured.py

`dsv4opt recommend` reads measured.json for its Amdahl bound. The figures are taken from the JSON
the benchmark run wrote, never typed in: evidence/h200/kernels/mma_attn_h200_bench_fp8.json
(`dsv4opt bench mma-attn --kv fp8 --json`): the baseline (SGLang's sm_120 path over both caches) /
mma-attn time, and under "on_paths" each other SGLang path's own figure against the kernel that path
runs (0.5.23 on Hopper: FlashMLA 1.0.0 / the drop-in in its slot, evidence/h200/mma_attn_peers_4ee4add.json); evidence/h200/optimizations/grouped_moe_h200_bench.json (`dsv4opt bench grouped-moe --json`):
SGLang's per-slot path / the grouped kernels; evidence/h200/optimizations/fuse_glue_h200_bench.json
(`dsv4opt bench fuse-glue --json`): one layer's eager glue / fused glue, skipped until that file is
committed. bf16-gemm has no record since its slot changed (the indexer logits); until it is
benchmarked again, recommend bounds it by its target's share alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsv4opt.fileio import write_json_atomic  # noqa: E402


def mma_attn() -> dict:
    src = ROOT / "evidence/h200/kernels/mma_attn_h200_bench_fp8.json"
    bench = json.loads(src.read_text())
    return {
        "device": bench["device"],
        "against": "SGLang 0.5.14's sm_120 CUDA-core sparse-MLA kernel",
        "source": f"{src.relative_to(ROOT)}, from `dsv4opt bench mma-attn --kv fp8`",
        "kernel_speedup": {str(r["batch"]): r["baseline_us"] / r["mma_us"] for r in bench["rows"]},
        "on_paths": {"0.5.23 sm_90": mma_attn_hopper()},
    }


def mma_attn_hopper() -> dict:
    """On SGLang 0.5.23's Hopper path the kernel mma-attn replaces is FlashMLA (sgl-flash-mla 1.0.0):
    the drop-in in SGLang's slot against it, from the bench's peers table."""
    src = ROOT / "evidence/h200/mma_attn_peers_4ee4add.json"
    bench = json.loads(src.read_text())
    rows = [r for r in bench["peers"]["rows"] if {"mma-attn slot", "FlashMLA 1.0.0"} <= set(r["us"])]
    return {
        "device": bench["device"],
        "against": "FlashMLA 1.0.0, SGLang 0.5.23's Hopper kernel",
        "source": f"{src.relative_to(ROOT)}, the peers table of `dsv4opt bench mma-attn --kv fp8`: the drop-in in SGLang's slot",
        "kernel_speedup": {str(r["batch"]): r["us"]["FlashMLA 1.0.0"] / r["us"]["mma-attn slot"] for r in rows},
    }


def grouped_moe(layout: str = "tp4") -> dict:
    """The rows of one layout (the workload's default); a file from before the bench had layouts
    holds dp-ep rows only."""
    src = ROOT / "evidence/h200/optimizations/grouped_moe_h200_bench.json"
    bench = json.loads(src.read_text())
    rows = [r for r in bench["rows"] if r.get("layout", layout) == layout and r.get("baseline_us")]
    return {
        "device": bench["device"],
        "against": "SGLang 0.5.14's sm_120 per-slot MXFP4 GEMVs",
        "source": f"{src.relative_to(ROOT)}, from `dsv4opt bench grouped-moe`{', ' + layout if rows and 'layout' in rows[0] else ''}",
        "kernel_speedup": {str(r["concurrency"]): r["baseline_us"] / r["grouped_us"] for r in rows},
    }


def fuse_glue() -> dict | None:
    src = ROOT / "evidence/h200/optimizations/fuse_glue_h200_bench.json"
    if not src.exists():
        print(f"{src.relative_to(ROOT)}: not committed yet, fuse-glue keeps no record")
        return None
    bench = json.loads(src.read_text())
    if not bench["check"]["passed"]:
        raise SystemExit(f"{src.relative_to(ROOT)}: its correctness check failed; no record written")
    return {
        "device": bench["device"],
        "against": "the eager glue of SGLang 0.5.14's sm_120 path",
        "source": f"{src.relative_to(ROOT)}, from `dsv4opt bench fuse-glue`: one layer's glue, eager / fused",
        "kernel_speedup": bench["kernel_speedup"],
    }


if __name__ == "__main__":
    for package, record in (("mma_attn", mma_attn()), ("grouped_moe", grouped_moe()), ("fuse_glue", fuse_glue())):
        if record is None:
            continue
        path = write_json_atomic(ROOT / "dsv4opt/optimizations" / package / "measured.json", record)
        print(path.relative_to(ROOT), {k: round(v, 2) for k, v in record["kernel_speedup"].items()})
