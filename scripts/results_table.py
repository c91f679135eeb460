"""Markdown tables for docs/results.md, read straight from committed profiles (no figure typed by hand).

    python scripts/results_table.py profiles/sweep/*.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.analysis.categories import LABELS  # noqa: E402
from dsv4opt.analysis.profile import Profile, is_profile_file  # noqa: E402
from dsv4opt.decision.fragmentation import fragmentation, steps_in  # noqa: E402
from dsv4opt.analysis.categories import GLUE  # noqa: E402


def main(paths: list[str]) -> None:
    profiles = [(Path(p), Profile.load(p)) for p in paths if is_profile_file(p)]
    base = {int(p.meta["concurrency"]): p for _, p in profiles if not p.meta.get("optimizations")}
    rows = sorted(profiles, key=lambda x: (len(x[1].meta.get("optimizations") or []),
                                           "+".join(x[1].meta.get("optimizations") or []),
                                           int(x[1].meta["concurrency"])))
    print("| C | variant | tokens/s | ms/step | x baseline | attention | FP32 SIMT GEMM | glue | launches/step | #1 category | #1 kernel | profile |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    for path, p in rows:
        c = int(p.meta["concurrency"])
        variant = "+".join(p.meta.get("optimizations") or []) or "baseline"
        tps, ms = p.throughput["tokens_per_s"], p.throughput["ms_per_step"]
        b = base.get(c)
        speed = f"{tps / b.throughput['tokens_per_s']:.2f}x" if b else "-"
        launches = sum(k["count"] for k in p.kernels) / steps_in(p)
        top_c, top_k = p.top_category, p.top_kernel
        print(f"| {c} | {variant} | {tps:.1f} | {ms:.2f} | {speed} | {p.category_share('attention'):.1%} | "
              f"{p.category_share('gemm_fp32_simt'):.1%} | {fragmentation(p, GLUE).share:.1%} | {launches:.0f} | "
              f"{LABELS[top_c['category']]} {top_c['share']:.1%} | {top_k.get('short_name') or top_k['name']} "
              f"{top_k['share']:.1%} | `{path}` |")


if __name__ == "__main__":
    main(sys.argv[1:])
