"""What a report says about a set of profiles: the verdict of the first against the last (the
bottleneck, and tokens/s against the measured noise), what moved most, time per step by category,
the spread of each figure, where each raw trace is, the recommendation for the last, sweep rows.
Computed here; dsv4opt/report/page.py only renders it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4opt.analysis.categories import CATEGORIES
from dsv4opt.analysis.compare import (
    Comparison, compare_profiles, kernels_summary, setting, setting_differences, sglang_path,
)
from dsv4opt.analysis.profile import GlueRegions, Profile
from dsv4opt.analysis.sweep import SweepRow, row_for, variant_name
from dsv4opt.decision.glue_plan import GluePlan, glue_of
from dsv4opt.decision.recommend import recommend


@dataclass
class Figure:
    """One measured figure of a profile with the spread it was measured with."""

    median: float | None
    low: float | None = None  # the slowest and fastest timed window; None when timed once
    high: float | None = None
    windows: int = 0


@dataclass
class TraceFile:
    role: str  # "trace" (the profiled steps) or "capture" (the eager step graph replays map to)
    path: str  # absolute
    exists: bool


@dataclass
class ProfileFacts:
    """What the page shows of one profile beyond its own rows."""

    steps: int | None  # profiled steps the kernel totals cover
    per_step: bool  # category_ms is per step (else over the whole profile: no steps marked)
    category_ms: dict[str, float]  # category -> kernel time (ms) per step
    ms_per_step: Figure
    tokens_per_s: Figure
    step_ms: list[float]  # kernel time of each profiled step, in order (empty: steps not recorded)
    step_span_ms: list[float]  # wall span of each step, where the trace has it
    traces: list[TraceFile]
    sglang_path: str | None = None  # "0.5.14 sm_120": the SGLang path it ran (None: a trace that does not say)
    layout: str | None = None


@dataclass
class Report:
    title: str
    generated: str
    names: list[str]  # one per profile, all different
    profiles: list[Profile]
    verdict: str | None
    recommendation: list[str]
    sweep_rows: list[SweepRow] = field(default_factory=list)
    glue: GlueRegions | None = None  # the last profile's glue regions
    glue_plans: list[GluePlan] = field(default_factory=list)  # what each optimisation of glue fuses of them
    facts: list[ProfileFacts] = field(default_factory=list)  # one per profile
    throughput_verdict: str | None = None  # first against last: ms/step against the measured noise
    comparison: Comparison | None = None  # first against last, when their settings match
    time_label: str = "GPU time"
    paths: list[str] = field(default_factory=list)  # the input file of each profile, as given
    sweep_names: list[str] = field(default_factory=list)  # the profile of each sweep row, by its name
    sweep_over: list[str] = field(default_factory=list)  # the name of each sweep row's speed-up reference
    mixed_paths: str | None = None  # the profiles ran different SGLang paths: said with the verdict


def label(profile: Profile, path: str) -> str:
    m = profile.meta
    if m.get("concurrency") is not None:
        return f"C={m['concurrency']} {variant_name(list(m.get('optimizations') or []))}"
    return Path(path).name


def _run_of(profile: Profile) -> str:
    """"SGLang 0.5.14 sm_120, tp4": the path and layout a profile ran, what tells two baselines apart."""
    return ", ".join(x for x in (f"SGLang {sglang_path(profile)}" if sglang_path(profile) else None,
                                 setting(profile, "layout"), kernels_summary(profile)) if x) or "-"


def distinct_names(profiles: list[Profile], paths: list[str]) -> list[str]:
    """Each profile's label ("C=4 baseline"), with the SGLang path and layout it ran when the profiles
    differ in them; where two are alike, with the file name, then the path as given where the file
    names are alike too, then the place on the command line (one file twice)."""
    base = [label(p, n) for p, n in zip(profiles, paths)]
    runs = [_run_of(p) for p in profiles]
    if len(set(runs)) > 1:
        base = [f"{b}, {r}" for b, r in zip(base, runs)]
    names = list(base)
    for more in (lambda i: Path(paths[i]).name, lambda i: paths[i], lambda i: f"#{i + 1}"):
        alike = {n for n in names if names.count(n) > 1}
        if not alike:
            break
        names = [f"{base[i]} ({more(i)})" if names[i] in alike and more(i) != base[i] else names[i]
                 for i in range(len(names))]
    return names


def build_report(paths: list[str], profiles: list[Profile], title: str = "dsv4opt report") -> Report:
    names = distinct_names(profiles, paths)
    verdict = throughput = comparison = None
    if len(profiles) >= 2:
        diffs = setting_differences(profiles[0], profiles[-1])
        if diffs:
            verdict = "first and last profile not compared: run under different settings (" + "; ".join(diffs) + ")"
        elif profiles[0].time_basis == profiles[-1].time_basis:
            comparison = compare_profiles(profiles[0], profiles[-1])
            verdict = comparison.verdict
            throughput = comparison.throughput_line()
    rec = recommend(profiles[-1]) if profiles else None
    rows, row_names, references = _sweep_rows(paths, profiles, names)
    facts = [profile_facts(p) for p in profiles]
    return Report(
        title=title,
        generated=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        names=names,
        profiles=profiles,
        verdict=verdict,
        recommendation=rec.explanation if rec else [],
        sweep_rows=rows,
        sweep_names=row_names,
        sweep_over=references,
        mixed_paths=mixed_paths(profiles, names),
        paths=list(paths),
        glue=glue_of(profiles[-1]) if profiles else None,
        glue_plans=rec.glue_plans if rec else [],
        facts=facts,
        throughput_verdict=throughput,
        comparison=comparison,
        time_label=profiles[-1].time_label if profiles else "GPU time",
    )


def mixed_paths(profiles: list[Profile], names: list[str]) -> str | None:
    """A sentence when the profiles side by side ran different SGLang paths, naming which ran which;
    None when they ran one (or do not say)."""
    by_path: dict[str, list[str]] = {}
    for p, name in zip(profiles, names):
        path = sglang_path(p) or "not recorded"
        ran = kernels_summary(p)
        by_path.setdefault(f"{path} ({ran})" if ran else path, []).append(name)
    if len(by_path) < 2:
        return None
    said = "; ".join(f"SGLang {path}: {len(group)} profile{'' if len(group) == 1 else 's'}"
                     for path, group in by_path.items())
    what = "SGLang paths" if len({sglang_path(p) for p in profiles}) > 1 else "kernels on one SGLang path"
    return (f"these profiles ran different {what} ({said}): their kernels differ, so shares and "
            "tokens/s compare within one path and kernel set only, and each speed-up below is over a profile of "
            "its own")


def profile_facts(profile: Profile) -> ProfileFacts:
    steps = profile.step_count
    scale = 1000.0 * (steps or 1)
    tput = profile.throughput or {}
    windows = [float(w) for w in tput.get("ms_per_step_windows") or []]
    recorded = [s for s in (profile.steps or {}).get("steps") or [] if isinstance(s, dict)]
    return ProfileFacts(
        steps=steps,
        per_step=steps is not None,
        category_ms={c: profile.category_total_us(c) / scale for c in CATEGORIES if profile.category_total_us(c) > 0},
        ms_per_step=_figure(tput.get("ms_per_step"), windows),
        # tokens/s goes as 1 / ms per step: the slowest window gives the lowest tokens/s
        tokens_per_s=_figure(tput.get("tokens_per_s"),
                             [tput["tokens_per_s"] * tput["ms_per_step"] / w for w in windows]
                             if tput.get("tokens_per_s") and tput.get("ms_per_step") else []),
        step_ms=[float(s.get("gpu_us") or 0.0) / 1000.0 for s in recorded],
        step_span_ms=[float(s["span_us"]) / 1000.0 for s in recorded if s.get("span_us") is not None],
        traces=_traces(profile),
        sglang_path=sglang_path(profile),
        layout=setting(profile, "layout"),
    )


def _figure(median: Any, windows: list[float]) -> Figure:
    if median is None:
        return Figure(None)
    if len(windows) < 2:
        return Figure(float(median), windows=len(windows))
    return Figure(float(median), min(windows), max(windows), len(windows))


def _traces(profile: Profile) -> list[TraceFile]:
    """The raw traces the profile was analysed from, where it names them (a profile captured without
    --trace-dir names none: its traces went with a temporary folder)."""
    out = [TraceFile("trace", str(Path(s).absolute()), Path(s).is_file()) for s in profile.meta.get("sources") or []]
    capture = profile.meta.get("capture_trace")
    if capture:
        out.append(TraceFile("capture", str(Path(capture).absolute()), Path(capture).is_file()))
    return out


def _sweep_rows(paths: list[str], profiles: list[Profile],
                names: list[str]) -> tuple[list[SweepRow], list[str], list[str]]:
    """Rows by (concurrency, variant) when the profiles carry both, and the reference of each row's
    speed-up: the first profile given at its concurrency on its SGLang path and layout, as the verdict
    takes the last over the first (so the last row at the first's C says what the verdict says); a
    profile of another path is never the reference. Where the profiles ran several paths, each row's
    variant names its path, so the chart draws one line a path."""
    keyed = [(p, path, name) for p, path, name in zip(profiles, paths, names)
             if p.meta.get("concurrency") is not None and p.throughput]
    several = len({_run_of(p) for p, _, _ in keyed}) > 1

    def key(p: Profile) -> tuple[int, str]:
        return int(p.meta["concurrency"]), _run_of(p)

    first: dict[tuple[int, str], tuple[Profile, str]] = {}
    for p, _, name in keyed:
        first.setdefault(key(p), (p, name))
    rows = []
    for p, path, name in keyed:
        row = row_for(p, Path(path), first[key(p)][0])
        if several:
            row.variant = f"{row.variant} ({_run_of(p)})"
        rows.append((row, name, first[key(p)][1]))
    rows.sort(key=lambda r: (not r[0].variant.startswith("baseline"), r[0].variant, r[0].concurrency))
    return [r for r, _, _ in rows], [n for _, n, _ in rows], [over for _, _, over in rows]
