"""Profile several concurrencies, baseline and with optimisations, and tabulate the effect."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dsv4opt.analysis.categories import ATTENTION
from dsv4opt.analysis.profile import Profile
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.fileio import unique_path, write_json_atomic

SWEEP_SCHEMA = "dsv4opt.sweep/1"
ProfileFn = Callable[[EmbeddedSettings], tuple[Profile, Path]]


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


@dataclass
class SweepResult:
    rows: list[SweepRow] = field(default_factory=list)
    summary_path: Path | None = None
    chart_path: Path | None = None


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


def sweep(
    concurrencies: list[int],
    variants: list[list[str]],
    base: EmbeddedSettings,
    *,
    out_dir: Path = Path("profiles"),
    profile_fn: ProfileFn,
    on_row: Callable[[SweepRow], None] = lambda r: None,
) -> SweepResult:
    """Profile the baseline and each variant (a list of optimisations) at every concurrency."""
    result = SweepResult()
    for c in concurrencies:
        baseline = None
        for opts in [[]] + [v for v in variants if v]:
            settings = dataclasses.replace(base, concurrency=c, optimizations=list(opts), out=None)
            profile, path = profile_fn(settings)
            baseline = baseline or profile
            row = row_for(profile, path, baseline)
            result.rows.append(row)
            on_row(row)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    result.summary_path = write_json_atomic(
        unique_path(out_dir / f"sweep-{stamp}.json"),
        {"schema": SWEEP_SCHEMA, "rows": [dataclasses.asdict(r) for r in result.rows]},
    )
    from dsv4opt.report.plots import throughput_chart_png

    png = throughput_chart_png(result.rows)
    if png is not None:
        from dsv4opt.fileio import write_bytes_atomic

        result.chart_path = write_bytes_atomic(result.summary_path.with_suffix(".png"), png)
    return result
