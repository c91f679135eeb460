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


def category_bars_png(labels: Sequence[str], shares: Sequence[dict[str, float]]) -> bytes | None:
    """Stacked bars, one per profile: share of GPU time per category."""
    plt = _pyplot()
    if plt is None or not labels:
        return None
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(labels) + 2.5), 4.2))
    bottoms = [0.0] * len(labels)
    for cat in CATEGORIES:
        values = [100.0 * s.get(cat, 0.0) for s in shares]
        if not any(values):
            continue
        ax.bar(labels, values, bottom=bottoms, color=COLOURS[cat], label=category_label(cat))
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_ylabel("share of GPU time (%)")
    ax.set_ylim(0, 100)
    if any(bottoms):
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
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
