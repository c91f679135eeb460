"""What a report says about a set of profiles: the verdict of the first against the last, the
recommendation for the last, sweep rows. Computed here; dsv4opt/report/page.py only renders it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from dsv4opt.analysis.compare import compare_profiles, setting_differences
from dsv4opt.analysis.profile import Profile
from dsv4opt.analysis.sweep import SweepRow, row_for, variant_name
from dsv4opt.analysis.profile import GlueRegions
from dsv4opt.decision.glue_plan import GluePlan, glue_of
from dsv4opt.decision.recommend import recommend


@dataclass
class Report:
    title: str
    generated: str
    names: list[str]
    profiles: list[Profile]
    verdict: str | None
    recommendation: list[str]
    sweep_rows: list[SweepRow] = field(default_factory=list)
    glue: GlueRegions | None = None  # the last profile's glue regions
    glue_plans: list[GluePlan] = field(default_factory=list)  # what each optimisation of glue fuses of them


def label(profile: Profile, path: str) -> str:
    m = profile.meta
    if m.get("concurrency") is not None:
        return f"C={m['concurrency']} {variant_name(list(m.get('optimizations') or []))}"
    return Path(path).name


def build_report(paths: list[str], profiles: list[Profile], title: str = "dsv4opt report") -> Report:
    names = [label(p, n) for p, n in zip(profiles, paths)]
    verdict = None
    if len(profiles) >= 2:
        diffs = setting_differences(profiles[0], profiles[-1])
        verdict = (compare_profiles(profiles[0], profiles[-1]).verdict if not diffs else
                   "first and last profile not compared: run under different settings (" + "; ".join(diffs) + ")")
    rec = recommend(profiles[-1]) if profiles else None
    report = Report(
        title=title,
        generated=dt.datetime.now().isoformat(timespec="seconds"),
        names=names,
        profiles=profiles,
        verdict=verdict,
        recommendation=rec.explanation if rec else [],
        sweep_rows=_sweep_rows(paths, profiles),
        glue=glue_of(profiles[-1]) if profiles else None,
        glue_plans=rec.glue_plans if rec else [],
    )
    return report


def _sweep_rows(paths: list[str], profiles: list[Profile]) -> list[SweepRow]:
    """Rows by (concurrency, variant) when the profiles carry both; baseline at the same C is the reference."""
    keyed = [(p, path) for p, path in zip(profiles, paths) if p.meta.get("concurrency") is not None and p.throughput]
    baselines = {int(p.meta["concurrency"]): p for p, _ in keyed if not p.meta.get("optimizations")}
    rows = [row_for(p, Path(path), baselines.get(int(p.meta["concurrency"]))) for p, path in keyed]
    return sorted(rows, key=lambda r: (r.variant != "baseline", r.variant, r.concurrency))


