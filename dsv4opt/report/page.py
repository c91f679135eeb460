"""A report on one or more profiles, as a self-contained HTML page or Markdown: rendering only.

dsv4opt.loop.report_facts.build_report() computes what a report says (verdicts, what moved, time
per step, spreads, trace paths, recommendation, sweep rows); render_html()/render_markdown() lay it
out. Charts are PNGs: inlined as data URIs in HTML (renders offline), written beside the Markdown.
Tables have one row per profile, so sixteen profiles make a long table rather than a wide one.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from dsv4opt.analysis.categories import CATEGORIES, GLUE, category_label
from dsv4opt.analysis.profile import Profile
from dsv4opt.display import duration, pct, value
from dsv4opt.loop.report_facts import Figure, Report
from dsv4opt.report.glue import header_lines, launches_text, plan_lines, share_text
from dsv4opt.report.plots import category_bars_png, category_time_png, step_timeline_png, throughput_chart_png

META_KEYS = ("target", "device", "config", "concurrency", "context", "layers", "optimizations",
             "torch", "triton", "date", "commit")
META_HEADERS = {"optimizations": "optimisations"}  # the meta key's spelling, the page's word
PERFETTO = ("Open a trace in Perfetto (ui.perfetto.dev, \"Open trace file\") or chrome://tracing; "
            "the files stay on this machine.")


def charts(report: Report) -> dict[str, bytes]:
    """The report's PNG charts by name: time per step and shares by category, the per-step
    timeline when steps were recorded, throughput when C varies."""
    out = {}
    basis = report.time_label
    per_step = all(f.per_step for f in report.facts)
    time = category_time_png(report.names, [f.category_ms for f in report.facts],
                             [f.ms_per_step.median for f in report.facts],
                             f"{basis} per step (ms)" if per_step else f"{basis}, whole profile (ms)")
    if time:
        out["time"] = time
    bars = category_bars_png(report.names, [{c.category: c.share for c in p.categories} for p in report.profiles],
                             basis)
    if bars:
        out["categories"] = bars
    steps = step_timeline_png(report.names, [f.step_ms for f in report.facts], f"{basis} of the step (ms)")
    if steps:
        out["steps"] = steps
    if len({r.concurrency for r in report.sweep_rows}) >= 2:
        chart = throughput_chart_png(report.sweep_rows)
        if chart:
            out["throughput"] = chart
    return out


def _spread(f: Figure, spec: str) -> str:
    if f.median is None:
        return value(None)
    if f.low is None:
        return f"{f.median:{spec}} (spread unknown: timed once)" if f.windows == 1 else f"{f.median:{spec}}"
    return f"{f.median:{spec}} ({f.low:{spec}}-{f.high:{spec}}, {f.windows} windows)"


def _kernel_rows(profile: Profile, top: int = 10) -> list[list[str]]:
    rows = []
    steps = profile.step_count or 1
    per = 1000.0 * steps  # µs over the profile -> ms per step (or over the whole profile)
    for i, k in enumerate(profile.kernels[:top], 1):
        where = " ".join(x for x in (f"[{k.part}]" if k.part else "", k.source or "") if x)
        op = k.launched_by or ""
        if k.graph_replay_share:
            op = (op + f" (CUDA-graph replay {k.graph_replay_share:.0%})").strip()
        rows.append([
            str(i), pct(k.share), f"{k.total_us / per:,.3f}", f"{k.count / steps:.{0 if k.count % steps == 0 else 1}f}",
            k.category_label, k.display_name,
            value(" ".join(x for x in (where, op) if x) or None),
        ])
    return rows


def _kernel_header(profile: Profile) -> list[str]:
    steps = profile.step_count
    total = "ms/step" if steps else "ms, whole profile"
    calls = "calls" if profile.time_basis == "cpu_self" else "launches"
    return ["#", "share", total, f"{calls}/step" if steps else calls, "category", "kernel", "launched from"]


def _present(report: Report) -> list[str]:
    return [c for c in CATEGORIES if any(p.category_share(c) for p in report.profiles)]


def _time_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """ms per step by category, one row per profile; glue summed after its categories."""
    cats = _present(report)
    glue = [c for c in cats if c in GLUE]
    unit = "ms/step" if all(f.per_step for f in report.facts) else "ms"
    header = (["profile"] + [f"{category_label(c)} ({unit})" for c in cats] + ([f"glue, sum ({unit})"] if glue else [])
              + [f"kernel sum ({unit})", "measured ms/step"])
    rows = []
    for name, f in zip(report.names, report.facts):
        cells = [f"{f.category_ms.get(c, 0.0):,.3f}" for c in cats]
        if glue:
            cells.append(f"{sum(f.category_ms.get(c, 0.0) for c in glue):,.3f}")
        cells.append(f"{sum(f.category_ms.values()):,.3f}")
        rows.append([name] + cells + [_spread(f.ms_per_step, ".2f")])
    return header, rows


def _category_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    cats = _present(report)
    glue = [c for c in cats if c in GLUE]
    header = ["profile"] + [f"{category_label(c)} (%)" for c in cats] + (["glue, sum (%)"] if glue else [])
    rows = [[name] + [pct(p.category_share(c)) for c in cats] + ([pct(p.glue_share)] if glue else [])
            for name, p in zip(report.names, report.profiles)]
    return header, rows


def _moved_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    c = report.comparison
    per_step = bool(c.steps.get("a") and c.steps.get("b"))
    sa, sb = (c.steps["a"], c.steps["b"]) if per_step else (1, 1)
    unit = "per step" if per_step else "whole profile"
    header = ["kernel", "category", f"{report.names[0]} ({unit})", f"{report.names[-1]} ({unit})", "change"]
    rows = [[r["short_name"], category_label(r["category"]), duration(r["total_us_a"] / sa),
             duration(r["total_us_b"] / sb), duration(r["total_us_b"] / sb - r["total_us_a"] / sa)]
            for r in c.moved]
    return header, rows


def _throughput_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["profile", "tokens/s (spread)", "ms/step (spread)", "profiled steps"]
    rows = [[name, _spread(f.tokens_per_s, ".2f"), _spread(f.ms_per_step, ".2f"), value(f.steps)]
            for name, f in zip(report.names, report.facts)]
    return header, rows


def _meta_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["profile", "basis", "SGLang path", "layout"] + [META_HEADERS.get(k, k) for k in META_KEYS] + ["total time"]
    rows = [[name, p.time_label, value(f.sglang_path), value(f.layout)] + [value(p.meta.get(key)) for key in META_KEYS]
            + [duration(p.total_us)] for name, p, f in zip(report.names, report.profiles, report.facts)]
    return header, rows


def _trace_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The raw traces; the note column only when some trace is not on this machine."""
    rows = [[name, t.role, t.path, "" if t.exists else "not on this machine"]
            for name, f in zip(report.names, report.facts) for t in f.traces]
    if any(r[3] for r in rows):
        return TRACE_HEADER, rows
    return TRACE_HEADER[:3], [r[:3] for r in rows]


