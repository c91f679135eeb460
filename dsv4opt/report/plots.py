"""Charts as PNG bytes (matplotlib, headless). Renderers only: data in, image out."""

from __future__ import annotations

import io
from typing import Iterable, Sequence

from dsv4opt.analysis.categories import CATEGORIES, category_label

# One fixed colour per category so every chart reads the same.
COLOURS = {
    "attention": "#d62728",
    "gemm_tc": "#1f77b4",
    "gemm_fp32_simt": "#ff7f0e",
    "moe": "#2ca02c",
    "communication": "#9467bd",
    "elementwise": "#8c564b",
    "reduction": "#e377c2",
    "copy": "#7f7f7f",
    "topk_sort": "#bcbd22",
    "other": "#17becf",
}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return None
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _bar_width_in(n: int) -> float:
    """Figure width for n bars: room for each label, never wider than a page takes in comfortably."""
    return min(16.0, max(4.0, 0.9 * n + 3.0))


def category_bars_png(labels: Sequence[str], shares: Sequence[dict[str, float]], basis: str = "GPU time") -> bytes | None:
    """Stacked bars, one per profile: share of `basis` per category."""
    return _drawn(_stacked_bars(labels, [{c: 100.0 * v for c, v in s.items()} for s in shares],
                                f"share of {basis} (%)", top=100.0))


def category_time_png(labels: Sequence[str], ms: Sequence[dict[str, float]], measured: Sequence[float | None],
                      ylabel: str) -> bytes | None:
    return _drawn(category_time_figure(labels, ms, measured, ylabel))


def category_time_figure(labels: Sequence[str], ms: Sequence[dict[str, float]], measured: Sequence[float | None],
                         ylabel: str):
    """Stacked bars, one per profile: time per category in ms (absolute, so a bar that shrinks is
    time saved) from 0, each bar's total written on it (a bar 29x shorter than its neighbour is a
    sliver on any linear axis, and a log axis would misdraw the stacked segments), with the
    measured ms/step of each profile as a marker where it has one."""
    if not any(ms):
        return None
    return _stacked_bars(labels, ms, ylabel, marks=measured, mark_label="measured ms/step", totals=True)


def _drawn(fig) -> bytes | None:
    """A figure as PNG bytes, and closed."""
    if fig is None:
        return None
    data = _png(fig)
    _pyplot().close(fig)
    return data


def _amount(x: float) -> str:
    """A bar's total in three significant figures or more."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 0.01 else f"{x:.2g}"


def _stacked_bars(labels: Sequence[str], values: Sequence[dict[str, float]], ylabel: str, top: float | None = None,
                  marks: Sequence[float | None] = (), mark_label: str = "", totals: bool = False):
    """One bar per label, a segment per category in the fixed colours, legend in stacking order
    beside the axes (never over a bar), y from 0; `totals` writes each bar's sum above it."""
    plt = _pyplot()
    if plt is None or not labels:
        return None
    fig, ax = plt.subplots(figsize=(_bar_width_in(len(labels)), 4.2))
    x = list(range(len(labels)))
    bottoms = [0.0] * len(labels)
    for cat in CATEGORIES:
        heights = [v.get(cat, 0.0) for v in values]
        if not any(heights):
            continue
        ax.bar(x, heights, bottom=bottoms, color=COLOURS[cat], label=category_label(cat))
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    points = [(i, v) for i, v in enumerate(marks) if v]
    if points:
        ax.scatter([p[0] for p in points], [p[1] for p in points], marker="_", s=400, color="black", zorder=3,
                   label=mark_label)
    if totals:
        for i, total in enumerate(bottoms):
            if total > 0:
                ax.annotate(_amount(total), (i, total), xytext=(0, 2), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8)
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top if top is not None else 1.12 * max(bottoms + [v or 0.0 for v in marks] + [1e-9]))
    if any(bottoms):
        handles, names = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], names[::-1], loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    many = len(labels) > 4
    plt.setp(ax.get_xticklabels(), rotation=30 if many else 0, ha="right" if many else "center", fontsize=8)
    return fig


def step_timeline_png(labels: Sequence[str], step_ms: Sequence[Sequence[float]], ylabel: str) -> bytes | None:
    """Time of each profiled step in order, for each profile that recorded its steps: one line each
    on one chart for a few profiles, a small chart each (same y scale) for more."""
    plt = _pyplot()
    series = [(label, list(ms)) for label, ms in zip(labels, step_ms) if ms]
    if plt is None or not series:
        return None
    if len(series) <= SMALL_MULTIPLES_FROM - 1:
        fig, ax = plt.subplots(figsize=(7.5, 4.0))
        for label, ms in series:
            ax.plot(range(1, len(ms) + 1), ms, marker="o", markersize=3, label=label)
        _step_axes(ax, ylabel)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    else:
        cols = 4
        rows = -(-len(series) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(12.0, 2.2 * rows), sharex=True, sharey=True, squeeze=False)
        top = 1.05 * max(max(ms) for _, ms in series) or 1.0
        for ax, (label, ms) in zip(axes.flat, series):
            ax.plot(range(1, len(ms) + 1), ms, marker="o", markersize=2.5, color="#1f77b4")
            ax.set_title(label, fontsize=8)
            _step_axes(ax, None)
            ax.set_ylim(0, top)
        for ax in list(axes.flat)[len(series):]:
            ax.set_visible(False)
        fig.supylabel(ylabel, fontsize=9)
        fig.supxlabel("profiled step", fontsize=9)
        fig.tight_layout()
    data = _png(fig)
    plt.close(fig)
    return data


def throughput_chart_png(rows: Iterable) -> bytes | None:
    return _drawn(throughput_figure(rows))


def throughput_figure(rows: Iterable):
    """Tokens/s against concurrency, one line per variant, y from 0 (6.8 -> 8.2 tokens/s is a 20%
    rise, not a cliff); the legend beside the axes, where it hides no point. `rows` carry
    concurrency/variant/tokens_per_s."""
    plt = _pyplot()
    rows = [r for r in rows if getattr(r, "tokens_per_s", None)]
    if plt is None or not rows:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for variant in dict.fromkeys(r.variant for r in rows):
        points = sorted((r.concurrency, r.tokens_per_s) for r in rows if r.variant == variant)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=variant)
    ax.set_xlabel("concurrency (requests)")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(0, 1.08 * max(r.tokens_per_s for r in rows))
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return fig


SMALL_MULTIPLES_FROM = 5  # profiles: from this many, one small chart each instead of one crowded one


def _step_axes(ax, ylabel: str | None) -> None:
    if ylabel:
        ax.set_xlabel("profiled step")
        ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
    ax.xaxis.get_major_locator().set_params(integer=True)
