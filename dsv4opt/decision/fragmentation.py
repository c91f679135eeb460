"""How fragmented a slice of GPU time is: launches per step and the typical launch's duration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from dsv4opt.analysis.profile import KernelRow, Profile


@dataclass(frozen=True)
class Fragmentation:
    share: float
    total_us: float
    launches: int
    launches_per_step: float
    median_kernel_us: float  # over launches, each launch counted at its kernel's mean duration
    kernels: int  # distinct kernel names

    @property
    def tiny(self) -> bool:
        """Thousands of short launches: fusing or compiling them is speculative work."""
        return self.launches_per_step >= 1000 and self.median_kernel_us < 10.0


def steps_in(profile: Profile) -> int:
    """Decode steps the profile covers (1 when unknown, so per-step figures become totals)."""
    return profile.step_count or 1


def fragmentation(profile: Profile, categories: Iterable[str],
                  keep: Callable[[KernelRow], bool] | None = None) -> Fragmentation:
    """The kernels of `categories` (those `keep` accepts, if given) as a share of the profile."""
    wanted = set(categories)
    rows = [k for k in profile.kernels if k.category in wanted and (keep is None or keep(k))]
    launches = sum(k.count for k in rows)
    total = sum(k.total_us for k in rows)
    return Fragmentation(
        share=total / profile.total_us if profile.total_us > 0 else 0.0,
        total_us=total,
        launches=launches,
        launches_per_step=launches / steps_in(profile),
        median_kernel_us=_weighted_median_mean(rows),
        kernels=len(rows),
    )


def _weighted_median_mean(rows: list[KernelRow]) -> float:
    points = sorted((k.total_us / k.count, k.count) for k in rows if k.count > 0)
    half = sum(n for _, n in points) / 2
    seen = 0
    for mean, n in points:
        seen += n
        if seen >= half:
            return mean
    return 0.0
