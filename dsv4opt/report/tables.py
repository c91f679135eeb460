"""Rich tables for a profile and a comparison (renderers only: no analysis happens here)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dsv4opt.analysis.categories import GLUE, category_label
from dsv4opt.display import duration, pct
from dsv4opt.report.layout import Column, clip, print_table


def headline(profile) -> str | None:
    """"#1 category X 12.3%; #1 kernel Y 4.5%", or None for a profile with no kernels."""
    top_c, top_k = profile.top_category, profile.top_kernel
    if top_c is None or top_k is None:
        return None
    return f"#1 category {top_c.label} {pct(top_c.share)}; #1 kernel {top_k.display_name} {pct(top_k.share)}"


def print_profile(profile, top: int = 15, console: Console | None = None) -> None:
    """Top kernels (with who launched them), categories with the glue roll-up, steps, parts, ranks."""
    console = console or Console()
    cpu = profile.time_basis == "cpu_self"
    basis = "CPU self time (no GPU events in the trace)" if cpu else "GPU time"
    src = ", ".join((profile.meta.get("sources") or [])[:3]) or "profile"
    console.print(f"[bold]{escape(src)}[/]  {escape(str(profile.meta.get('device') or ''))}  "
                  f"{basis}: {duration(profile.total_us)}, {sum(k.count for k in profile.kernels)} {'calls' if cpu else 'launches'}")
    if not profile.kernels:
        console.print("no kernels in this profile")
        return
    # the totals cover every profiled step: say how many
    span = f"totals over {profile.step_count} profiled steps" if profile.step_count else "totals over the whole trace"
    t = Table(title=f"top {min(top, len(profile.kernels))} {'CPU operators' if cpu else 'kernels'} by {basis} ({span})",
              box=box.SIMPLE_HEAD, pad_edge=False)
    # Numbers never wrap; on a narrow terminal the names give way (ellipsis) and attribution moves
    # below the table, rather than the figures being squeezed.
    wide = console.width >= 120
    num = {"justify": "right", "no_wrap": True}
    columns = [("#", num), ("share", num), ("total", num), ("calls" if cpu else "launches", num), ("mean", num),
               ("category", {"no_wrap": True}),
               ("name", {"no_wrap": True})]
    name_width = 56 if wide else max(16, console.width - 64)
    if wide:
        columns.append(("launched by", {"overflow": "fold", "max_width": 40}))
    for col, kw in columns:
        t.add_column(col, **kw)
    notes = []
    for i, k in enumerate(profile.kernels[:top], 1):
        who = " ".join(x for x in (f"[{k.part}]" if k.part else None, k.launched_by, k.source) if x)
        if k.graph_replay_share:
            who += f" [graph replay {pct(k.graph_replay_share)}]"
        row = [str(i), pct(k.share), duration(k.total_us), str(k.count), duration(k.mean_us),
               k.category_label, escape(clip([k.display_name], name_width)[0])]
        if wide:
            row.append(escape(who))
        elif who and i <= 5:
            notes.append(f"  #{i} launched by {escape(who)}")
        t.add_row(*row)
    console.print(t)
    for line in notes:
        console.print(line, highlight=False)
    if profile.categories:
        c = Table(title=f"categories ({span})")
        for col in ("category", "share", "total", "calls" if cpu else "launches"):
            c.add_column(col, justify="left" if col == "category" else "right")
        # the glue categories last, so the glue row sums the rows right above it
        glue = sorted((r for r in profile.categories if r.category in GLUE), key=lambda r: -r.total_us)
        rows = sorted((r for r in profile.categories if r.category not in GLUE), key=lambda r: -r.total_us) + glue
        for i, row in enumerate(rows):
            c.add_row(row.label, pct(row.share), duration(row.total_us), str(row.count), end_section=i == len(rows) - 1)
        if glue:
            c.add_row(f"glue: sum of the {len(glue)} rows above", pct(sum(r.share for r in glue)),
                      duration(sum(r.total_us for r in glue)), str(sum(r.count for r in glue)))
        console.print(c)
    if profile.steps:
        s = profile.steps
        console.print(f"steps ({escape(s.get('source', ''))}): {s['count']}, {profile.time_label}/step "
                      f"{duration(s['gpu_us_per_step'])}, {'calls' if cpu else 'launches'}/step {s['launches_per_step']:.0f}, "
                      f"median {'call' if cpu else 'kernel'} {duration(s.get('median_kernel_us'))}", highlight=False)
    match = profile.capture_match
    if match and match.replayed:
        console.print(f"graph-replayed launches matched to the reference step: {match.matched}/{match.replayed} "
                      f"({match.matched / match.replayed:.1%}); parts and operators of the rest are unknown")
    if profile.throughput:
        t = profile.throughput
        line = "throughput: " + ", ".join(f"{label} {t[k]:.2f}" for k, label in (("tokens_per_s", "tokens/s"), ("ms_per_step", "ms/step"))
                                          if t.get(k) is not None)
        windows = t.get("ms_per_step_windows") or []
        if len(windows) >= 2:
            line += f" (median of {len(windows)} timed windows, {min(windows):.2f}-{max(windows):.2f} ms/step)"
        elif t.get("ms_per_step") is not None:
            line += " (spread unknown: timed once)"
        console.print(line, highlight=False)
    if profile.parts:
        p = Table(title="model parts (record_function ranges)")
        for col in ("part", "share", "total", "launches"):
            p.add_column(col, justify="left" if col == "part" else "right")
        for row in profile.parts[:top]:
            p.add_row(escape(row.part), pct(row.share), duration(row.total_us), str(row.count))
        console.print(p)
    from dsv4opt.report.rank_balance import print_rank_balance

    print_rank_balance(profile, console)


def print_comparison(comparison, console: Console | None = None) -> None:
    """Category shares before/after (glue summed under its rows), what moved most per step, #1
    kernel/category, throughput against the measured noise, verdict."""
    console = console or Console()
    basis = "CPU self time" if comparison.time_basis == "cpu_self" else "GPU time"
    glue = [r for r in comparison.categories if r["category"] in GLUE]
    rows = [[category_label(r["category"]), pct(r["share_a"]), pct(r["share_b"]), f"{100 * r['delta']:+.1f} pt"]
            for r in comparison.categories]
    if glue:
        a, b = sum(r["share_a"] for r in glue), sum(r["share_b"] for r in glue)
        rows.append([f"glue: sum of the {len(glue)} rows above", pct(a), pct(b), f"{100 * (b - a):+.1f} pt"])
    print_table(console, [Column("category"), Column("before", right=True), Column("after", right=True),
                          Column("change", right=True)], rows, title=f"categories, share of {basis}: before -> after")
    if comparison.moved:
        steps_a, steps_b = comparison.steps.get("a"), comparison.steps.get("b")
        per_step = bool(steps_a and steps_b)
        scale_a, scale_b = (steps_a, steps_b) if per_step else (1, 1)
        what = "CPU operators" if comparison.time_basis == "cpu_self" else "kernels"
        span = (f"{basis} per step" if per_step else f"{basis}, whole profile (the trace marks no steps)")
        rows = [[r["short_name"], category_label(r["category"]), duration(r["total_us_a"] / scale_a),
                 duration(r["total_us_b"] / scale_b), duration(r["total_us_b"] / scale_b - r["total_us_a"] / scale_a)]
                for r in comparison.moved]
        print_table(console, [Column(what[:-1], shrink=True), Column("category"), Column("before", right=True),
                              Column("after", right=True), Column("change", right=True)], rows,
                    title=f"{what} that moved most ({span})")
    for which, label in (("a", "before"), ("b", "after")):
        k = comparison.top_kernel.get(which)
        cat = comparison.top_category.get(which)
        if k and cat:
            console.print(f"{label}: #1 kernel {escape(k['short_name'])} {pct(k['share'])}; "
                          f"#1 category {category_label(cat['category'])} {pct(cat['share'])}", highlight=False)
    for line in throughput_lines(comparison):
        console.print(line, highlight=False)
    console.print(f"[bold]{escape(comparison.verdict)}[/]", highlight=False)


def throughput_lines(comparison) -> list[str]:
    """tokens/s and ms/step before -> after with the verdict against the noise, then the kernel
    time per step: one line each, every figure once."""
    lines = []
    tput = comparison.throughput or {}
    change = comparison.change
    if change is not None:
        tps = tput.get("tokens_per_s")
        head = f"tokens/s {tps['a']:.2f} -> {tps['b']:.2f}, " if tps else ""
        lines.append(head + change.line())
    per_step = tput.get("gpu_us_per_step")
    if per_step:
        basis = "CPU self time" if comparison.time_basis == "cpu_self" else "GPU kernel time"
        lines.append(f"{basis} per profiled step: {duration(per_step['a'])} -> {duration(per_step['b'])}")
    return lines
