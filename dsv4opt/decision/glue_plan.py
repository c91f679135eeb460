"""Which glue regions of a profile an optimisation fuses, what `dsv4opt glue` predicts for them,
and - given the profile after it - what it measurably saved.

A region is fused by an optimisation of glue slots when one of its source sites is a baseline
function that the optimisation's slots replace (Optimization.replaced_functions). The prediction
is the regions' own estimate (dsv4opt/analysis/glue.py); the measurement is the glue time per
step before and after, which the step's heavy kernels and their run-to-run noise do not enter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import msgspec

from dsv4opt.analysis.categories import GLUE
from dsv4opt.analysis.glue import SEP
from dsv4opt.analysis.profile import GlueRegionRow, GlueRegions, KernelRow, Profile, step_gain
from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations.registry import get

FUSE_GLUE = "fuse-glue"


def glue_of(profile: Profile) -> GlueRegions | None:
    """The profile's glue regions, None when it has none (a CPU profile, or one saved before)."""
    return profile.glue


def require_glue(profile: Profile, source: str) -> GlueRegions:
    """The glue regions, or a one-line error that says how to get them."""
    if profile.time_basis != "gpu":
        raise DsvOptError(f"{source}: ranks CPU operators (no GPU kernels in its trace); glue regions are runs of "
                          "GPU launches: profile on a GPU, or `dsv4opt analyze` a GPU trace")
    summary = glue_of(profile)
    if summary is None:
        raise DsvOptError(f"{source}: holds no glue regions (saved by an earlier dsv4opt); run `dsv4opt glue` on its "
                          "trace files instead (with --capture EAGER for a CUDA-graph replay), or profile again")
    return summary


@dataclass
class GlueKernels:
    """A profile's glue as its kernel table has it, for a profile that keeps no regions: what is
    known without the trace (which kernels, how often, how long), and what is not (their order, so
    no regions and no estimate of what fusing saves)."""

    kernels: list[KernelRow]  # the glue categories' kernels, by GPU time
    steps: int
    launches_per_step: float
    gpu_us_per_step: float
    share: float
    missing: str  # one line: what is missing and what to run instead

    def to_dict(self) -> dict:
        return {"kernels": msgspec.to_builtins(self.kernels), "steps": self.steps,
                "launches_per_step": self.launches_per_step, "gpu_us_per_step": self.gpu_us_per_step,
                "share": self.share, "missing": self.missing}


def glue_kernels(profile: Profile, source: str, profile_again: str | None) -> GlueKernels:
    """The glue kernels of a GPU profile without regions. profile_again: the command that captures
    the profile's settings again (its regions come with it), None where it cannot be told."""
    rows = [k for k in profile.kernels if k.category in GLUE]
    steps = profile.step_count or 1
    traces = list(profile.meta.get("sources") or [])
    if traces:
        todo = (f"run `dsv4opt glue` on its trace file{'s' if len(traces) > 1 else ''} ({', '.join(traces[:3])}; "
                "with --capture EAGER for a CUDA-graph replay)")
    elif profile_again:
        todo = f"on a GPU run `{profile_again}`, then `dsv4opt glue` on the profile it writes"
    else:
        todo = "profile again, then run `dsv4opt glue` on the new profile"
    missing = (f"{source}: no glue regions (written before profiles kept them; its trace was not kept): the kernels "
               f"above are its kernel table's, without the order of launches that regions and their saving need; "
               f"for them {todo}")
    return GlueKernels(kernels=rows, steps=steps, launches_per_step=sum(k.count for k in rows) / steps,
                       gpu_us_per_step=sum(k.total_us for k in rows) / steps, share=profile.glue_share,
                       missing=missing)


def _functions(where: str) -> set[str]:
    """Function names of a region's sites ('glue.py:31 moe_act_eager' -> 'moe_act_eager')."""
    return {site.rsplit(" ", 1)[-1] for site in where.split(SEP) if " " in site}


