"""Rich rendering of a profile's glue regions (dsv4opt/analysis/glue.py) and of what an optimisation
of glue fuses of them (dsv4opt/decision/glue_plan.py): renderers only."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dsv4opt.analysis.profile import GlueRegionRow, GlueRegions
from dsv4opt.decision.glue_plan import GlueKernels, GlueOutcome, GluePlan
from dsv4opt.display import count, duration


def share_text(x: float | None) -> str:
    """Shares of GPU time, with the precision a small share needs."""
    if x is None:
        return ""
    if x >= 0.1:
        return f"{100 * x:.1f}%"
    if x >= 0.0001:
        return f"{100 * x:.2f}%"
    return "<0.01%" if x > 0 else "0%"


def bytes_text(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def launches_text(r: GlueRegionRow) -> str:
    now, fused = r.launches_per_step, r.launches_per_step - r.launches_saved_per_step
    return f"{now:.0f}→{fused:.0f}"


def print_regions(regions: list[GlueRegionRow], console: Console, title: str) -> None:
    """Numbers first, in columns that never cut them (80 columns suffice); where each region comes
    from on its own line below."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    num = {"justify": "right", "no_wrap": True}
    for col, kw in (("#", num), ("part", {"overflow": "fold", "max_width": 12}), ("launches", num),
                    ("GPU/step", num), ("share", num), ("median", num), ("fused", num), ("saves", num)):
        table.add_column(col, **kw)
    for i, r in enumerate(regions, 1):
        table.add_row(str(i), escape(r.part or "-"), launches_text(r), duration(r.gpu_us_per_step), share_text(r.share),
                      duration(r.median_kernel_us), duration(r.fused_us_per_step), duration(r.saving_us_per_step))
    console.print(table)
    console.print("  launches: per step now → fused (one per region instance); fused: the estimate; saves: GPU time "
                  "per step", highlight=False)
    for line in region_lines(regions):
        console.print(f"  {escape(line)}", highlight=False)


def region_lines(regions: list[GlueRegionRow]) -> list[str]:
    """One line per region: where it comes from, how often, and what its estimate rests on."""
    lines = []
    for i, r in enumerate(regions, 1):
        moved = f"; moves {bytes_text(r.bytes_per_step)}/step" if r.bytes_per_step is not None else ""
        what = f"{r.instances_per_step:.0f}x/step, estimate: {r.estimate}{moved}"
        lines.append(f"#{i} {r.part or '-'}: {r.where} ({what})")
    return lines


def header_lines(summary: GlueRegions) -> list[str]:
    s = summary
    saved = s.saving_us_per_step / s.step_us if s.step_us > 0 else 0.0
    lines = [
        f"glue: {s.glue_launches_per_step:.0f} launches/step, {duration(s.glue_us_per_step)}/step = "
        f"{share_text(s.glue_share)} of GPU time, over {count(s.steps, 'step')}; regions keyed by {s.keyed_by}",
        f"fusing every region would save at most {duration(s.saving_us_per_step)}/step ({share_text(saved)} of the step's "
        f"GPU time): the step gains at most {s.step_gain_bound:.4f}x, whatever the launches saved",
        f"launch floor {duration(s.launch_floor_us)} ({s.floor_from})"
        + (f"; bytes at {s.copy_gbps:.0f} GB/s" if s.copy_gbps else ""),
    ]
    if s.in_heavy_calls["launches_per_step"]:
        lines.append(f"not in any region: {s.in_heavy_calls['launches_per_step']:.0f} glue launches/step "
                     f"({duration(s.in_heavy_calls['gpu_us_per_step'])}) made by a heavy kernel's own call")
    return lines + list(s.notes)


def print_glue(summary: GlueRegions, console: Console, top: int = 15, plan: GluePlan | None = None) -> None:
    """The regions ranked by what fusing saves, numbers first (never cut), where they come from below."""
    for line in header_lines(summary):
        console.print(escape(line), highlight=False)
    if not summary.regions:
        console.print("no glue regions")
        return
    print_regions(summary.regions[:top], console, f"glue regions by saving, top {min(top, len(summary.regions))}")
    if summary.rest["regions"]:
        console.print(f"  and {summary.rest['regions']:.0f} more regions: {summary.rest['launches_per_step']:.0f} "
                      f"launches, {duration(summary.rest['gpu_us_per_step'])}/step", highlight=False)
    if plan is not None:
        for line in plan_lines(plan):
            console.print(escape(line), highlight=False)


def print_glue_kernels(glue: GlueKernels, console: Console, top: int = 15) -> None:
    """A profile without regions: its glue kernels by time per step (numbers first, names below),
    then the one line that says what is missing and how to get it."""
    console.print(f"glue: {glue.launches_per_step:.0f} launches/step, {duration(glue.gpu_us_per_step)}/step = "
                  f"{share_text(glue.share)} of GPU time, over {count(glue.steps, 'step')}; no regions, only the kernel table",
                  highlight=False)
    shown = glue.kernels[:top]
    if shown:
        table = Table(title=f"glue kernels by GPU time, top {len(shown)}", box=box.SIMPLE_HEAD, pad_edge=False,
                      title_justify="left")
        num = {"justify": "right", "no_wrap": True}
        for col, kw in (("#", num), ("category", {"no_wrap": True}), ("part", {"overflow": "fold", "max_width": 12}),
                        ("launches/step", num), ("GPU/step", num), ("share", num), ("mean", num)):
            table.add_column(col, **kw)
        for i, k in enumerate(shown, 1):
            table.add_row(str(i), k.category_label, escape(k.part or "-"), f"{k.count / glue.steps:.0f}",
                          duration(k.total_us / glue.steps), share_text(k.share), duration(k.mean_us))
        console.print(table)
        for i, k in enumerate(shown, 1):
            where = f" ({k.source})" if k.source else ""
            console.print(f"  #{i} {escape(k.display_name)}{escape(where)}", highlight=False)
    console.print(escape(glue.missing), soft_wrap=True, highlight=False)  # one line: the command stays whole


def plan_lines(plan: GluePlan) -> list[str]:
    if plan.already_on:
        return list(plan.notes)
    if not plan.regions:
        return [f"{plan.optimisation}: " + ("; ".join(plan.notes) or "fuses none of these regions")]
    ids = ", ".join(f"#{i}" for i in plan.ranks)
    return [
        f"{plan.optimisation} fuses {len(plan.regions)} of the regions ({ids}): {plan.launches_per_step:.0f} → "
        f"{plan.launches_per_step - plan.launches_saved_per_step:.0f} launches/step, predicted to save "
        f"{duration(plan.saving_us_per_step)}/step ({share_text(plan.saving_share)} of GPU time): the step gains at most "
        f"{plan.step_gain_bound:.4f}x",
        *plan.notes,
    ]


def outcome_line(outcome: GlueOutcome) -> str:
    frac = outcome.of_prediction
    launches = ""
    if outcome.launches_per_step_before and outcome.launches_per_step_after:
        launches = f"; launches/step {outcome.launches_per_step_before:.0f} → {outcome.launches_per_step_after:.0f}"
    return (f"{outcome.optimisation}: glue {duration(outcome.glue_us_per_step_before)} → {duration(outcome.glue_us_per_step_after)}"
            f"/step, saved {duration(outcome.measured_saving_us_per_step)}/step against "
            f"{duration(outcome.predicted_saving_us_per_step)} predicted"
            + (f" ({frac:.0%} of the prediction)" if frac is not None else "") + launches)
