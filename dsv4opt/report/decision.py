"""Rich renderers for checks, recommendations and sweeps."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from dsv4opt.analysis.categories import category_label
from dsv4opt.decision.diagnose import Diagnosis
from dsv4opt.decision.recommend import Recommendation
from dsv4opt.display import duration, pct, value
from dsv4opt.optimizations.registry import CheckResult, Optimization
from dsv4opt.report.layout import Column, print_notes, print_prose, print_table


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
    for note in result.notes:
        console.print(note, highlight=False)


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
    """Optimisations (switched on by `apply`) and levers (advice) apart, each ranked; risks under them."""
    columns = [Column("candidate"), Column("target"), Column("share", right=True), Column("share of", optional=True),
               Column("Amdahl\nbound", right=True), Column("launches\n/step", right=True, optional=True),
               Column("median\nkernel", right=True, optional=True), Column("risk", below=True)]
    for kind, title in (("optimisation", "Optimisations: `dsv4opt apply NAME` switches one on behind its gate"),
                        ("lever", "Levers: advice, no switch in dsv4opt")):
        rows = [[c.name + (" (on)" if c.enabled else "") + (" *" if rec.chosen is c else ""),
                 category_label(c.target), pct(c.share), c.share_of,
                 "∞" if c.amdahl_bound == float("inf") else f"{c.amdahl_bound:.2f}x",
                 f"{c.fragmentation.launches_per_step:.0f}", duration(c.fragmentation.median_kernel_us), c.risk]
                for c in rec.ranked if c.kind == kind]
        if rows:
            print_table(console, columns, rows, title=title)
    if rec.ranked:
        console.print("  * = the recommendation; Amdahl bound = the most the whole step can speed up", highlight=False)
    if rec.not_applicable:
        console.print("Not applicable here, because:", highlight=False)
        print_notes(console, [(c.name, c.why_not or "") for c in rec.not_applicable])
    for line in rec.explanation:
        print_prose(console, line)
    if rec.glue_regions:
        from dsv4opt.report.glue import plan_lines, print_regions

        print_regions(rec.glue_regions, console, f"Glue worth fusing (top {len(rec.glue_regions)}; `dsv4opt glue` "
                      "for all)")
        for plan in rec.glue_plans:
            for line in plan_lines(plan):
                console.print(f"  {line}", highlight=False)


def print_optimisations(optimisations: list[Optimization], checks: dict, enabled: list[str], gated: set[str],
                        console: Console) -> None:
    """What dsv4opt can switch on: target, env gate, latest gate verdict, whether on; what each
    replaces and risks under the table."""
    # target and verdict go under the table when they do not fit: the names and env gates stay whole
    columns = [Column("name"), Column("target", optional=True), Column("env gate"), Column("check", optional=True),
               Column("on"),
               Column("replaces", below=True), Column("risk", below=True)]
    rows = []
    for opt in optimisations:
        verdict = checks.get(opt.name)
        shown = "not run" if not verdict else f"{'passes' if verdict.passed else 'FAILS'} on {verdict.device}"
        on = "yes" if opt.name in enabled else ("env" if opt.name in gated else "no")
        rows.append([opt.name, category_label(opt.target_category), f"{opt.env_gate}=1", shown, on,
                     opt.replaces, opt.risk])
    print_table(console, columns, rows)
    if any(not checks.get(o.name) for o in optimisations):
        console.print("  not run: `dsv4opt list --check` runs every gate on this device", highlight=False)


def print_diagnosis(diag: Diagnosis, console: Console) -> None:
    console.print("[bold]Diagnosis[/]")
    for line in diag.lines():
        print_prose(console, line)


def print_sweep(rows, console: Console) -> None:
    columns = [Column("C", right=True), Column("variant"), Column("tokens/s", right=True), Column("ms/step", right=True),
               Column("speed-up", right=True), Column("attention", right=True, optional=True),
               Column("#1 category", optional=True)]
    table = [[str(r.concurrency), r.variant, value(r.tokens_per_s, ".1f"), value(r.ms_per_step, ".2f"),
              value(r.speedup, ".2f", "x"), pct(r.attention_share), category_label(r.top_category)] for r in rows]
    print_table(console, columns, table, title="Sweep (speed-up: tokens/s over the baseline at the same C)")