@dataclass
class GluePlan:
    """The regions `optimisation` fuses in a profile and the saving predicted for them, per step."""

    optimisation: str
    regions: list[GlueRegionRow]
    ranks: list[int]  # the regions' places (from 1) in the profile's ranking by saving
    launches_per_step: float
    launches_saved_per_step: float
    gpu_us_per_step: float
    fused_us_per_step: float
    saving_us_per_step: float
    share: float  # the regions' share of the profile's GPU time
    saving_share: float  # the predicted saving's share of the step's GPU time
    step_gain_bound: float  # 1 / (1 - saving_share): what the step can gain at most
    notes: list[str] = field(default_factory=list)
    already_on: bool = False  # the profile was taken with it on: its regions are the glue it left

    def to_dict(self) -> dict:
        return {**asdict(self), "regions": msgspec.to_builtins(self.regions)}


def glue_plan(profile: Profile, optimisation: str = FUSE_GLUE) -> GluePlan:
    summary = require_glue(profile, "profile")
    already_on = optimisation in (profile.meta.get("optimizations") or [])
    functions = set(get(optimisation).replaced_functions())
    ranks = [] if already_on else [i for i, r in enumerate(summary.regions, 1) if _functions(r.where) & functions]
    mine = [summary.regions[i - 1] for i in ranks]
    total = sum(r.gpu_us_per_step for r in mine)
    saving = sum(r.saving_us_per_step for r in mine)
    notes = []
    if already_on:
        notes.append(f"{optimisation} is already on in this profile: its regions are the glue left after it")
    elif summary.keyed_by != "source sites":
        notes.append(f"the profile's regions are keyed by {summary.keyed_by}, not source sites: which of them "
                     f"{optimisation} fuses cannot be told")
    elif not mine:
        notes.append(f"none of the profile's regions comes from the code {optimisation} replaces "
                     f"({', '.join(sorted(functions))})")
    return GluePlan(
        optimisation=optimisation, regions=mine, ranks=ranks,
        launches_per_step=sum(r.launches_per_step for r in mine),
        launches_saved_per_step=sum(r.launches_saved_per_step for r in mine),
        gpu_us_per_step=total, fused_us_per_step=sum(r.fused_us_per_step for r in mine), saving_us_per_step=saving,
        share=sum(r.share for r in mine),
        saving_share=saving / summary.step_us if summary.step_us > 0 else 0.0,
        step_gain_bound=step_gain(saving, summary.step_us),
        notes=notes, already_on=already_on,
    )


@dataclass
class GlueOutcome:
    """Before and after an optimisation of glue: the saving predicted for the regions it fuses against
    the glue time per step it removed, and the launches per step."""

    optimisation: str
    predicted_saving_us_per_step: float
    glue_us_per_step_before: float
    glue_us_per_step_after: float
    launches_per_step_before: float | None
    launches_per_step_after: float | None

    @property
    def measured_saving_us_per_step(self) -> float:
        return self.glue_us_per_step_before - self.glue_us_per_step_after

    @property
    def of_prediction(self) -> float | None:
        """Measured saving as a fraction of the predicted one."""
        p = self.predicted_saving_us_per_step
        return self.measured_saving_us_per_step / p if p > 0 else None

    def to_dict(self) -> dict:
        return {**asdict(self), "measured_saving_us_per_step": self.measured_saving_us_per_step,
                "of_prediction": self.of_prediction}


def glue_outcome(before: Profile, after: Profile, optimisation: str = FUSE_GLUE) -> GlueOutcome:
    plan = glue_plan(before, optimisation)
    b, a = require_glue(before, "the profile before"), require_glue(after, "the profile after")
    return GlueOutcome(
        optimisation=optimisation, predicted_saving_us_per_step=plan.saving_us_per_step,
        glue_us_per_step_before=b.glue_us_per_step, glue_us_per_step_after=a.glue_us_per_step,
        launches_per_step_before=(before.steps or {}).get("launches_per_step"),
        launches_per_step_after=(after.steps or {}).get("launches_per_step"),
    )