def _sweep_table(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["C", "profile", "tokens/s", "ms/step", "attention", "#1 category", "speed-up", "over"]
    rows = [[str(r.concurrency), name, value(r.tokens_per_s, ".2f"), value(r.ms_per_step, ".2f"),
             pct(r.attention_share), category_label(r.top_category), value(r.speedup, ".2f", "x"),
             over]
            for r, name, over in zip(report.sweep_rows, report.sweep_names, report.sweep_over)]
    return header, rows


SWEEP_INTRO = ("speed-up: tokens/s over the first profile given at the same C, SGLang path and layout (named under "
               "\"over\"), as the verdict takes the last profile over the first.")


def _profile_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Which file each name on the page stands for, and the SGLang path and layout it ran."""
    return ["profile", "SGLang path", "layout", "file"], [
        [name, value(f.sglang_path), value(f.layout), path] for name, f, path in zip(report.names, report.facts, report.paths)]


GLUE_HEADER = ["#", "part", "where", "launches/step now → fused", "GPU µs/step", "share", "median µs",
               "fused µs/step", "saves µs/step", "estimate"]
GLUE_TOP = 10


def _glue_rows(report: Report) -> list[list[str]]:
    rows = []
    for i, r in enumerate(report.glue.regions[:GLUE_TOP], 1):
        rows.append([str(i), r.part or "-", r.where, launches_text(r), f"{r.gpu_us_per_step:.1f}",
                     share_text(r.share), f"{r.median_kernel_us:.2f}", f"{r.fused_us_per_step:.1f}",
                     f"{r.saving_us_per_step:.1f}", r.estimate])
    return rows


def _glue_lines(report: Report) -> list[str]:
    return header_lines(report.glue) + [line for plan in report.glue_plans for line in plan_lines(plan)]
TRACE_HEADER = ["profile", "trace", "path", "note"]


def _time_intro(report: Report) -> str:
    per_step = all(f.per_step for f in report.facts)
    basis = report.time_label
    text = (f"{basis} per category, ms {'per profiled step' if per_step else 'over the whole profile'}: a bar that "
            "gets shorter is time saved; its total is written on it.")
    if any(f.ms_per_step.median for f in report.facts):
        text += (" The black mark is the measured ms/step (wall clock, without the profiler); the gap to the bar is "
                 "time no kernel ran.")
    return text


def _generated(report: Report) -> str:
    n = len(report.profiles)
    return f"Generated {report.generated} by dsv4opt from {n} profile{'' if n == 1 else 's'}."


def render_markdown(report: Report, chart_dir: Path | None = None, stem: str = "report") -> tuple[str, dict[Path, bytes]]:
    """Markdown text plus the PNG files it links to (written beside it by the caller)."""
    files: dict[Path, bytes] = {}
    pngs = charts(report) if chart_dir is not None and report.profiles else {}

    def chart(key: str, alt: str) -> list[str]:
        if key not in pngs:
            return []
        name = f"{stem}-{key}.png"
        files[chart_dir / name] = pngs[key]
        return [f"![{alt}]({name})", ""]

    out = [f"# {report.title}", "", _generated(report), ""]
    if not report.profiles:
        return "\n".join(out + ["No profiles given.", ""]), files
    out += ["## Profiles", ""] + _md_table(*_profile_rows(report)) + [""]
    if report.verdict or report.mixed_paths:
        out += ["## Verdict", ""] + [part for line in (report.mixed_paths, report.verdict) if line
                                     for part in (f"**{line}**", "")]
        if report.throughput_verdict:
            out += [f"**{report.throughput_verdict}**", ""]
    out += ["## Time per step by category", "", _time_intro(report), ""] + chart("time", "time per step by category")
    out += _md_table(*_time_rows(report)) + [""]
    out += ["## Category shares", ""] + chart("categories", "category shares") + _md_table(*_category_rows(report)) + [""]
    if report.comparison is not None and report.comparison.moved:
        out += [f"## What moved most: {report.names[0]} -> {report.names[-1]}", ""] + _md_table(*_moved_rows(report)) + [""]
    out += ["## Throughput and its spread", ""] + _md_table(*_throughput_rows(report)) + [""]
    if report.sweep_rows:
        out += ["## Throughput across concurrencies", ""] + chart("throughput", "throughput")
        out += [SWEEP_INTRO, ""] + _md_table(*_sweep_table(report)) + [""]
    if "steps" in pngs:
        out += ["## Per-step timeline", ""] + chart("steps", "per-step timeline")
    for name, profile in zip(report.names, report.profiles):
        out += [f"## Top kernels: {name}", ""] + _md_table(_kernel_header(profile), _kernel_rows(profile)) + [""]
    out += ["## Recommendation for the last profile", ""] + [f"- {line}" for line in report.recommendation] + [""]
    if report.glue is not None:
        out += ["## Glue regions of the last profile", ""] + [f"- {line}" for line in _glue_lines(report)] + [""]
        out += _md_table(GLUE_HEADER, _glue_rows(report)) + [""]
    out += ["## Evidence", ""] + _md_table(*_meta_rows(report)) + [""]
    header, traces = _trace_rows(report)
    out += ["## Raw traces", ""]
    out += ([PERFETTO, ""] + _md_table(header, traces) if traces else
            ["The profiles name no raw trace (captured without --trace-dir)."]) + [""]
    return "\n".join(out), files


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, its columns of figures right-aligned."""
    rule = "|" + "".join("---:|" if _figures(rows, c) else "---|" for c in range(len(header)))
    lines = ["| " + " | ".join(map(_md_cell, header)) + " |", rule]
    lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
    return lines


def _figure_cell(text: str) -> bool:
    """A cell that is a figure: digits first (after a sign), or the missing-value dash; a version
    ("0.5.14 sm_120") is text."""
    t = str(text).strip()
    if re.match(r"\d+\.\d+\.\d+", t):
        return False
    return t == "-" or (t[:1].isdigit() or (t[:1] in "+-<" and t[1:2].isdigit()))


def _figures(rows: list[list[str]], column: int) -> bool:
    """A column of figures: every cell one, and not all of them dashes."""
    cells = [str(r[column]).strip() for r in rows if str(r[column]).strip()]
    return bool(cells) and all(_figure_cell(c) for c in cells) and any(c != "-" for c in cells)


def render_html(report: Report) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(report.title)}</h1><p class='small'>{e(_generated(report))}</p>",
    ]
    if not report.profiles:
        parts.append("<p>No profiles given.</p></body></html>")
        return "".join(parts)
    parts.append("<h2>Profiles</h2>")
    parts.append(_html_table(*_profile_rows(report)))
    pngs = charts(report)
    if report.verdict or report.mixed_paths:
        parts.append("<h2>Verdict</h2>" + "".join(f"<p class='verdict'>{e(line)}</p>"
                                                  for line in (report.mixed_paths, report.verdict) if line))
        if report.throughput_verdict:
            parts.append(f"<p class='verdict'>{e(report.throughput_verdict)}</p>")
    parts.append(f"<h2>Time per step by category</h2><p>{e(_time_intro(report))}</p>")
    parts.append(_img(pngs, "time", "time per step by category"))
    parts.append(_html_table(*_time_rows(report)))
    parts.append("<h2>Category shares</h2>")
    parts.append(_img(pngs, "categories", "category shares"))
    parts.append(_html_table(*_category_rows(report)))
    if report.comparison is not None and report.comparison.moved:
        parts.append(f"<h2>What moved most: {e(report.names[0])} -> {e(report.names[-1])}</h2>")
        parts.append(_html_table(*_moved_rows(report)))
    parts.append("<h2>Throughput and its spread</h2>")
    parts.append(_html_table(*_throughput_rows(report)))
    if report.sweep_rows:
        parts.append("<h2>Throughput across concurrencies</h2>")
        parts.append(_img(pngs, "throughput", "throughput"))
        parts.append(f"<p>{e(SWEEP_INTRO)}</p>")
        parts.append(_html_table(*_sweep_table(report)))
    if "steps" in pngs:
        parts.append("<h2>Per-step timeline</h2>")
        parts.append(_img(pngs, "steps", "per-step timeline"))
    parts.append("<h2>Top kernels</h2>")
    for i, (name, profile) in enumerate(zip(report.names, report.profiles)):
        # open when there are few; a sweep's sixteen stay folded until asked for
        opened = " open" if len(report.profiles) <= 2 else ""
        parts.append(f"<details{opened}><summary>{e(name)}</summary>")
        parts.append(_html_table(_kernel_header(profile), _kernel_rows(profile)))
        parts.append("</details>")
    parts.append("<h2>Recommendation for the last profile</h2><ul>")
    parts += [f"<li>{e(line)}</li>" for line in report.recommendation]
    parts.append("</ul>")
    if report.glue is not None:
        parts.append("<h2>Glue regions of the last profile</h2><ul>")
        parts += [f"<li>{e(line)}</li>" for line in _glue_lines(report)]
        parts.append("</ul>")
        parts.append(_html_table(GLUE_HEADER, _glue_rows(report)))
    parts.append("<h2>Evidence</h2>")
    parts.append(_html_table(*_meta_rows(report)))
    parts.append("<h2>Raw traces</h2>")
    header, traces = _trace_rows(report)
    if traces:
        parts.append(f"<p>{e(PERFETTO)}</p>")
        parts.append(_html_table(header, traces, link_column=2))
    else:
        parts.append("<p>The profiles name no raw trace (captured without --trace-dir).</p>")
    parts.append("</body></html>")
    return "".join(parts)


