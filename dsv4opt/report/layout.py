"""Tables that fit the terminal: a figure, a unit or a name a user types is never cut.

Every cell is one unbroken line. Prose (what an optimisation replaces, its risk) goes under the
table, one block per row; a column of figures that would make the table wider than the terminal
goes there too instead of being squeezed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from dsv4opt.display import narrow_table
from dsv4opt.report.fit import distinct_labels


@dataclass(frozen=True)
class Column:
    header: str  # "\n" splits a header over two lines
    right: bool = False  # figures: right-aligned
    below: bool = False  # prose: always under the table
    optional: bool = False  # in the table when it fits, else under it
    shrink: bool = False  # names that may be shortened (never a name a user types): the width left


def overhead(columns: int) -> int:
    """What box.SIMPLE_HEAD without edges adds between `columns` columns: a padding space either
    side of a one-space rule."""
    return 3 * (columns - 1)


MIN_SHRUNK = 12  # a shortened name keeps at least this many characters


def clip(texts: list[str], width: int) -> list[str]:
    """Each text in at most `width` characters: its head and an ellipsis."""
    return [t if len(t) <= width else t[: width - 1] + "…" for t in texts]


def _widths(columns: list[Column], rows: list[list[str]]) -> list[int]:
    return [max([len(line) for line in c.header.split("\n")] + [len(r[i]) for r in rows])
            for i, c in enumerate(columns)]


def natural_width(columns: list[Column], rows: list[list[str]]) -> int:
    widths = [MIN_SHRUNK if c.shrink else w for c, w in zip(columns, _widths(columns, rows))]
    return sum(widths) + overhead(len(columns))


def print_table(console: Console, columns: list[Column], rows: list[list[str]], title: str | None = None,
                shorten: Callable[[list[str], int], list[str]] = distinct_labels) -> None:
    """The rows (plain text, one cell per column) as a table of the columns that fit the console;
    under it, for each row, its first cell and the cells of the columns left out. A shrink column
    gets the width the others leave, its texts shortened by `shorten(texts, width)`."""
    shown = [i for i, c in enumerate(columns) if not c.below]
    for i in reversed([i for i, c in enumerate(columns) if c.optional]):
        if natural_width([columns[j] for j in shown], [[r[j] for j in shown] for r in rows]) <= console.width:
            break
        shown.remove(i)
    rows = [list(r) for r in rows]
    widths = _widths(columns, rows)
    shrink = [i for i in shown if columns[i].shrink]
    folded: dict[int, int] = {}  # shrink columns whose shortened texts would look alike: width
    if shrink:
        fixed = sum(widths[i] for i in shown if i not in shrink) + overhead(len(shown))
        room = max(MIN_SHRUNK, (console.width - fixed) // len(shrink))
        for i in shrink:
            texts = [r[i] for r in rows]
            short = shorten(texts, min(room, widths[i]))
            if len(set(short)) < len(set(texts)):
                folded[i] = min(room, widths[i])  # different names must not read alike: shown whole, folded
                continue
            for r, text in zip(rows, short):
                r[i] = text
    table = narrow_table(title)
    for i in shown:
        if i in folded:
            table.add_column(columns[i].header, overflow="fold", width=folded[i])
        else:
            table.add_column(columns[i].header, justify="right" if columns[i].right else "left", no_wrap=True)
    for r in rows:
        table.add_row(*(escape(r[i]) for i in shown))
    console.print(table)
    left_out = [i for i in range(len(columns)) if i not in shown and i != 0]
    if left_out:
        print_notes(console, [(r[0], "; ".join(f"{_one_line(columns[i].header)}: {r[i]}" for i in left_out if r[i]))
                              for r in rows])


def _one_line(header: str) -> str:
    """A two-line header on one line: "launches\n/step" -> "launches/step", "Amdahl\nbound" -> "Amdahl bound"."""
    return header.replace("\n/", "/").replace("\n", " ")


def print_prose(console: Console, text: str, indent: int = 2) -> None:
    """A paragraph wrapped at word boundaries, every line indented."""
    console.print(Padding(Text(text), (0, 0, 0, indent)))


def print_notes(console: Console, notes: list[tuple[str, str]]) -> None:
    """`name  text` blocks: the name whole, the text wrapped at word boundaries beside it."""
    grid = Table.grid(padding=(0, 1), pad_edge=False)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for name, text in notes:
        if text:
            grid.add_row(f"  {escape(name)}", escape(text))
    if grid.row_count:
        console.print(grid)
