"""How figures are written wherever a person reads them: shares, times, numbers, a missing value."""

from __future__ import annotations

from typing import Any

MISSING = "-"


def _unsigned_zero(text: str) -> str:
    """"-0.00 µs" -> "0.00 µs": a figure that rounds to zero has no sign."""
    return text[1:] if text.startswith("-") and not any(c in "123456789" for c in text) else text


def pct(share: float | None) -> str:
    """0.123 -> "12.3%"."""
    return MISSING if share is None else _unsigned_zero(f"{100 * share:.1f}%")


def duration(us: float | None) -> str:
    """Microseconds as "12.3 µs" ("0.86 µs" under one), or "1.23 ms" from a millisecond up."""
    if us is None:
        return MISSING
    if abs(us) >= 1000:
        return _unsigned_zero(f"{us / 1000:.2f} ms")
    return _unsigned_zero(f"{us:.1f} µs" if abs(us) >= 1 or us == 0 else f"{us:.2f} µs")


def change(us: float | None) -> str:
    """A difference of durations with its sign: "+4.13 ms", "-624.79 ms", "0.0 µs"."""
    text = duration(us)
    return text if text == MISSING or text.startswith("-") or not any(c in "123456789" for c in text) else "+" + text


def count(n: int, what: str) -> str:
    """3, "step" -> "3 steps"; 1 -> "1 step"."""
    return f"{n} {what}{'' if n == 1 else 's'}"


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


def shown_path(path) -> str:
    """A path as a header shows it: relative to the working folder when it lies inside (a whole
    path on one line fits 80 columns more often), else as given."""
    from pathlib import Path

    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)
