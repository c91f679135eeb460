"""Profile several concurrencies, baseline and with optimisations, and tabulate the effect."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dsv4opt.analysis.profile import Profile
from dsv4opt.analysis.sweep import SweepRow, row_for, summary_dict
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
        summary_dict(result.rows),
    )
    return result