def _img(pngs: dict[str, bytes], key: str, alt: str) -> str:
    png = pngs.get(key)
    if not png:
        return ""
    return f"<img alt='{alt}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _html_table(header: list[str], rows: list[list[str]], link_column: int | None = None) -> str:
    """A table in a box that scrolls sideways when the table is wider than the page."""
    e = html.escape

    figures = {c for c in range(len(header)) if _figures(rows, c)}

    def cell(i: int, text: str) -> str:
        if i == link_column and text:
            return f"<td><a href='{e(Path(text).as_uri())}'>{e(text)}</a></td>"
        return f"<td class='n'>{e(str(text))}</td>" if i in figures else f"<td>{e(str(text))}</td>"

    head = "".join(f"<th class='n'>{e(h)}</th>" if i in figures else f"<th>{e(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<div class='wide'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
    ".wide{overflow-x:auto;margin:0.5em 0 1.5em}"
    "table{border-collapse:collapse;font-size:0.85em}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
    "td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}"
    "td{white-space:nowrap}th{background:#f3f3f3;position:sticky;top:0}"
    ".verdict{font-size:1.15em;font-weight:600}.small{color:#666}"
    "img{max-width:100%;height:auto}details{margin:0.3em 0}summary{cursor:pointer;font-weight:600}"
)
