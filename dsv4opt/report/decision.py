"""Rich renderers for checks, recommendations and sweeps."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from dsv4opt.analysis.categories import category_label
from dsv4opt.decision.diagnose import Diagnosis
from dsv4opt.decision.recommend import Recommendation
from dsv4opt.display import pct, value
from dsv4opt.optimizations.registry import CheckResult


def print_check(result: CheckResult, console: Console) -> None:
    colour = "green" if result.passed else "red"
    console.print(f"[bold]{result.name}[/] check on {result.device}: [{colour}]{'passed' if result.passed else 'FAILED'}[/]")
    table = Table("figure", "measured", "bound", "of bound", box=None, pad_edge=False)
    for key, figure in result.figures.items():
        bound = result.bounds.get(key)
        table.add_row(key, _num(figure), _num(bound) if bound is not None else "", _share(figure, bound))
    if result.figures:
        console.print(table)
    console.print(result.summary, highlight=False)


def _share(figure, bound) -> str:
    """How much of its bound a figure uses: a percentage up to 10x, then a multiple."""
    if bound is None or not isinstance(figure, (int, float)):
        return ""
    if bound == 0:
        return pct(0.0) if figure == 0 else "over"
    share = figure / bound
    return pct(share) if share < 10 else f"{share:.3g}x"


def _num(figure) -> str:
    return value(figure, ".4g") if isinstance(figure, float) else value(figure)


def print_recommendation(rec: Recommendation, console: Console) -> None:
    table = Table("candidate", "kind", "target", "share", "Amdahl bound", "launches/step", "median µs", "risk",
                  title="Candidates", title_justify="left")
    for c in rec.candidates:
        name = c.name + (" (on)" if c.enabled else "") + (" *" if rec.chosen is c else "")
        bound = "∞" if c.amdahl_bound == float("inf") else f"{c.amdahl_bound:.2f}x"
        table.add_row(name, c.kind, category_label(c.target), pct(c.share), bound,
                      f"{c.fragmentation.launches_per_step:.0f}", f"{c.fragmentation.median_kernel_us:.1f}", c.risk)
    console.print(table)
    console.print("  * = the recommendation; kind 'optimisation': `dsv4opt apply NAME` switches it on behind "
                  "its gate; 'lever': advice, no switch in dsv4opt", highlight=False)
    for line in rec.explanation:
        console.print(f"  {line}", highlight=False)
    if rec.glue_regions:
        from dsv4opt.report.glue import plan_lines, print_regions

        print_regions(rec.glue_regions, console, f"Glue worth fusing (top {len(rec.glue_regions)}; `dsv4opt glue` "
                      "for all)")
        for plan in rec.glue_plans:
            for line in plan_lines(plan):
                console.print(f"  {line}", highlight=False)


def print_diagnosis(diag: Diagnosis, console: Console) -> None:
    console.print("[bold]Diagnosis[/]")
    for line in diag.lines():
        console.print(f"  {line}", highlight=False)


def print_sweep(rows, console: Console) -> None:
    table = Table("C", "variant", "tokens/s", "ms/step", "attention", "#1 category", "speed-up", title="Sweep",
                  title_justify="left")
    for r in rows:
        table.add_row(str(r.concurrency), r.variant, value(r.tokens_per_s, ".1f"), value(r.ms_per_step, ".2f"),
                      pct(r.attention_share), category_label(r.top_category), value(r.speedup, ".2f", "x"))
    console.print(table)
