"""One row per profile of a sweep: throughput, attention share and speed-up over the baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4opt.analysis.categories import ATTENTION
from dsv4opt.analysis.profile import Profile


@dataclass
class SweepRow:
    concurrency: int
    variant: str  # "baseline" or "opt+opt"
    profile: str
    tokens_per_s: float | None
    ms_per_step: float | None
    attention_share: float
    top_category: str | None
    speedup: float | None  # tokens/s over the baseline at the same concurrency


def variant_name(optimizations: list[str]) -> str:
    return "+".join(optimizations) if optimizations else "baseline"


def row_for(profile: Profile, path: Path, baseline: Profile | None) -> SweepRow:
    tput = profile.throughput or {}
    base_tps = (baseline.throughput or {}).get("tokens_per_s") if baseline else None
    tps = tput.get("tokens_per_s")
    top = profile.top_category
    return SweepRow(
        concurrency=int(profile.meta.get("concurrency") or 0),
        variant=variant_name(list(profile.meta.get("optimizations") or [])),
        profile=str(path),
        tokens_per_s=tps,
        ms_per_step=tput.get("ms_per_step"),
        attention_share=profile.category_share(ATTENTION),
        top_category=top["category"] if top else None,
        speedup=(tps / base_tps) if (tps and base_tps) else None,
    )
