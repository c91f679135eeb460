"""Rich tables for a profile and a comparison (renderers only: no analysis happens here)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.segment import Segments
from rich.table import Table

from dsv4opt.analysis.busy import timeline_summary, whole_trace
from dsv4opt.analysis.categories import GLUE, category_label
from dsv4opt.analysis.names import long_name
from dsv4opt.display import MISSING, change, count, duration, pct, value
from dsv4opt.report.fit import distinct_labels
from dsv4opt.report.layout import Column, natural_width, print_table


def headline(profile) -> str | None:
    """"#1 category X 12.3%; #1 kernel Y 4.5%", or None for a profile with no kernels."""
    top_c, top_k = profile.top_category, profile.top_kernel
    if top_c is None or top_k is None:
        return None
    what = "CPU operator" if profile.time_basis == "cpu_self" else "kernel"  # a CPU profile ranks operators
    return f"#1 category {top_c.label} {pct(top_c.share)}; #1 {what} {top_k.display_name} {pct(top_k.share)}"


# Separators a rich table with box.SIMPLE_HEAD and pad_edge=False adds around n columns: a space
# at each edge, and between two columns a padding space each side of a one-space rule.
def _table_overhead(columns: int) -> int:
    return 2 + 3 * (columns - 1)


def _table(title: str) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")


# The width --wide lays tables out at: room for any name whole.
WIDE = 10_000


def _fit(table: Table, rows: list[list[str]], headers: list[str], text_columns: dict[int, list[str]],
         width: int, floor: int = 12) -> list[list[str]]:
    """Give every column but the text ones the width its widest cell needs, and the text columns
    (index -> the full texts, with their keys) what is left, shortened so different entries stay
    different. Figures are never cut; a name is (but not at width WIDE)."""
    fixed = [max([len(headers[c])] + [len(r[c]) for r in rows]) for c in range(len(headers))]
    spare = width - _table_overhead(len(headers)) - sum(w for c, w in enumerate(fixed) if c not in text_columns)
    share = max(floor, spare // max(1, len(text_columns)))
    out = [list(r) for r in rows]
    for c, (texts, keys, fuller) in text_columns.items():
        # wide: no cut, and a column as wide as its labels (fuller ones where short names clash)
        labels = distinct_labels(texts, width if width >= WIDE else min(fixed[c], share), keys=keys, fuller=fuller)
        for r, label in zip(out, labels):
            r[c] = label
        if width >= WIDE:
            fixed[c] = max([fixed[c]] + [len(label) for label in labels])
    for c, h in enumerate(headers):
        justify = "left" if c in text_columns or not rows or not _numeric(rows[0][c]) else "right"
        w = min(fixed[c], share) if c in text_columns else fixed[c]
        table.add_column(h, justify=justify, no_wrap=True, min_width=w, max_width=w)
    if table.title and width < WIDE:  # a title wider than its table would wrap
        table.min_width = min(len(str(table.title)), width)
    return out


def _show(console: Console, table: Table, width: int) -> None:
    """Print a table laid out for `width`: one wider than the console (--wide) is printed whole, its
    lines as long as they need (a terminal wraps them, a file keeps them)."""
    if width <= console.width:
        console.print(table)
        return
    needed = console.measure(table, options=console.options.update(width=width)).maximum
    console.print(Segments(console.render(table, console.options.update(width=needed))), crop=False)


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "-+" or cell == MISSING)


def _names(kernels) -> tuple[list[str], list[str], list[str]]:
    return ([k.display_name for k in kernels], [k.name for k in kernels], [long_name(k.name) for k in kernels])


def print_profile(profile, top: int = 15, console: Console | None = None, wide: bool = False,
                  name: str | None = None) -> None:
    """Top kernels, who launched them, categories with the glue roll-up, steps, GPU busy/idle and
    overlap, efficiency where shapes were recorded, parts, ranks. Fits the console's width: figures
    are never cut, names are shortened so different kernels stay different; `wide` keeps every name
    whole (the lines as long as they need) and lists the trace's own names under the table. `name`:
    what to call the profile in the heading (its file), else its trace files."""
    console = console or Console()
    width = WIDE if wide else console.width
    cpu = profile.time_basis == "cpu_self"
    basis = "CPU self time (no GPU events in the trace)" if cpu else "GPU time"
    src = name or ", ".join((profile.meta.get("sources") or [])[:3]) or "profile"
    console.print(f"[bold]{escape(src)}[/]  {escape(str(profile.meta.get('device') or ''))}  "
                  f"{basis}: {duration(profile.total_us)}, {sum(k.count for k in profile.kernels)} {'calls' if cpu else 'launches'}")
    if not profile.kernels:
        console.print("no kernels in this profile")
        return
    shown = profile.kernels[:top]
    # the totals cover every profiled step: say how many
    span = f"totals over {count(profile.step_count, 'profiled step')}" if profile.step_count else "totals over the whole trace"
    spread = width >= 120 and not cpu and any(k.p90_us is not None for k in shown)
    headers = ["#", "share", "total", "calls" if cpu else "launches", "mean"] + (["p90", "max"] if spread else []) + ["category", "name"]
    rows = [[str(i), pct(k.share), duration(k.total_us), str(k.count), duration(k.mean_us)]
            + ([duration(k.p90_us), duration(k.max_us)] if spread else []) + [k.category_label, k.display_name]
            for i, k in enumerate(shown, 1)]
    t = _table(f"top {len(shown)} {'CPU operators' if cpu else 'kernels'} by {basis} ({span})")
    fitted = _fit(t, rows, headers, {len(headers) - 1: _names(shown)}, width)
    for row in fitted:
        t.add_row(*map(escape, row))
    _show(console, t, width)
    _print_full_names(shown, [r[-1] for r in fitted], wide, console)
    _print_launchers(shown, width, console)
    if profile.categories:
        c = _table(f"categories ({span})")
        # the glue categories last, so the glue row sums the rows right above it
        glue = sorted((r for r in profile.categories if r.category in GLUE), key=lambda r: -r.total_us)
        ordered = sorted((r for r in profile.categories if r.category not in GLUE), key=lambda r: -r.total_us) + glue
        rows = [[row.label, pct(row.share), duration(row.total_us), str(row.count)] for row in ordered]
        if glue:
            rows.append([f"glue: sum of the {len(glue)} rows above", pct(sum(r.share for r in glue)),
                         duration(sum(r.total_us for r in glue)), str(sum(r.count for r in glue))])
        for i, row in enumerate(_fit(c, rows, ["category", "share", "total", "calls" if cpu else "launches"], {}, width)):
            c.add_row(*row, end_section=bool(glue) and i == len(ordered) - 1)
        _show(console, c, width)
    if profile.steps:
        s = profile.steps
        console.print(f"steps ({escape(s.get('source', ''))}): {s['count']}, {profile.time_label}/step "
                      f"{duration(s['gpu_us_per_step'])}, {'calls' if cpu else 'launches'}/step {s['launches_per_step']:.0f}, "
                      f"median {'call' if cpu else 'kernel'} {duration(s.get('median_kernel_us'))}", highlight=False)
    _print_timeline(profile, width, console)
    _print_efficiency(profile, top, width, console)
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
        p = _table("model parts (record_function ranges)")
        parts = profile.parts[:top]
        names = [row.part for row in parts]
        rows = [[row.part, pct(row.share), duration(row.total_us), str(row.count)] for row in parts]
        for row in _fit(p, rows, ["part", "share", "total", "launches"], {0: (names, names, None)}, width):
            p.add_row(*map(escape, row))
        _show(console, p, width)
    print_part_kernels(profile, console)
    from dsv4opt.report.rank_balance import print_rank_balance

    print_rank_balance(profile, console)


def print_part_kernels(profile, console: Console) -> None:
    """The baseline's kernel in each part, where the profile records it (the Hopper path): SGLang's
    own or a stand-in of ours, so a share is read for what it is."""
    kernels = profile.meta.get("kernels") or {}
    if not kernels:
        return
    stand_ins = sum("stand-in" in str(k) for k in kernels.values())
    console.print(f"baseline kernel by part ({stand_ins} of {len(kernels)} parts run a stand-in, in whole or in part: "
                  "those shares are partly ours, not SGLang's):" if stand_ins else "baseline kernel by part:",
                  highlight=False)
    for part, kernel in kernels.items():
        console.print(f"  {part}: {escape(str(kernel))}", highlight=False, soft_wrap=True)


def _print_full_names(kernels, shown: list[str], wide: bool, console: Console) -> None:
    """With --wide, the trace's own name of each kernel the table shows by a shorter one; without,
    a hint where a name was cut to fit."""
    if not wide:
        if any(s != k.display_name for k, s in zip(kernels, shown)):
            console.print(f"names cut to fit {console.width} columns: `dsv4opt analyze PROFILE --wide` shows them "
                          "whole", highlight=False)
        return
    longer = [(i, k.name) for i, k in enumerate(kernels, 1) if k.name != k.display_name]
    if longer:
        console.print("full names, as in the trace:", highlight=False)
        for i, full in longer:
            console.print(f"  #{i} {escape(full)}", soft_wrap=True, highlight=False)


def _print_launchers(kernels, width: int, console: Console, limit: int = 5) -> None:
    """Who launched the top kernels: one block, by the numbers of the table above."""
    rows = []
    for i, k in enumerate(kernels[:limit], 1):
        if not (k.launched_by or k.source or k.part):
            continue
        replay = pct(k.graph_replay_share) if k.graph_replay_share else ""
        rows.append([str(i), k.part or "", k.launched_by or MISSING, k.source or MISSING] + ([replay] if replay else []))
    if not rows:
        return
    headers = ["#", "part", "launched by", "source"]
    if any(len(r) == 5 for r in rows):
        headers.append("graph replay")
        rows = [r + [""] * (5 - len(r)) for r in rows]
    t = _table(f"who launched the top {len(rows)}")
    text = {c: ([r[c] for r in rows], [r[c] for r in rows], None) for c in (1, 2, 3)}
    for row in _fit(t, rows, headers, text, width):
        t.add_row(*map(escape, row))
    _show(console, t, width)


def _print_timeline(profile, width: int, console: Console) -> None:
    """GPU busy and idle time and stream overlap per step (the union of kernel intervals, not their
    sum), per stream, and per category what ran alone (exposed) and what ran under other work."""
    tl = timeline_summary(profile.timeline)
    if tl is None:
        return
    per = "per step" if profile.steps else "whole trace"
    d = _table(f"GPU busy time, {per} (mean of {count(tl.steps, 'step')}; busy = union of kernel intervals)")
    rows = [[m.label, duration(m.kernel_us), duration(m.span_us), duration(m.busy_us), duration(m.idle_us),
             pct(m.idle_us / m.span_us) if m.span_us else MISSING, duration(m.overlap_us)] for m in tl.devices]
    rows += [["  " + m.label, duration(m.kernel_us), "", duration(m.busy_us), duration(m.idle_us), "", ""] for m in tl.streams]
    headers = ["", "kernel sum", "span", "busy", "idle", "idle %", "overlap"]
    for row in _fit(d, rows, headers, {0: ([r[0] for r in rows], [r[0] for r in rows], None)}, width):
        d.add_row(*map(escape, row))
    _show(console, d, width)
    if profile.steps:
        line = whole_trace_line(profile.timeline)
        if line:
            console.print(line, highlight=False)
    if not any(c.overlapped_us for c in tl.categories):
        console.print("no two categories ran at the same time: each category's busy time is all exposed", highlight=False)
        return
    c = _table(f"categories under other work, {per} (mean)")
    rows = [[category_label(m.label), duration(m.busy_us), duration(m.exposed_us), duration(m.overlapped_us),
             pct(m.overlapped_us / m.busy_us) if m.busy_us else MISSING] for m in tl.categories]
    for row in _fit(c, rows, ["category", "busy", "exposed", "overlapped", "hidden"], {}, width):
        c.add_row(*row)
    _show(console, c, width)


def whole_trace_line(timeline) -> str | None:
    """The whole trace's busy, idle and overlap beside the per-step means, and how much of its busy
    time the steps hold (a trace's warm-up or data loading can sit outside every step)."""
    w = whole_trace(timeline)
    if w is None:
        return None
    held = f" ({pct(w.in_steps_busy_us / w.busy_us)})" if w.busy_us else ""
    return (f"whole trace, steps or not: span {duration(w.span_us)}, busy {duration(w.busy_us)}, idle "
            f"{duration(w.idle_us)} ({pct(w.idle_us / w.span_us) if w.span_us else MISSING}), overlap "
            f"{duration(w.overlap_us)}; {'its step holds' if w.steps == 1 else f'its {w.steps} profiled steps hold'} "
            f"{duration(w.in_steps_busy_us)} of the busy time{held}")


def _print_efficiency(profile, top: int, width: int, console: Console) -> None:
    """Achieved rates where the trace recorded shapes, against the device's datasheet peaks."""
    rated = sorted((k for k in profile.kernels if k.efficiency is not None), key=lambda k: -k.efficiency.modelled_us)[:top]
    if not rated:
        return
    peak = profile.peak
    t = _table("efficiency of the operator calls behind each kernel (record_shapes)")
    rows = [[k.display_name, k.efficiency.op, duration(k.efficiency.modelled_us), value(k.efficiency.tflops, ".1f"),
             pct(k.efficiency.compute_of_peak), value(k.efficiency.gbps, ".0f"), pct(k.efficiency.bandwidth_of_peak)]
            for k in rated]
    headers = ["kernel", "op", "time", "TFLOP/s", "of peak", "GB/s", "of HBM"]
    texts = {0: _names(rated), 1: ([r[1] for r in rows], [r[1] for r in rows], None)}
    for row in _fit(t, rows, headers, texts, width):
        t.add_row(*map(escape, row))
    _show(console, t, width)
    if peak is not None:
        rates = ", ".join(f"{kind} {v:g}" for kind, v in peak.tflops.items())
        console.print(f"peaks ({escape(peak.label)}, {escape(peak.source)}): TFLOP/s dense {rates}; HBM {peak.hbm_gbps:g} GB/s",
                      highlight=False)
    else:
        console.print("device peaks unknown for this GPU: rates without fractions", highlight=False)


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
        # a kernel one side does not run shows "-" there, not 0.0 µs
        rows = [[r["short_name"], category_label(r["category"]),
                 duration(r["total_us_a"] / scale_a) if r["total_us_a"] else MISSING,
                 duration(r["total_us_b"] / scale_b) if r["total_us_b"] else MISSING,
                 change(r["total_us_b"] / scale_b - r["total_us_a"] / scale_a)]
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
    tl = comparison.timeline
    if tl:
        rows = [[label, duration(tl[key]["a"]), duration(tl[key]["b"]), change(tl[key]["delta"])]
                for key, label in (("kernel_us", "kernel sum"), ("span_us", "span"), ("busy_us", "busy"),
                                   ("idle_us", "idle"), ("overlap_us", "stream overlap"))]
        rows += [[f"{category_label(c['category'])} exposed", duration(c["exposed_us_a"]), duration(c["exposed_us_b"]),
                  change(c["exposed_us_b"] - c["exposed_us_a"])] for c in tl["categories"] if c["overlapped_us_a"] or c["overlapped_us_b"]]
        print_table(console, [Column(""), Column("before", right=True), Column("after", right=True), Column("change", right=True)],
                    rows, title=f"GPU time per step (mean of {tl['steps']['a']} -> {count(tl['steps']['b'], 'step')}; busy = union of kernel intervals)")
    for line in throughput_lines(comparison):
        console.print(line, highlight=False)
    console.print(f"[bold]{escape(comparison.verdict)}[/]", highlight=False)


def throughput_lines(comparison) -> list[str]:
    """tokens/s and ms/step before -> after with the verdict against the noise, then the kernel
    time per step: one line each, every figure once."""
    lines = [comparison.throughput_line()] if comparison.change is not None else []
    tput = comparison.throughput or {}
    per_step = tput.get("gpu_us_per_step")
    if per_step:
        basis = "CPU self time" if comparison.time_basis == "cpu_self" else "GPU kernel time"
        lines.append(f"{basis} per profiled step: {duration(per_step['a'])} -> {duration(per_step['b'])}")
    return lines


def print_saved_profiles(saved, console: Console) -> None:
    """A folder's saved profiles, one row each (`analyze DIR` of profiles), and what to run next."""
    from dsv4opt.analysis.compare import sglang_path, setting

    columns = [Column("profile"), Column("C", right=True), Column("tokens/s", right=True), Column("SGLang path"),
               Column("layout"), Column("#1 category")]
    rows = []
    for path, prof in saved.profiles:
        top = prof.top_category
        rows.append([path.name, value(prof.meta.get("concurrency")), value((prof.throughput or {}).get("tokens_per_s"), ".2f"),
                     sglang_path(prof) or MISSING, value(setting(prof, "layout")),
                     f"{top.label} {pct(top.share)}" if top else MISSING])
    n = len(saved.profiles)
    title = f"{saved.folder}: {n} saved profile{'' if n == 1 else 's'}"
    if natural_width(columns, rows) <= console.width:
        print_table(console, columns, rows, title=title)
    else:  # file names are typed, never cut: each on its own line, its figures under it
        console.print(title, highlight=False, soft_wrap=True)
        for r in rows:
            console.print(f"  {escape(r[0])}", highlight=False, soft_wrap=True)
            console.print(f"    C={r[1]}, {r[2]} tokens/s, SGLang {escape(r[3])}, {escape(r[4])}, #1 category {escape(r[5])}",
                          highlight=False, soft_wrap=True)
    for path, why in saved.unreadable:
        console.print(f"  {escape(path.name)}: not listed, {escape(why)}", highlight=False, soft_wrap=True)
    folder = str(saved.folder).rstrip("/")
    console.print(f"`dsv4opt analyze {escape(folder)}/FILE` shows one; `dsv4opt report {escape(folder)}/*.json` puts "
                  "them side by side", highlight=False, soft_wrap=True)
