"""Markdown tables for docs/results.md, read straight from committed profiles (no figure typed by hand).

    python scripts/results_table.py evidence/h200/profiles/embedded-*.json

1. Every profile: throughput, shares of the categories that matter, launches per step.
2. Each optimisation's saving on its target: the GPU time per step of the target (attention part
   for mma-attn, FP32 SIMT GEMM kernels for bf16-gemm, MoE kernels for grouped-moe) before and after,
   at the same settings.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.analysis.profile import Profile, is_profile_file  # noqa: E402


def key(p: Profile) -> tuple[int, int, str, int]:
    """What a profile is compared within: concurrency, context, layout and graph width (profiles from
    before those settings ran dp-ep with rows sized to the contexts)."""
    return (int(p.meta["concurrency"]), int(p.meta["context"]), p.meta.get("layout") or "dp-ep",
            int(p.meta.get("graph_context") or 0))


def variant(p: Profile) -> str:
    return "+".join(p.meta.get("optimizations") or []) or "baseline"


def ms_per_step(p: Profile, us: float) -> float:
    return us / p.steps["count"] / 1000


def part_us(p: Profile, part: str) -> float:
    return sum(r.total_us for r in p.parts or [] if r.part == part)


def lines(paths: list[str]) -> list[str]:
    """Both tables as Markdown lines; the second only where a profile has a baseline to save against."""
    profiles = [(Path(x), Profile.load(x)) for x in paths if is_profile_file(x)]
    base = {key(p): p for _, p in profiles if variant(p) == "baseline"}
    rows = sorted(profiles, key=lambda x: (key(x[1]), len(x[1].meta.get("optimizations") or []), variant(x[1])))
    out = ["| C | context | layout | graph width | variant | tokens/s | ms/step | x baseline | MoE | attention | FP32 SIMT GEMM | glue | launches/step | profile |",
           "|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for path, p in rows:
        c, ctx, layout, graph = key(p)
        tps, ms = p.throughput["tokens_per_s"], p.throughput["ms_per_step"]
        b = base.get(key(p))
        speed = f"{tps / b.throughput['tokens_per_s']:.3f}x" if b else "-"
        out.append(f"| {c} | {ctx} | {layout} | {graph or 'contexts'} | {variant(p)} | {tps:.2f} | {ms:.1f} | {speed} | "
                   f"{p.category_share('moe'):.1%} | {p.category_share('attention'):.2%} | "
                   f"{p.category_share('gemm_fp32_simt'):.2%} | {p.glue_share:.2%} | "
                   f"{p.steps['launches_per_step']:.0f} | `{path.name}` |")
    saved = []
    for path, p in rows:
        b = base.get(key(p))
        if b is None or variant(p) == "baseline":
            continue
        opts = p.meta["optimizations"]
        targets = []
        if "mma-attn" in opts:
            targets.append(("attention part (two kernel calls, merge, sink, inverse RoPE)", part_us(b, "attn"), part_us(p, "attn")))
        if "bf16-gemm" in opts:
            targets.append(("FP32 SIMT GEMM kernels", b.category_total_us("gemm_fp32_simt"), p.category_total_us("gemm_fp32_simt")))
        if "grouped-moe" in opts:
            targets.append(("MoE kernels (routed experts, router, shared expert)", b.category_total_us("moe"), p.category_total_us("moe")))
        for name, before, after in targets:
            saved.append(f"| {key(p)[0]} | {key(p)[1]} | {variant(p)} | {name} | {ms_per_step(b, before):.2f} | "
                         f"{ms_per_step(p, after):.2f} | {1 - after / before:.1%} | {b.throughput['ms_per_step']:.1f} | "
                         f"{p.throughput['ms_per_step']:.1f} |")
    if saved:
        out += ["", "| C | context | optimisation | target | target ms/step before | after | saved | ms/step before | after |",
                "|---:|---:|---|---|---:|---:|---:|---:|---:|", *saved]
    return out


def main(paths: list[str]) -> None:
    print("\n".join(lines(paths)))


if __name__ == "__main__":
    main(sys.argv[1:])
