"""One row per profile of a sweep: throughput, attention share and speed-up over the baseline."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from dsv4opt.analysis.categories import ATTENTION
from dsv4opt.analysis.profile import Profile
from dsv4opt.errors import DsvOptError
from dsv4opt.validate import convert

SWEEP_SCHEMA = "dsv4opt.sweep/1"


@dataclass
class SweepRow:
    concurrency: int
    variant: str  # "baseline" or "opt+opt"
    profile: str
    tokens_per_s: float | None
    ms_per_step: float | None
    attention_share: float
    top_category: str | None
    speedup: float | None  # tokens/s over the reference at the same concurrency (a sweep's: its baseline)


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
        top_category=top.category if top else None,
        speedup=(tps / base_tps) if (tps and base_tps) else None,
    )


class _Summary(msgspec.Struct):
    schema: str
    rows: list[SweepRow]


def summary_dict(rows: list[SweepRow]) -> dict[str, Any]:
    """A sweep's summary file: its rows, each naming its profile."""
    return {"schema": SWEEP_SCHEMA, "rows": [dataclasses.asdict(r) for r in rows]}


def summary_rows(data: Any, source: str) -> list[SweepRow]:
    """The rows of a sweep summary as read from `source`, checked (one line for a bad field)."""
    summary = convert(data, _Summary, source, DsvOptError)
    if summary.schema != SWEEP_SCHEMA:
        raise DsvOptError(f"{source}: schema: expected {SWEEP_SCHEMA!r}, got {summary.schema!r}")
    return summary.rows
