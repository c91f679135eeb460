"""How figures are written wherever a person reads them: shares, times, numbers, a missing value."""

from __future__ import annotations

from typing import Any

MISSING = "-"


def pct(share: float | None) -> str:
    """0.123 -> "12.3%"."""
    return MISSING if share is None else f"{100 * share:.1f}%"


def duration(us: float | None) -> str:
    """Microseconds as "12.3 µs" ("0.86 µs" under one), or "1.23 ms" from a millisecond up."""
    if us is None:
        return MISSING
    if abs(us) >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} µs" if abs(us) >= 1 or us == 0 else f"{us:.2f} µs"


def value(x: Any, spec: str = "", suffix: str = "") -> str:
    """Any figure by a format spec ("" for str()); a list joined ("none" when empty)."""
    if x is None:
        return MISSING
    if isinstance(x, (list, tuple)):
        return ", ".join(map(str, x)) or "none"
    return (format(x, spec) if spec else str(x)) + suffix


def narrow_table(title: str, **options):
    """A rich table in the project's one shape, which fits 80 columns: the title on the left, a rule
    under the header and nothing else drawn, no padding at its sides; `options` go to rich's Table."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, **options)
