"""Profile several concurrencies, baseline and with optimisations, and tabulate the effect."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dsv4opt.analysis.profile import Profile
from dsv4opt.analysis.sweep import SweepRow, row_for, summary_dict, variant_name
from dsv4opt.capture.naming import profile_path
from dsv4opt.capture.result import Progress, no_progress
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.fileio import unique_path, write_json_atomic

ProfileFn = Callable[[EmbeddedSettings], tuple[Profile, Path]]


@dataclass
class SweepResult:
    rows: list[SweepRow] = field(default_factory=list)
    summary_path: Path | None = None


def sweep(
    concurrencies: list[int],
    variants: list[list[str]],
    base: EmbeddedSettings,
    *,
    out_dir: Path = Path("profiles"),
    profile_fn: ProfileFn | None = None,
    progress: Progress = no_progress,
    on_row: Callable[[SweepRow], None] = lambda r: None,
) -> SweepResult:
    """Profile the baseline and each variant (a list of optimisations) at every concurrency, each
    into a new file under out_dir; progress hears the runs done of the total."""
    if profile_fn is None:
        from dsv4opt.loop.profiles import profile_embedded

        def profile_fn(settings: EmbeddedSettings) -> tuple[Profile, Path]:
            return profile_embedded(settings, progress)

    plan = [(c, list(opts)) for c in concurrencies for opts in [[]] + [v for v in variants if v]]
    result = SweepResult()
    baselines: dict[int, Profile] = {}
    for done, (c, opts) in enumerate(plan):
        progress.runs(done, len(plan), f"C={c} {variant_name(opts)}")
        settings = dataclasses.replace(base, concurrency=c, optimizations=opts, out=_profile_file(base, c, opts, out_dir))
        profile, path = profile_fn(settings)
        baselines.setdefault(c, profile)
        row = row_for(profile, path, baselines[c])
        result.rows.append(row)
        on_row(row)
    progress.runs(len(plan), len(plan), None)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    result.summary_path = write_json_atomic(
        unique_path(Path(out_dir) / f"sweep-{stamp}.json"),
        summary_dict(result.rows),
    )
    return result


def _profile_file(base: EmbeddedSettings, concurrency: int, optimizations: list[str], out_dir: Path) -> Path:
    from dsv4opt.capture.rank_run import default_config

    config = base.config or default_config(base.device)
    return profile_path("embedded", config, concurrency, optimizations, out_dir, ranks=base.ranks)
