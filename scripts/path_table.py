"""Markdown tables for one SGLang path's profiles, read straight from committed profiles: each
baseline's throughput, launches, category and part shares, and its step's bytes floor
(dsv4opt/workload/floor.py) with the fraction of it reached; then every profile of the loop.

    python scripts/path_table.py evidence/h200/profiles/hopper-0.5.23/*.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.analysis.profile import Profile, is_profile_file  # noqa: E402
from dsv4opt.workload.config import ModelConfig  # noqa: E402
from dsv4opt.workload.floor import fp8_weight_bytes, step_floor  # noqa: E402
from dsv4opt.workload.paths import ran_fp8_wo_a  # noqa: E402

HBM_GBS = 4800  # H200 SXM: the peak the profiles' efficiency tables use
CATEGORIES = (("moe", "MoE"), ("gemm_tc", "tensor-core GEMM"), ("attention", "attention"))


def variant(p: Profile) -> str:
    return "+".join(p.meta.get("optimizations") or []) or "baseline"


def floor_ms(p: Profile) -> tuple[float, dict]:
    m = p.meta
    cfg = ModelConfig.from_name(m["config"]).with_layers(m["layers"])
    f = step_floor(cfg, m["layout"], m["contexts"], fp8_wo_a=ran_fp8_wo_a(m))
    return f.ms(HBM_GBS), f.parts


def lines(paths: list[str]) -> list[str]:
    out: list[str] = []
    profiles = sorted((Profile.load(x) for x in paths if is_profile_file(x)),
                      key=lambda p: (int(p.meta["concurrency"]), len(p.meta.get("optimizations") or [])))
    out.append("| C | tokens/s | ms/step | launches/step | " + " | ".join(n for _, n in CATEGORIES) +
               " | glue | top parts | bytes floor (ms) | of floor |")
    out.append("|---:|---:|---:|---:|" + "---:|" * len(CATEGORIES) + "---:|---|---:|---:|")
    for p in profiles:
        if variant(p) != "baseline":
            continue
        ms = p.throughput["ms_per_step"]
        floor, _ = floor_ms(p)
        parts = sorted(p.parts or [], key=lambda r: -r.total_us)
        total = sum(r.total_us for r in parts) or 1.0
        top = ", ".join(f"{r.part} {r.total_us / total:.0%}" for r in parts[:3])
        shares = " | ".join(f"{p.category_share(c):.1%}" for c, _ in CATEGORIES)
        out.append(f"| {p.meta['concurrency']} | {p.throughput['tokens_per_s']:.1f} | {ms:.2f} | "
                   f"{p.steps['launches_per_step']:.0f} | {shares} | {p.glue_share:.1%} | {top} | {floor:.2f} | {floor / ms:.0%} |")
    out.append("")
    out.append("| C | profile | tokens/s | x baseline | ms/step | of floor |")
    out.append("|---:|---|---:|---:|---:|---:|")
    base = {p.meta["concurrency"]: p for p in profiles if variant(p) == "baseline"}
    for p in profiles:
        b = base.get(p.meta["concurrency"])
        x = p.throughput["tokens_per_s"] / b.throughput["tokens_per_s"] if b else float("nan")
        ms = p.throughput["ms_per_step"]
        out.append(f"| {p.meta['concurrency']} | {variant(p)} | {p.throughput['tokens_per_s']:.1f} | {x:.3f}x | {ms:.2f} | "
                   f"{floor_ms(p)[0] / ms:.0%} |")
    out.append("")
    for p in profiles:
        if variant(p) == "baseline":
            floor, parts = floor_ms(p)
            out.append(f"- C = {p.meta['concurrency']}: floor {floor:.2f} ms = " +
                       ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in parts.items()))
    out.append("")
    for p in profiles:  # the block-FP8 GEMM (DeepGEMM's stand-in on the Hopper path) against its weights
        gemm = [k for k in p.kernels if k.name == "_block_fp8_matmul_kernel"]
        if variant(p) != "baseline" or not gemm:
            continue
        m = p.meta
        cfg = ModelConfig.from_name(m["config"]).with_layers(m["layers"])
        nbytes = fp8_weight_bytes(cfg, m["layout"], ran_fp8_wo_a(m))
        us = gemm[0].total_us / p.steps["count"]
        out.append(f"- C = {m['concurrency']}: block-FP8 GEMM {us / 1e3:.2f} ms a step ({gemm[0].share:.1%}) for "
                   f"{nbytes / 1e9:.2f} GB of FP8 weights: {nbytes / us / 1e3:.0f} GB/s, {nbytes / us / 1e3 / HBM_GBS:.0%} of HBM")
    return out


def main(paths: list[str]) -> None:
    print("\n".join(lines(paths)))


if __name__ == "__main__":
    main(sys.argv[1:])
