"""A report on one or more profiles, as a self-contained HTML page or Markdown: rendering only.

dsv4opt.loop.report_facts.build_report() computes what a report says (comparison verdict,
recommendation, sweep rows); render_html()/render_markdown() lay it out. Charts are PNGs: inlined
as data URIs in HTML (renders offline), written beside the Markdown.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from dsv4opt.analysis.categories import CATEGORIES, category_label
from dsv4opt.analysis.profile import Profile
from dsv4opt.display import pct, value
from dsv4opt.loop.report_facts import Report
from dsv4opt.report.glue import header_lines, launches_text, plan_lines, share_text
from dsv4opt.report.plots import category_bars_png, throughput_chart_png

META_KEYS = ("target", "device", "config", "concurrency", "context", "layers", "optimizations",
             "torch", "triton", "date", "commit")


def charts(report: Report) -> dict[str, bytes]:
    """The report's PNG charts by name: category shares, and throughput when C varies."""
    out = {}
    bars = category_bars_png(report.names, [{c.category: c.share for c in p.categories} for p in report.profiles])
    if bars:
        out["categories"] = bars
    if len({r.concurrency for r in report.sweep_rows}) >= 2:
        chart = throughput_chart_png(report.sweep_rows)
        if chart:
            out["throughput"] = chart
    return out


def _kernel_rows(profile: Profile, top: int = 10) -> list[list[str]]:
    rows = []
    for i, k in enumerate(profile.kernels[:top], 1):
        where = " ".join(x for x in (f"[{k.part}]" if k.part else "", k.source or "") if x)
        op = k.launched_by or ""
        if k.graph_replay_share:
            op = (op + f" (CUDA-graph replay {k.graph_replay_share:.0%})").strip()
        rows.append([
            str(i), pct(k.share), f"{k.total_us:.1f}", str(k.count), k.category_label, k.display_name,
            value(" ".join(x for x in (where, op) if x) or None),
        ])
    return rows


def _category_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["category"] + report.names
    rows = []
    for cat in CATEGORIES:
        shares = [p.category_share(cat) for p in report.profiles]
        if any(shares):
            rows.append([category_label(cat)] + [f"{s:.1%}" for s in shares])
    rows.append(["glue (total)"] + [f"{p.glue_share:.1%}" for p in report.profiles])
    return header, rows


def _meta_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["field"] + report.names
    rows = [["basis"] + [p.time_basis for p in report.profiles]]
    rows += [[key] + [value(p.meta.get(key)) for p in report.profiles] for key in META_KEYS]
    rows.append(["tokens/s"] + [value((p.throughput or {}).get("tokens_per_s"), ".1f") for p in report.profiles])
    rows.append(["ms/step"] + [value((p.throughput or {}).get("ms_per_step"), ".2f") for p in report.profiles])
    rows.append(["GPU time (µs)"] + [f"{p.total_us:.1f}" for p in report.profiles])
    return header, rows


def _sweep_table(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["C", "variant", "tokens/s", "ms/step", "attention", "#1 category", "speed-up"]
    rows = [[str(r.concurrency), r.variant, value(r.tokens_per_s, ".1f"), value(r.ms_per_step, ".2f"),
             pct(r.attention_share), category_label(r.top_category), value(r.speedup, ".2f", "x")]
            for r in report.sweep_rows]
    return header, rows


KERNEL_HEADER = ["#", "share", "total µs", "launches", "category", "kernel", "launched from"]
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


def render_markdown(report: Report, chart_dir: Path | None = None, stem: str = "report") -> tuple[str, dict[Path, bytes]]:
    """Markdown text plus the PNG files it links to (written beside it by the caller)."""
    files: dict[Path, bytes] = {}
    pngs = charts(report) if chart_dir is not None else {}
    out = [f"# {report.title}", "", f"Generated {report.generated} by dsv4opt from {len(report.profiles)} profile(s).", ""]
    if not report.profiles:
        return "\n".join(out + ["No profiles given.", ""]), files
    if report.verdict:
        out += ["## Verdict", "", f"**{report.verdict}**", ""]
    out += ["## Category shares", ""]
    if "categories" in pngs:
        name = f"{stem}-categories.png"
        files[chart_dir / name] = pngs["categories"]
        out += [f"![category shares]({name})", ""]
    out += _md_table(*_category_rows(report)) + [""]
    if report.sweep_rows:
        out += ["## Throughput across concurrencies", ""]
        if "throughput" in pngs:
            name = f"{stem}-throughput.png"
            files[chart_dir / name] = pngs["throughput"]
            out += [f"![throughput]({name})", ""]
        out += _md_table(*_sweep_table(report)) + [""]
    for name, profile in zip(report.names, report.profiles):
        out += [f"## Top kernels: {name}", ""] + _md_table(KERNEL_HEADER, _kernel_rows(profile)) + [""]
    out += ["## Recommendation for the last profile", ""] + [f"- {line}" for line in report.recommendation] + [""]
    if report.glue is not None:
        out += ["## Glue regions of the last profile", ""] + [f"- {line}" for line in _glue_lines(report)] + [""]
        out += _md_table(GLUE_HEADER, _glue_rows(report)) + [""]
    out += ["## Evidence", ""] + _md_table(*_meta_rows(report)) + [""]
    return "\n".join(out), files


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
    return lines


def render_html(report: Report) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(report.title)}</h1><p class='small'>Generated {e(report.generated)} by dsv4opt from "
        f"{len(report.profiles)} profile(s).</p>",
    ]
    if not report.profiles:
        parts.append("<p>No profiles given.</p></body></html>")
        return "".join(parts)
    pngs = charts(report)
    if report.verdict:
        parts.append(f"<h2>Verdict</h2><p class='verdict'>{e(report.verdict)}</p>")
    parts.append("<h2>Category shares</h2>")
    parts.append(_img(pngs, "categories", "category shares"))
    parts.append(_html_table(*_category_rows(report)))
    if report.sweep_rows:
        parts.append("<h2>Throughput across concurrencies</h2>")
        parts.append(_img(pngs, "throughput", "throughput"))
        parts.append(_html_table(*_sweep_table(report)))
    for name, profile in zip(report.names, report.profiles):
        parts.append(f"<h2>Top kernels: {e(name)}</h2>")
        parts.append(_html_table(KERNEL_HEADER, _kernel_rows(profile)))
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
    parts.append("</body></html>")
    return "".join(parts)


def _img(pngs: dict[str, bytes], key: str, alt: str) -> str:
    png = pngs.get(key)
    if not png:
        return ""
    return f"<img alt='{alt}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.9em}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
    "th{background:#f3f3f3}.verdict{font-size:1.15em;font-weight:600}.small{color:#666}"
    "img{max-width:100%}"
)
