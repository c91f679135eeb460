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
    return _stacked_bars(labels, [{c: 100.0 * v for c, v in s.items()} for s in shares], f"share of {basis} (%)",
                         top=100.0)


def category_time_png(labels: Sequence[str], ms: Sequence[dict[str, float]], measured: Sequence[float | None],
                      ylabel: str) -> bytes | None:
    """Stacked bars, one per profile: time per category in ms (absolute, so a bar that shrinks is
    time saved), with the measured ms/step of each profile as a marker where it has one."""
    if not any(ms):
        return None
    return _stacked_bars(labels, ms, ylabel, marks=measured, mark_label="measured ms/step")


def _stacked_bars(labels: Sequence[str], values: Sequence[dict[str, float]], ylabel: str, top: float | None = None,
                  marks: Sequence[float | None] = (), mark_label: str = "") -> bytes | None:
    """One bar per label, a segment per category in the fixed colours, legend in stacking order."""
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
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    if top is not None:
        ax.set_ylim(0, top)
    if any(bottoms):
        handles, names = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], names[::-1], loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    many = len(labels) > 4
    plt.setp(ax.get_xticklabels(), rotation=30 if many else 0, ha="right" if many else "center", fontsize=8)
    data = _png(fig)
    plt.close(fig)
    return data


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
    """Tokens/s against concurrency, one line per variant. `rows` carry concurrency/variant/tokens_per_s."""
    plt = _pyplot()
    rows = [r for r in rows if getattr(r, "tokens_per_s", None)]
    if plt is None or not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in dict.fromkeys(r.variant for r in rows):
        points = sorted((r.concurrency, r.tokens_per_s) for r in rows if r.variant == variant)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=variant)
    ax.set_xlabel("concurrency (requests)")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax.legend()
    data = _png(fig)
    plt.close(fig)
    return data


SMALL_MULTIPLES_FROM = 5  # profiles: from this many, one small chart each instead of one crowded one


def _step_axes(ax, ylabel: str | None) -> None:
    if ylabel:
        ax.set_xlabel("profiled step")
        ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
    ax.xaxis.get_major_locator().set_params(integer=True)
